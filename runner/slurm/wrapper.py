"""What a Slurm push writes and submits: one bundle per push (ROOT/scripts/PLAN/bundle.HASH.json, every job's
body and attempt spec, content-addressed so a pending job runs exactly the text it was submitted with), the
sbatch wrapper each Slurm job or array is given on stdin, and the sbatch options it is submitted with."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from pathlib import Path

import runner
from runner.slurm.bundle import KILL_AFTER_S, Element, PushJob

TYPE_CHECKING = False
if TYPE_CHECKING:  # each job's wrapper imports this module: the request's reader is the push's alone
    from runner.slurm.request import PushRequest

MARGIN_S = 30  # the wrapper's own start, gate and DONE_IF checks, inside --time


def submit_env(slurm_conf: str | None = None) -> dict[str, str]:
    """The environment sbatch runs in, which a job gets whole (--export=ALL) with Slurm's SLURM_* added: who the
    user is, a plain PATH and the cluster's config; the lane's env is set by the wrapper. Neither the submitting
    process's variables nor the login environment that --export=NONE loads (a profile's exports, and 0.1-1 s
    of `su -` per job start where slurmd does not cache it)."""
    import pwd  # at submit time only

    user = pwd.getpwuid(os.getuid())
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
    }
    conf = slurm_conf or os.environ.get("SLURM_CONF")
    if conf:
        env["SLURM_CONF"] = conf
    return env


def job_paths(root: str, plan: str, name: str, digest: str) -> dict[str, Path]:
    """A job's body (written by its attempt from the bundle, per content hash) and its log (per name)."""
    return {
        "body": Path(root) / "scripts" / plan / f"{name}.{digest}.job",
        "log": Path(root) / "logs" / plan / f"{name}.job.log",
    }


def time_limit(job: PushJob) -> str | None:
    """--time for one attempt: its timeout plus the kill grace and the wrapper's margin, in whole minutes; the
    lane's default time (from the hosts file) for a job without a timeout."""
    if job.timeout_s:
        return str(math.ceil((float(job.timeout_s) + KILL_AFTER_S + MARGIN_S) / 60))
    return job.default_time or None


def _pattern_safe(path: Path) -> str:
    return str(path).replace("%", "%%")  # sbatch expands %j and friends in --output


def shared_options(root: str, job: PushJob) -> list[str]:
    """The options every job of one lane shape shares (so an array can carry them): environment, limits, lane
    resources, the lane's own options last."""
    options = ["--open-mode=append", "--kill-on-invalid-dep=yes", "--export=ALL", f"--chdir={root}"]
    limit = time_limit(job)
    if limit:
        options.append(f"--time={limit}")
    return options + list(job.sbatch)


def sbatch_options(root: str, plan: str, job: PushJob) -> list[str]:
    """sbatch's command-line options for JOB on its own (no --dependency): names, log, then shared_options.
    On the command line, not in #SBATCH lines, so no path needs quoting for sbatch's own parser."""
    log = job_paths(root, plan, job.name, job.hash)["log"]
    naming = [f"--job-name={plan}/{job.name}", f"--comment=plan={plan}@{job.hash}"]
    return [*naming, f"--output={_pattern_safe(log)}", *shared_options(root, job)]


def array_options(root: str, plan: str, jobs: list[PushJob], name: str) -> list[str]:
    """Options of an array of JOBS (one lane shape) named NAME: each element writes its own job's log, so
    Slurm's --output (one file per element, ARRAY_TASK) takes only what goes wrong before its attempt starts.
    Its comment names each element's job where Slurm's 1024 bytes hold them all (squeue -O Comment)."""
    log = _pattern_safe(Path(root) / "logs" / plan / f"{jobs[0].name}..{jobs[-1].name}") + ".%A_%a.log"
    members = array_members(root, plan, jobs)
    names = ",".join(job.name for job in jobs)
    comment = f"plan={plan}@{members}" + (f":{names}" if len(plan) + len(members) + len(names) < 1000 else "")
    naming = [f"--job-name={plan}/{name}", f"--comment={comment}", f"--array=0-{len(jobs) - 1}"]
    return [*naming, f"--output={log}", *shared_options(root, jobs[0])]


def array_members(root: str, plan: str, jobs: list[PushJob]) -> str:
    """Which plan job each element of an array is, kept as ROOT/scripts/PLAN/array.SHA.json (element i is the
    i-th [name, hash]) and named in the array's --comment as `array.SHA`: Slurm's 1024-byte comment cannot hold
    a large array's names, and a lost ledger is rebuilt from it (runner.slurm.rebuild)."""
    import hashlib

    data = (json.dumps([[job.name, job.hash] for job in jobs]) + "\n").encode()
    tag = f"array.{hashlib.sha256(data).hexdigest()[:16]}"
    path = Path(root) / "scripts" / plan / f"{tag}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_once(path, data)
    return tag


def runner_path() -> str:
    """Where this runner package is imported from (a directory or the cached .pyz), for the wrapper's PYTHONPATH."""
    return os.path.dirname(os.path.dirname(os.path.abspath(runner.__file__)))


def wrapper_text(
    root: str,
    plan: str,
    label: str,
    env: dict[str, str],
    where: tuple[Path, list[int], int],
    slurm_conf: str | None = None,
    shown: tuple[list[str], list[tuple[str, str]]] = ([], []),
) -> str:
    """The sbatch script of LABEL: WHERE is (bundle, entries, attempt). One entry is a job; several are an array
    whose element i runs entry i of them (SLURM_ARRAY_TASK_ID). SHOWN: its sbatch options and (name, body) of
    its jobs, written into it for a reader of `scontrol write batch_script` (the bundle stays what runs)."""
    q = shlex.quote
    bundle, entries, attempt = where
    options, bodies = shown
    lines = ["#!/bin/bash"]
    # The options as #SBATCH lines where sbatch's own parser reads them as given (no blank, no quote): the same
    # ones are on sbatch's command line, which wins; the others are said in a comment.
    lines += [f"#SBATCH {o}" for o in options if not any(c in o for c in " \t'\"\\")]
    lines += [f"# (on sbatch's command line) {o}" for o in options if any(c in o for c in " \t'\"\\")]
    lines += [
        f"# plan {plan}, {label}: written by `plan push`.",
        "# Attempts, the timer, DONE_IF and external gates are the runner's (runner.slurm.attempt); the",
        "# environment is only what is set here and sbatch's own few (runner.slurm.wrapper.submit_env).",
    ]
    for i, (name, text) in enumerate(bodies):
        where_ = f"element {i}: " if len(bodies) > 1 else ""
        lines.append(f"# {where_}the body of {name}, which the last line runs from {bundle.name}:")
        lines += [f"#   {line}" for line in text.splitlines()]
    lines.append('export PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}"')
    if slurm_conf:
        lines.append(f"export SLURM_CONF={q(slurm_conf)}")
    lines += [f"export {key}={q(str(value))}" for key, value in sorted(env.items())]
    lines += [f"export PYTHONPATH={q(runner_path())}", f"cd {q(root)} || exit 1"]
    entry = str(entries[0])
    if len(entries) > 1:
        lines.append(f"entries=({' '.join(str(i) for i in entries)})")
        entry = '"${entries[${SLURM_ARRAY_TASK_ID:?}]}"'
    # -S: the attempt is standard library only; the node's site-packages cost most of its start-up (as the loader's)
    lines.append(f"exec {q(sys.executable)} -S -m runner.slurm.attempt {q(str(bundle))} {attempt} {entry}")
    return "\n".join(lines) + "\n"


def retry_script(element: Element, attempt: int) -> str:
    """The sbatch script of ATTEMPT of ELEMENT on its own (a next try), run from the bundle it was read from."""
    where = (Path(str(element.bundle)), [int(element.entry or 0)], attempt)
    shown = (list(element.sbatch), [(element.name, element.text or "")])
    return wrapper_text(
        element.root, element.plan, f"job {element.name}", element.env, where, element.slurm_conf, shown
    )


def element(root: str, plan: str, job: PushJob, request: PushRequest) -> Element:
    """One job's entry in the bundle: everything its attempts need (the host's settings from REQUEST), its body
    text included."""
    paths = job_paths(root, plan, job.name, job.hash)
    return Element(
        root=root,
        plan=plan,
        name=job.name,
        hash=job.hash,
        text=job.text,
        body=str(paths["body"]),
        log=str(paths["log"]),
        env=dict(job.env),
        slurm_conf=request.slurm_conf,
        retries=job.retries,
        timeout_s=job.timeout_s,
        kill_after_s=KILL_AFTER_S,
        done_if=job.done_if,
        gate=job.gate,
        gate_interval_s=float(request.gate_interval_s),
        backoff_base_s=float(request.backoff_base_s),
        backoff_max_s=float(request.backoff_max_s),
        sbatch=tuple(sbatch_options(root, plan, job)),
    )


def write_bundle(root: str, plan: str, elements: list[Element]) -> Path:
    """All ELEMENTS in one file named by its content: one write (and one sync) per push, however many jobs;
    never rewritten under a pending job. The log directory is made here too, once."""
    import hashlib  # at push time only, not in every job's wrapper (which imports this module)

    data = (json.dumps({"elements": [e.to_json() for e in elements]}, sort_keys=True) + "\n").encode()
    path = Path(root) / "scripts" / plan / f"bundle.{hashlib.sha256(data).hexdigest()[:16]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    (Path(root) / "logs" / plan).mkdir(parents=True, exist_ok=True)
    write_once(path, data)
    return path


def write_once(path: Path, data: bytes) -> None:
    """A content-addressed file: left alone when it already holds DATA, else replaced whole (renamed into place)."""
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

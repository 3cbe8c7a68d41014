"""What a Slurm push writes for one job: its body, its attempt spec and its sbatch wrapper, per plan and per
content hash (ROOT/scripts/PLAN/NAME.HASH.{job,json,sbatch}), and the sbatch options it is submitted with."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import runner
from runner.config import Config

KILL_AFTER_S = 10  # TERM at the timeout, KILL this long after (as the runner's kill grace)
MARGIN_S = 30  # the wrapper's own start, gate and DONE_IF checks, inside --time


def job_paths(root: str, plan: str, name: str, digest: str) -> dict[str, Path]:
    scripts = Path(root) / "scripts" / plan
    return {
        "body": scripts / f"{name}.{digest}.job",
        "spec": scripts / f"{name}.{digest}.json",
        "sbatch": scripts / f"{name}.{digest}.sbatch",
        "log": Path(root) / "logs" / plan / f"{name}.job.log",
    }


def time_limit(job: dict[str, Any]) -> str | None:
    """--time for one attempt: its timeout plus the kill grace and the wrapper's margin, in whole minutes; the
    lane's default time (from the hosts file) for a job without a timeout."""
    if job.get("timeout_s"):
        return str(math.ceil((float(job["timeout_s"]) + KILL_AFTER_S + MARGIN_S) / 60))
    return job.get("default_time") or None


def _pattern_safe(path: Path) -> str:
    return str(path).replace("%", "%%")  # sbatch expands %j and friends in --output


def sbatch_options(root: str, plan: str, job: dict[str, Any], request: dict[str, Any]) -> list[str]:
    """sbatch's command-line options for JOB (no --dependency): names, log, environment, limits, lane resources.
    On the command line, not in #SBATCH lines, so no path needs quoting for sbatch's own parser."""
    paths = job_paths(root, plan, job["name"], job["hash"])
    options = [
        f"--job-name={plan}/{job['name']}",
        f"--comment=plan={plan}@{job['hash']}",
        f"--output={_pattern_safe(paths['log'])}",
        "--open-mode=append",
        "--kill-on-invalid-dep=yes",
        "--export=NONE",
        f"--chdir={root}",
    ]
    limit = time_limit(job)
    if limit:
        options.append(f"--time={limit}")
    return options + list(job.get("sbatch", []))


def runner_path() -> str:
    """Where this runner package is imported from (a directory or the cached .pyz), for the wrapper's PYTHONPATH."""
    return os.path.dirname(os.path.dirname(os.path.abspath(runner.__file__)))


def wrapper_text(
    root: str, plan: str, job: dict[str, Any], paths: dict[str, Path], slurm_conf: str | None = None
) -> str:
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# plan {plan}, job {job['name']}, script {job['hash']}: written by `plan push`; its sbatch options",
        "# are on sbatch's command line. Attempts, the timer, DONE_IF and external gates are the runner's",
        "# (runner.slurm_attempt); the environment is only what is set here (--export=NONE).",
        'export PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}"',
    ]
    if slurm_conf:
        lines.append(f"export SLURM_CONF={q(slurm_conf)}")
    for key, value in sorted((job.get("env") or {}).items()):
        lines.append(f"export {key}={q(str(value))}")
    lines += [
        f"export PYTHONPATH={q(runner_path())}",
        f"cd {q(root)} || exit 1",
        f'exec {q(sys.executable)} -m runner.slurm_attempt {q(str(paths["spec"]))} "${{1:-1}}"',
    ]
    return "\n".join(lines) + "\n"


def write_job(root: str, plan: str, job: dict[str, Any], request: dict[str, Any], paths: dict[str, Path]) -> None:
    """The body, the attempt spec and the wrapper of JOB; content-addressed, so never rewritten under a job."""
    paths["body"].parent.mkdir(parents=True, exist_ok=True)
    paths["log"].parent.mkdir(parents=True, exist_ok=True)
    spec = {
        "root": root,
        "plan": plan,
        "name": job["name"],
        "hash": job["hash"],
        "body": str(paths["body"]),
        "log": str(paths["log"]),
        "script": str(paths["sbatch"]),
        "retries": int(job.get("retries") or 1),
        "timeout_s": job.get("timeout_s"),
        "kill_after_s": KILL_AFTER_S,
        "done_if": job.get("done_if"),
        "gate": job.get("gate"),
        "gate_interval_s": float(request.get("gate_interval_s", 60)),
        "backoff_base_s": float(request.get("backoff_base_s", Config.backoff_base_s)),
        "backoff_max_s": float(request.get("backoff_max_s", Config.backoff_max_s)),
        "sbatch": sbatch_options(root, plan, job, request),
    }
    write_once(paths["body"], job["text"].encode())
    write_once(paths["spec"], (json.dumps(spec, indent=1) + "\n").encode())
    write_once(paths["sbatch"], wrapper_text(root, plan, job, paths, request.get("slurm_conf")).encode())


def write_once(path: Path, data: bytes) -> None:
    """A content-addressed file: left alone when it already holds DATA, else replaced whole (renamed into place).
    Not fsynced one by one: the push syncs once after writing them all, before anything is submitted."""
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

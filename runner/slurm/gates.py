"""External gates on Slurm that cost no Slurm job while closed: a gated job is submitted held (--hold), and the
submit host checks its gate (REQUIRES, by runner.conditions) at every push, status and watch contact, under
the push lock, releasing the job once it holds. Between contacts one small keeper job per root, started at
most every gate_interval (--begin), makes the same check (it is `runner agent status`) while a gate is
closed: one Slurm job per interval for the root, whatever the number of gated jobs, and none once all are
open. The attempt's wrapper checks the gate again when it starts (runner.slurm.attempt)."""

from __future__ import annotations

import json
import shlex
import sys

from runner.conditions import compile_condition, evaluate
from runner.slurm.bundle import Element
from runner.slurm.query import live_of, slurm, state_of
from runner.slurm.records import JobRecord, Ledger
from runner.slurm.retry import spec_of
from runner.slurm.wrapper import runner_path, submit_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.query import Live

KEEPER = ".plan-gates"  # the keeper's Slurm job name; its comment is not `plan=`, so no push takes it for a job
HELD = "JobHeldUser"


def gated_and_held(root: str, plan: str, name: str, record: JobRecord, live: Live) -> Element | None:
    """The bundle element of NAME if its current attempt waits, held, for its gate; else None."""
    state, last = state_of(record, live)
    if last is None or state != "PENDING":
        return None
    cur = live_of(record, last.id, live)
    if cur is None or cur.reason != HELD:
        return None
    element = spec_of(root, plan, name, record)
    return element if element is not None and element.gate else None


def check_gates(root: str, ledger: Ledger, live: Live, env: dict[str, str], slurm_conf: str | None) -> list[str]:
    """Release every held gated job whose gate holds now; while one stays closed, see that a keeper will look
    again within gate_interval (its SLURM_CONF the host's). What was released, a line each."""
    released: list[str] = []
    closed: list[float] = []
    for plan, entry in ledger.plans.items():
        for name, record in sorted(entry.jobs.items()):
            element = gated_and_held(root, plan, name, record, live)
            if element is None:
                continue
            if not evaluate(compile_condition(str(element.gate)), root, 30).holds:
                closed.append(element.gate_interval_s or 60.0)
                continue
            job_id = str(record.attempts[-1].id)
            if slurm(["scontrol", "release", job_id], env)[0] == 0:
                released.append(f"{plan}/{name} ({job_id}): its REQUIRES holds; released")
    if closed:
        _keep_watch(root, env, slurm_conf, min(closed))
    return released


def _keep_watch(root: str, env: dict[str, str], slurm_conf: str | None, interval: float) -> None:
    """Submit the root's keeper to start INTERVAL from now, unless one is pending for this root already."""
    rc, out, _ = slurm(["squeue", "-h", "-n", KEEPER, "-t", "PD", "-o", "%Z"], env)
    if rc == 0 and any(line.strip() == root for line in out.splitlines()):
        return
    ask = json.dumps({"backend": "slurm", "slurm_conf": slurm_conf})
    script = "\n".join(
        [
            "#!/bin/bash",
            "# plan: checks this root's closed external gates and releases the jobs whose gates hold",
            f"export PYTHONPATH={shlex.quote(runner_path())}",
            f"cd {shlex.quote(root)} || exit 1",
            # -S: the agent is standard library only, found by PYTHONPATH (as the attempts' wrappers run it)
            f"exec {shlex.quote(sys.executable)} -S -m runner agent status {shlex.quote(root)} <<'EOF' >/dev/null",
            ask,
            "EOF",
            "",
        ]
    )
    argv = ["sbatch", "--parsable", f"--job-name={KEEPER}", "--comment=gates", f"--chdir={root}"]
    argv += ["--export=ALL", "--output=/dev/null", f"--begin=now+{max(1, int(interval))}", "--time=5"]
    slurm(argv, submit_env(slurm_conf), 60, script)

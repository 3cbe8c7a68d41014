"""One attempt of a plan job inside its Slurm allocation: `python3 -m runner.slurm.attempt BUNDLE ATTEMPT ENTRY`.

The sbatch wrapper execs this (an array's element picks its ENTRY by SLURM_ARRAY_TASK_ID); it writes the
job's body from the bundle (runner.slurm.wrapper) and appends its output to the job's own log. It checks an
external gate (REQUIRES, by runner.conditions), runs the body under its own timer (TIMEOUT is this timer
firing, never an exit code), decides success by DONE_IF as the runner does, and ends the allocation: a retry
or a closed gate is a new Slurm job submitted with `--begin=now+WAIT` (the runner's backoff), with this job's
pending dependents re-pointed to it first, so GRES and licences are free meanwhile and nothing downstream is
cancelled. What happened is left as ROOT/results/PLAN/NAME/ID.json for the ledger (runner.slurm.ledger) to
fold in under the push lock.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from runner import pushlock
from runner.backoff import backoff_s
from runner.files import atomic_write, read_json
from runner.logs import TAIL_LINES, tail_lines
from runner.queue import timestamp
from runner.records import replaced
from runner.slurm.bundle import Element, parse_element, read_element
from runner.slurm.jsonfields import RecordError
from runner.slurm.result import AttemptResult
from runner.slurm.wrapper import retry_script, submit_env, write_once

_DEP = r"(\w+):(\d+(?:_\d+|_\*)?)(?:\((\w+)\))?"  # compiled by re (and kept in its cache) at a first repoint only


def repoint(dependency: str, old: int | str, new: int | str, task: str = "") -> str | None:
    """squeue's %E for a pending job with OLD replaced by NEW, in `scontrol update Dependency=` form; None if the
    job does not wait on OLD. OLD may be an array element (ID_N): then element N of an array that waits
    `aftercorr` on that array (TASK is the pending job's own array index) waits on NEW instead. Fulfilled parts
    are left out: they no longer hold anything back."""
    parts: dict[str, list[str]] = {}
    found = False
    array, _, index = str(old).partition("_")
    for kind, ident, status in re.findall(_DEP, dependency):
        if status and status != "unfulfilled":
            continue
        if ident == str(old) or (kind == "aftercorr" and ident == f"{array}_*" and index and task == index):
            found, ident = True, str(new)
            kind = "afterok" if kind == "aftercorr" else kind
        parts.setdefault(kind, [])
        if ident not in parts[kind]:
            parts[kind].append(ident)
    if not found:
        return None
    return ",".join(f"{kind}:{':'.join(ids)}" for kind, ids in parts.items())


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """A Slurm client command in submit_env: not this job's own SLURM_* variables, which sbatch would read as
    defaults (an array's task id among them), nor the lane's env (a retry's wrapper sets it again)."""
    env = submit_env(os.environ.get("SLURM_CONF"))
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120, env=env)


def pending_updates(listing: str, old: int | str, new: int | str) -> list[tuple[str, str]]:
    """(JobId=, Dependency=) updates that move every pending job of LISTING (squeue -r `JobID|JobArrayID|%E`
    lines) off OLD onto NEW. A dependency the tasks of an unsplit array share is updated once, by the array's
    id; one that names this task only (aftercorr) by the task's id, which splits it off its array."""
    updates: dict[str, str] = {}
    for line in listing.splitlines():
        job_id, array_id, dependency = (line.split("|") + ["", ""])[:3]
        task = array_id.partition("_")[2]
        dep = repoint(dependency, old, new, task)
        if dep is None:
            continue
        shared = repoint(dependency, old, new, "")
        updates[job_id if dep == shared else array_id] = dep
    return list(updates.items())


def hand_over(old: int | str, new: int | str) -> list[str]:
    """Point every pending job that waits on OLD at NEW instead; the ids re-pointed."""
    listing = _run(["squeue", "-h", "-r", "-t", "PD", "-O", "JobID:|,JobArrayID:|,Dependency:|"])
    moved: list[str] = []
    for job_id, dep in pending_updates(listing.stdout.replace(" ", ""), old, new):
        if _run(["scontrol", "update", f"JobId={job_id}", f"Dependency={dep}"]).returncode == 0:
            moved.append(job_id)
    return moved


def resubmit(spec: Element, attempt: int, wait_s: float, old: int | str) -> tuple[int | None, list[str], str]:
    """Submit ATTEMPT as a new Slurm job starting WAIT_S from now; move OLD's dependents to it."""
    begin = f"--begin=now+{max(1, int(round(wait_s)))}"
    try:
        return _resubmit(spec, attempt, begin, old)
    except (OSError, subprocess.TimeoutExpired) as exc:  # sbatch that does not end: the controller is away
        return None, [], f"sbatch did not answer: {exc}"


def _resubmit(spec: Element, attempt: int, begin: str, old: int | str) -> tuple[int | None, list[str], str]:
    if spec.bundle is None:  # a job submitted before bundles: its own wrapper file takes the attempt
        proc = _run(["sbatch", "--parsable", *spec.sbatch, begin, str(spec.script), str(attempt)])
    else:
        proc = _run(["sbatch", "--parsable", *spec.sbatch, begin], retry_script(spec, attempt))
    if proc.returncode != 0:
        return None, [], proc.stderr.strip()
    new = int(proc.stdout.strip().split(";")[0])
    try:
        return new, hand_over(old, new), ""
    except (OSError, subprocess.TimeoutExpired):  # submitted; its dependents are requeued by the agent
        return new, [], ""


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


_STOPPED: list[int] = []  # the signals Slurm sent this attempt (scancel, its time limit, preemption)
_BODY: list[subprocess.Popen[bytes]] = []  # the body, once started


def _on_slurm_signal(sig: int, frame: object) -> None:
    """A SIGTERM/SIGINT from Slurm is passed on to the body's process group and remembered: the attempt then
    ends without a result of its own, so the ledger reads Slurm's final state (CANCELLED, TIMEOUT, ...) and a
    job someone cancelled is never taken for a failure, nor retried. (Without this the body, signalled too,
    could end first and its exit be written down as FAILED before this process's own signal came.)"""
    _STOPPED.append(sig)
    for body in _BODY:
        try:
            os.killpg(body.pid, sig)
        except OSError:
            pass


def run_body(spec: Element) -> tuple[int, bool]:
    """(exit code, whether our own timer ended it): TERM to its process group at the timeout, KILL after."""
    if spec.text is not None:  # a job submitted before bundles has its body written by its push
        write_once(Path(spec.body), spec.text.encode())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_slurm_signal)
    proc = subprocess.Popen(["bash", spec.body], cwd=spec.root, stdin=subprocess.DEVNULL, start_new_session=True)
    _BODY.append(proc)
    if _STOPPED:  # came while it started
        os.killpg(proc.pid, _STOPPED[0])
    timeout = spec.timeout_s or None
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        pass
    for sig, grace in ((signal.SIGTERM, float(spec.kill_after_s)), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            return proc.wait(timeout=grace), True
        except subprocess.TimeoutExpired:
            continue
    return proc.wait(), True


# squeue's states of a job Slurm has ended while its batch script may still run. Not STOPPED or SUSPENDED (a
# `scancel -s STOP`, `scontrol suspend`): the job goes on, and a body that fails meanwhile has failed.
_ENDED = frozenset(
    {"COMPLETING", "CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "NODE_FAIL", "REQUEUED", "BOOT_FAIL"}
)


def slurm_ended(job_id: int | str) -> bool:
    """Whether Slurm has ended JOB_ID (scancel, its time limit, preemption) while this wrapper still runs it:
    its state is then one of _ENDED. Slurm signals every process of the job in no set order, so a body
    (its TERM trap, say) may end before this process's own signal arrives: asked after every body, Slurm
    keeps that from reading as the body's failure (or success), and from a retry. False where Slurm cannot be
    asked (the body's exit then stands)."""
    try:
        proc = _run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"])
    except (OSError, subprocess.TimeoutExpired):
        return False
    states = proc.stdout.split()
    return proc.returncode == 0 and bool(states) and states[0] in _ENDED


def holds(condition: str, root: str) -> bool:
    """Whether CONDITION (a gate's REQUIRES, a DONE_IF) holds in ROOT, judged as the runner judges it."""
    from runner.conditions import CONDITION_TIMEOUT_S, compile_condition, evaluate  # a job without one: not loaded

    return evaluate(compile_condition(condition), root, CONDITION_TIMEOUT_S).holds


def attempt_once(spec: Element, attempt: int) -> int:
    root, label = spec.root, f"{spec.plan}/{spec.name}"
    job_id = this_job()
    result = AttemptResult(id=job_id, attempt=attempt, start=time.time())
    gate = spec.gate
    if gate and not holds(gate, root):
        _say(f"=== {timestamp(time.time())} {label}: REQUIRES is false; checked again in {spec.gate_interval_s:g}s")
        result = replaced(result, kind="gated", state="GATED", next_attempt=attempt)
        return _finish(spec, result, attempt, float(spec.gate_interval_s), 0)
    _say(
        f"=== {timestamp(time.time())} {label} attempt {attempt} of {spec.retries} on "
        f"{os.uname().nodename} (Slurm job {job_id})"
    )
    body_at = _log_size(spec.log)
    oom_before = oom_kills()
    rc, timed_out = run_body(spec)
    oom = not timed_out and oom_before is not None and (oom_kills() or 0) > oom_before
    # Asked whatever the exit: Slurm's signal may end the body before it reaches this process, and a body can
    # exit 0 on it (a `wait` for children Slurm killed returns 0): a cancelled job is never taken for done.
    if not _STOPPED and not timed_out and slurm_ended(job_id):
        _STOPPED.append(signal.SIGTERM)
    if _STOPPED:
        _say(f"=== {timestamp(time.time())} {label}: stopped by Slurm (signal {_STOPPED[0]}); its state is Slurm's")
        return 128 + _STOPPED[0]
    done_if = spec.done_if
    ok = rc == 0 and not timed_out and (not done_if or holds(done_if, root))
    if ok:
        kind, state = "done", "COMPLETED"
    elif timed_out:
        kind, state = "timeout", "TIMEOUT"
    else:  # the kernel's OOM killer in this job's memory cgroup: Slurm's state will be OUT_OF_MEMORY
        kind, state = "failed", "OUT_OF_MEMORY" if oom else "FAILED"
    # the body's own last lines, from its start on and before the wrapper says anything (the failure cluster's label)
    tail = tuple(tail_lines(Path(spec.log), TAIL_LINES, body_at))
    result = replaced(result, rc=rc, kind=kind, state=state, tail=tail, cause=None if ok else state)
    if timed_out:
        _say(f"=== TIMEOUT: {spec.name} ended after {spec.timeout_s or 0:g}s; Slurm ends the job as TIMEOUT")
    elif oom:
        _say(f"=== OUT_OF_MEMORY: the kernel killed a process of {spec.name} at the job's memory limit")
    elif not ok and rc == 0:
        _say("=== exited 0 but DONE_IF is false")
    if not ok and attempt < int(spec.retries):
        result = replaced(result, next_attempt=attempt + 1)
        wait_s = backoff_s(attempt, float(spec.backoff_base_s), float(spec.backoff_max_s))
        code = _finish(spec, result, attempt, wait_s, rc or 1)
    else:
        code = _finish(spec, result, attempt, None, 0 if ok else (rc or 1))
    return end_as_timeout(float(result.start or 0), code) if timed_out else code


def _finish(spec: Element, result: AttemptResult, attempt: int, wait_s: float | None, code: int) -> int:
    """Submit the next try (if any) and leave the result file, both under the push lock, so a push sees either
    this job as current or its successor with its dependents already moved."""
    root = spec.root
    end = time.time()
    result = replaced(result, end=end)
    got = pushlock.lock(root, {"wait_s": 120, "by": f"slurm job {result.id}"})
    try:
        if _STOPPED:  # Slurm stopped the job after its body ended: its state, not this result, says how it ended
            return 128 + _STOPPED[0]
        if wait_s is not None:
            new, moved, error = resubmit(spec, int(result.next_attempt or attempt + 1), wait_s, result.id)
            result = replaced(result, next_id=new, wait_s=wait_s, moved=tuple(moved))
            if new is None:  # kept due: the agent submits it at the next push, status or watch contact
                _say(f"could not submit the next try: {error}; it is submitted at the next push, status or watch")
                result = replaced(result, retry_due=end + wait_s)
                code = code or 1
            else:
                _say(f"next try is Slurm job {new}, not before {timestamp(time.time() + wait_s)}")
        directory = Path(root) / "results" / spec.plan / spec.name
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(directory / f"{result.id}.json", json.dumps(result.to_json()).encode())
    finally:
        if got.get("locked"):
            pushlock.release_lock()
    return code


def _log_size(path: str | None) -> int:
    try:
        return os.stat(path).st_size if path else 0
    except OSError:
        return 0


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has ended in this process's memory cgroup (the job's, under
    Slurm's task/cgroup): cgroup v1's memory.oom_control, or v2's memory.events. None where neither is there."""
    try:
        with open("/proc/self/cgroup") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            where = ("/sys/fs/cgroup/memory" + path, "memory.oom_control")
        elif controllers == "":
            where = ("/sys/fs/cgroup" + path, "memory.events")
        else:
            continue
        try:
            with open(os.path.join(*where)) as handle:
                for row in handle.read().splitlines():
                    key, _, value = row.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit():
                        return int(value)
        except OSError:
            continue
    return None


# Slurm looks at its running jobs' time limits every 30 s (slurmctld's PERIODIC_TIMEOUT, not configurable)
TIME_CHECK_S = 30


def end_as_timeout(started: float, code: int) -> int:
    """After the wrapper's own timer ended the body (its result written, its next try submitted): lower this
    job's time limit below its run time (scontrol(1): a job's owner may lower its TimeLimit, only an operator
    may raise it), so that Slurm ends it as TIMEOUT, which sacct and squeue then show. The allocation is held
    until Slurm's next look at time limits (TIME_CHECK_S at most); CODE is returned if Slurm does not end it by
    then. An update Slurm refuses (a site's job_submit plugin, an element of a split array, a controller that
    does not answer) is said in the attempt's log and CODE returned at once: the job ends as FAILED, not TIMEOUT,
    and nothing else changes (the result says timeout, the next try is already submitted)."""
    job = str(this_job())  # an array's element as ARRAY_N: the array's own id would update all its elements
    if job == "0":
        return code
    minutes = int((time.time() - started) // 60)
    try:
        done = _run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"])
        why = "" if done.returncode == 0 else done.stderr.strip() or f"scontrol exited {done.returncode}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why:
        _say(f"=== could not lower this job's time limit ({why}): Slurm will say it ended {code}")
        return code
    deadline = time.time() + TIME_CHECK_S + 15
    while not _STOPPED and time.time() < deadline:
        time.sleep(0.2)
    return 128 + _STOPPED[0] if _STOPPED else code


def this_job() -> int | str:
    """This Slurm job as the ledger names it: ARRAY_N for an array's element, else its job id."""
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if task:
        return f"{os.environ.get('SLURM_ARRAY_JOB_ID', '0')}_{task}"
    return int(os.environ.get("SLURM_JOB_ID", "0"))


def to_log(path: str) -> None:
    """Stdout and stderr appended to the job's own log (an array element's Slurm --output is the array's)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python3 -m runner.slurm.attempt BUNDLE ATTEMPT ENTRY\n")
        return 2
    attempt = int(argv[1]) if len(argv) > 1 else 1
    if len(argv) > 2:
        spec = read_element(argv[0], int(argv[2]))
    else:  # SPEC [ATTEMPT]: a job submitted before bundles, still queued after an upgrade
        spec = parse_element(read_json(Path(argv[0])), argv[0])
    if isinstance(spec, RecordError):  # said in Slurm's output for the job: nothing ran
        sys.stderr.write(f"runner.slurm.attempt: {spec}\n")
        return 2
    if spec.bundle is not None:
        to_log(spec.log)
    return attempt_once(spec, attempt)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

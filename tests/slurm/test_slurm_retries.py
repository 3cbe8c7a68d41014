"""Retries outside the allocation, on a real cluster: each attempt a Slurm job of its own, started after the
runner's backoff, its dependents moved along, GRES free in between, a `retry` event per attempt."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.slurm.attempt import slurm_ended
from tests.conftest import REPO, plan_cli, wait_for
from tests.slurm.cluster import Slurm, start_slurm, stop_slurm
from tests.slurm.jobs import (
    attempts,
    cancel_root,
    ended,
    job_processes,
    second_try_writes,
    settle,
    time_limit,
    write_plan,
)

pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli


def test_retries_are_new_jobs_after_the_backoff_and_free_the_gpu_meanwhile(tmp_path: Path, slurm: Slurm) -> None:
    root, count, spans = tmp_path / "submit", tmp_path / "count", tmp_path / "spans"
    flaky = (
        f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}; "
        f'echo \\"g1 $n $(date +%s.%N)\\" >> {spans}; '
        f'if [ $n -lt 3 ]; then echo \\"flaky failure $n\\"; exit 5; fi; touch {tmp_path}/flaky.out'
    )
    jobs = (
        f'  - name: flaky\n    lane: gpu\n    retries: 3\n    timeout: 10s\n    run: "{flaky}"\n'
        f"    outputs: ['{tmp_path}/flaky.out']\n"
        f"  - name: after\n    lane: cpu\n    run: touch {tmp_path}/after.out\n    requires: [{{after: flaky}}]\n"
        f"    outputs: ['{tmp_path}/after.out']\n"
        f'  - name: g2\n    lane: gpu\n    run: "echo \\"g2 0 $(date +%s.%N)\\" >> {spans}"\n'
        "  - name: plain\n    lane: cpu\n    run: 'true'\n"
    )
    p = write_plan(tmp_path / "rt.yaml", "rt", jobs)
    hosts = slurm.hosts_file(root, extra="    backoff_base: 2\n    lanes:\n      cpu: {time: '7'}\n")
    code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
    assert code == 0, out
    watch = ["watch", "cluster", "--hosts", str(hosts), "--once", "--state", str(tmp_path / "w.json"), "--idle", "3600"]
    plan(*watch)  # the watcher's first probe: it alerts on what comes after
    try:
        first = attempts(root, "rt", "flaky")[0]["id"]
        assert time_limit(slurm, first) == "00:01:00"  # one attempt: 10 s + kill grace + margin, rounded up
        assert time_limit(slurm, attempts(root, "rt", "plain")[0]["id"]) == "00:07:00"  # the lane's default
        wait_for(lambda: ended(root, "rt", "after") == "COMPLETED", 120, 0.2)
    finally:
        cancel_root(slurm, root)
    code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")  # folds the attempts into the ledger
    tries = attempts(root, "rt", "flaky")
    assert [t["attempt"] for t in tries] == [1, 2, 3] and len({t["id"] for t in tries}) == 3
    assert [t["state"] for t in tries] == ["FAILED", "FAILED", "COMPLETED"]
    # the runner's backoff: 2 s, then 4 s, between one attempt's end and the next one's start (whole seconds)
    assert tries[1]["start"] - tries[0]["end"] >= 2 - 1 and tries[2]["start"] - tries[1]["end"] >= 4 - 1
    runs = sorted((float(t), job, int(n)) for job, n, t in (ln.split() for ln in spans.read_text().splitlines()))
    g2 = next(t for t, job, _ in runs if job == "g2")
    second = next(t for t, job, n in runs if job == "g1" and n == 2)
    assert g2 < second, "the gpu job waited for flaky's backoff: the allocation was held"
    events = [e for e in json.loads(out)["events"] if e["job"] == "rt/flaky.job"]
    retries = [e for e in events if e["event"] == "retry"]
    assert [e["next_attempt"] for e in retries] == [2, 3] and [e["backoff_s"] for e in retries] == [2, 4]
    assert retries[0]["tail"] == ["flaky failure 1"] and retries[1]["tail"][-1] == "flaky failure 2"
    assert [e["event"] for e in events if e["event"] in ("done", "failed")] == ["done"]
    code, out = plan(*watch)  # watch's default `retry` alert fires on Slurm too
    assert code == 10 and "EVENT" in out and "retry" in out and "rt/flaky.job" in out, out


def test_exit_124_is_a_failure_and_only_the_wrappers_timer_is_a_timeout(tmp_path: Path, slurm: Slurm) -> None:
    root = tmp_path / "submit"
    jobs = "  - name: rc124\n    run: exit 124\n    timeout: 30s\n  - name: slow\n    run: sleep 60\n    timeout: 1s\n"
    p = write_plan(tmp_path / "tt.yaml", "tt", jobs)
    hosts = slurm.hosts_file(root)
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        wait_for(lambda: ended(root, "tt", "rc124") and ended(root, "tt", "slow"), 60, 0.2)
    finally:
        settle(slurm, root)
    assert ended(root, "tt", "rc124") == "FAILED" and ended(root, "tt", "slow") == "TIMEOUT"
    assert "TIMEOUT" not in (root / "logs/tt/rc124.job.log").read_text()
    code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
    kinds = {(e["job"], e["event"]) for e in json.loads(out)["events"]}
    assert ("tt/rc124.job", "failed") in kinds and ("tt/slow.job", "timeout") in kinds


def test_a_closed_external_gate_costs_no_slurm_job_and_the_submit_host_releases_it(
    tmp_path: Path, slurm: Slurm
) -> None:
    """The gated job is submitted held; the submit host checks its gate at each contact and, between them, one
    keeper job per root every gate_interval: while the gate is closed no job of the plan runs, and the job
    keeps its one Slurm id; opened, the keeper releases it without any `plan` command."""
    root, gate, done = tmp_path / "submit", tmp_path / "gate", tmp_path / "gated.out"
    jobs = (
        f"  - name: gated\n    run: touch {done}\n    outputs: ['{done}']\n"
        f"    requires: [{{sh: 'test -e {gate}', external: true}}]\n"
        f"  - name: next\n    run: touch {tmp_path}/next.out\n    requires: [{{after: gated}}]\n"
        f"    outputs: ['{tmp_path}/next.out']\n"
    )
    p = write_plan(tmp_path / "gt.yaml", "gt", jobs)
    hosts = slurm.hosts_file(root, extra="    gate_interval: 2\n")
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    gated = str(attempts(root, "gt", "gated")[0]["id"])

    def keepers() -> list[str]:
        return [j["id"] for j in slurm.squeue() if j["name"] == ".plan-gates"]

    try:
        wait_for(lambda: len(keepers()) >= 3, 60, 0.3)  # the keeper has looked twice at least, every 2 s
        code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
        item = next(q for q in json.loads(out)["status"]["queued"] if q["job"] == "gt/gated.job")
        assert item["reason"] == "requires" and "held (no Slurm job runs for it)" in item["detail"], item
        mine = {j["id"]: j["state"] for j in slurm.squeue() if j["name"].startswith("gt/")}
        assert mine == {gated: "PENDING", str(attempts(root, "gt", "next")[0]["id"]): "PENDING"}, mine
        assert not done.exists() and not (root / "results").exists()  # nothing of the plan ran
        gate.touch()  # no plan command from here on: the keeper releases it
        opened = gate.stat().st_mtime
        wait_for(lambda: ended(root, "gt", "next") == "COMPLETED", 60, 0.2)
    finally:
        cancel_root(slurm, root)
    assert done.stat().st_mtime >= opened
    tries = attempts(root, "gt", "gated")
    assert [str(t["id"]) for t in tries] == [gated] and ended(root, "gt", "gated") == "COMPLETED", tries


def test_the_wrapper_asks_slurm_whether_it_ended_the_job(
    tmp_path: Path, slurm: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm signals a job's processes in no set order, so a body's TERM trap can end it before the wrapper's
    own TERM arrives; the wrapper then asks Slurm (runner.slurm.attempt.slurm_ended) instead of writing the
    body's exit down as a failure. That answer, against the real controller: a running job is not ended; once
    scancelled it is, while its process (ignoring TERM) still runs."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    alive, pid = tmp_path / "alive", tmp_path / "pid"
    script = f"#!/bin/bash\ntrap '' TERM\necho $$ >{pid}\nwhile :; do touch {alive}; sleep 0.2; done\n"
    sub = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={tmp_path}", "--output=/dev/null"],
        input=script,
        env=slurm.env,
        capture_output=True,
        text=True,
        check=True,
    )
    job = int(sub.stdout.strip())
    try:
        wait_for(alive.exists, 60, 0.1)
        assert not slurm_ended(job)
        subprocess.run(["scancel", str(job)], env=slurm.env, check=True)
        wait_for(lambda: slurm_ended(job), 10, 0.1)
        alive.unlink()
        wait_for(alive.exists, 5, 0.1)  # still running: Slurm said so before this job's process ended
        assert not slurm_ended(999999)  # a job Slurm does not know: the body's exit stands
    finally:  # its script ignores TERM: Slurm would KILL it only after KillWait (30 s), so it is ended here
        subprocess.run(["scancel", str(job)], env=slurm.env, capture_output=True)
        if pid.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid.read_text()), signal.SIGKILL)


def test_a_job_cancelled_while_it_runs_is_cancelled_not_failed_and_never_retried(tmp_path: Path, slurm: Slurm) -> None:
    """scancel signals the wrapper and the body alike; a body that ends at once on TERM (exit 3) must not be
    written down as a failure, nor retried: the attempt leaves no result and Slurm's CANCELLED is the outcome.
    (Which process Slurm signals first is Slurm's: this holds the outcome; the test above holds the question
    the wrapper asks when its body ends first.)"""
    root, running = tmp_path / "submit", tmp_path / "running"
    body = f"trap 'exit 3' TERM; touch {running}; sleep 60 & wait"
    p = write_plan(tmp_path / "cx.yaml", "cx", f'  - name: c\n    retries: 3\n    run: "{body}"\n')
    hosts = slurm.hosts_file(root, extra="    backoff_base: 1\n")
    code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
    assert code == 0, out
    try:
        wait_for(running.exists, 60, 0.1)
        first = attempts(root, "cx", "c")[0]["id"]
        name = next(j["name"] for j in slurm.squeue() if j["id"] == str(first))  # a retry would have its name
        subprocess.run(["scancel", str(first)], env=slurm.env, check=True)
        wait_for(lambda: {j["id"]: j["state"] for j in slurm.squeue()}.get(str(first)) == "CANCELLED", 30, 0.2)
        # A retry is submitted (held for its backoff) by the attempt's wrapper as it ends, or by the next contact
        # for a try it could not submit: once the script's processes are gone and `plan status` has been, any
        # retry would be in squeue.
        wait_for(lambda: not job_processes(first), 30, 0.1)
        code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
        assert code == 0, out
        mine = [j["id"] for j in slurm.squeue() if j["name"] == name]
        assert mine == [str(first)], mine
        tries = attempts(root, "cx", "c")
        assert [t["id"] for t in tries] == [first] and tries[0]["state"] == "CANCELLED", tries
        assert not (root / "results" / "cx" / "c" / f"{first}.json").exists()  # no result: Slurm's state stands
    finally:
        cancel_root(slurm, root)


# The tests of the shaky cluster run on one worker (`--dist loadgroup`): one cluster started, not one on each
# worker that one of them lands on.
SHAKY = pytest.mark.xdist_group("shaky")


@pytest.fixture(scope="module")
def shaky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """A cluster of this module's own, whose controller and node the tests stop and fail: clients give up on a
    silent controller after 1 s, and a job on a failed node ends NODE_FAIL (JobRequeue=0) instead of being
    requeued by Slurm itself."""
    cluster = start_slurm(tmp_path_factory.mktemp("shaky"), message_timeout=1, settings={"JobRequeue": 0})
    yield cluster
    stop_slurm(cluster)


def _flaky(tmp_path: Path, name: str, first: str) -> str:
    """A job whose first attempt runs FIRST and whose second writes NAME.out; and `next`, after it."""
    return second_try_writes(tmp_path, name, first) + (
        f"  - name: next\n    run: touch {tmp_path}/next.out\n    requires: [{{after: {name}}}]\n"
        f"    outputs: ['{tmp_path}/next.out']\n"
    )


def _retried(root: Path, hosts: Path, plan_name: str, job: str) -> list[dict]:
    """Probe with `plan status` (the contact that submits what is due) until `next` is done; the job's events."""

    def done() -> list[dict] | None:
        code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
        assert code == 0, out
        return json.loads(out)["events"] if ended(root, plan_name, "next") == "COMPLETED" else None

    events = wait_for(done, 120, 0.5)
    return [e for e in events if e["job"] == f"{plan_name}/{job}.job"]


@SHAKY
def test_a_next_try_the_controller_kept_from_the_wrapper_is_submitted_at_the_next_contact(
    tmp_path: Path, shaky: Slurm
) -> None:
    root, started, go = tmp_path / "submit", tmp_path / "started", tmp_path / "go"
    first = f"touch {started}; until [ -e {go} ]; do sleep 0.05; done; exit 5"
    p = write_plan(tmp_path / "cd.yaml", "cd", _flaky(tmp_path, "flaky", first))
    hosts = shaky.hosts_file(root, extra="    backoff_base: 1\n")
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    log = root / "logs" / "cd" / "flaky.job.log"
    try:
        wait_for(started.exists, 60, 0.1)
        os.kill(shaky.pids["slurmctld"], signal.SIGSTOP)
        try:  # the body fails while the controller does not answer: its wrapper cannot submit the next try
            go.touch()
            wait_for(lambda: log.exists() and "could not submit the next try" in log.read_text(), 120, 0.2)
        finally:
            os.kill(shaky.pids["slurmctld"], signal.SIGCONT)
        events = _retried(root, hosts, "cd", "flaky")
    finally:
        cancel_root(shaky, root)
    assert "it is submitted at the next push, status or watch" in log.read_text()
    tries = attempts(root, "cd", "flaky")
    assert [t["attempt"] for t in tries] == [1, 2] and tries[-1]["state"] == "COMPLETED", tries
    retry = next(e for e in events if e["event"] == "retry")
    assert retry["next_attempt"] == 2 and retry["cause"] == "FAILED", (
        retry,
        tries,
        (root / "events.jsonl").read_text(),
    )
    assert (tmp_path / "next.out").exists()


@SHAKY
def test_a_silent_controller_is_unreachable_exit_3_through_the_typed_answer(tmp_path: Path, shaky: Slurm) -> None:
    """squeue times out (this cluster's clients wait 1 s): the agent raises ControllerDown, its dispatch answers
    {"controller_down": ...}, the workstation raises its own ControllerDown, and `plan` says unreachable, 3."""
    hosts = shaky.hosts_file(tmp_path / "submit")
    (tmp_path / "submit").mkdir()
    os.kill(shaky.pids["slurmctld"], signal.SIGSTOP)
    try:
        code, out = plan("status", "cluster", "--hosts", str(hosts))
    finally:
        os.kill(shaky.pids["slurmctld"], signal.SIGCONT)
    assert code == 3 and "plan: unreachable: " in out and "the Slurm controller did not answer: " in out, out


@SHAKY
def test_an_attempt_slurm_ends_on_a_node_failure_is_retried_with_its_dependents(tmp_path: Path, shaky: Slurm) -> None:
    root, started = tmp_path / "submit", tmp_path / "started"
    p = write_plan(tmp_path / "nf.yaml", "nf", _flaky(tmp_path, "long", f"touch {started}; sleep 120"))
    hosts = shaky.hosts_file(root, extra="    backoff_base: 1\n")
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        wait_for(started.exists, 60, 0.1)
        first = str(attempts(root, "nf", "long")[0]["id"])
        node = ["scontrol", "update", "NodeName=localhost"]
        subprocess.run([*node, "State=DOWN", "Reason=plantest"], env=shaky.env, check=True)
        wait_for(lambda: {j["id"]: j["state"] for j in shaky.squeue()}.get(first) == "NODE_FAIL", 30, 0.2)
        subprocess.run([*node, "State=RESUME"], env=shaky.env, capture_output=True)  # idle again already, mostly
        wait_for(
            lambda: (
                subprocess.run(
                    ["sinfo", "-h", "-o", "%T"], env=shaky.env, capture_output=True, text=True
                ).stdout.strip()
                == "idle"
            ),
            30,
            0.2,
        )
        events = _retried(root, hosts, "nf", "long")
    finally:
        cancel_root(shaky, root)
    tries = attempts(root, "nf", "long")
    assert [t["state"] for t in tries] == ["NODE_FAIL", "COMPLETED"], tries
    retry = next(e for e in events if e["event"] == "retry")
    assert retry["cause"] == "NODE_FAIL" and retry["next_attempt"] == 2, retry
    assert (tmp_path / "next.out").exists()  # Slurm cancelled it with the node's failure; submitted again


def test_a_job_waiting_on_a_drained_node_reads_drained(tmp_path: Path, slurm: Slurm) -> None:
    """On the shared cluster, whose clients wait for the controller as long as a user's would: on the shaky one
    (1 s) a loaded machine's controller answered too late for `plan status` to read anything. Its node is
    resumed before any other test of this worker runs."""
    root = tmp_path / "submit"
    p = write_plan(tmp_path / "dr.yaml", "dr", "  - name: waits\n    run: 'true'\n")
    hosts = slurm.hosts_file(root)
    node = ["scontrol", "update", "NodeName=localhost"]
    subprocess.run([*node, "State=DRAIN", "Reason=plantest"], env=slurm.env, check=True)
    try:
        assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0

        seen: list[object] = []

        def waiting() -> dict | None:
            code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
            assert code == 0, out
            queued = json.loads(out)["status"]["queued"]
            seen[:] = [queued, slurm.squeue()]
            return next((q for q in queued if q["reason"] != "order"), None) if queued else None

        try:
            item = wait_for(waiting, 30, 0.3)
        except AssertionError:
            raise AssertionError(f"no reason but order; last seen {seen}") from None
        # Slurm says it in one of two ways, as its scheduler last looked (the second once failed this test)
        said = ("ReqNodeNotAvail", "Nodes required for job are DOWN, DRAINED")
        assert item["reason"] == "drained" and item["detail"].startswith(said), item
    finally:
        subprocess.run([*node, "State=RESUME"], env=slurm.env, capture_output=True)
        cancel_root(slurm, root)


def test_a_gate_checks_events_are_valid_events_once_slurm_has_forgotten_the_check(tmp_path: Path) -> None:
    """A closed gate's check is a Slurm job that ends with no state of its own once squeue forgets it: its
    requires-wait event carried `"state": null`, which every reader skipped as malformed."""
    from runner.readers import event_problem
    from runner.slurm.events import attempt_events
    from runner.slurm.records import Ledger, parse_ledger

    gated = {"id": 7, "attempt": 1, "kind": "gated", "result": True, "start": 1.0, "end": 2.0, "state": None}
    raw = {"plans": {"gt": {"jobs": {"g": {"lane": "cpu", "deps": [], "attempts": [gated, {"id": 9}]}}}}}
    ledger = parse_ledger({"version": 2, **raw})
    assert isinstance(ledger, Ledger), ledger
    found = attempt_events(str(tmp_path), ledger, {})
    events = [{"ts": "2026-12-03 10:00:00", "job": key, "event": kind.value, **d} for _, key, kind, d, _ in found]
    assert [e["event"] for e in events] == ["requires-wait"]
    assert [event_problem(e) for e in events] == [None], events


def test_a_job_slurm_requeued_reads_slurms_reason_not_a_negative_backoff(tmp_path: Path, slurm: Slurm) -> None:
    """On the shared cluster: Slurm's default JobRequeue=1 lets `scontrol requeue` put a running job back."""
    root, started = tmp_path / "submit", tmp_path / "started"
    p = write_plan(tmp_path / "rq.yaml", "rq", f"  - name: again\n    run: touch {started}; sleep 120\n")
    hosts = slurm.hosts_file(root)
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        wait_for(started.exists, 60, 0.1)
        job = str(attempts(root, "rq", "again")[0]["id"])
        subprocess.run(["scontrol", "requeue", job], env=slurm.env, check=True)

        def requeued() -> dict | None:
            code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
            answer = json.loads(out)
            return next((q for q in answer["status"]["queued"] if "requeued" in q["detail"]), None)

        item = wait_for(requeued, 30, 0.3)
        assert item["detail"].startswith("requeued by Slurm (1 times), BeginTime; eligible again at "), item
        # Waiting since it was queued again, not for minus 117 s (its BeginTime). Slurm's clock reads whole
        # seconds and its requeue may stamp the new submit time a second on: since is at most the next second.
        assert item["since"] <= math.ceil(time.time()), item
    finally:
        cancel_root(slurm, root)


def test_a_time_limit_slurm_refuses_to_lower_is_said_and_the_attempt_ends_with_its_code_at_once(slurm: Slurm) -> None:
    """A plan timeout lowers the job's own TimeLimit so that sacct says TIMEOUT; where the controller refuses
    that update (here, for real: a job id that is not this job's, which Slurm does not know), the attempt's log
    says so and the wrapper ends with its own code at once, not after Slurm's 30 s time-limit pass."""
    probe = (
        "import time\n"
        "from runner.slurm.attempt import TIME_CHECK_S, end_as_timeout\n"
        "began = time.time()\n"
        "code = end_as_timeout(began - 125, 7)\n"
        "print('code', code, 'waited', time.time() - began < TIME_CHECK_S)\n"
    )
    env = {**slurm.env, "SLURM_JOB_ID": "4000000000", "PYTHONPATH": str(REPO)}
    env.pop("SLURM_ARRAY_TASK_ID", None)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said, _, last = done.stdout.strip().rpartition("\n")
    assert last == "code 7 waited True", done.stdout
    assert said.startswith("=== could not lower this job's time limit (") and "Invalid job id" in said, said
    assert said.endswith("): Slurm will say it ended 7"), said

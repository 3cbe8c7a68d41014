"""One job at a time, as pueue and task-spooler users work: add, hold and release, move, park a lane, account,
list the history; and a YAML foreach over a range."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.queue import Queue
from runner.runstate import RunnerState
from tests.conftest import RunnerProcess, wait_for, write_job
from tests.inprocess import Ran, plan_main
from tests.ticking import Ticking

pytestmark = pytest.mark.usefixtures("plan_env")
NOW = 1_000_000.0


def plan(tmp_path: Path, *args: str) -> Ran:
    return plan_main(*args, cwd=tmp_path, cache=tmp_path / "cache")


def _queued(runner: RunnerProcess, job: str) -> dict | None:
    return next((q for q in runner.status()["queued"] if q["job"] == job), None)


# -- plan add ---------------------------------------------------------------------------------------------------


def test_add_runs_a_command_in_its_lane_quoted_exactly_and_a_push_never_prunes_it(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    runner.start()
    words = ["printf", "<%s>", "a b", "$HOME", "it's", "*", "", "-n", "`id`;$(id)", '"q"\\']
    added = plan(tmp_path, "add", str(queue_root), "--lane", "net", "--", *words)
    assert added.returncode == 0, added.stderr
    name = added.stdout.strip()
    assert name.startswith("add-") and name.endswith("-printf"), name
    start = runner.wait_event("start", job=f"{name}.job")
    assert start["lane"] == "net"
    runner.wait_event("done", job=f"{name}.job")
    log = (queue_root / "logs" / f"{name}.job.log").read_text()
    assert '<a b><$HOME><it\'s><*><><-n><`id`;$(id)><"q"\\>' in log
    manifest = json.loads((queue_root / "manifest.json").read_text())
    assert f"{name}.job" in manifest["plans"]["adhoc"]["jobs"]

    # --json for scripts; a name of one's own; a job that waits (its file is not there): a plan's push leaves it
    gate = tmp_path / "gate"
    waits = plan(tmp_path, "add", str(queue_root), "--json", "--name", "w1", "--requires", str(gate), "--", "true")
    assert waits.returncode == 0, waits.stderr
    assert json.loads(waits.stdout) == {"job": "w1.job", "host": str(queue_root), "lane": "cpu"}
    again = plan(tmp_path, "add", str(queue_root), "--name", "w1", "--", "true")
    assert again.returncode == 1 and "already on this host" in again.stderr
    plan_file = tmp_path / "p.yaml"
    plan_file.write_text("plan: other\njobs:\n  - name: o1\n    run: 'true'\n")
    pushed = plan(tmp_path, "push", str(queue_root), str(plan_file))
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert (queue_root / "queue/w1.job").exists()
    assert "w1.job" in json.loads((queue_root / "manifest.json").read_text())["plans"]["adhoc"]["jobs"]
    gate.touch()
    runner.wait_event("done", job="w1.job")


def test_add_is_refused_on_a_shellcheck_error_and_installs_nothing(tmp_path: Path, queue_root: Path) -> None:
    refused = plan(tmp_path, "add", str(queue_root), "--shell", 'echo "$never_set_anywhere"')
    assert refused.returncode == 1
    assert "plan add:" in refused.stdout and "SC2154" in refused.stdout, refused.stdout
    assert not os.listdir(queue_root / "queue") and not (queue_root / "manifest.json").exists()
    usage = plan(tmp_path, "add", str(queue_root), "--retries", "0", "--", "true")  # attempts, as a plan's retries
    assert usage.returncode == 1 and usage.stdout.startswith(
        "plan add:1:1: error[P004]: --retries: counts attempts in all, the first one included: at least 1 "
        "(1: no retry), got 0\n"
    )
    assert "attempts in all, the first one included (1: no retry)" in plan(tmp_path, "add", "--help").stdout
    none = plan(tmp_path, "add", str(queue_root))
    assert none.returncode == 2 and "no command" in none.stderr
    assert not os.listdir(queue_root / "queue")


def test_add_after_a_job_waits_for_it_and_is_blocked_when_it_failed(tmp_path: Path, queue_root: Path) -> None:
    write_job(queue_root, "1-first.job", "# LANE=cpu\nexit 3\n", state="failed")
    added = plan(tmp_path, "add", str(queue_root), "--after", "1-first", "--name", "2-then", "--", "true")
    assert added.returncode == 0, added.stderr
    text = (queue_root / "queue/2-then.job").read_text()
    assert "# REQUIRES=test -f done/1-first.job" in text and "# PLAN=adhoc@" in text
    nowhere = plan(tmp_path, "add", str(queue_root), "--after", "nosuch", "--", "true")
    assert nowhere.returncode == 1 and "no job nosuch.job" in nowhere.stderr
    t = Ticking(queue_root).start(NOW)
    try:
        t.tick(NOW + 1)
        reason = t.reason("2-then.job")
        assert reason is not None and reason["reason"] == "blocked" and "1-first.job" in reason["detail"]
    finally:
        t.close()


# -- hold, release, move, park a lane ----------------------------------------------------------------------------


def test_hold_keeps_a_job_from_starting_until_release_while_its_lane_runs_others(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    runner.start()
    assert plan(tmp_path, "park", str(queue_root)).returncode == 0
    runner.wait_event("parked")
    write_job(queue_root, "1-a.job", "# LANE=cpu\ntrue\n")
    write_job(queue_root, "2-b.job", "# LANE=cpu\ntrue\n")
    held = plan(tmp_path, "hold", str(queue_root), "1-a")
    assert held.returncode == 0, held.stderr
    assert plan(tmp_path, "unpark", str(queue_root)).returncode == 0
    runner.wait_event("done", job="2-b.job")
    reason = wait_for(lambda: _queued(runner, "1-a.job"))
    assert reason["reason"] == "held" and "held by" in reason["detail"]  # type: ignore[index]
    assert not runner.events("start") or all(e["job"] != "1-a.job" for e in runner.events("start"))
    status = plan(tmp_path, "status", str(queue_root))
    assert "1-a.job" in status.stdout and "held" in status.stdout
    watch = plan(tmp_path, "watch", str(queue_root), "--once", "--state", str(tmp_path / "w.json"), "--waiting", "0")
    assert watch.returncode == 0, watch.stdout  # a held job is never alerted as waiting
    runner.stop()  # held survives the runner's restart: it is state.json's
    runner.start()
    assert wait_for(lambda: _queued(runner, "1-a.job"))["reason"] == "held"  # type: ignore[index]
    assert plan(tmp_path, "release", str(queue_root), "1-a").returncode == 0
    runner.wait_event("done", job="1-a.job")
    running = plan(tmp_path, "hold", str(queue_root), "1-a")
    assert running.returncode == 1 and "not queued" in running.stderr


def test_hold_with_no_runner_says_so_at_once_and_the_next_runner_carries_it_out(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    """Asked before any runner serves the root (pushed, not yet started): said at once, not after the whole wait
    as 'no runner took it ... is the runner running?', and the request stays for the runner that starts next."""
    write_job(queue_root, "1-a.job", "# LANE=cpu\ntrue\n")
    held = plan(tmp_path, "hold", str(queue_root), "1-a", "--wait", "20")  # said before the wait ends
    assert held.returncode == 1, held.stderr
    assert "no runner serves" in held.stderr and "(hold 1-a.job) is queued there and is carried out" in held.stderr
    assert "within" not in held.stderr
    runner.start()
    assert wait_for(lambda: _queued(runner, "1-a.job"))["reason"] == "held"  # type: ignore[index]
    assert not runner.events("start")


def test_move_first_starts_a_job_before_lower_named_ones_without_renaming_it(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    runner.start()
    assert plan(tmp_path, "park", str(queue_root)).returncode == 0
    runner.wait_event("parked")
    for name in ("1-a", "2-b", "3-c"):
        write_job(queue_root, f"{name}.job", "# LANE=cpu\ntrue\n")
    moved = plan(tmp_path, "move", str(queue_root), "3-c", "--first")
    assert moved.returncode == 0, moved.stderr
    assert plan(tmp_path, "unpark", str(queue_root)).returncode == 0
    runner.wait_event("done", job="2-b.job")
    runner.wait_event("done", job="1-a.job")
    runner.wait_event("done", job="3-c.job")
    assert [e["job"] for e in runner.events("start")] == ["3-c.job", "1-a.job", "2-b.job"]
    assert sorted(os.listdir(queue_root / "done")) == ["1-a.job", "2-b.job", "3-c.job"]


def test_priority_header_last_before_and_a_parked_lane(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "1-a.job", "# LANE=cpu\ntrue\n")
    write_job(queue_root, "2-b.job", "# LANE=cpu\n# PRIORITY=5\ntrue\n")
    write_job(queue_root, "3-c.job", "# LANE=cpu\ntrue\n")
    write_job(queue_root, "4-gpu.job", "# LANE=gpu\ntrue\n")
    t = ticking()
    (queue_root / "parked.json").write_text('{"reason": "wait"}')
    t.tick(NOW + 1)
    queue = Queue(queue_root)
    control = queue_root / "control"
    control.mkdir(exist_ok=True)
    (control / "move-3-c.job").write_text(json.dumps({"by": "me", "to": "before", "other": "1-a.job"}))
    (control / "move-2-b.job").write_text(json.dumps({"by": "me", "to": "last"}))
    (queue_root / "parked-lanes.json").write_text(json.dumps({"gpu": {"reason": "driver swap", "by": "me"}}))
    os.unlink(queue_root / "parked.json")
    t.tick(NOW + 2)
    assert t.procs.running() == ["3-c.job"]
    assert t.reason("4-gpu.job")["reason"] == "parked"  # type: ignore[index]
    assert "driver swap" in t.reason("4-gpu.job")["detail"]  # type: ignore[index]
    state, _ = RunnerState.load(queue)
    assert state.priority == {"3-c.job": 1, "2-b.job": -1}  # c sorts after a: one more than a
    for expected in ("1-a.job", "2-b.job"):
        t.procs.exit("3-c.job" if expected == "1-a.job" else "1-a.job")
        t.tick(NOW + 3)
        assert t.procs.running() == [expected]
    bad = control / "move-1-a.job"
    bad.write_text(json.dumps({"by": "me", "to": "sideways"}))
    t.tick(NOW + 4)
    assert not bad.exists()
    corrupt = t.events("state-corrupt")
    assert corrupt and corrupt[-1]["file"] == "control/move-1-a.job"


def test_a_move_or_hold_of_a_job_not_queued_changes_nothing(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    t = ticking()
    (queue_root / "control").mkdir(exist_ok=True)
    (queue_root / "control" / "hold-nosuch.job").write_text('{"by": "me"}')
    t.tick(NOW + 1)
    state, _ = RunnerState.load(Queue(queue_root))
    assert state.held == {} and not (queue_root / "control" / "hold-nosuch.job").exists()


# -- accounting and history --------------------------------------------------------------------------------------

ALLOCATE = "b = bytearray(100 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
BUSY_S = 0.5  # seconds of CPU the busy job spends: more than its start, or than the other cpu job spends
BUSY = f"import time\nwhile time.process_time() < {BUSY_S}: pass\n"
# Two processes of 60 MB side by side for a few ticks: only the sample of the whole tree sees 120 MB at once.
TWO = "import time\nb = bytearray(60 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(1.5)\n"


def test_end_events_carry_cpu_and_peak_memory_and_history_lists_them(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    write_job(queue_root, "1-mem.job", f"# LANE=cpu\n{sys.executable} -c '{ALLOCATE}'\n")
    write_job(queue_root, "2-busy.job", f"# LANE=cpu\n{sys.executable} -c '{BUSY}'\n")
    write_job(queue_root, "3-fails.job", "# LANE=net\nexit 4\n")
    write_job(queue_root, "4-two.job", f"# LANE=gpu\n{sys.executable} -c '{TWO}' & {sys.executable} -c '{TWO}'; wait\n")
    runner.start()
    mem = runner.wait_event("done", job="1-mem.job")
    busy = runner.wait_event("done", job="2-busy.job", timeout=30)
    failed = runner.wait_event("failed", job="3-fails.job")
    assert mem["peak_rss_mb"] >= 100, mem
    two = runner.wait_event("done", job="4-two.job", timeout=30)
    assert 115 <= two["peak_rss_mb"] < 200, two  # the tree's sum, sampled while both lived
    assert BUSY_S <= busy["cpu_s"] <= busy["duration_s"] + 0.1, busy
    assert busy["peak_rss_mb"] < 100 and failed["cpu_s"] is not None and failed["lane"] == "net"
    shown = plan(tmp_path, "status", str(queue_root), "--history", "-n", "5")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert sorted(ln.split()[-1] for ln in lines[1:]) == ["1-mem.job", "2-busy.job", "3-fails.job", "4-two.job"]
    mem_line = next(ln for ln in lines if ln.endswith("1-mem.job"))
    assert " done " in mem_line and " MB" in mem_line and "#1" in mem_line
    only = plan(tmp_path, "status", str(queue_root), "--history", "--outcome", "failed", "--json")
    rows = json.loads(only.stdout)
    assert [r["job"] for r in rows] == ["3-fails.job"] and rows[0]["outcome"] == "failed"
    lane = plan(tmp_path, "status", str(queue_root), "--history", "-n", "1", "--lane", "cpu", "--json")
    assert [r["job"] for r in json.loads(lane.stdout)] == ["2-busy.job"]
    typo = plan(tmp_path, "status", str(queue_root), "--history", "--outcome", "faild")
    assert typo.returncode == 2 and "did you mean 'failed'" in typo.stderr
    report = plan(tmp_path, "report", str(queue_root), "--json")
    jobs = json.loads(report.stdout)["jobs"]
    assert jobs["1-mem.job"]["peak_rss_mb"] >= 100 and jobs["2-busy.job"]["cpu_s"] >= BUSY_S
    lanes = json.loads(report.stdout)["lanes"]
    assert lanes["cpu"]["cpu_s"] >= BUSY_S and lanes["cpu"]["peak_rss_mb"] >= 100
    text = plan(tmp_path, "report", str(queue_root)).stdout
    assert "peak" in text and "cpu" in text


# -- foreach over a range ----------------------------------------------------------------------------------------


def test_a_300_element_yaml_range_expands_and_a_bad_one_is_located(tmp_path: Path) -> None:
    from plancompiler.compile import compile_plan

    good = tmp_path / "sweep.yaml"
    good.write_text(
        "plan: sweep\njobs:\n  - name: 'arm-{{ i }}-{{ k }}'\n    foreach: {i: {range: [0, 300]}, k: {range: [1, 2]}}\n"
        "    run: echo {{ i }}\n"
    )
    compiled = compile_plan(good, lint=False)
    assert [d.code for d in compiled.diagnostics] == ["P014"]  # arm-10-1 starts before arm-9-1: a warning
    assert [j.name for j in compiled.jobs][:2] == ["arm-0-1", "arm-1-1"] and len(compiled.jobs) == 300
    stepped = tmp_path / "step.yaml"
    stepped.write_text(
        "plan: s\njobs:\n  - name: 'a-{{ i }}'\n    foreach: {i: {range: [10, 0, -5]}}\n    run: 'true'\n"
    )
    assert [j.name for j in compile_plan(stepped, lint=False).jobs] == ["a-10", "a-5"]
    for spec, says in (
        ("{range: [0, 1000000000]}", "more than the 100,000"),
        ("{range: [0, 10, 0]}", "step"),
        ("{range: [a, 3]}", "whole numbers"),
        ("{range: [1]}", "[start, stop]"),
        ("{rnage: [0, 3]}", "did you mean 'range'"),
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"plan: b\njobs:\n  - name: 'a-{{{{ i }}}}'\n    foreach: {{i: {spec}}}\n    run: 'true'\n")
        found = compile_plan(bad, lint=False).diagnostics
        assert found and found[0].line == 4 and says in found[0].message, (spec, found)


def test_park_a_lane_alone_from_the_command_line(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    write_job(queue_root, "1-gpu.job", "# LANE=gpu\ntrue\n")
    write_job(queue_root, "2-cpu.job", "# LANE=cpu\ntrue\n")
    t = ticking()
    parked = plan(tmp_path, "park", str(queue_root), "--lane", "gpu", "--reason", "driver swap")
    assert parked.returncode == 0 and "parked lane gpu" in parked.stdout, parked.stderr
    assert plan(tmp_path, "park", str(queue_root), "--lane", "gpu", "--now").returncode == 2
    t.tick(NOW + 1)
    assert t.procs.running() == ["2-cpu.job"]
    assert t.reason("1-gpu.job")["reason"] == "parked"  # type: ignore[index]
    assert t.events("parked")[-1]["lane"] == "gpu"
    typo = plan(tmp_path, "park", str(queue_root), "--lane", "gpus")  # a lane the runner (now ticked) lacks
    assert typo.returncode != 0 and "no lane 'gpus' on this queue: its runner serves cpu, gpu, net" in typo.stderr
    assert "gpus" not in (queue_root / "parked-lanes.json").read_text()
    assert "PARKED LANE gpu" in plan(tmp_path, "status", str(queue_root)).stdout
    assert plan(tmp_path, "unpark", str(queue_root)).stdout.endswith("was not parked\n")  # the queue itself was not
    assert plan(tmp_path, "unpark", str(queue_root), "--lane", "gpu").returncode == 0
    t.tick(NOW + 2)
    assert t.procs.running() == ["1-gpu.job", "2-cpu.job"] and not (queue_root / "parked-lanes.json").exists()


def test_history_names_timeouts_retries_and_queued_cancels() -> None:
    from plancompiler.watch import history_ends

    events = [
        {"ts": "t1", "job": "a.job", "event": "start", "lane": "gpu", "attempt": 1},
        {"ts": "t2", "job": "a.job", "event": "timeout", "limit_s": 5},
        {"ts": "t2", "job": "a.job", "event": "retry", "attempt": 1, "duration_s": 5.0, "cpu_s": 4.5},
        {"ts": "t3", "job": "a.job", "event": "start", "lane": "gpu", "attempt": 2},
        {"ts": "t4", "job": "a.job", "event": "timeout", "limit_s": 5},
        {"ts": "t4", "job": "a.job", "event": "failed", "attempt": 2, "plan": "p", "duration_s": 5.0},
        {"ts": "t5", "job": "b.job", "event": "cancelled", "was": "queued"},
        {"ts": "t6", "job": "-", "event": "idle"},
    ]
    ends = history_ends(events, 10)
    assert [(e.job, e.outcome, e.attempt, e.start, e.lane) for e in ends] == [
        ("a.job", "retry", 1, "t1", "gpu"),
        ("a.job", "timeout", 2, "t3", "gpu"),
        ("b.job", "cancelled", None, None, ""),
    ]
    assert [e.outcome for e in history_ends(events, 10, plan="p@abc")] == ["timeout"]
    assert [e.job for e in history_ends(events, 1)] == ["b.job"]


def test_a_held_job_raises_no_idle_and_no_incident(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "1-a.job", "# LANE=cpu\ntrue\n")
    write_job(queue_root, "2-b.job", "# LANE=cpu\n# REQUIRES=test -f never-made\ntrue\n")
    t = ticking(idle_s=60.0)
    (queue_root / "control").mkdir(exist_ok=True)
    (queue_root / "control" / "hold-1-a.job").write_text('{"by": "me"}')
    t.tick(NOW + 1)
    os.unlink(queue_root / "queue" / "2-b.job")
    for step in range(2, 40):
        t.tick(NOW + step * 100)
    assert t.reason("1-a.job")["reason"] == "held"  # type: ignore[index]
    assert not t.events("idle") and t.procs.running() == []
    book = json.loads((queue_root / "incidents.json").read_text()) if (queue_root / "incidents.json").exists() else {}
    assert "1-a.job" not in json.dumps(book)

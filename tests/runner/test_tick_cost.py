"""What a tick keeps between ticks to stay cheap at 10 000 queued jobs, and that each kept thing is seen to change
on the next tick: stamped jobs' verdicts (runner/stamp_judge.Verdicts); one /proc read shared by a job's end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner import procs, stamps
from runner.queue import fresh_status
from runner.records import Running
from runner.service.proctable import OsProcesses
from runner.stamps import judge as stamp_judge
from tests.conftest import read_events, write_job
from tests.ticking import Ticking

T0 = 1_800_000_000.0


def _job(root: Path, name: str, done_if: str, requires: str = "") -> None:
    header = f"# PLAN=p1\n# OUTPUTS=out/{name}\n# DONE_IF={done_if}\n" + (
        f"# REQUIRES={requires}\n" if requires else ""
    )
    write_job(root, f"{name}.job", header + f"echo {name} > out/{name}\n")


def _stamp(root: Path, name: str, stamp: dict[str, object]) -> None:
    (root / "stamps").mkdir(exist_ok=True)
    tmp = root / "stamps" / f".{name}.tmp"
    tmp.write_text(json.dumps(stamp))
    os.replace(tmp, root / "stamps" / f"{name}.json")


def _still(root: Path) -> None:
    """As if nothing under ROOT's state directories had changed for a while (a verdict is kept only then)."""
    for name in stamp_judge.WORLD_DIRS:
        if (root / name).exists():
            os.utime(root / name, (time.time() - 10, time.time() - 10))


def _queue(tmp_path: Path) -> tuple[Path, Ticking]:
    """b follows a (manifest.json); a's stamp is marked stale by a push, so b waits for a to run again."""
    root = tmp_path / "q"
    (root / "out").mkdir(parents=True)
    (root / "parked.json").write_text('{"reason": "test"}')  # nothing starts: the verdicts are the point
    manifest = {"jobs": {"a.job": {"after": []}, "b.job": {"after": ["a.job"]}}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    write_job(root, "a.job", "# PLAN=p1\n# OUTPUTS=out/a\necho a > out/a\n", state="done")
    _job(root, "b", "test -f out/b")
    _stamp(root, "a", {"version": 1, "job": "a.job", "sha": "", "id": "id-a", "producers": {}, "stale": "a changed"})
    _stamp(root, "b", {"version": 1, "job": "b.job", "sha": "", "id": "id-b", "producers": {}, "stale": "a changed"})
    runner = Ticking(root).start(T0)
    return root, runner


def _reason(runner: Ticking, job: str) -> tuple[str, str]:
    found = runner.reason(job)
    assert found is not None, job
    return found["reason"], found["detail"]


def test_a_verdict_is_kept_while_nothing_it_read_changed(tmp_path: Path) -> None:
    root, runner = _queue(tmp_path)
    runner.tick(T0)
    assert _reason(runner, "b.job") == ("stale", "waits for a.job to run again first")
    _still(root)
    runner.tick(T0 + 1)  # the first still tick judges once more and keeps it
    verdicts = runner.runner.facts.verdicts
    judged = verdicts.judged
    for i in range(3):
        runner.tick(T0 + 2 + i)
    assert verdicts.judged == judged
    assert _reason(runner, "b.job") == ("stale", "waits for a.job to run again first")
    runner.close()


def test_a_changed_stamp_is_seen_on_the_next_tick(tmp_path: Path) -> None:
    root, runner = _queue(tmp_path)
    runner.tick(T0)
    _still(root)
    runner.tick(T0 + 1)
    runner.tick(T0 + 2)
    # a ran again (its stamp is fresh): b no longer waits; marked stale, it would run (only the park holds it)
    _stamp(root, "a", {"version": 1, "job": "a.job", "sha": "x", "id": "id-a2", "producers": {}})
    _still(root)  # written a while before this tick (--tick 10): its directory's mtime changed all the same
    runner.tick(T0 + 3)
    assert _reason(runner, "b.job")[0] == "parked"


def test_a_producer_queued_again_is_seen_on_the_next_tick(tmp_path: Path) -> None:
    root, runner = _queue(tmp_path)
    _stamp(root, "a", {"version": 1, "job": "a.job", "sha": "x", "id": "id-a", "producers": {}})
    runner.tick(T0)
    assert _reason(runner, "b.job")[0] == "parked"
    _still(root)
    runner.tick(T0 + 1)
    runner.tick(T0 + 2)
    os.replace(root / "done/a.job", root / "queue/a.job")
    _still(root)
    runner.tick(T0 + 3)
    assert _reason(runner, "b.job") == ("stale", "waits for a.job to run again first")


def test_a_changed_condition_and_a_changed_job_file_are_seen_on_the_next_tick(tmp_path: Path) -> None:
    root = tmp_path / "q"
    (root / "out").mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"jobs": {"c.job": {"after": []}}}))
    _job(root, "c", "test -f out/c", requires="test -f out/never")
    text = (root / "queue/c.job").read_bytes()
    _stamp(root, "c", {"version": 1, "job": "c.job", "sha": "other", "id": "id-c", "producers": {}})
    runner = Ticking(root).start(T0)
    runner.tick(T0)
    assert _reason(runner, "c.job")[0] == "requires"
    (root / "out/c").write_text("c\n")  # its DONE_IF holds now, but what it runs is not what its stamp says
    _still(root)
    runner.tick(T0 + 1)
    runner.tick(T0 + 2)
    assert _reason(runner, "c.job")[0] == "requires" and (root / "queue/c.job").exists()
    # rewritten in place (queue/ itself unchanged): now it is what its stamp says it ran, so it is done
    _stamp(root, "c", {"version": 1, "job": "c.job", "sha": stamps.content_hash(text + b"\n"), "id": "id-c"})
    _still(root)
    runner.tick(T0 + 3)
    runner.tick(T0 + 4)
    assert (root / "queue/c.job").exists()
    with open(root / "queue/c.job", "ab") as handle:
        handle.write(b"\n")
    runner.tick(T0 + 5)
    assert not (root / "queue/c.job").exists() and (root / "done/c.job").exists()
    assert [e["job"] for e in read_events(root) if e["event"] == "skipped"] == ["c.job"]
    runner.close()


def test_a_job_end_reads_proc_once_and_finds_what_its_job_left(tmp_path: Path) -> None:
    """tree(), the leaks and the GPU users of one tick share one read of /proc; the tree still finds a process
    that left the job's session but kept its tag, and one still in its session."""
    table = OsProcesses(kill_grace_s=1.0)
    table.adopt_orphans()
    tag = f"test-tick-cost:{os.getpid()}:x.job"
    script = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nelse:\n    time.sleep(30)\n"
    env = dict(os.environ, PLAN_RUNNER_TAG=tag)
    child = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    try:
        deadline = time.time() + 10
        run = Running("x.job", None, child.pid, "cpu", 1, 0.0, 0, tag)  # type: ignore[arg-type]
        while len(table.tree(run)) < 2 and time.time() < deadline:
            table.reap()  # a new tick reads /proc again
            time.sleep(0.05)
        found = table.tree(run)
        assert child.pid in {p.pid for p in found} and len(found) == 2, found
        assert table.stats() is table.stats()  # one read until the next reap
        table.end([p.pid for p in found])
        table.reap()
        assert table.tree(run) == []
    finally:
        child.kill()
        child.wait()


def test_a_job_end_reads_only_the_runners_descendants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a job left when its wrapper ended (one still in its session, one that left it but kept its tag) is
    found through the kernel's lists of children from the runner down, the subreaper they came back to: the
    tree and the leaks of a job's end read no other process (reading every one would fail here)."""
    table = OsProcesses(kill_grace_s=1.0)
    table.adopt_orphans()
    if not procs.children_files():
        pytest.skip("this kernel lists no task's children (CONFIG_PROC_CHILDREN)")
    tag = f"test-tick-cost:{os.getpid()}:y.job"
    ready = tmp_path / "ready"
    # the wrapper's part: one child stays in the session, one leaves it (setsid), then the wrapper exits
    script = f"sleep 30 & setsid sleep 31 & while [ ! -e {ready} ]; do sleep 0.01; done; exit 0"
    env = dict(os.environ, PLAN_RUNNER_TAG=tag)
    with open(tmp_path / "log", "wb") as log:
        pid = table.spawn(["bash", "-c", f"touch {ready}.go; {script}"], env, str(tmp_path), log.fileno(), "y.job")
    run = Running("y.job", None, pid, "cpu", 1, 0.0, 0, tag)  # type: ignore[arg-type]
    left: list[procs.Proc] = []
    try:
        deadline = time.time() + 10
        while not (tmp_path / "ready.go").exists() and time.time() < deadline:
            time.sleep(0.01)
        while not {"sleep 30", "sleep 31"} <= {p.cmdline for p in procs.all_procs() if p.tag == tag}:
            assert time.time() < deadline, "both sleeps started"
            time.sleep(0.01)
        ready.touch()
        while table.exit_code(pid) is None and time.time() < deadline:
            table.reap()
            time.sleep(0.01)
        assert table.exit_code(pid) == 0

        def every_process() -> dict[int, procs.Stat]:
            raise AssertionError("read every process at a job's end")

        monkeypatch.setattr(procs, "all_stats", every_process)
        table.reap()
        left = table.tree(run)
        assert sorted(p.cmdline for p in left) == ["sleep 30", "sleep 31"], left
        leaked = {pid for leak in table.leaks(set()) for pid in leak.group}
        assert {p.pid for p in left} <= leaked  # both came back to us: leaks too, until their job's end ends them
    finally:
        monkeypatch.undo()
        table.end([p.pid for p in left])
        table.forget(pid)
        table.reap()
    assert table.tree(run) == []


def test_a_shared_condition_and_a_changed_one_are_each_seen_on_the_next_tick(tmp_path: Path) -> None:
    """Conditions are compiled once per text (a chain's DONE_IF is the next job's REQUIRES): two jobs share one,
    and a job file rewritten with another REQUIRES is judged by the new one on the next tick."""
    root = tmp_path / "q"
    (root / "out").mkdir(parents=True)
    write_job(root, "a.job", "# DONE_IF=test -f out/a\necho a\n")
    write_job(root, "b.job", "# REQUIRES=test -f out/a\n# LANE=gpu\necho b\n")
    runner = Ticking(root).start(T0)
    runner.tick(T0)
    parsed = runner.runner.scanner.taken
    assert parsed["a.job"].done_if is parsed["b.job"].requires  # one compiled condition for both
    assert runner.procs.running() == ["a.job"] and _reason(runner, "b.job")[0] == "requires"
    (root / "out/b-ready").write_text("")
    write_job(root, "b.job", "# REQUIRES=test -f out/b-ready\n# LANE=gpu\necho b\n")
    runner.tick(T0 + 1)
    assert runner.procs.running() == ["a.job", "b.job"]
    runner.close()


def _judged(metrics: Path, name: str) -> int:
    """A counter as the runner's --metrics file shows it."""
    line = next(ln for ln in metrics.read_text().splitlines() if ln.startswith(name + " "))
    return int(line.split()[1])


def _chain(root: Path, jobs: int) -> None:
    """JOBS no-op cpu jobs in name order, each with its own output as its DONE_IF (a foreach plan's)."""
    (root / "out").mkdir(parents=True, exist_ok=True)
    for i in range(jobs):
        write_job(root, f"j-{i:04d}.job", f"# LANE=cpu\n# DONE_IF=test -f {root}/out/{i:04d}\ndate > out/{i:04d}\n")


def test_a_jobs_end_judges_its_lanes_next_candidates_not_the_queue(tmp_path: Path, queue_root: Path) -> None:
    _chain(queue_root, 300)
    metrics = tmp_path / "runner.prom"
    q = Ticking(queue_root, metrics_path=metrics).start(T0)
    q.tick(T0)  # the first tick is a sweep: every job judged, the first one started
    assert q.procs.running() == ["j-0000.job"]
    swept = _judged(metrics, "plan_runner_jobs_judged_total")
    assert swept >= 300
    assert q.reason("j-0200.job")["detail"] == "j-0000.job is ahead of it"
    writes = q.runner.statusfile.writes
    for i in range(1, 6):  # each job's end: the lane's next job starts, no other job is looked at
        (queue_root / f"out/{i - 1:04d}").write_text("done\n")
        q.procs.exit(f"j-{i - 1:04d}.job", 0)
        looked, stats = q.runner.facts.looked_at, q.runner.facts.stats
        q.runner.tick(T0 + i, sweep=False)
        assert q.procs.running() == [f"j-{i:04d}.job"]
        assert q.runner.facts.looked_at - looked <= 2  # its free slot's candidate, and one more
        assert q.runner.facts.stats - stats <= 4  # their DONE_IF paths, the ended job's own
    assert _judged(metrics, "plan_runner_jobs_judged_total") - swept <= 10
    # status.json is the sweep's; what changed since is laid over it from heartbeat.json by every reader
    assert q.runner.statusfile.writes == writes
    assert q.reason("j-0200.job")["detail"] == "j-0000.job is ahead of it"  # as old as the last sweep
    fresh = fresh_status(queue_root, q.status())
    assert [run["job"] for run in fresh["running"]] == ["j-0005.job"]
    assert fresh["swept"] == T0 and fresh["counts"]["done"] == 5
    assert not any(entry["job"] <= "j-0005.job" for entry in fresh["queued"])
    assert len(fresh["queued"]) == 294 and fresh["waiting"] == {"order": 294}
    q.tick(T0 + 10)  # the next sweep: every reason current again
    assert q.reason("j-0200.job")["detail"] == "j-0005.job is running in cpu"
    assert q.runner.statusfile.writes == writes + 1 and q.status()["swept"] == T0 + 10
    assert _judged(metrics, "plan_runner_sweeps_total") == 2
    q.close()


def test_a_jobs_end_looks_further_down_its_lane_only_as_far_as_a_job_can_start(queue_root: Path) -> None:
    """The seed's rule: the first job in order whose DONE_IF is false and REQUIRES true, however far down."""
    _chain(queue_root, 200)
    gate = queue_root / "gate"
    for i in range(1, 41):  # behind the first job: 40 that wait, 20 already done, then the one that can run
        path = queue_root / f"queue/j-{i:04d}.job"
        path.write_text(path.read_text().replace("# LANE=cpu\n", f"# LANE=cpu\n# REQUIRES=test -f {gate}\n"))
    for i in range(41, 61):
        (queue_root / f"out/{i:04d}").write_text("done\n")
    q = Ticking(queue_root).start(T0)
    q.tick(T0)
    assert q.procs.running() == ["j-0000.job"]
    (queue_root / "out/0000").write_text("done\n")
    q.procs.exit("j-0000.job", 0)
    looked = q.runner.facts.looked_at
    q.runner.tick(T0 + 1, sweep=False)
    assert q.procs.running() == ["j-0061.job"]
    assert 61 <= q.runner.facts.looked_at - looked < 130  # doubling: never all 199
    assert [e["job"] for e in q.events("skipped")] == [f"j-{i:04d}.job" for i in range(41, 61)]
    gate.touch()  # the 40 may run now: the lane takes the first of them once its job ends
    q.procs.exit("j-0061.job", 0)
    (queue_root / "out/0061").write_text("done\n")
    q.runner.tick(T0 + 2, sweep=False)
    assert q.procs.running() == ["j-0001.job"]
    q.close()

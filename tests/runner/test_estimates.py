"""Estimates: the runner's history of done runs (bounded), when running jobs end and queued jobs start, each with
its basis, in `plan status`, `status --json` and the agent's answer."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from plancompiler.compile import compile_plan, manifest
from runner.estimates import History, estimate, progress_left
from runner.estimates.history import MAX_JOBS, RUNS_PER_JOB
from tests.conftest import write_job
from tests.inprocess import plan_main
from tests.ticking import Ticking

NOW = 1_000_000.0


def test_progress_gives_the_time_left_by_its_own_eta_or_by_the_share_done() -> None:
    assert progress_left("64% of 52.44G (33.95G) at 2.72M/s, ETA 1:55:35", 100) == (6935.0, "its progress line's ETA")
    assert progress_left("64% (33.95G) at 2.72MB/s, ETA 1h 55m", 100) == (6900.0, "its progress line's ETA")
    assert progress_left("25% (1/4 MB)", 60) == (180.0, "25% done in 1m00s")
    assert progress_left("0% (0/4)", 60) is None and progress_left("100% (4/4)", 60) is None


def test_history_keeps_the_last_runs_of_each_job_and_family_and_stays_bounded(tmp_path: Path) -> None:
    history = History()
    for n in range(RUNS_PER_JOB + 2):
        history.record("a.job", "fetch.sh.j2", 10.0 * (n + 1), NOW + n)
    assert history.jobs["a.job"]["runs"] == [30.0, 40.0, 50.0, 60.0, 70.0]
    assert history.expected("a.job") == (50.0, "median of its last 5 runs")
    assert history.expected("b.job", "fetch.sh.j2") == (40.0, "median of 7 runs of its family fetch.sh.j2")
    assert history.expected("b.job") is None
    for n in range(MAX_JOBS + 10):
        history.record(f"j{n}.job", None, 1.0, NOW + 100 + n)
    assert len(history.jobs) == MAX_JOBS and "a.job" not in history.jobs  # the least recently run went first
    history.save(tmp_path)
    assert History.load(tmp_path).jobs == history.jobs
    (tmp_path / "history.json").write_text('{"jobs": {"x.job": {"runs": "no", "last": 1}, "y.job": [1]}}')
    assert History.load(tmp_path).jobs == {}  # a cache: what is not well-formed is left out, never an error
    (tmp_path / "history.json").write_text("not json")
    assert History.load(tmp_path).jobs == {}


def _status(running: list[dict[str, Any]], queued: list[dict[str, Any]], slots: int = 1) -> dict[str, Any]:
    return {"lanes": {"cpu": {"slots": slots}, "gpu": {"slots": 1}}, "running": running, "queued": queued}


def test_queued_jobs_start_when_a_slot_frees_and_after_their_producers() -> None:
    history = History()
    history.record("b.job", None, 100.0, 0)
    history.record("x.job", "fam", 300.0, 0)
    status = _status(
        [{"job": "a.job", "lane": "cpu", "elapsed_s": 50, "progress": "25% (1/4)"}],
        [
            {"job": "b.job", "lane": "cpu", "reason": "lane-busy", "blocker": "a.job"},
            {"job": "c.job", "lane": "cpu", "reason": "order"},
            {"job": "d.job", "lane": "gpu", "reason": "requires", "blocker": "test -f /out/c"},
            {"job": "e.job", "lane": "gpu", "reason": "requires", "blocker": "test -f /ext"},
            {"job": "f.job", "lane": "gpu", "reason": "blocked", "blocker": "z.job"},
        ],
    )
    jobs = {"c.job": {"family": "fam"}, "d.job": {"after": ["c.job"]}, "e.job": {"after": []}}
    found = estimate(status, history, jobs, NOW)
    assert found["running"]["a.job"] == {"ends": NOW + 150, "left_s": 150.0, "basis": "25% done in 50s"}
    queued = found["queued"]
    assert queued["b.job"]["starts"] == NOW + 150 and queued["b.job"]["basis"].startswith(
        "when a.job ends; runs ~1m40s"
    )
    assert queued["c.job"]["starts"] == NOW + 250 and "median of 1 run of its family fam" in queued["c.job"]["basis"]
    assert queued["d.job"]["starts"] == NOW + 550 and queued["d.job"]["basis"].startswith("after c.job ends")
    assert queued["e.job"] == {"starts": None, "in_s": None, "basis": "its REQUIRES is made outside the plan"}
    assert queued["f.job"]["starts"] is None and "blocked" in queued["f.job"]["basis"]


def test_a_lane_of_two_slots_starts_two_at_once_and_an_unknown_length_leaves_what_follows_unknown() -> None:
    history = History()
    history.record("a.job", None, 60.0, 0)
    status = _status(
        [],
        [
            {"job": "a.job", "lane": "cpu", "reason": "order"},
            {"job": "b.job", "lane": "cpu", "reason": "order"},
            {"job": "c.job", "lane": "cpu", "reason": "order"},
            {"job": "d.job", "lane": "cpu", "reason": "order"},
        ],
        slots=2,
    )
    queued = estimate(status, history, {}, NOW)["queued"]
    assert queued["a.job"]["starts"] == NOW and queued["b.job"]["starts"] == NOW
    assert queued["c.job"]["starts"] == NOW + 60 and queued["c.job"]["basis"].startswith("when a.job ends")
    assert queued["d.job"] == {"starts": None, "in_s": None, "basis": "after c.job, whose end is unknown"}


def test_a_held_job_has_no_start_and_the_job_after_it_takes_the_free_slot() -> None:
    status = _status(
        [], [{"job": "a.job", "lane": "cpu", "reason": "held"}, {"job": "b.job", "lane": "cpu", "reason": "order"}]
    )
    queued = estimate(status, History(), {}, NOW)["queued"]
    assert queued["a.job"] == {"starts": None, "in_s": None, "basis": "it is held: `plan release` lets it start"}
    assert queued["b.job"]["starts"] == NOW


def test_a_running_job_without_progress_ends_by_its_history_and_says_when_it_is_past_it() -> None:
    history = History()
    history.record("a.job", None, 600.0, 0)
    running = estimate(_status([{"job": "a.job", "lane": "cpu", "elapsed_s": 200}], []), history, {}, NOW)["running"]
    assert running["a.job"] == {"ends": NOW + 400, "left_s": 400.0, "basis": "median of its last 1 run"}
    late = estimate(_status([{"job": "a.job", "lane": "cpu", "elapsed_s": 900}], []), history, {}, NOW)["running"]
    assert late["a.job"]["left_s"] == 0.0 and late["a.job"]["basis"].startswith("past its expected 10m00s")
    none = estimate(_status([{"job": "n.job", "lane": "cpu", "elapsed_s": 9}], []), history, {}, NOW)["running"]
    assert none["n.job"]["ends"] is None


def test_the_manifest_names_each_jobs_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAN_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "fetch.sh.j2").write_text("echo {{ url }}\n")
    (tmp_path / "p.yaml").write_text(
        textwrap.dedent(
            """\
            plan: p
            jobs:
              - name: "20-cpu-bench-{{ m }}"
                foreach: {m: [a, b]}
                run: echo {{ m }}
              - name: 10-net-fetch
                lane: net
                template: fetch.sh.j2
                with: {url: "https://example.org/x"}
              - name: 30-cpu-one
                run: "true"
            """
        )
    )
    jobs = manifest(compile_plan(tmp_path / "p.yaml", lint=False))["jobs"]
    assert jobs["20-cpu-bench-a.job"]["family"] == jobs["20-cpu-bench-b.job"]["family"] == "20-cpu-bench-{{ m }}"
    assert jobs["10-net-fetch.job"]["family"] == "fetch.sh.j2"
    assert "family" not in jobs["30-cpu-one.job"]


def test_done_runs_go_into_the_history_and_status_shows_estimates_with_their_basis(
    tmp_path: Path, queue_root: Path, ticking: Any, stand_in: int
) -> None:
    (queue_root / "manifest.json").write_text(json.dumps({"jobs": {"1-cpu-a.job": {"family": "bench"}}}))
    write_job(queue_root, "1-cpu-a.job", "true\n")
    run = ticking(pid=stand_in).tick(NOW)
    run.procs.exit("1-cpu-a.job", 0)
    run.runner.tick(NOW + 120, sweep=False)  # its end's own tick: history.json waits for the sweep's
    assert History.load(queue_root).expected("1-cpu-a.job") is None
    run.tick(NOW + 121)
    assert History.load(queue_root).expected("1-cpu-a.job") == (120.0, "median of its last 1 run")
    assert History.load(queue_root).expected("2-cpu-b.job", "bench") == (120.0, "median of 1 run of its family bench")
    (queue_root / "done" / "1-cpu-a.job").rename(queue_root / "queue" / "1-cpu-a.job")  # it runs again ...
    write_job(queue_root, "2-cpu-b.job", "true\n")  # ... and another waits behind it
    run.tick(NOW + 200).tick(NOW + 230)
    ran = plan_main("status", str(queue_root), "--json", cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 0, ran.stderr
    estimates = json.loads(ran.stdout)["estimates"]
    ends = estimates["running"]["1-cpu-a.job"]
    assert ends["basis"] == "median of its last 1 run" and 80 <= ends["left_s"] <= 90
    starts = estimates["queued"]["2-cpu-b.job"]
    assert starts["basis"].startswith("when 1-cpu-a.job ends; its length is unknown")
    out = plan_main("status", str(queue_root), cwd=tmp_path, cache=tmp_path / "cache").stdout
    assert "est. end ~" in out and "(estimate: median of its last 1 run)" in out
    assert "est. start ~" in out and "2-cpu-b.job" in out
    every = plan_main("status", str(queue_root), "--all", cwd=tmp_path, cache=tmp_path / "cache").stdout
    assert "estimated starts" not in every  # --all says it on each job's own line
    assert any("2-cpu-b.job" in line and "(est. start ~" in line for line in every.splitlines())


def test_a_runner_stopped_between_sweeps_writes_the_history_of_the_runs_that_ended_since(queue_root: Path) -> None:
    write_job(queue_root, "1-cpu-a.job", "true\n")
    run = Ticking(queue_root).start(NOW).tick(NOW)
    run.procs.exit("1-cpu-a.job", 0)
    run.runner.tick(NOW + 30, sweep=False)
    assert History.load(queue_root).expected("1-cpu-a.job") is None
    run.runner.stop(NOW + 31)
    assert History.load(queue_root).expected("1-cpu-a.job") == (30.0, "median of its last 1 run")
    run.runner.release_lock()


def test_status_reads_a_running_job_s_progress_its_estimate_and_its_log_s_growth_as_the_log_says_now(
    tmp_path: Path, queue_root: Path, ticking: Any, stand_in: int
) -> None:
    """status.json is as old as the runner's last write (up to --tick): its progress (30 %) under a log that says
    50 % now showed the one beside an estimate from the other, and `log +6s ago` for a log written just now. The
    agent reads the log's tail and mtime and gives progress, last line, growth and estimate from them alike."""
    import time

    from runner.queue import Queue

    write_job(queue_root, "1-cpu-p.job", "true\n")
    began = time.time() - 13
    run = ticking(pid=stand_in).tick(began)
    log = Queue(queue_root).log_path("1-cpu-p.job")
    log.write_text("PROGRESS: 3/10 MB\n")
    run.tick(began + 7)  # status.json: 30 %, as the runner last read it
    assert json.loads((queue_root / "status.json").read_text())["running"][0]["progress"].startswith("30%")
    with log.open("a") as handle:
        handle.write("PROGRESS: 5/10 MB\nsaying more\n")
    ran = plan_main("status", str(queue_root), "--json", cwd=tmp_path, cache=tmp_path / "cache")
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    [running] = answer["status"]["running"]
    assert running["progress"].startswith("50%") and running["last_line"] == "saying more", running
    assert answer["now"] - running["log_grew_at"] < 5  # written just now, not at the runner's last look
    basis = answer["estimates"]["running"]["1-cpu-p.job"]["basis"]
    assert basis.startswith("50% done in 1"), basis  # ~13 s: counted to when the 50 % was read
    shown = plan_main("status", str(queue_root), cwd=tmp_path, cache=tmp_path / "cache").stdout
    assert "50% (5/10 MB)" in shown and "estimate: 50% done in" in shown and "30%" not in shown, shown

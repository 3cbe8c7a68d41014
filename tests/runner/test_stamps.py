"""Rerun on change: stamps under ROOT/stamps/, what the runner does with them and what `plan push` says."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.cli import app
from runner import stamps
from tests.conftest import RunnerProcess, read_events, wait_for, write_job
from tests.sshd import Sshd
from tests.ticking import Ticking

cli = CliRunner()


pytestmark = pytest.mark.usefixtures("plan_env")  # a shellcheck cache of its own, no hosts file from outside


def make_plan(
    tmp_path: Path, a_says: str = "v1", a_rerun: str | None = None, c: bool = False, a_timeout: str = ""
) -> Path:
    """a writes out/a; b copies it into out/b (so b's output shows which a it followed); c follows b."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    rerun = f"    rerun: {a_rerun}\n" if a_rerun else ""
    rerun += f"    timeout: {a_timeout}\n" if a_timeout else ""
    text = (
        f"plan: p\njobs:\n"
        f"  - name: a\n    run: echo {a_says} > {out}/a\n    outputs: [{out}/a]\n{rerun}"
        f"  - name: b\n    run: cat {out}/a > {out}/b\n    requires: [{out}/a]\n    outputs: [{out}/b]\n"
    )
    if c:
        text += f"  - name: c\n    run: cat {out}/b > {out}/c\n    requires: [{out}/b]\n    outputs: [{out}/c]\n"
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def push(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, ["push", *args])
    return result.exit_code, result.output


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in (".push.lock", "status.json", "events.jsonl")
    }


def stamp(root: Path, job: str) -> dict:
    return json.loads((root / "stamps" / f"{job}.json").read_text())


def _done(runner: RunnerProcess, job: str, count: int) -> bool:
    return len([e for e in runner.events("done") if e["job"] == job]) >= count


# -- real runner processes -------------------------------------------------------------------------------
def test_a_changed_done_job_reruns_and_its_consumers_follow(tmp_path: Path) -> None:
    root, out = tmp_path / "q", tmp_path / "out"
    assert push(str(root), str(make_plan(tmp_path, c=True)))[0] == 0
    write_job(root, "zz-seed.job", "# DONE_IF=test -f out-seed\ntouch out-seed\n")  # hand-written: no stamp
    runner = RunnerProcess(root).start()
    try:
        wait_for(lambda: _done(runner, "c.job", 1) and _done(runner, "zz-seed.job", 1), 20)
        first = {job: stamp(root, job) for job in "abc"}
        assert first["b"]["producers"] == {"a.job": first["a"]["id"]}
        assert first["c"]["producers"] == {"b.job": first["b"]["id"]}
        assert first["a"]["sha"] == stamps.content_hash((root / "done/a.job").read_bytes())
        assert sorted(os.listdir(root / "stamps")) == ["a.json", "b.json", "c.json"]  # none for the seed job

        code, output = push(str(root), str(make_plan(tmp_path, "v2", c=True)))
        assert code == 0, output
        assert "  ~  a.job  (changed, will run again: its output is stale)" in output
        assert "  ^  b.job  (stale because a.job changed)" in output
        assert "  ^  c.job  (stale because a.job changed, via b.job)" in output
        assert "will run again: a.job, b.job, c.job" in output
        wait_for(lambda: _done(runner, "c.job", 2), 20)
    finally:
        runner.stop()
    assert (out / "c").read_text() == "v2\n"  # c followed b, which followed the new a
    assert [e["attempt"] for e in read_events(root) if e["event"] == "start" and e["job"] == "c.job"] == [1, 1]
    order = [(e["event"], e["job"]) for e in read_events(root) if e["event"] in ("start", "done")][-6:]
    assert order == [
        ("start", "a.job"),
        ("done", "a.job"),
        ("start", "b.job"),
        ("done", "b.job"),
        ("start", "c.job"),
        ("done", "c.job"),
    ]
    assert not [e for e in read_events(root) if e["event"] == "skipped" and e["job"] in ("a.job", "b.job", "c.job")]
    assert stamp(root, "b")["producers"] == {"a.job": stamp(root, "a")["id"]} != first["b"]["producers"]
    code, output = push(str(root), str(make_plan(tmp_path, "v2", c=True)))
    assert code == 0 and "nothing will run again" in output and "nothing to push" in output


def test_rerun_never_keeps_the_old_result(tmp_path: Path) -> None:
    root, out = tmp_path / "q", tmp_path / "out"
    assert push(str(root), str(make_plan(tmp_path, "v1", a_rerun="never")))[0] == 0
    runner = RunnerProcess(root).start()
    try:
        wait_for(lambda: _done(runner, "b.job", 1), 20)
        code, output = push(str(root), str(make_plan(tmp_path, "v2", a_rerun="never")))
        assert code == 0, output
        assert "  ~  a.job  (changed, output kept: rerun: never)" in output
        assert "b.job" not in output and "nothing will run again" in output
        runner.wait_event("skipped", job="a.job")
    finally:
        runner.stop()
    assert (out / "a").read_text() == "v1\n" and (out / "b").read_text() == "v1\n"
    assert "v2" in (root / "done/a.job").read_text()
    assert [e["job"] for e in read_events(root) if e["event"] == "start"] == ["a.job", "b.job"]


# -- push text, against queues set up by hand (no runner needed) ------------------------------------------
def _stamp(root: Path, job: str, sha: str, ident: str, producers: dict | None = None) -> None:
    (root / "stamps").mkdir(exist_ok=True)
    (root / "stamps" / f"{job}.json").write_text(
        json.dumps(
            {"version": 1, "job": f"{job}.job", "sha": sha, "id": ident, "producers": producers or {}, "ts": "t"}
        )
    )


def _all_done(root: Path, stamped: bool) -> None:
    for name in os.listdir(root / "queue"):
        os.replace(root / "queue" / name, root / "done" / name)
        if stamped:
            sha = stamps.content_hash((root / "done" / name).read_bytes())
            _stamp(root, name[:-4], sha, f"id-{name}", {"a.job": "id-a.job"} if name == "b.job" else {})


def test_dry_run_says_the_same_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "q"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    _all_done(root, stamped=True)
    before = tree(root)
    code, output = push(str(root), str(make_plan(tmp_path, "v2")), "--dry-run")
    assert code == 0, output
    assert "  ~  a.job  (changed, will run again: its output is stale)" in output
    assert "  ^  b.job  (stale because a.job changed)" in output and "dry run" in output
    assert tree(root) == before
    code, output = push(str(root), str(make_plan(tmp_path, "v2")))
    assert code == 0 and sorted(os.listdir(root / "queue")) == ["a.job", "b.job"]
    assert stamp(root, "b")["stale"] == "a.job changed" and stamp(root, "b")["sha"] == ""
    assert stamp(root, "b")["id"] == "id-b.job"  # kept: c (if any) still knows which b it followed


def test_unstamped_queue_behaves_as_before(tmp_path: Path) -> None:
    root = tmp_path / "q"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    _all_done(root, stamped=False)
    code, output = push(str(root), str(make_plan(tmp_path, "v2")))
    assert code == 0, output
    assert "  ~  a.job  (changed, queued again; output kept if its DONE_IF holds (no stamp" in output
    # the summary is exact: a.job goes back to queue/ and only its DONE_IF says whether it runs
    assert "^" not in output and "queued again, its DONE_IF decides (no stamp): a.job" in output
    assert "nothing will run again" not in output
    assert os.listdir(root / "queue") == ["a.job"] and not (root / "stamps").exists()


def test_catch_up_a_producer_that_ran_again_after_its_consumer(tmp_path: Path) -> None:
    root = tmp_path / "q"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    _all_done(root, stamped=True)
    _stamp(root, "a", stamps.content_hash((root / "done/a.job").read_bytes()), "id-a-second-run")
    code, output = push(str(root), str(make_plan(tmp_path)))
    assert code == 0, output
    assert "  ^  b.job  (stale because a.job ran again after it)" in output
    assert "will run again: b.job" in output and os.listdir(root / "queue") == ["b.job"]


def test_torn_stamp_is_reported_and_treated_as_missing_by_push(tmp_path: Path) -> None:
    root = tmp_path / "q"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    _all_done(root, stamped=True)
    (root / "stamps/a.json").write_text('{"sha": "12')
    code, output = push(str(root), str(make_plan(tmp_path, "v2")))
    assert code == 0, output
    assert "warning: stamps/a.json on" in output and "not valid JSON" in output
    assert "(no stamp" in output and "^" not in output


# -- the runner's judgement, by driving tick(now) in-process (no job is started here) ----------------------
_started: list[Ticking] = []


@pytest.fixture(autouse=True)
def _close_runners() -> Iterator[None]:
    yield
    while _started:
        _started.pop().close()


def _ticking(root: Path) -> Ticking:
    runner = Ticking(root).start(time.time())
    _started.append(runner)
    return runner


def _reason(runner: Ticking, job: str) -> tuple[str, str]:
    reason = runner.reason(job)
    assert reason is not None, job
    return reason["reason"], reason["detail"]


def test_runner_skips_unstamped_jobs_adopts_their_stamp_and_never_stamps_seed_jobs(tmp_path: Path) -> None:
    root = tmp_path / "q"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    (tmp_path / "out/a").write_text("old\n")
    (tmp_path / "out/b").write_text("old\n")
    write_job(root, "zz-seed.job", f"# DONE_IF=test -f {tmp_path}/out/a\necho seed\n")
    write_job(root, "zz-no-outputs.job", f"# DONE_IF=test -f {tmp_path}/out/a\n# PLAN=p@1\necho\n")
    runner = _ticking(root)
    runner.tick(time.time())
    assert sorted(os.listdir(root / "done")) == ["a.job", "b.job", "zz-no-outputs.job", "zz-seed.job"]
    assert stamp(root, "a")["id"] == "" and stamp(root, "b")["producers"] == {"a.job": ""}
    assert sorted(os.listdir(root / "stamps")) == ["a.json", "b.json"]  # none for seed or output-less jobs


def test_runner_waits_for_a_stale_producer_and_reruns_a_changed_job(tmp_path: Path) -> None:
    root, out = tmp_path / "q", tmp_path / "out"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    _all_done(root, stamped=True)
    (out / "a").write_text("v1\n")
    (out / "b").write_text("v1\n")
    assert push(str(root), str(make_plan(tmp_path, "v2")))[0] == 0
    (root / "parked.json").write_text('{"reason": "test"}')  # nothing starts in-process
    runner = _ticking(root)
    runner.tick(time.time())
    assert _reason(runner, "b.job") == ("stale", "waits for a.job to run again first")
    assert _reason(runner, "a.job")[0] == "parked"  # stale, so it would run: only the park holds it
    status = runner.status()  # every waiting job (from waiting.json)
    assert {q["job"]: q["reason"] for q in status["queued"]} == {"a.job": "parked", "b.job": "stale"}
    # a ran meanwhile (its new stamp): b is no longer waiting, it is stale and would run
    _stamp(root, "a", stamps.content_hash((root / "queue/a.job").read_bytes()), "id-a-v2")
    os.replace(root / "queue/a.job", root / "done/a.job")
    runner.tick(time.time() + 1)
    assert _reason(runner, "b.job")[0] == "parked" and (root / "queue/b.job").exists()


def test_torn_stamp_in_the_runner_is_reported_and_treated_as_missing(tmp_path: Path) -> None:
    root = tmp_path / "q"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    (tmp_path / "out/a").write_text("old\n")
    (tmp_path / "out/b").write_text("old\n")
    (root / "stamps").mkdir()
    (root / "stamps/a.json").write_bytes(b"\x00\xff garbage")
    (root / "stamps/b.json").write_text('{"sha": 3, "id": "x", "producers": {}}')
    write_job(root, "zz-later.job", "# REQUIRES=test -f never\necho\n")  # keeps the runner ticking on
    runner = _ticking(root)
    runner.tick(time.time())
    runner.tick(time.time() + 1)
    corrupt = [(e["file"], e["field"]) for e in read_events(root) if e["event"] == "state-corrupt"]
    assert corrupt == [("stamps/a.json", "(whole file)"), ("stamps/b.json", "sha")]  # once each, not every tick
    assert sorted(os.listdir(root / "done")) == ["a.job", "b.job"]  # as with no stamp: DONE_IF decides
    assert stamp(root, "a")["id"] == stamp(root, "b")["id"] == ""  # adopted over the torn ones


def test_a_queued_consumer_waits_for_its_changed_producer_even_before_its_first_run(tmp_path: Path) -> None:
    root, out = tmp_path / "q", tmp_path / "out"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    os.replace(root / "queue/a.job", root / "done/a.job")
    _stamp(root, "a", stamps.content_hash((root / "done/a.job").read_bytes()), "id-a")
    (out / "a").write_text("v1\n")  # b's REQUIRES holds on a's old output: only its stamp holds it back
    code, output = push(str(root), str(make_plan(tmp_path, "v2")))
    assert code == 0, output
    assert "  ^  b.job  (stale because a.job changed)" in output and "will run again: a.job, b.job" in output
    (root / "parked.json").write_text('{"reason": "test"}')
    runner = _ticking(root)
    runner.tick(time.time())
    assert _reason(runner, "b.job") == ("stale", "waits for a.job to run again first")
    result = cli.invoke(app, ["status", str(root)])
    assert "stale" in result.output and "waits for a.job to run again first" in result.output, result.output


def test_push_over_ssh_reads_and_marks_stamps_on_the_host(tmp_path: Path, sshd: Sshd) -> None:
    root = tmp_path / "remote-q"
    hosts = str(sshd.hosts_file(root))
    assert push("testbox", str(make_plan(tmp_path)), "--hosts", hosts)[0] == 0
    _all_done(root, stamped=True)
    code, output = push("testbox", str(make_plan(tmp_path)), "--hosts", hosts)
    assert code == 0 and "nothing will run again" in output and "nothing to push" in output, output
    code, output = push("testbox", str(make_plan(tmp_path, "v2")), "--hosts", hosts, "--json")
    assert code == 0, output
    answer, _ = json.JSONDecoder().raw_decode(output[output.index("{") :])  # notes follow on stderr
    assert answer["reruns"] == ["a.job", "b.job"] and answer["counts"] == {"~": 1, "^": 1}
    assert {c["job"]: c["mark"] for c in answer["changes"]} == {"a.job": "~", "b.job": "^"}
    assert stamp(root, "a")["stale"] == "a.job changed" and stamp(root, "b")["stale"] == "a.job changed"
    assert sorted(os.listdir(root / "queue")) == ["a.job", "b.job"]


def test_a_new_timeout_changes_how_a_job_is_scheduled_not_what_it_makes(tmp_path: Path) -> None:
    root = tmp_path / "q"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    _all_done(root, stamped=True)
    (tmp_path / "out/a").write_text("v1\n")
    code, output = push(str(root), str(make_plan(tmp_path, a_timeout="6h")))
    assert code == 0, output
    assert "  ~  a.job  (changed header only, output kept: what it runs is the same)" in output
    assert (
        "^" not in output and "nothing will run again" in output and "TIMEOUT=6h" in (root / "queue/a.job").read_text()
    )
    runner = _ticking(root)
    runner.tick(time.time())
    assert sorted(os.listdir(root / "done")) == ["a.job", "b.job"]  # its DONE_IF and its stamp agree: skipped


def test_a_marked_job_that_became_rerun_never_releases_its_consumers(tmp_path: Path) -> None:
    root, out = tmp_path / "q", tmp_path / "out"
    assert push(str(root), str(make_plan(tmp_path)))[0] == 0
    _all_done(root, stamped=True)
    (out / "a").write_text("v1\n")
    (out / "b").write_text("v1\n")
    assert push(str(root), str(make_plan(tmp_path, "v2")))[0] == 0  # a and b marked stale, queued again
    code, output = push(str(root), str(make_plan(tmp_path, "v2", a_rerun="never")))  # the user thinks again
    assert code == 0 and "pushed" in output, output
    (root / "parked.json").write_text('{"reason": "test"}')
    runner = _ticking(root)
    runner.tick(time.time())
    assert (root / "done/a.job").exists() and "stale" not in stamp(root, "a")  # skipped, its mark cleared
    assert stamp(root, "a")["id"] == "id-a.job"  # the output it made stands
    runner.tick(time.time() + 1)
    assert _reason(runner, "b.job") == ("parked", "parked since ?: test")  # stale (marked), no longer waiting

"""The sweep bounded per tick and spread across ticks, and what status.json carries of the waiting jobs: a summary
that does not grow with the queue (the whole list in waiting.json). In-process runners driven by `tick(now)`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runner.agent import handlers
from runner.queue import fresh_status
from runner.service import statusfile
from runner.service.dispatch import SWEEP_MIN
from runner.views.status import render_status
from runner.views.waiting import Summary, group_waiting, patch
from tests.conftest import write_job
from tests.ticking import Ticking

T0 = 1_000_000.0
WAITING = 350  # 3.5 times what a sweep judges at least: a pass takes four ticks with a budget of 0


def _queue(root: Path, waiting: int) -> None:
    """a-run.job (nothing to wait for: it takes the cpu lane), then WAITING jobs whose REQUIRES is false."""
    (root / "in").mkdir(parents=True)
    write_job(root, "a-run.job", "true\n")
    for i in range(waiting):
        write_job(root, f"b-{i:03d}.job", f"# REQUIRES=test -f {root}/in/{i:03d}\ntrue\n")


def _looked(q: Ticking, now: float, sweep: bool = True) -> int:
    """Queued jobs whose facts the tick at NOW found out."""
    before = q.runner.facts.looked_at
    q.runner.tick(now, sweep=sweep)
    return q.runner.facts.looked_at - before


def test_a_large_queue_is_swept_over_several_ticks_and_its_reasons_say_how_old(queue_root: Path) -> None:
    _queue(queue_root, WAITING)
    q = Ticking(queue_root, sweep_budget_s=0.0).start(T0)
    # The first tick judges every job (none had a reason yet: what changed is judged at once, whatever the budget).
    assert _looked(q, T0) == WAITING + 1
    assert q.procs.running() == ["a-run.job"]
    status = q.status()
    assert status["swept"] == T0 and status["waiting_count"] == WAITING
    assert {e["reason"] for e in status["queued"]} == {"requires"}
    # From then on each sweep judges SWEEP_MIN jobs on from where the last stopped (and the lane's candidates).
    (queue_root / "in" / "320").touch()  # b-320 could run: the pass tells at its fourth tick
    for n in range(1, 4):
        assert _looked(q, T0 + 10 * n) <= SWEEP_MIN + 2
        status = q.status()
        assert status["sweep"] == {"began": T0 + 10, "judged": SWEEP_MIN * n}
        assert status["swept"] == T0  # no pass has ended since: every reason is at most this old
        assert q.reason("b-320.job")["reason"] == "requires"
    screen = render_status(status, T0 + 35)
    assert "reasons as of 35s ago" in screen and f"this one has judged {3 * SWEEP_MIN} since 25s ago" in screen
    assert _looked(q, T0 + 40) <= WAITING - 3 * SWEEP_MIN + 2
    status = q.status()
    assert status["swept"] == T0 + 10  # the pass that ended began then
    assert q.reason("b-320.job")["reason"] == "lane-busy"
    assert "reasons as of 31s ago (a sweep over every waiting job spans several ticks)" in render_status(
        status, T0 + 41
    )
    # The next pass begins at the first job again.
    assert _looked(q, T0 + 50) <= SWEEP_MIN + 2 and q.status()["sweep"] == {"began": T0 + 50, "judged": SWEEP_MIN}


def test_a_jobs_end_starts_its_lanes_next_job_whatever_the_pass_has_judged(queue_root: Path) -> None:
    _queue(queue_root, WAITING)
    q = Ticking(queue_root, sweep_budget_s=0.0).start(T0)
    q.tick(T0)
    q.tick(T0 + 10)  # the pass has judged the first SWEEP_MIN
    (queue_root / "in" / "300").touch()
    q.procs.exit("a-run.job")
    q.runner.tick(T0 + 11, sweep=False)  # the end's own tick: the lane's candidates, in order, until one starts
    assert q.procs.running() == ["b-300.job"]
    assert q.status()["sweep"]["judged"] == SWEEP_MIN  # the pass did not move for it


def test_a_small_queue_is_swept_whole_every_tick(queue_root: Path) -> None:
    _queue(queue_root, 20)
    q = Ticking(queue_root, sweep_budget_s=0.0).start(T0)
    for n in range(3):
        assert _looked(q, T0 + 10 * n) == (21 if n == 0 else 20)
        assert q.status()["swept"] == T0 + 10 * n
    assert "reasons as of" not in render_status(q.status(), T0 + 29)


def _status_bytes(root: Path, waiting: int) -> tuple[int, dict]:
    _queue(root, waiting)
    q = Ticking(root).start(T0)
    q.tick(T0)
    q.tick(T0 + 10)
    q.close()
    return len((root / "status.json").read_bytes()), q.status()


def test_status_json_does_not_grow_with_the_queue_and_plan_status_shows_what_the_whole_list_shows(
    tmp_path: Path,
) -> None:
    small, _ = _status_bytes(tmp_path / "small", 60)
    large, whole = _status_bytes(tmp_path / "large", 600)
    assert abs(large - small) < 200  # the same summary (the counts have another digit)
    assert len(whole["queued"]) == 600 and (tmp_path / "large" / "waiting.json").stat().st_size > 8 * large
    # `plan status` without --all: the agent sends status.json's summary; it reads as the whole list grouped does
    answer = handlers.status(str(tmp_path / "large"), {"offset": -1, "estimates": True, "grouped": True})
    status = answer["status"]
    assert status["waiting_count"] == 600 and len(status["queued"]) < 100 and "queued_first" not in status
    made = group_waiting(whole["queued"], T0 + 20)
    assert [(g["reason"], g["count"], [w["job"] for w in g["oldest"]]) for g in status["waiting_groups"]] == [
        (g.reason, g.count, [w.job for w in g.oldest]) for g in made
    ]
    listed = dict(whole, waiting_groups=None, waiting_count=None)  # grouped here from the whole list, as before
    assert render_status(status, T0 + 20) == render_status(listed, T0 + 20)
    # --all (and plan watch, plan top): every waiting job, from waiting.json
    every = handlers.status(str(tmp_path / "large"), {"offset": -1})["status"]
    assert [e["job"] for e in every["queued"]] == [e["job"] for e in whole["queued"]]
    raw = json.loads((tmp_path / "large" / "status.json").read_text())
    assert "queued" not in raw and fresh_status(tmp_path / "large", raw)["queued"] == raw["queued_first"]


def test_the_summary_moves_on_with_the_jobs_judged_between_sweeps(queue_root: Path) -> None:
    _queue(queue_root, 60)
    q = Ticking(queue_root).start(T0)
    q.tick(T0)
    (queue_root / "in" / "000").touch()
    q.runner.tick(T0 + 1, sweep=False)  # a new file's tick: b-000 waits for the busy lane now; no list is written
    answer = handlers.status(str(queue_root), {"offset": -1, "grouped": True})["status"]
    made = group_waiting(q.status()["queued"], T0 + 2)
    assert [(g.reason, g.count) for g in made] == [("requires", 59), ("lane-busy", 1)]
    assert [(g["reason"], g["count"]) for g in answer["waiting_groups"]] == [(g.reason, g.count) for g in made]
    assert answer["waiting_count"] == 60 and "b-000.job" in render_status(answer, T0 + 2)
    q.close()


def test_waiting_json_lists_each_job_as_its_own_entry_encoded_whole_would(queue_root: Path) -> None:
    """Entries that share a reason (and lane) are encoded from that reason's parts, made once: the list is byte for
    byte the entries encoded one by one, for shared reasons, reasons of their own, other lanes, and files that are
    not jobs (yet)."""
    _queue(queue_root, 40)  # a-run runs; the b-* wait for their REQUIRES, each on its own file
    for i in range(6):  # one reason shared by jobs in two lanes
        lane = "net" if i < 4 else "cpu"
        write_job(queue_root, f"c-{i}.job", f'# LANE={lane}\n# REQUIRES=test -f "in/é \\"q\\""\ntrue\n')
    write_job(queue_root, "d-1.job", "true\n")  # waits for the busy cpu lane
    settling = queue_root / "queue" / 'e-"é".job'  # not a job's name: listed (settling) until it is taken
    settling.write_text("true\n")
    for path in (queue_root / "queue").iterdir():  # older than the settle, taken at once; the odd one just written
        os.utime(path, (T0, T0) if path == settling else (T0 - 100, T0 - 100))
    q = Ticking(queue_root, settle_s=60.0).start(T0)
    q.tick(T0)
    q.tick(T0 + 10)
    runner = q.runner
    runner.statusfile.write(runner.snapshot(), T0 + 10, runner.scanner.queued, force=True)  # the list whole
    taken = runner.scanner.taken
    names = [f for f, _ in runner.scanner.queued if f in runner.reasons]
    names += sorted(f for f, _ in runner.reasons.items() if f not in taken)
    want = [
        statusfile._entry(f, taken[f].job.lane if f in taken else None, runner.reasons[f])  # type: ignore[union-attr]
        for f in names
    ]
    assert {e["reason"] for e in want} == {"requires", "lane-busy", "settling"} and len(want) == 48
    text = (queue_root / "waiting.json").read_text()
    assert text.endswith(',"queued":[' + ",".join(statusfile._encode(e) for e in want) + "]}\n")
    assert json.loads(text)["queued"] == want
    q.close()


def _scratch(q: Ticking) -> dict[str, dict]:
    """Every waiting job's entry as a whole waiting.json written now would list it, by job."""
    runner = q.runner
    taken = runner.scanner.taken
    return {
        f: statusfile._entry(f, taken[f].job.lane if f in taken else None, r)  # type: ignore[union-attr]
        for f, r in runner.reasons.items()
    }


def _seen(root: Path) -> tuple[dict[str, dict], list[tuple[str, int]]]:
    """What the readers see: every waiting job (`plan status --all`, watch, top: waiting.json and what is laid over
    it), and the summary's groups (`plan status`: status.json and heartbeat.json alone), as the agent sends them."""
    every = handlers.status(str(root), {"offset": -1})["status"]["queued"]
    grouped = handlers.status(str(root), {"offset": -1, "grouped": True})["status"]
    assert len(every) == len({e["job"] for e in every}) == grouped["waiting_count"]
    return {e["job"]: e for e in every}, [(g["reason"], g["count"]) for g in grouped["waiting_groups"]]


def _agrees(q: Ticking) -> None:
    every, groups = _seen(q.root)
    scratch = _scratch(q)
    assert every == scratch
    assert groups == [(g.reason, g.count) for g in group_waiting(scratch.values(), T0)]


def test_waiting_json_is_written_whole_only_past_a_bound_and_readers_see_every_change_meanwhile(
    queue_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changed entries ride in status.json (and heartbeat.json between sweeps) until more than the bound of them, or
    the oldest WHOLE_AGE_S old, have piled up: then the list is written whole. At every step each reader sees what a
    whole list written then would say."""
    monkeypatch.setattr(statusfile, "WHOLE_MIN", 5)  # whole_bound(30 waiting): 5
    _queue(queue_root, 30)
    q = Ticking(queue_root).start(T0)
    files = q.runner.statusfile
    q.tick(T0)
    assert files.lists == 1
    _agrees(q)
    ready = queue_root / "in"
    for i in range(3):  # three wait for the busy lane now, not for their REQUIRES
        (ready / f"{i:03d}").touch()
    q.tick(T0 + 10)
    assert files.lists == 1  # 3 changed: status.json carries them
    status = json.loads((queue_root / "status.json").read_text())
    assert [e["job"] for e in status["queued_set"]] == ["b-000.job", "b-001.job", "b-002.job"]
    assert status["listed"] == T0 and status["waiting_count"] == 30
    _agrees(q)
    q.procs.exit("a-run.job")  # its end's tick, between sweeps: b-000 starts; heartbeat.json carries the change
    q.runner.tick(T0 + 11, sweep=False)
    beat = json.loads((queue_root / "heartbeat.json").read_text())
    assert q.procs.running() == ["b-000.job"] and files.lists == 1
    assert "b-000.job" in beat["queued_gone"] and beat["queued_was"]["b-000.job"] == ["lane-busy", "a-run.job"]
    _agrees(q)
    for i in range(3, 6):
        (ready / f"{i:03d}").touch()
    q.tick(T0 + 20)  # b-000 to b-005 changed since the list: past the bound, written whole
    assert files.lists == 2
    assert json.loads((queue_root / "status.json").read_text())["queued_set"] == []
    _agrees(q)
    (ready / "001").unlink()  # back under the bound: one entry carried again
    q.tick(T0 + 30)
    assert files.lists == 2
    assert [e["job"] for e in json.loads((queue_root / "status.json").read_text())["queued_set"]] == ["b-001.job"]
    _agrees(q)
    writes = files.writes
    q.tick(T0 + 40)  # nothing changed: neither file is written
    assert (files.lists, files.writes) == (2, writes)
    _agrees(q)
    write_job(queue_root, "b-020.job", f"# LANE=net\n# REQUIRES=test -f {ready}/020\ntrue\n")  # its lane only
    q.tick(T0 + 50)
    assert files.lists == 2 and _seen(queue_root)[0]["b-020.job"]["lane"] == "net"
    _agrees(q)
    q.tick(T0 + 30 + statusfile.WHOLE_AGE_S)  # the entry carried since T0 + 30 is that old: written whole
    assert files.lists == 3
    _agrees(q)
    q.close()


def test_a_reader_sees_one_runner_s_view_whatever_write_a_kill_cut_off(
    queue_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner killed between waiting.json and status.json, or between status.json and heartbeat.json (the files
    of the tick before, laid beside the new ones), or replaced by another life: what a reader sees is one moment's."""
    monkeypatch.setattr(statusfile, "WHOLE_MIN", 5)
    _queue(queue_root, 30)
    q = Ticking(queue_root).start(T0)
    q.tick(T0)
    ready = queue_root / "in"
    for i in range(3):
        (ready / f"{i:03d}").touch()
    q.tick(T0 + 10)  # carried in status.json
    before = _scratch(q)
    names = ("waiting.json", "status.json", "heartbeat.json")
    old = {name: (queue_root / name).read_bytes() for name in names}
    for i in range(3, 9):
        (ready / f"{i:03d}").touch()
    q.tick(T0 + 20)  # past the bound: all three written
    assert q.runner.statusfile.lists == 2
    new = {name: (queue_root / name).read_bytes() for name in names}
    after = _scratch(q)
    # killed after waiting.json: the list is newer than status.json's, and read as it is
    (queue_root / "status.json").write_bytes(old["status.json"])
    (queue_root / "heartbeat.json").write_bytes(old["heartbeat.json"])
    every, groups = _seen(queue_root)
    assert every == after
    assert groups == [(g.reason, g.count) for g in group_waiting(before.values(), T0)]
    # killed after status.json: the heartbeat is older, and laid over nothing
    (queue_root / "status.json").write_bytes(new["status.json"])
    assert _seen(queue_root) == (after, [(g.reason, g.count) for g in group_waiting(after.values(), T0)])
    (queue_root / "heartbeat.json").write_bytes(new["heartbeat.json"])
    q.close()
    # another life: its first tick writes the list whole; until then the readers see the last life's
    again = Ticking(queue_root).start(T0 + 30)
    assert _seen(queue_root)[0] == after
    (ready / "000").unlink()
    again.tick(T0 + 30)
    assert again.runner.statusfile.lists == 1
    _agrees(again)
    again.close()


def test_a_status_json_not_written_after_its_list_is_written_with_the_next(queue_root: Path) -> None:
    _queue(queue_root, 30)
    q = Ticking(queue_root).start(T0)
    status = queue_root / "status.json"
    status.mkdir()  # no file can replace it: the tick writes waiting.json, then fails to write status.json
    q.tick(T0)
    assert q.runner.statusfile.lists == 1 and status.is_dir()
    status.rmdir()
    (queue_root / "in" / "000").touch()
    q.tick(T0 + 10)
    _agrees(q)
    q.close()


def test_a_summary_moved_on_groups_a_reason_as_a_whole_list_would() -> None:
    """A reason whose jobs come to wait on more than MAX_BLOCKERS blockers is one group, as group_waiting makes it."""
    entries = [
        {"job": f"b{i}.job", "lane": "cpu", "reason": "blocked", "blocker": f"p{i}", "since": T0 + i} for i in range(3)
    ]
    made = Summary(T0)
    for entry in entries:
        made.add(entry)
    listed = made.result()
    assert [(g["reason"], g["blocker"]) for g in listed["waiting_groups"]] == [("blocked", f"p{i}") for i in range(3)]
    came = {"job": "a.job", "lane": "cpu", "reason": "blocked", "blocker": "p9", "since": T0 - 1, "detail": ""}
    moved = patch(listed["waiting_groups"], listed["waiting_count"], [came], [], {})
    assert moved is not None
    whole = group_waiting([came, *entries], T0)
    assert (
        [(g["reason"], g["blocker"], g["count"], [w["job"] for w in g["oldest"]]) for g in moved[0]]
        == [(g.reason, g.blocker, g.count, [w.job for w in g.oldest]) for g in whole]
        == [("blocked", "", 4, ["a.job", "b0.job", "b1.job"])]
    )

"""Incidents driven in-process with an explicit clock: open once, repeat every --realert, recover, ack."""

from __future__ import annotations

import pytest

from plancompiler.watch import Rules, WatchState, evaluate
from plancompiler.watch.args import event_names, waiting_limits
from plancompiler.watch.incidents import AckError, Condition, Incident, ack, reconcile

DEAD = Condition("DEAD", "a9", "runner pid 7 is not running", "dead")


def kinds(alerts: list) -> list[str]:
    return [a.kind for a in alerts]


def test_an_incident_fires_once_repeats_every_realert_and_recovers() -> None:
    book: dict[str, Incident] = {}
    assert kinds(reconcile(book, [DEAD], 1000.0, {}, 600.0)) == ["DEAD"]
    assert reconcile(book, [DEAD], 1300.0, {}, 600.0) == []
    assert kinds(reconcile(book, [DEAD], 1600.0, {}, 600.0)) == ["DEAD"]
    assert reconcile(book, [DEAD], 1700.0, {}, 600.0) == []
    recovered = reconcile(book, [], 1745.0, {}, 600.0)
    assert kinds(recovered) == ["RECOVERED"] and book == {}
    assert recovered[0].detail == "DEAD a9 recovered after 12m25s (was: runner pid 7 is not running)"
    assert recovered[0].payload()["recovered"] == "DEAD" and recovered[0].payload()["lasted_s"] == 745.0
    # 45 s later it dies again: a new incident, sent at once whatever --realert says
    assert kinds(reconcile(book, [DEAD], 1790.0, {}, 3600.0)) == ["DEAD"]


def test_realert_per_kind_and_per_subject() -> None:
    book: dict[str, Incident] = {}
    parked = Condition("PARKED", "a9", "reboot", "parked")
    stall_a, stall_b = (Condition("STALL", j, f"{j} past WARN_AFTER", "warn-after") for j in ("a.job", "b.job"))
    assert kinds(reconcile(book, [parked, stall_a], 0.0, {"PARKED": 7200.0}, 600.0)) == ["PARKED", "STALL"]
    assert [a.subject for a in reconcile(book, [parked, stall_a, stall_b], 10.0, {"PARKED": 7200.0}, 600.0)] == [
        "b.job"
    ]
    assert kinds(reconcile(book, [parked, stall_a, stall_b], 700.0, {"PARKED": 7200.0}, 600.0)) == ["STALL", "STALL"]


def test_a_probe_that_could_not_judge_a_kind_leaves_its_incidents_open() -> None:
    book: dict[str, Incident] = {}
    stall = Condition("STALL", "a.job", "running for 2h", "net")
    reconcile(book, [stall], 0.0, {}, 600.0)
    assert reconcile(book, [], 60.0, {}, 600.0, judged=frozenset()) == []
    unreachable = Condition("UNREACHABLE", "a9", "5 probes in a row failed", "unreachable")
    assert kinds(reconcile(book, [unreachable], 120.0, {}, 600.0, judged=frozenset({"UNREACHABLE"}))) == ["UNREACHABLE"]
    assert set(book) == {"STALL:a.job", "UNREACHABLE:a9"}
    back = reconcile(book, [], 180.0, {}, 600.0)
    assert sorted(a.detail.split(" recovered")[0] for a in back) == ["STALL a.job", "UNREACHABLE a9"]


def test_ack_silences_until_the_incident_changes() -> None:
    book: dict[str, Incident] = {}
    blocked = Condition("BLOCKED", "84c.job", "no job produces x.json", "-:no job produces x.json")
    reconcile(book, [blocked], 0.0, {}, 60.0)
    assert ack(book, "blocked:84c", None, 10.0).subject == "84c.job"
    assert reconcile(book, [blocked], 1000.0, {}, 60.0) == []
    changed = Condition("BLOCKED", "84c.job", "its producer 84b.job failed", "84b.job:its producer 84b.job failed")
    assert kinds(reconcile(book, [changed], 1001.0, {}, 60.0)) == ["BLOCKED"]
    assert not book["BLOCKED:84c.job"].acked


def test_ack_for_a_time_then_repeats() -> None:
    book: dict[str, Incident] = {}
    reconcile(book, [DEAD], 0.0, {}, 600.0)
    ack(book, "DEAD", 8 * 3600.0, 0.0)
    assert reconcile(book, [DEAD], 4 * 3600.0, {}, 600.0) == []
    assert kinds(reconcile(book, [DEAD], 8 * 3600.0, {}, 600.0)) == ["DEAD"]
    assert kinds(reconcile(book, [], 8 * 3600.0 + 5, {}, 600.0)) == ["RECOVERED"]


def test_ack_refuses_what_it_cannot_pick() -> None:
    book: dict[str, Incident] = {}
    reconcile(book, [Condition("STALL", j, "slow", "net") for j in ("a.job", "b.job")], 0.0, {}, 60.0)
    with pytest.raises(AckError, match="did you mean 'STALL'") as unknown:
        ack(book, "STAL", None, 0.0)
    assert unknown.value.code == 2
    with pytest.raises(AckError, match="names 2 open incidents; say which: STALL:a.job, STALL:b.job") as two:
        ack(book, "STALL", None, 0.0)
    assert two.value.code == 1
    with pytest.raises(AckError, match=r"no open incident DEAD \(open: STALL:a.job, STALL:b.job\)"):
        ack(book, "DEAD", None, 0.0)
    assert not any(i.acked for i in book.values())


def _answer(
    now: float,
    queued: list[dict],
    running: list[dict] | None = None,
    lanes: dict | None = None,
    alive: bool = True,
    heartbeat: float | None = None,
) -> dict:
    status = {
        "runner": {"pid": 7, "heartbeat": now if heartbeat is None else heartbeat},
        "running": running or [],
        "queued": queued,
        "lanes": lanes or {},
        "parked": None,
    }
    return {"status": status, "now": now, "runner_alive": alive, "events": []}


def _wait(job: str, reason: str, since: float, blocker: str = "") -> dict:
    return {
        "job": job,
        "lane": "gpu",
        "reason": reason,
        "detail": f"{reason} detail",
        "blocker": blocker,
        "since": since,
    }


def test_waiting_is_judged_from_status_with_per_reason_limits() -> None:
    rules = Rules(idle_s=1e9, waiting_s=1800.0, waiting_by_reason={"gpu-foreign": 600.0})
    queued = [
        _wait("70-gpu.job", "gpu-foreign", 0.0, "pid 46458"),
        _wait("71-net.job", "exclusive", 0.0),
        _wait("72-cpu.job", "order", 0.0),
        _wait("73-gpu.job", "lane-busy", 0.0),
        _wait("74-gpu.job", "blocked", 0.0),
    ]
    fresh = WatchState()
    seen = evaluate(_answer(601.0, queued), fresh, rules, replay=False)
    waiting = [c for c in seen.conditions if c.kind == "WAITING"]
    assert [(c.subject, c.detail) for c in waiting] == [
        ("70-gpu.job", "70-gpu.job has waited 10m01s on gpu-foreign: gpu-foreign detail")
    ]
    assert [c.subject for c in seen.conditions if c.kind == "BLOCKED"] == ["74-gpu.job"]
    later = evaluate(_answer(1801.0, queued), fresh, rules, replay=False)
    assert sorted(c.subject for c in later.conditions if c.kind == "WAITING") == ["70-gpu.job", "71-net.job"]


def test_waiting_counts_from_first_seen_where_the_host_has_no_since() -> None:
    """Slurm's squeue gives no time a reason began: the watcher's own first sighting is the floor."""
    rules = Rules(idle_s=1e9, waiting_s=60.0)
    state = WatchState()
    for now in (0.0, 30.0, 59.0):
        assert not evaluate(_answer(now, [_wait("1.job", "requires", now)]), state, rules).conditions
    later = evaluate(_answer(61.0, [_wait("1.job", "requires", 61.0)]), state, rules)
    assert [c.kind for c in later.conditions] == ["WAITING"]
    # another blocker is another wait: it starts again
    other = evaluate(_answer(62.0, [_wait("1.job", "requires", 62.0, blocker="y")]), state, rules)
    assert other.conditions == []


def test_idle_is_judged_from_the_lanes_since_by_a_fresh_watcher() -> None:
    lanes = {"gpu": {"state": "idle", "since": 100.0}, "net": {"state": "idle", "since": 40.0}}
    seen = evaluate(_answer(800.0, [], lanes=lanes), WatchState(), Rules(idle_s=600.0))
    assert [(c.kind, c.detail) for c in seen.conditions] == [("IDLE", "nothing running for 11m40s, nothing queued")]
    assert evaluate(_answer(650.0, [], lanes=lanes), WatchState(), Rules(idle_s=600.0)).conditions == []


def test_a_dead_runner_is_not_also_idle_or_waiting() -> None:
    queued = [_wait("70-gpu.job", "gpu-foreign", 0.0)]
    seen = evaluate(_answer(5000.0, queued, alive=False), WatchState(), Rules(idle_s=1.0, waiting_s=1.0))
    assert [c.kind for c in seen.conditions] == ["DEAD"]
    assert seen.judged is not None and "WAITING" not in seen.judged and "IDLE" not in seen.judged


def test_event_and_reason_words_are_checked() -> None:
    assert event_names("failed,done", ["timeout"]) == ("failed", "done", "timeout")
    assert event_names("none", None) == ()
    with pytest.raises(ValueError, match="--events: unknown event 'faild'; did you mean 'failed'"):
        event_names("faild", None)
    with pytest.raises(ValueError, match="--wake-on: unknown event 'dnoe'; did you mean 'done'"):
        event_names(None, ["dnoe"])
    assert waiting_limits(["10m", "gpu-foreign=90s,requires=2h"], 1800.0) == (
        600.0,
        {"gpu-foreign": 90.0, "requires": 7200.0},
    )
    with pytest.raises(ValueError, match="did you mean 'gpu-foreign'"):
        waiting_limits(["gpu-foriegn=10m"], 1800.0)
    with pytest.raises(ValueError, match="'order' is not a reason a job waits on for long"):
        waiting_limits(["order=10m"], 1800.0)
    with pytest.raises(ValueError, match="--waiting: not a duration: 'soon'"):
        waiting_limits(["soon"], 1800.0)

"""A push's install left pending that the runner cannot finish is heard: an `install-stuck` event once per cause,
every lane's reason `install-pending` naming the error, the `install-stuck` incident; its end is said too."""

from __future__ import annotations

import json
from pathlib import Path

from runner import pushlock
from runner.agent import delivery
from runner.queue import fresh_status
from tests.inprocess import plan_main
from tests.ticking import Ticking

T0 = 1_000_000.0
JOB = "# LANE=cpu\ntrue\n"


def _lanes(root: Path) -> dict[str, dict[str, object]]:
    return fresh_status(root, json.loads((root / "status.json").read_text()))["lanes"]


def _incidents(ticking: Ticking) -> list[tuple[str, str]]:
    return [(e["what"], e["id"]) for e in ticking.events("incident")]


def test_an_install_that_cannot_be_finished_is_said_once_per_cause_and_its_end_too(tmp_path: Path) -> None:
    root = tmp_path / "q"
    delivery.install(str(root), {"files": {"old.job": JOB}, "record": {"plan": "p", "jobs": {}}})
    pushlock.release_lock()
    for name in ("b.job", "c.job"):  # where they land, a directory each: their renames fail, one after the other
        (root / "queue" / name).mkdir()
    files = {name: JOB for name in ("a.job", "b.job", "c.job")}
    try:
        delivery.install(str(root), {"files": files, "remove": [["queue", "old.job"]], "record": None})
    except IsADirectoryError:
        pass
    finally:
        pushlock.release_lock()
    assert (root / ".install.json").exists() and (root / "queue" / "a.job").exists(), "a.job landed, then b.job failed"
    ticking = Ticking(root, slots={"cpu": 2}, lanes=["cpu", "net"])
    try:
        ticking.start(T0)
        for t in range(0, 60, 10):  # six sweeps over the same cause
            ticking.tick(T0 + t)
        stuck = ticking.events("install-stuck")
        assert len(stuck) == 1, "once per cause, not every tick"
        assert "IsADirectoryError" in stuck[0]["error"] and "b.job" in stuck[0]["error"]
        assert not list((root / "running").iterdir()), "a.job waits for the install it is part of"
        lanes = _lanes(root)
        for lane in ("cpu", "net"):
            assert lanes[lane]["state"] == "waiting" and lanes[lane]["reason"] == "install-pending"
            assert "b.job" in str(lanes[lane]["blocker"])
        assert _incidents(ticking) == [("open", "install-stuck:install")]
        shown = plan_main("status", str(root), cwd=tmp_path, cache=tmp_path / "c")
        assert "cpu   0/2 slots busy (install-pending: IsADirectoryError" in shown.stdout, shown.stdout
        assert "WAITING" in shown.stdout and "a push's install cannot be finished" in shown.stdout

        (root / "queue" / "b.job").rmdir()  # the next cause: c.job's
        ticking.tick(T0 + 60).tick(T0 + 70)
        stuck = ticking.events("install-stuck")
        assert len(stuck) == 2 and "c.job" in stuck[1]["error"] and stuck[1]["stuck_s"] == 60.0
        assert "c.job" in str(_lanes(root)["cpu"]["blocker"])
        assert not list((root / "running").iterdir())

        (root / "queue" / "c.job").rmdir()
        ticking.tick(T0 + 80)
        finished = ticking.events("install-finished")
        assert [(e["by"], e["stuck_s"]) for e in finished] == [("the runner", 80.0)]
        assert not (root / ".install.json").exists() and not list(root.glob(".plan-stage-*"))
        assert sorted(ticking.procs.running()) == ["a.job", "b.job"], "finished, then started in name order"
        assert not (root / "queue" / "old.job").exists()
        assert _lanes(root)["cpu"]["reason"] != "install-pending" and _lanes(root)["net"]["state"] == "idle"
        assert _incidents(ticking) == [("open", "install-stuck:install"), ("recovered", "install-stuck:install")]
        ticking.tick(T0 + 90)
        assert len(ticking.events("install-stuck")) == 2 and len(ticking.events("install-finished")) == 1
    finally:
        ticking.close()

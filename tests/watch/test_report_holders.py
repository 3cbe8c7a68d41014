"""`plan report --html` from a real runner's events (issue 30): a waiting bar names what held the lane, with the
jobs that waited behind it in its tooltip; reruns are counted apart from retries."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import RunnerProcess, plan_cli, read_events, wait_for, write_job
from tests.watch.page import Page

pytestmark = pytest.mark.usefixtures("plan_env")


def _plan(tmp_path: Path, says: str) -> Path:
    gate, out = tmp_path / "gate", tmp_path / "out"
    path = tmp_path / "p.yaml"
    path.write_text(
        "plan: p\njobs:\n"
        f"  - name: 1-net-dl\n    lane: net\n    run: while [ ! -e {gate} ]; do sleep 0.05; done\n"
        "  - name: 5a-gpu\n    lane: gpu\n    run: 'true'\n"
        f"  - name: r\n    lane: cpu\n    retries: 2\n    run: if [ ! -e {out}/tried ]; then touch {out}/tried; exit 1; fi\n"
        f"  - name: d\n    lane: cpu\n    run: echo {says} > {out}/d\n    outputs: [{out}/d]\n"
    )
    return path


def _past(ts: str) -> None:
    wait_for(lambda: time.strftime("%Y-%m-%d %H:%M:%S") > ts, 3)


def _count(root: Path, event: str, job: str) -> int:
    return len([e for e in read_events(root) if e["event"] == event and e["job"] == job])


def test_waiting_bars_name_the_holder_and_reruns_are_not_retries(tmp_path: Path) -> None:
    root = tmp_path / "q"
    (tmp_path / "out").mkdir()
    assert plan_cli("push", str(root), str(_plan(tmp_path, "v1")))[0] == 0
    runner = RunnerProcess(root).start("--backoff-base", "0.1")
    try:
        wait_for(lambda: _count(root, "done", "r.job") and _count(root, "done", "d.job"), 20)
        first = runner.wait_event("lane", lane="gpu", state="waiting", job="5a-gpu.job")
        _past(first["ts"])  # events are timed to the second: each wait lasts into the next one
        write_job(root, "4-gpu.job", "# LANE=gpu\ntrue\n")  # sorts first: the lane's next job changes, its holder not
        second = runner.wait_event("lane", lane="gpu", state="waiting", job="4-gpu.job")
        _past(second["ts"])
        (tmp_path / "gate").touch()
        wait_for(lambda: _count(root, "done", "5a-gpu.job"), 20)
        assert plan_cli("push", str(root), str(_plan(tmp_path, "v2")))[0] == 0  # d changed: it runs again
        wait_for(lambda: _count(root, "done", "d.job") == 2, 20)
    finally:
        runner.stop()
    page_path = tmp_path / "report.html"
    code, out = plan_cli("report", str(root), "--html", str(page_path))
    assert code == 0, out
    page = Page()
    page.feed(page_path.read_text())
    waiting = [b for b in page.bars if b["data-state"] == "waiting" and b.get("data-holder") == "1-net-dl.job"]
    assert len(waiting) == 1, page.bars  # one bar for one holder, however the waiting job changed behind it
    assert "exclusive: held by 1-net-dl.job; 5a-gpu.job, 4-gpu.job wait" in waiting[0]["title"]
    jobs = {row[0]: row for row in page.tables["jobs"][1:]}
    header = page.tables["jobs"][0]
    retries, reruns = header.index("retries"), header.index("reruns")
    assert (jobs["r.job"][retries], jobs["r.job"][reruns]) == ("1", "0")
    assert (jobs["d.job"][retries], jobs["d.job"][reruns]) == ("0", "1")
    text = plan_cli("report", str(root))[1]
    lines = {line.split()[0]: " ".join(line.split()[1:]) for line in text.splitlines() if line.startswith("  ")}
    assert lines["r.job"].startswith("cpu 2 attempts (1 retry) done")
    assert lines["d.job"].startswith("cpu 2 attempts (1 rerun) done")

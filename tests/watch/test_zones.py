"""Time across zones: a box in Asia/Tokyo reported from a workstation in America/Los_Angeles gives the figures
the box gives itself, for the runner's events (their epoch `t`) and for the seed's zone-less ones (read in the
zone the agent reports). Real runner and agent processes in their own TZ, over the loopback sshd."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RunnerProcess, write_job
from tests.inprocess import plan_main
from tests.sshd import Sshd


@pytest.fixture
def in_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Set this process's zone (TZ and time.tzset); put back afterwards."""

    def set_zone(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield set_zone
    monkeypatch.undo()
    time.tzset()


def _figures(report: dict) -> tuple:
    job = report["jobs"]["a.job"]
    return (job["outcome"], job["durations"], round(job["busy_s"], 1), round(report["lanes"]["cpu"]["busy_s"], 1))


def test_a_tokyo_box_reported_from_los_angeles_gives_the_box_s_figures(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess, sshd: Sshd, in_zone
) -> None:
    in_zone("Asia/Tokyo")  # the runner (started from here) runs in Tokyo
    write_job(queue_root, "a.job", "sleep 1\n")
    runner.start()
    runner.wait_event("done")
    runner.stop()

    python = tmp_path / "tokyo-python"  # the box's agent, in the box's zone
    python.write_text(f'#!/bin/sh\nTZ=Asia/Tokyo exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        f"hosts:\n  a9:\n    ssh: testbox\n    root: {queue_root}\n    python: {python}\n"
        f"    ssh_options: [-F, {sshd.config}]\n"
    )
    for seed_format in (False, True):
        if seed_format:  # the seed's events: no epoch, a naive local time of the box
            lines = (queue_root / "events.jsonl").read_text().splitlines()
            events = [{k: v for k, v in json.loads(line).items() if k != "t"} for line in lines]
            (queue_root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        in_zone("Asia/Tokyo")  # the box reads its own events
        on_box = plan_main("report", str(queue_root / "events.jsonl"), "--json", cwd=tmp_path, cache=tmp_path / "c")
        assert on_box.returncode == 0, on_box.stderr
        tokyo = json.loads(on_box.stdout)
        in_zone("America/Los_Angeles")
        got = plan_main("report", "a9", "--hosts", str(hosts), "--json", cwd=tmp_path, cache=tmp_path / "c")
        assert got.returncode == 0, got.stderr
        far = json.loads(got.stdout)
        assert _figures(far) == _figures(tokyo), seed_format
        assert _figures(far)[0] == "done" and 0.9 <= _figures(far)[2] < 30
        span = [s for s in far["spans"] if s["job"] == "a.job" and s["state"] == "busy"]
        assert span and all(s["seconds"] >= 0 for s in far["spans"]) and span[0]["seconds"] < 30
        assert os.environ["TZ"] == "America/Los_Angeles"

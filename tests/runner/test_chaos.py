"""kill -9 the runner at random moments over a 30-job plan (short form of bench/chaos.py, which does 50)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import run


@pytest.mark.long
def test_kill_9_at_random_loses_nothing_runs_nothing_twice(tmp_path: Path) -> None:
    out = run(kills=8, jobs=30, seed=7, root=tmp_path)
    assert out.kills == 8
    assert out.lost == [] and out.double_runs == [] and out.reruns_of_finished == [] and out.leftovers == []
    # The kills did land while jobs ran: some ended while the runner was down and were recorded as they ended.
    assert out.kills_mid_plan > 0 and out.recorded_while_down + out.interrupted_reruns > 0

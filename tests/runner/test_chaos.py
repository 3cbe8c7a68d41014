"""kill -9 the runner at random moments over a 30-job plan (short form of bench/chaos.py, which does 50)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import run


@pytest.mark.long
def test_kill_9_at_random_loses_nothing_runs_nothing_twice(tmp_path: Path) -> None:
    out = run(kills=8, jobs=30, seed=7, root=tmp_path)
    assert out.kills == 8
    assert (out.lost, out.double_runs, out.reruns_of_finished, out.leftovers) == ([], [], [], []), out.details
    # The kills did land while jobs ran: some ended while the runner was down and were recorded as they ended.
    assert out.kills_mid_plan > 0 and out.recorded_while_down + out.interrupted_reruns > 0


def test_the_judge_tells_a_finished_run_from_one_a_runner_life_ended(tmp_path: Path) -> None:
    """A run that wrote its last line and was then run again is a finished job re-run, unless a new runner life
    ended it (its pid in orphans-killed): a TERM that lands while bash runs its last `exit` ends it without its
    trap's line. The judge's report names the runs and events of each job it flags."""
    import json

    from bench.chaos import Outcome, _judge

    root = tmp_path / "q"
    (root / "done").mkdir(parents=True)
    (root / "done" / "a.job").touch()
    (root / "runs.log").write_text("start a.job 10 1.0\nend a.job 10 2.0\nstart a.job 20 3.0\nend a.job 20 4.0\n")
    killed = {"ts": "-", "job": "-", "event": "orphans-killed", "pids": [10, 11], "t": 2.5}
    for events, flagged in (([], ["a.job"]), ([killed], [])):
        (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        out = Outcome()
        _judge(root, {"a.job": "done"}, out)
        assert out.reruns_of_finished == flagged and out.lost == [] and out.double_runs == []
        assert out.interrupted_reruns == len(events)
        assert [d.splitlines()[0] for d in out.details] == flagged
        if flagged:
            assert "  run 10: {'start': 1.0, 'end': 2.0}" in out.details[0].splitlines()

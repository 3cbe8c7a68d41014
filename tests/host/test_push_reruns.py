"""`plan push` says what runs again when it is a retry or a take-over that sends a job back (a new user's trial):
never `nothing will run again` while one will; and 3 000 jobs another plan holds are one refusal, not 3 000 lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import RunnerProcess, plan_cli, read_events, wait_for

pytestmark = pytest.mark.usefixtures("plan_env")


def _json(out: str) -> dict:
    return json.loads(out[out.index("{") : out.rindex("}") + 1])  # stderr's check summary comes first


def _count(root: Path, event: str, job: str) -> int:
    return len([e for e in read_events(root) if e["event"] == event and e["job"] == job])


def test_a_retried_failed_job_is_said_to_run_again_and_does(tmp_path: Path) -> None:
    """f0 (no DONE_IF) surely runs again; f1's DONE_IF (its output) may hold after a failed run, so it decides."""
    root, plan = tmp_path / "q", tmp_path / "blk.yaml"
    plan.write_text(
        "plan: blk\njobs:\n"
        "  - {name: f0, run: 'exit 4'}\n"
        f"  - {{name: f1, run: 'exit 5', outputs: [{tmp_path}/f1.txt]}}\n"
        f"  - {{name: f3, lane: gpu, run: 'touch {tmp_path}/f3.txt', outputs: [{tmp_path}/f3.txt]}}\n"
    )
    assert plan_cli("push", str(root), str(plan))[0] == 0
    with RunnerProcess(root).start() as runner:
        for job in ("f0.job", "f1.job", "f3.job"):
            runner.wait_event("failed" if job != "f3.job" else "done", job=job)
    code, out = plan_cli("push", str(root), str(plan), "--retry-failed")
    assert code == 0, out
    assert "nothing will run again" not in out
    lines = out.splitlines()
    at = lines.index("  runs again (2 jobs):")
    assert lines[at + 1 : at + 3] == ["  r  f0.job  (attempts reset)", "  r  f1.job  (attempts reset)"]
    assert "  will run again: f0.job" in lines
    assert "  retried, runs unless its DONE_IF holds already: f1.job" in lines
    with RunnerProcess(root).start():
        wait_for(lambda: _count(root, "start", "f0.job") == 2 and _count(root, "start", "f1.job") == 2, 20)
    assert _count(root, "start", "f3.job") == 1


def test_a_retried_job_whose_stamp_is_stale_surely_runs_again(tmp_path: Path) -> None:
    """a was done (stamped), changed and failed: its output still holds its DONE_IF, but its stamp is of other
    content, so --retry-failed runs it whatever its DONE_IF says, and the summary says so."""
    root, plan, out_file = tmp_path / "q", tmp_path / "p.yaml", tmp_path / "a.txt"

    def write(body: str) -> None:
        plan.write_text(f"plan: p\njobs:\n  - {{name: a, run: '{body}', outputs: [{out_file}]}}\n")

    write(f"echo v1 > {out_file}")
    assert plan_cli("push", str(root), str(plan))[0] == 0
    with RunnerProcess(root).start() as runner:
        runner.wait_event("done", job="a.job")
        write(f"echo v2 > {out_file}; exit 3")
        code, out = plan_cli("push", str(root), str(plan))
        assert code == 0 and "will run again: a.job" in out, out
        runner.wait_event("failed", job="a.job")
    answer = _json(plan_cli("push", str(root), str(plan), "--retry-failed", "--json", "--dry-run")[1])
    assert answer["reruns"] == ["a.job"] and answer["maybe_reruns"] == []
    code, out = plan_cli("push", str(root), str(plan), "--retry-failed")
    assert code == 0, out
    lines = out.splitlines()
    assert "  will run again: a.job" in lines and "nothing will run again" not in out
    at = lines.index("  runs again (1 job, 3 B of outputs to redo):")  # what it redoes, as other reruns say
    assert lines[at + 1] == "  r  a.job  (attempts reset)  [3 B]"
    with RunnerProcess(root).start():
        wait_for(lambda: _count(root, "start", "a.job") == 3, 20)


def test_a_taken_over_done_job_is_said_to_run_again_and_does(tmp_path: Path) -> None:
    root = tmp_path / "q"
    (root / "queue").mkdir(parents=True)
    (root / "queue/hh.job").write_text("# LANE=cpu\necho hand\n")  # hand-written: no PLAN= header
    with RunnerProcess(root).start() as runner:
        runner.wait_event("done", job="hh.job")
    plan = tmp_path / "hp.yaml"
    plan.write_text("plan: hp\njobs:\n  - {name: hh, run: 'echo plan'}\n")
    code, out = plan_cli("push", str(root), str(plan), "--take-over")
    assert code == 0, out
    lines = out.splitlines()
    at = lines.index("  runs again (1 job):")
    assert lines[at + 1] == (
        "  ~  hh.job  (taken over from a hand-written job; attempts reset; done before; content changed, queued again)"
    )
    assert "  will run again: hh.job" in lines and "nothing will run again" not in out
    with RunnerProcess(root).start():
        wait_for(lambda: _count(root, "done", "hh.job") == 2, 20)


def test_jobs_another_plan_holds_are_one_refusal_with_the_count_and_json_lists_them_all(tmp_path: Path) -> None:
    root = tmp_path / "q"
    body = "jobs:\n  - name: \"j-{{ '%05d' | format(i) }}\"\n    foreach: {i: {range: [0, 3000]}}\n    run: 'true'\n"
    big, other = tmp_path / "big.yaml", tmp_path / "other.yaml"
    big.write_text("plan: big\n" + body)
    other.write_text("plan: other\n" + body)
    assert plan_cli("push", str(root), str(big))[0] == 0
    code, out = plan_cli("push", str(root), str(other))
    assert code == 1
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and len(out.splitlines()) < 10, out
    assert errors[0].startswith(
        "error: 3000 jobs (j-00000.job, j-00001.job, j-00002.job, j-00003.job, j-00004.job, and 2995 more) "
        "in queue/ belong to plan big, pushed by "
    )
    assert errors[0].endswith(": plan other will not replace them; push with --take-over to move them to other")
    assert "  " not in out.splitlines()  # no line of two spaces where the counts of a refused push would be
    code, out = plan_cli("push", str(root), str(other), "--json", "--dry-run")
    answer = _json(out)
    assert len(answer["errors"]) == 1 and len(answer["refused"]) == 3000
    assert answer["refused"][0] == {"job": "j-00000.job", "state": "queue", "plan": "big"}
    assert sorted(r["job"] for r in answer["refused"]) == [f"j-{i:05d}.job" for i in range(3000)]

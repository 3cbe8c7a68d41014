"""The Slurm backend's records at their JSON boundary (runner.slurm.records): the ledger and an attempt's result
file parse to typed records or a located error, and write back the same JSON. No cluster needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from runner.records import replaced
from runner.slurm import ledger as ledger_mod
from runner.slurm.records import (
    Attempt,
    JobRecord,
    Ledger,
    PlanEntry,
    RecordError,
    parse_ledger,
)
from runner.slurm.result import AttemptResult, parse_result
from tests.conftest import REPO

WRITTEN = {
    "version": 2,
    "generation": 3,
    "plans": {
        "lf": {
            "by": "me@box",
            "pushed_at": "2026-12-03 10:00:00",
            "lanes": {"net": ["net:1"]},
            "jobs": {
                "p1": {
                    "hash": "abc",
                    "lane": "net",
                    "deps": ["p0"],
                    "slurm_name": "lf/p1",
                    "attempts": [
                        {
                            "id": 12,
                            "hash": "abc",
                            "attempt": 1,
                            "submitted": 1.5,
                            "state": "FAILED",
                            "result": True,
                            "kind": "failed",
                            "rc": 3,
                            "tail": ["boom"],
                            "wait_s": 30.0,
                            "moved": ["14"],
                            "bundle": "/r/scripts/lf/bundle.1.json",
                            "entry": 0,
                        },
                        {"id": 13, "hash": "abc", "attempt": 2, "submitted": 2.0, "state": None, "after": "failed"},
                        {
                            "id": "20_3",
                            "hash": "abc",
                            "attempt": 1,
                            "submitted": None,
                            "state": None,
                            "slurm_name": "lf/a..d",
                        },
                    ],
                }
            },
        }
    },
    "seen": {"12:end": True},
}


def test_a_ledger_parses_to_typed_records_and_writes_back_the_same_json() -> None:
    ledger = parse_ledger(json.loads(json.dumps(WRITTEN)))
    assert isinstance(ledger, Ledger), ledger
    record = ledger.plans["lf"].jobs["p1"]
    assert isinstance(record, JobRecord) and record.deps == ("p0",) and record.lane == "net"
    first, second, third = record.attempts
    assert first == Attempt(
        id=12,
        hash="abc",
        submitted=1.5,
        state="FAILED",
        result=True,
        kind="failed",
        rc=3,
        tail=("boom",),
        wait_s=30.0,
        moved=("14",),
        bundle="/r/scripts/lf/bundle.1.json",
        entry=0,
    )
    assert second.attempt == 2 and second.after == "failed" and third.id == "20_3" and record.current is third
    assert ledger.to_json() == WRITTEN


def test_a_ledger_field_of_the_wrong_kind_is_a_located_error() -> None:
    for path, value, where, said in (
        (
            ("plans", "lf", "jobs", "p1", "attempts", 1, "attempt"),
            "2",
            "plans.lf.jobs.p1.attempts[1].attempt",
            "an integer",
        ),
        (("plans", "lf", "jobs", "p1", "attempts", 0, "tail"), "boom", "plans.lf.jobs.p1.attempts[0].tail", "a list"),
        (("plans", "lf", "jobs", "p1", "deps"), [7], "plans.lf.jobs.p1.deps[0]", "a string"),
        (
            ("plans", "lf", "jobs", "p1", "attempts", 0, "sate"),
            "FAILED",
            "plans.lf.jobs.p1.attempts[0]",
            "unknown key 'sate'",
        ),
        (("plans", "lf", "jobs", "p1", "attempts", 2, "id"), None, "", ""),  # a LOST job's attempt has no id
    ):
        raw = json.loads(json.dumps(WRITTEN))
        holder = raw
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value
        found = parse_ledger(raw)
        if not where:
            assert isinstance(found, Ledger), found
            continue
        assert isinstance(found, RecordError) and found.where == where and said in found.message, found
        assert str(found).startswith(f"{where}: ")
    assert parse_ledger({"version": 1, "plans": {}}) == RecordError("", "not a version-2 ledger")
    assert parse_ledger([]) == RecordError("", "not a version-2 ledger")


def test_a_ledger_this_version_cannot_read_is_distrusted_naming_where_and_its_backup_read(tmp_path: Path) -> None:
    """Never read as empty, never a traceback: the push rebuilds it (runner.slurm.rebuild) and says why."""
    (tmp_path / "scripts").mkdir()
    bad = json.loads(json.dumps(WRITTEN))
    bad["plans"]["lf"]["jobs"]["p1"]["attempts"][0]["rc"] = "3"
    (tmp_path / "slurm.json").write_text(json.dumps(bad))
    ledger, why = ledger_mod.read(str(tmp_path))
    assert ledger == Ledger() and why == (
        "slurm.json is not a ledger this version wrote (plans.lf.jobs.p1.attempts[0].rc: an integer was expected, "
        "not str)"
    )
    (tmp_path / "slurm.json.1").write_text(json.dumps(WRITTEN))
    ledger, why = ledger_mod.read(str(tmp_path))
    assert ledger.generation == 3 and why.endswith("its previous generation (slurm.json.1) was read"), why
    ledger_mod.save(str(tmp_path), ledger)  # the damaged file is not kept over the good backup
    assert json.loads((tmp_path / "slurm.json").read_text()) == {**WRITTEN, "generation": 4}
    assert json.loads((tmp_path / "slurm.json.1").read_text()) == WRITTEN


def test_an_attempts_result_file_parses_and_is_folded_into_its_attempt(tmp_path: Path) -> None:
    result = AttemptResult(id=13, attempt=2, start=5.0, end=9.0, kind="failed", state="FAILED", rc=1, tail=("x",))
    result = replaced(result, next_attempt=3, next_id=15, wait_s=60.0, moved=("16",))
    written = result.to_json()
    assert written["next_id"] == 15 and written["moved"] == ["16"] and "retry_due" not in written
    assert parse_result(json.loads(json.dumps(written))) == result
    assert parse_result({"attempt": 1}, "r/13.json") == RecordError("r/13.json", "no 'id'")
    assert parse_result({"id": 13, "end": "soon"}, "r/13.json") == RecordError(
        "r/13.json.end", "a number was expected, not str"
    )

    raw = json.loads(json.dumps(WRITTEN))
    del raw["plans"]["lf"]["jobs"]["p1"]["attempts"][2]  # attempt 13 is the current one
    ledger = parse_ledger(raw)
    assert isinstance(ledger, Ledger)
    (tmp_path / "results" / "lf" / "p1").mkdir(parents=True)
    (tmp_path / "results" / "lf" / "p1" / "13.json").write_text(json.dumps(written))
    folded = ledger_mod.fold_results(str(tmp_path), ledger)
    assert folded == [("lf", "p1", result)]
    attempts = ledger.plans["lf"].jobs["p1"].attempts
    assert attempts[1].result and attempts[1].state == "FAILED" and attempts[1].tail == ("x",)
    assert attempts[-1] == Attempt(id=15, hash="abc", attempt=3, submitted=9.0, after="failed")


def test_a_ledger_older_than_the_result_files_is_told_from_one_that_only_lags_their_chain(tmp_path: Path) -> None:
    """Result files of attempts the ledger reaches by their next-try chain are folded in (the ledger lags, as
    between contacts); one it cannot reach, or of a job it lacks, says the ledger is older than Slurm's truth."""
    from runner.slurm.rebuild import untracked

    raw = json.loads(json.dumps(WRITTEN))
    del raw["plans"]["lf"]["jobs"]["p1"]["attempts"][2]
    ledger = parse_ledger(raw)
    assert isinstance(ledger, Ledger)
    results = tmp_path / "results" / "lf" / "p1"
    results.mkdir(parents=True)
    (results / "12.json").write_text(json.dumps(AttemptResult(id=12, state="FAILED").to_json()))
    (results / "13.json").write_text(json.dumps(AttemptResult(id=13, kind="failed", next_id=15).to_json()))
    (results / "15.json").write_text(json.dumps(AttemptResult(id=15, attempt=3, state="COMPLETED").to_json()))
    ledger_mod.fold_results(str(tmp_path), ledger)
    assert [a.id for a in ledger.plans["lf"].jobs["p1"].attempts] == [12, 13, 15]
    assert untracked(str(tmp_path), ledger, {}) == []
    (results / "14.json").write_text(json.dumps(AttemptResult(id=14).to_json()))  # a try the ledger never saw
    (tmp_path / "results" / "lf" / "p9").mkdir()
    (tmp_path / "results" / "lf" / "p9" / "20_1.json").write_text("{}")
    assert untracked(str(tmp_path), ledger, {}) == ["lf/p1 (14)", "lf/p9 (20_1)"]


def test_a_job_squeue_has_that_a_failed_attempts_result_expected_is_taken_as_its_next_try(tmp_path: Path) -> None:
    """The wrapper's sbatch said it failed (the controller stopped answering) and the controller took the job
    later: squeue's job is that next try (attempt 2, after FAILED), not a new first attempt, and none is due."""
    from runner.slurm.rebuild import from_squeue, untracked
    from runner.slurm.records import LiveJob

    failed = Attempt(id=1, hash="h", result=True, kind="failed", state="FAILED", retry_due=5.0, next_attempt=2)
    ledger = Ledger(
        plans={"cd": PlanEntry(jobs={"flaky": JobRecord(hash="h", slurm_name="cd/flaky", attempts=(failed,))})}
    )
    ghost = LiveJob(3, "3", "cd/flaky", "PENDING", "BeginTime", "cd", "h", "", None, None, None, 9.0, 0, str(tmp_path))
    assert untracked(str(tmp_path), ledger, {3: ghost}) == ["cd/flaky (3)"]
    assert from_squeue(str(tmp_path), ledger, {3: ghost}) == ["cd/flaky (3)"]
    first, second = ledger.plans["cd"].jobs["flaky"].attempts
    assert first == replace(failed, next_id=3, retry_due=None, cause="FAILED")
    assert second == Attempt(id=3, hash="h", attempt=2, submitted=9.0, after="failed")
    assert untracked(str(tmp_path), ledger, {3: ghost}) == []


def test_an_array_element_is_told_by_its_arrays_name_where_sacct_has_no_comment(tmp_path: Path) -> None:
    """FIRST..LAST or the group's name (`e*`): the element's job where every members file it can be agrees."""
    from runner.slurm.rebuild import element_by_name

    scripts = tmp_path / "scripts" / "p"
    scripts.mkdir(parents=True)
    (scripts / "array.1.json").write_text(json.dumps([["e0", "h0"], ["e1", "h1"], ["e2", "h2"]]))
    (scripts / "array.2.json").write_text(json.dumps([["e0", "g0"], ["e1", "g1"], ["e2", "h2"]]))  # pushed again
    (scripts / "array.3.json").write_text(json.dumps([["x0", "k0"], ["x1", "k1"]]))
    assert element_by_name(str(tmp_path), "p", "e0..e2", "2") == ("e2", "h2")
    assert element_by_name(str(tmp_path), "p", "e*", "1") == ("e1", None)  # the hash as the newest body says
    assert element_by_name(str(tmp_path), "p", "x*", "1") == ("x1", "k1")
    assert element_by_name(str(tmp_path), "p", "e0..e2", "3") is None
    (scripts / "array.4.json").write_text(json.dumps([["e3", "h3"], ["e4", "h4"]]))  # another chunk of e*
    assert element_by_name(str(tmp_path), "p", "e*", "1") is None  # e1 or e4: cannot be told


def test_the_agents_answers_are_typed_where_they_reach_the_workstation_and_a_malformed_one_is_located() -> None:
    import pytest

    from plancompiler.backends.slurm import outcome_lines
    from plancompiler.backends.slurmanswer import history_answer, push_answer
    from plancompiler.errors import AgentError

    answer = push_answer(
        {
            "changes": [["+", "a", ""], ["=", "b", "pending as 7_1"]],
            "submitted": {"a": 9},
            "repointed": {"a": ["12"]},
            "cancelled": [8, "7_2"],
            "accounting": "on",
            "a key a newer agent adds": 1,
        },
        "lab (login)",
    )
    assert answer.changes == (("+", "a", ""), ("=", "b", "pending as 7_1")) and answer.cancelled == (8, "7_2")
    assert outcome_lines(answer) == (
        ["pushed: 1 submitted"],
        ["  submitted a.job as 9", "  re-pointed 1 pending dependents of a.job to 9: 12", "  cancelled 8 7_2"],
    )
    assert push_answer({"error": "locked"}, "lab").changes is None  # refused before any diff
    with pytest.raises(AgentError) as bad:
        push_answer({"changes": [["+", "a"]], "submitted": {}}, "lab (login)")
    assert str(bad.value).startswith("lab (login): the agent's push answer is malformed at changes.0.2: ")
    assert bad.value.code == 1 and bad.value.where == "lab (login)"
    with pytest.raises(AgentError, match=r"^lab: the agent's history answer is malformed at events: "):
        history_answer({"events": "none"}, "lab")
    history = history_answer({"accounting": True, "events": [{"job": "p/a.job"}], "plans": ["p"]}, "lab")
    assert history.accounting and history.events == ({"job": "p/a.job"},) and history.plans == ("p",)


def test_a_bundle_element_reads_to_a_typed_element_located_in_its_bundle_and_writes_back_the_same_json(
    tmp_path: Path,
) -> None:
    from runner.slurm.bundle import Element, PushJob, find_element, read_element
    from runner.slurm.request import PushRequest
    from runner.slurm.wrapper import element, write_bundle

    job = PushJob(name="p1", hash="abc", text="echo hi\n", env={"A": "1"}, retries=2, timeout_s=30)
    made = element(str(tmp_path), "lf", job, PushRequest("lf", slurm_conf="/etc/slurm.conf", gate_interval_s=5))
    path = write_bundle(str(tmp_path), "lf", [made, replaced(made, name="p2", gate="test -e x")])
    written = json.loads(path.read_text())["elements"]
    assert written[0] == made.to_json() and written[0]["sbatch"] == list(made.sbatch) and written[0]["timeout_s"] == 30
    assert set(written[0]) == {
        "root", "plan", "name", "hash", "text", "body", "log", "env", "slurm_conf", "retries", "timeout_s",
        "kill_after_s", "done_if", "gate", "gate_interval_s", "backoff_base_s", "backoff_max_s", "sbatch",
    }  # fmt: skip
    second = read_element(str(path), 1)
    assert isinstance(second, Element) and second == replaced(
        made, name="p2", gate="test -e x", bundle=str(path), entry=1
    )
    assert find_element(str(path), "p2", "abc") == second and find_element(str(path), "p2", "abd") is None
    assert read_element(str(path), 2) == RecordError(str(path), "no element 2")

    for key, value, where, said in (
        ("retries", "2", "elements[0].retries", "an integer"),
        ("env", {"A": 1}, "elements[0].env.A", "a string"),
        ("sbatch", ["-p", 3], "elements[0].sbatch[1]", "a string"),
        ("sabtch", [], "elements[0]", "unknown key 'sabtch'"),
        ("body", None, "elements[0]", "no 'body'"),
    ):
        bad = dict(written[0], **{key: value})
        if value is None:
            del bad[key]
        path.write_text(json.dumps({"elements": [bad]}))
        found = read_element(str(path), 0)
        assert isinstance(found, RecordError) and found.where == f"{path}: {where}" and said in found.message, found
        assert find_element(str(path), "p1", "abc") is None
    # the attempt's wrapper given that element says where and why, and runs nothing
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ran = subprocess.run(
        [sys.executable, "-m", "runner.slurm.attempt", str(path), "1", "0"], env=env, capture_output=True, text=True
    )
    assert ran.returncode == 2 and ran.stderr == f"runner.slurm.attempt: {path}: elements[0]: no 'body'\n", ran
    assert not (tmp_path / "results").exists()


def test_a_push_requests_jobs_read_to_typed_jobs_or_a_located_error_answered_before_anything_is_touched(
    tmp_path: Path,
) -> None:
    from runner.errors import AgentError
    from runner.slurm.agent import push
    from runner.slurm.bundle import PushJob, parse_jobs

    raw = {"name": "p1", "hash": "abc", "text": "true\n", "deps": ["p0"], "group": 3, "timeout_s": 30, "env": {}}
    assert parse_jobs([raw, {"name": "p2", "hash": "d", "text": ""}]) == (
        PushJob(name="p1", hash="abc", text="true\n", deps=("p0",), group=3, timeout_s=30),
        PushJob(name="p2", hash="d", text=""),
    )
    for jobs, where, said in (
        ({"p1": raw}, "jobs", "a list"),
        ([raw, dict(raw, deps=["p0", 3])], "jobs[1].deps[1]", "a string"),
        ([dict(raw, lnae="cpu")], "jobs[0]", "unknown key 'lnae'"),
        ([{"name": "p1", "text": ""}], "jobs[0]", "no 'hash'"),
        ([dict(raw, env={"A": 1})], "jobs[0].env.A", "a string"),
    ):
        found = parse_jobs(jobs)
        assert isinstance(found, RecordError) and found.where == where and said in found.message, found
    with pytest.raises(AgentError) as refused:  # answered {"error": ...} by runner.agent.dispatch
        push(str(tmp_path), {"plan": "lf", "jobs": [dict(raw, retries="2")]})
    assert refused.value.answer() == {"error": "the push request's jobs[0].retries: an integer was expected, not str"}
    assert list(tmp_path.iterdir()) == []  # no lock taken, no ledger written

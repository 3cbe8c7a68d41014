"""The Slurm push request and status answer at the wire (runner.slurm.request, runner.slurm.statusitems): what one
side writes the other reads back as the same frozen values; what the other side sends wrongly is a located error,
answered before anything is touched (the agent) or said naming the host, never a traceback (the workstation)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runner.slurm.request import PushJob, PushRequest, parse_push_request
from runner.slurm.statusitems import Counts, Lane, RecordError, Running, SlurmStatus, Waiting, parse_status_answer
from tests.conftest import plan_cli
from tests.sshd import Sshd

JOB = PushJob(
    name="p1",
    hash="abc",
    text="true\n",
    deps=("p0",),
    lane="net",
    group=2,
    family="p*",
    done_if="test -e out",
    retries=3,
    timeout_s=30.0,
    default_time="1:00:00",
    env={"A": "1"},
    sbatch=("--licenses=net:1",),
)
REQUEST = PushRequest(
    "lf", (JOB,), external=("/data",), retry_failed=True, by="me@ws", slurm_conf="/etc/slurm.conf", keep=True
)


def test_a_push_request_reads_back_as_written_and_an_older_clients_with_the_defaults() -> None:
    wire = json.loads(json.dumps(REQUEST.to_json()))
    assert set(wire) == {
        "backend", "slurm_conf", "plan", "jobs", "external", "retry_failed", "prune", "dry_run", "verify_external",
        "create", "by", "lock_wait_s", "gate_interval_s", "backoff_base_s", "backoff_max_s", "keep",
    }  # fmt: skip
    assert wire["backend"] == "slurm" and wire["create"] is True and wire["external"] == ["/data"]
    assert set(wire["jobs"][0]) == {
        "name", "group", "family", "text", "hash", "deps", "lane", "done_if", "gate", "retries", "timeout_s",
        "default_time", "env", "sbatch",
    }  # fmt: skip
    assert parse_push_request(wire) == REQUEST
    applied = replace(REQUEST, keep=False, token="t0")  # the apply: the same request with the diff's token
    assert "keep" not in applied.to_json() and parse_push_request(applied.to_json()) == applied
    older = {  # an older client: none of the keys added since, nulls where this one writes values
        "backend": "slurm",
        "slurm_conf": None,
        "plan": "lf",
        "jobs": [{"name": "p1", "hash": "abc", "text": "true\n", "group": None, "env": {}}],
        "dry_run": True,
        "create": True,
    }
    assert parse_push_request(older) == PushRequest("lf", (PushJob("p1", "abc", "true\n"),), dry_run=True)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"retry_failed": "yes"}, "the push request's retry_failed: true or false was expected, not str"),
        ({"lock_wait_s": "60"}, "the push request's lock_wait_s: a number was expected, not str"),
        ({"external": "/data"}, "the push request's external: a list was expected, not str"),
        ({"plna": "lf"}, "the push request: unknown key 'plna'"),
        ({"plan": ""}, "the push request's plan: a plan name was expected, not an empty string"),
        ({"plan": None}, "the push request's plan: a string was expected, not null"),
        ({"jobs": {"p1": {}}}, "the push request's jobs: a list was expected, not dict"),
        (
            {"jobs": [dict(JOB.to_json(), deps=["p0", 3])]},
            "the push request's jobs[0].deps[1]: a string was expected, not int",
        ),
        ({"token": 7}, "the push request's token: a string was expected, not int"),
    ],
)
def test_a_garbage_push_request_is_answered_as_a_located_error_before_anything_is_touched(
    tmp_path: Path, change: dict[str, Any], said: str
) -> None:
    from runner.agent.dispatch import answer

    root = tmp_path / "box"
    root.mkdir(mode=0o700)
    assert answer("push", str(root), {**REQUEST.to_json(), **change}) == {"error": said}
    missing = {key: value for key, value in REQUEST.to_json().items() if key != "plan"}
    assert answer("push", str(root), missing) == {"error": "the push request: no 'plan'"}
    assert list(root.iterdir()) == []  # no lock taken, no ledger, no bundle


STATUS = SlurmStatus(
    root="/r",
    heartbeat=100.0,
    lanes={"gpu": Lane("running", ("st/g1.job",), (90.0,), 1, 90.0, slots=1), "cpu": Lane("idle")},
    running=(Running("st/g1.job", "gpu", 90.0, 12, 1, 10.0, 3, 95.0, "hi", 12),),
    queued=(Waiting("st/g2.job", "lane-busy", "gpu", "Resources", "", 91.0, "13_1"),),
    counts=Counts(queue=1, running=1),
)


def test_a_slurm_status_reads_back_as_written_and_a_newer_agents_keys_are_passed_over() -> None:
    wire = json.loads(json.dumps(STATUS.answer()))
    assert wire["now"] == 100.0 and wire["runner_alive"] is True and wire["counts"] == wire["status"]["counts"]
    assert wire["status"]["runner"] == {
        "pid": None, "version": "slurm", "format_version": 1, "heartbeat": 100.0, "tick": 0, "root": "/r",
        "backend": "slurm",
    }  # fmt: skip
    assert "slots" not in wire["status"]["lanes"]["cpu"] and wire["status"]["lanes"]["gpu"]["slots"] == 1
    assert parse_status_answer(wire) == STATUS
    newer = json.loads(json.dumps(wire))
    newer["status"]["running"][0]["gpu"] = 0
    newer["status"]["lanes"]["cpu"]["queued"] = 3
    newer["status"]["waiting_count"] = 1
    assert parse_status_answer(newer) == STATUS


GARBAGE = [
    ([], "", "an object was expected, not list"),
    ({"now": "soon"}, "now", "a number was expected, not str"),
    ({"status": None}, "status", "an object was expected, not null"),
    ({"status": {"runner": {"root": "/r"}}}, "status.runner", "no 'heartbeat'"),
    ({"status.running": "none"}, "status.running", "a list was expected, not str"),
    ({"status.running": [{"job": "a", "lane": "gpu", "started": "soon"}]}, "status.running[0].started", "a number"),
    ({"status.queued": [{"job": "a", "lane": "gpu"}]}, "status.queued[0]", "no 'reason'"),
    ({"status.queued": [{"job": "a", "reason": "order", "slurm_id": []}]}, "status.queued[0].slurm_id", "an integer"),
    ({"status.lanes": {"gpu": {"state": "idle", "running": [1]}}}, "status.lanes.gpu.running[0]", "a string"),
    ({"status.counts": {"queue": "1"}}, "status.counts.queue", "an integer was expected, not str"),
]


def _garbled(change: Any) -> Any:
    if not isinstance(change, dict):
        return change
    wire = json.loads(json.dumps(STATUS.answer()))
    for key, value in change.items():
        holder, _, name = key.rpartition(".")
        (wire[holder] if holder else wire)[name] = value
    return wire


@pytest.mark.parametrize(("change", "where", "said"), GARBAGE)
def test_a_garbage_status_answer_is_a_located_error(change: Any, where: str, said: str) -> None:
    found = parse_status_answer(_garbled(change))
    assert isinstance(found, RecordError) and found.where == where and said in found.message, found


@pytest.mark.usefixtures("plan_env")
def test_plan_status_of_a_slurm_box_that_answers_garbage_says_where_and_exits_1(tmp_path: Path, sshd: Sshd) -> None:
    """The workstation trusts no box: a status answer of the wrong shape is said naming the host and the place,
    exit 1, no traceback; one that reads is shown."""
    answer = tmp_path / "answer.json"
    fake = tmp_path / "fake-python3"
    fake.write_text(f"#!/bin/sh\ncat >/dev/null\ncat {answer}\n")  # the agent's place: whatever it is asked
    fake.chmod(0o755)
    (tmp_path / "box").mkdir(mode=0o700)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        f"hosts:\n  lab:\n    backend: slurm\n    ssh: testbox\n    root: {tmp_path / 'box'}\n    python: {fake}\n"
        f"    ssh_options: [-F, {sshd.config}]\n"
    )
    answer.write_text(json.dumps(_garbled(GARBAGE[5][0])))
    code, out = plan_cli("status", "lab", "--hosts", str(hosts))
    assert code == 1 and "Traceback" not in out, out
    assert "the agent's status answer is malformed at status.running[0].started: a number was expected, not str" in out
    watched = ("watch", "lab", "--hosts", str(hosts), "--once", "--state", str(tmp_path / "w.json"))
    code, out = plan_cli(*watched)  # the watcher reads it as `plan status` does: one ERROR that says where
    assert code == 16 and "Traceback" not in out, out
    assert "ERROR" in out and "malformed at status.running[0].started: a number was expected, not str" in out, out
    answer.write_text(json.dumps({**STATUS.answer(), "events": [], "offset": 0}))
    code, out = plan_cli("status", "lab", "--hosts", str(hosts), "--json")
    assert code == 0, out
    assert json.loads(out)["status"] == STATUS.to_json()


def test_a_push_result_is_written_as_the_workstation_reads_it_its_optional_keys_only_where_they_say_something() -> None:
    from plancompiler.backends.slurmanswer import push_answer
    from runner.slurm.request import PushResult

    diffed = PushResult(changes=(("+", "a", ""), ("~", "b", "pending 7 has other content")), accounting="on")
    assert diffed.to_json() == {
        "changes": [["+", "a", ""], ["~", "b", "pending 7 has other content"]],
        "external_missing": [],
        "submitted": {},
        "repointed": {},
        "cancelled": [],
        "accounting": "on",
    }
    applied = replace(diffed, submitted={"a": 9, "b": "10_1"}, repointed={"b": ("12",)}, cancelled=(7,), released=())
    wire = json.loads(json.dumps(applied.to_json()))
    assert wire["released"] == [] and "error" not in wire and "withdrawn" not in wire and "token" not in wire
    read = push_answer(wire, "lab")
    assert read.changes == applied.changes and read.submitted == applied.submitted and read.cancelled == (7,)
    assert read.repointed == {"b": ("12",)}
    failed = replace(diffed, error="sbatch failed", withdrawn=("9",), rebuilt="rebuilt from squeue", token="t")
    assert push_answer(failed.to_json(), "lab").withdrawn == ("9",) and set(failed.to_json()) > {"rebuilt", "token"}

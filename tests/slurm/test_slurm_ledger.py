"""The Slurm ledger on a real cluster: what was pushed is known after squeue forgets it, pushes take the lock,
plans on one root stay apart, and a re-push re-points pending dependents instead of orphaning them."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import plan_cli, wait_for
from tests.slurm.cluster import Slurm, start_slurm, stop_slurm
from tests.slurm.jobs import attempts, cancel_root, ended, held_until, known_ids, ledger, write_plan

pytestmark = pytest.mark.usefixtures("plan_env")


plan = plan_cli


@pytest.fixture(scope="module")
def aging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """A cluster that forgets finished jobs (MinJobAge=2) at slurmctld's next purge: 10 s after it started, then
    every 10 s (the shortest interval slurmctld purges at)."""
    cluster = start_slurm(tmp_path_factory.mktemp("aging"), min_job_age=2)
    yield cluster
    stop_slurm(cluster)


def test_ledger_outlives_squeue_finished_stays_finished_failed_stays_held(tmp_path: Path, aging: Slurm) -> None:
    count, root = tmp_path / "count", tmp_path / "submit"
    p = write_plan(
        tmp_path / "lg.yaml",
        "lg",
        f"  - name: hello\n    run: echo run >> {count}\n"
        f"  - name: bad\n    run: echo broken; exit 3\n    outputs: ['{tmp_path}/bad.out']\n"
        "  - name: gone\n    run: 'true'\n    requires: [{after: bad}]\n",
    )
    hosts = aging.hosts_file(root)
    code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
    assert code == 0 and out.count("submitted ") == 3, out
    try:
        wait_for(lambda: ended(root, "lg", "hello") == "COMPLETED" and ended(root, "lg", "bad") == "FAILED", 60, 0.2)
        ids = {str(a["id"]) for job in ("hello", "bad", "gone") for a in attempts(root, "lg", job)}
        wait_for(lambda: not ids & known_ids(aging), 60, 0.2)  # squeue has forgotten all three; no probe ever ran
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts), "--dry-run")
        assert code == 0 and re.search(r"  d  hello\.job  \(completed as \d+\)", out), out
        assert re.search(r"  !  bad\.job  \(FAILED as \d+; not resubmitted without --retry-failed\)", out), out
        # the ledger lost now: the results directory still knows hello and bad; gone (cancelled by Slurm as bad
        # failed, so no result) is known to nothing any more: the push refuses, naming it
        kept = (root / "slurm.json").read_bytes()
        (root / "slurm.json").unlink()
        (root / "slurm.json.1").unlink(missing_ok=True)
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts), "--dry-run")
        assert code == 1 and re.search(r"  d  hello\.job  \(completed as \d+\)", out), out
        assert re.search(r"  !  bad\.job  \(FAILED as \d+; not resubmitted", out), out
        assert "  !  gone.job  (lost with the ledger" in out, out
        assert (
            "1 job of plan lg cannot be accounted for: a push submitted it" in out
            and ": gone. Nothing was submitted" in out
        ), out
        assert "push again with --retry-failed" in out, out
        (root / "slurm.json").write_bytes(kept)
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0 and "pushed: 0 submitted" in out and not re.findall(r"submitted (\S+) as", out), out
        # a new consumer of the failed job is held with it: submitted, it would run without bad's output
        p.write_text(p.read_text() + "  - name: user\n    run: 'true'\n    requires: [{after: bad}]\n")
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0 and "  !  user.job  (its producer bad failed: not submitted" in out, out
        assert not re.findall(r"submitted (\S+) as", out)
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts), "--retry-failed")
        assert code == 0 and re.findall(r"submitted (\S+) as", out) == ["bad.job", "gone.job", "user.job"], out
        assert "  r  bad.job" in out
        wait_for(lambda: ended(root, "lg", "bad") == "FAILED" and len(attempts(root, "lg", "bad")) == 2, 60, 0.2)
    finally:
        cancel_root(aging, root)
    assert count.read_text() == "run\n"  # hello ran once, whatever squeue forgot
    record = ledger(root)["plans"]["lg"]
    assert [a["state"] for a in record["jobs"]["hello"]["attempts"]] == ["COMPLETED"]
    assert record["by"] and record["pushed_at"]


def test_a_push_waits_for_the_push_lock_and_is_refused_naming_its_holder(tmp_path: Path, slurm: Slurm) -> None:
    root = tmp_path / "submit"
    root.mkdir()
    p = write_plan(tmp_path / "lk.yaml", "lk", "  - name: one\n    run: 'true'\n")
    hosts = slurm.hosts_file(root)
    fd = os.open(root / ".push.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": os.getpid(), "user": "someone@else", "since": "now"}).encode())
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts), "--lock-wait", "0.2")
    finally:
        os.close(fd)
    assert code == 1 and "another push to cluster is in progress" in out and "someone@else" in out, out
    assert not (root / "slurm.json").exists() and not any(j["name"].startswith("lk/") for j in slurm.squeue())


def test_two_plans_on_one_root_keep_their_same_named_jobs_apart(tmp_path: Path, slurm: Slurm) -> None:
    root = tmp_path / "sub mit"  # a root with a space: every path is quoted or passed as one argument
    hosts = slurm.hosts_file(root)
    outs, gate = {}, tmp_path / "gate"
    for name in ("rp", "rq"):
        outs[name] = tmp_path / f"{name}.out"
        write_plan(
            tmp_path / f"{name}.yaml",
            name,
            f"  - name: a\n    run: {held_until(gate)}; touch {tmp_path}/{name}.a\n    outputs: ['{tmp_path}/{name}.a']\n"
            f"  - name: b\n    run: echo {name} > {outs[name]}\n    requires: [{{after: a}}]\n"
            f"    outputs: ['{outs[name]}']\n",
        )
    try:
        for name in ("rp", "rq"):
            code, out = plan("push", "cluster", str(tmp_path / f"{name}.yaml"), "--hosts", str(hosts))
            assert code == 0 and out.count("submitted ") == 2, out
        names = {j["name"] for j in slurm.squeue()}
        assert {"rp/a", "rp/b", "rq/a", "rq/b"} <= names
        gate.touch()  # neither a could end before both plans were pushed
        wait_for(lambda: all(ended(root, n, "b") == "COMPLETED" for n in ("rp", "rq")), 90, 0.2)
    finally:
        cancel_root(slurm, root)
    assert outs["rp"].read_text() == "rp\n" and outs["rq"].read_text() == "rq\n"
    assert sorted(p.name for p in (root / "scripts" / "rp").glob("b.*.job")) != sorted(
        p.name for p in (root / "scripts" / "rq").glob("b.*.job")
    )
    assert "rp/b attempt 1" in (root / "logs/rp/b.job.log").read_text()
    code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
    events = json.loads(out)["events"]
    assert {e["job"] for e in events if e["event"] == "done"} == {"rp/a.job", "rp/b.job", "rq/a.job", "rq/b.job"}
    code, out = plan("logs", "cluster", "rq/b", "--hosts", str(hosts))
    assert code == 0 and "rq/b attempt 1" in out and "rp/b" not in out, out
    code, out = plan("logs", "cluster", "b", "--hosts", str(hosts))
    assert code != 0 and "b.job is in plans rp, rq: name one, as PLAN/b.job" in out, out


def test_changing_a_pending_job_re_points_its_pending_dependents(tmp_path: Path, slurm: Slurm) -> None:
    root, runs, gate = tmp_path / "submit", tmp_path / "runs", tmp_path / "gate"
    text = "".join(
        f"  - name: {job}\n    run: {run}; echo {job}{n} >> {runs}; touch {tmp_path}/{job}\n"
        f"    outputs: ['{tmp_path}/{job}']\n" + (f"    requires: [{{after: {dep}}}]\n" if dep else "")
        for job, run, n, dep in (("a", held_until(gate), "", ""), ("b", "true", "1", "a"), ("c", "true", "", "b"))
    )
    p = write_plan(tmp_path / "ch.yaml", "ch", text)
    hosts = slurm.hosts_file(root)
    try:
        assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
        first = {job: attempts(root, "ch", job)[-1]["id"] for job in ("a", "b", "c")}
        p.write_text(p.read_text().replace("echo b1", "echo b2"))
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0, out
        assert "  ~  b.job  (pending" in out and "its pending dependents re-pointed to it: c" in out, out
        new_b = attempts(root, "ch", "b")[-1]["id"]
        assert re.findall(r"submitted (\S+) as", out) == ["b.job"] and new_b != first["b"]
        assert f"re-pointed 1 pending dependents of b.job to {new_b}: {first['c']}" in out
        assert f"cancelled {first['b']}" in out
        assert attempts(root, "ch", "c")[-1]["id"] == first["c"]
        gate.touch()  # a ends only now: b and c stayed pending through the re-push
        wait_for(lambda: ended(root, "ch", "c") == "COMPLETED", 90, 0.2)
        # c's wrapper writes its result and then exits: until it has, Slurm (and so a push) still says running
        c = str(attempts(root, "ch", "c")[-1]["id"])
        wait_for(lambda: all(j["state"] not in ("RUNNING", "COMPLETING") for j in slurm.squeue() if j["id"] == c), 30)
    finally:
        cancel_root(slurm, root)
    assert runs.read_text() == "a\nb2\nc\n"
    code, out = plan("push", "cluster", str(p), "--hosts", str(hosts), "--dry-run")
    assert code == 0 and "3 done" in out and "!" not in out, out


def test_jobs_of_the_first_format_still_queued_are_adopted_not_run_twice(tmp_path: Path, slurm: Slurm) -> None:
    """A job submitted by the earlier backend (bare name, no ledger) that is still pending is replaced in one
    step, and one that runs is left alone, instead of either being submitted a second time."""
    root = tmp_path / "submit"
    old = {}
    for name, hold in (("waits", True), ("runs", False)):
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            "--comment=plan=up@000000000000",
            f"--output={tmp_path}/old-%j.out",
            "--wrap",
            "sleep 30",
        ]
        out = subprocess.run(
            argv + (["--hold"] if hold else []), capture_output=True, text=True, env=slurm.env, check=True
        ).stdout
        old[name] = int(out.strip())
    p = write_plan(tmp_path / "up.yaml", "up", "  - name: waits\n    run: 'true'\n  - name: runs\n    run: 'true'\n")
    hosts = slurm.hosts_file(root)
    try:
        wait_for(lambda: any(j["id"] == str(old["runs"]) and j["state"] == "RUNNING" for j in slurm.squeue()), 60, 0.2)
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0, out
        assert f"  ~  waits.job  (pending {old['waits']} has other content" in out
        assert f"  >~ runs.job  (running as {old['runs']})" in out
        assert re.findall(r"submitted (\S+) as", out) == ["waits.job"] and f"cancelled {old['waits']}" in out
    finally:
        cancel_root(slurm, root)
        subprocess.run(["scancel", *(str(i) for i in old.values())], env=slurm.env, capture_output=True)


def test_a_lost_truncated_or_unreadable_ledger_is_rebuilt_and_nothing_runs_twice(tmp_path: Path, slurm: Slurm) -> None:
    """slurm.json deleted (with its previous generation), cut short, or garbage: each re-push rebuilds it from
    squeue (names, `plan=` comments, working directory; an array's elements from its members file) and the
    results directory, says so, and submits nothing that squeue or the results already have."""
    root, gate = tmp_path / "submit", tmp_path / "gate"
    p = write_plan(
        tmp_path / "lr.yaml",
        "lr",
        f"  - name: a\n    run: {held_until(gate)}; touch {tmp_path}/a\n    outputs: ['{tmp_path}/a']\n"
        "  - name: b\n    run: 'true'\n    requires: [{after: a}]\n"
        "  - name: c\n    run: 'true'\n"
        "  - name: 'd{{ i }}'\n    foreach: {i: [0, 1, 2, 3]}\n    run: 'true'\n    requires: [{after: a}]\n",
    )
    hosts = slurm.hosts_file(root)
    try:
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0 and "pushed: 7 submitted" in out, out
        a = attempts(root, "lr", "a")[0]["id"]
        c = str(attempts(root, "lr", "c")[0]["id"])  # ended in squeue too: its wrapper writes its result first
        wait_for(lambda: any(j["id"] == c and j["state"] == "COMPLETED" for j in slurm.squeue()), 60, 0.2)
        wait_for(lambda: any(j["id"] == str(a) and j["state"] == "RUNNING" for j in slurm.squeue()), 60, 0.2)
        ids = sorted(j["id"] for j in slurm.squeue(expand=True) if j["name"].startswith("lr/"))
        text = (root / "slurm.json").read_bytes()
        for damage in ("deleted", "truncated", "garbage"):
            if damage == "deleted":
                (root / "slurm.json").unlink()
                (root / "slurm.json.1").unlink(missing_ok=True)
            else:
                (root / "slurm.json").write_bytes(text[: len(text) // 2] if damage == "truncated" else b"\x00\xff{")
                (root / "slurm.json.1").unlink(missing_ok=True)
            code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
            assert code == 0 and "pushed: 0 submitted" in out, (damage, out)
            assert "warning: the ledger could not be trusted" in out and "rebuilt under the push lock" in out, out
            assert re.search(r"  d  c\.job  \(completed as \d+\)", out) and "  >  a.job" in out, out
            now = sorted(j["id"] for j in slurm.squeue(expand=True) if j["name"].startswith("lr/"))
            assert now == ids, (damage, out)  # nothing submitted again, nothing cancelled
        # the rebuilt ledger is the one saved (a generation of its own); the next save keeps it beside the new one
        assert ledger(root)["generation"] == 1 and not (root / "slurm.json.1").exists()
        assert plan("status", "cluster", "--hosts", str(hosts))[0] == 0
        assert ledger(root)["generation"] == 2 and json.loads((root / "slurm.json.1").read_text())["generation"] == 1
        gate.touch()
        wait_for(lambda: all(ended(root, "lr", j) == "COMPLETED" for j in ("b", "d0", "d3")), 90, 0.2)
    finally:
        cancel_root(slurm, root)


def test_an_older_ledger_generation_restored_is_rebuilt_and_nothing_runs_twice(tmp_path: Path, slurm: Slurm) -> None:
    """slurm.json replaced by an older generation (a restored backup): squeue has pending jobs and the results
    directory an attempt the ledger does not record. The re-push says the ledger is older than Slurm's truth,
    rebuilds it under the lock and submits nothing again; an array element it cannot tell (its members file
    gone) refuses the push (exit 1) naming it, with nothing submitted."""
    root, gate = tmp_path / "submit", tmp_path / "gate"
    first = f"  - name: a\n    run: {held_until(gate)}; touch {tmp_path}/a\n    outputs: ['{tmp_path}/a']\n"
    p = write_plan(tmp_path / "so.yaml", "so", first)
    hosts = slurm.hosts_file(root)
    ids: list[str] = []
    try:
        assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
        older = (root / "slurm.json").read_bytes()  # generation 1: a only
        write_plan(
            p,
            "so",
            first
            + "  - name: 'e{{ i }}'\n    foreach: {i: [0, 1, 2, 3]}\n    run: 'true'\n    requires: [{after: a}]\n"
            "  - name: f\n    run: 'true'\n",
        )
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0 and "pushed: 5 submitted" in out, out
        f = str(attempts(root, "so", "f")[0]["id"])
        wait_for(lambda: any(j["id"] == f and j["state"] == "COMPLETED" for j in slurm.squeue()), 60, 0.2)
        ids = sorted(j["id"] for j in slurm.squeue(expand=True) if j["name"].startswith("so/"))
        assert len(ids) == 6, ids

        (root / "slurm.json").write_bytes(older)
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 0 and "pushed: 0 submitted" in out, out
        assert "warning: the ledger could not be trusted (slurm.json (generation 1) is older than Slurm's truth" in out
        # the pending elements from squeue; f, ended, from its result file alone (squeue's ended jobs are not asked)
        assert re.search(rf"it does not record so/e0 \(\d+_0\), .*so/e3 \(\d+_3\), so/f \({f}\)\): rebuilt", out), out
        assert re.search(r"  =  e3\.job  \(pending as \d+_3\)", out) and re.search(r"  d  f\.job  \(completed as", out)
        now = sorted(j["id"] for j in slurm.squeue(expand=True) if j["name"].startswith("so/"))
        assert now == ids, out  # nothing submitted again, nothing cancelled
        assert sorted(ledger(root)["plans"]["so"]["jobs"]) == ["a", "e0", "e1", "e2", "e3", "f"]

        (root / "slurm.json").write_bytes(older)
        members = next((root / "scripts" / "so").glob("array.*.json"))
        members.rename(tmp_path / "members.json")
        code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
        assert code == 1 and "refused; nothing was changed" in out, out
        assert re.search(r"squeue has 4 pending or running jobs of plan so under this root that the ledger cannot", out)
        assert re.search(r"so \(\d+_0\), so \(\d+_1\), so \(\d+_2\), so \(\d+_3\)\. Nothing was submitted", out), out
        assert sorted(j["id"] for j in slurm.squeue(expand=True) if j["name"].startswith("so/")) == ids
    finally:
        subprocess.run(["scancel", *{i.partition("_")[0] for i in ids}], env=slurm.env, capture_output=True)
        cancel_root(slurm, root)

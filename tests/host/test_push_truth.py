"""`plan push` tells the whole truth (issue 30): retired running jobs, two operators and their versions, outputs
two plans share, held failed jobs that changed, and what a rerun costs; real runners, a real sshd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import runner
from plancompiler.hosts import resolve
from tests.conftest import REPO, RunnerProcess, plan_cli, read_events, wait_for
from tests.sshd import Sshd

pytestmark = pytest.mark.usefixtures("plan_env")


def write_plan(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _json(out: str) -> dict:
    return json.loads(out[out.index("{") : out.rindex("}") + 1])  # stderr's check summary comes first


def _done(root: Path, job: str, count: int = 1) -> bool:
    return len([e for e in read_events(root) if e["event"] == "done" and e["job"] == job]) >= count


# -- 1. a running job that left the plan -------------------------------------------------------------------
def test_a_retired_running_job_is_listed_and_stop_retired_ends_it_as_cancel_does(tmp_path: Path) -> None:
    root = tmp_path / "q"
    slow = "    lane: net\n    run: sleep 300\n"
    first = write_plan(tmp_path / "p.yaml", f"plan: p\njobs:\n  - name: 70-net-dl\n{slow}")
    assert plan_cli("push", str(root), str(first))[0] == 0
    runner = RunnerProcess(root).start()
    try:
        runner.wait_event("start", job="70-net-dl.job")
        moved = write_plan(tmp_path / "p.yaml", f"plan: p\njobs:\n  - name: 99-net-dl\n{slow}")
        code, out = plan_cli("push", str(root), str(moved))
        assert code == 0, out
        line = next(ln for ln in out.splitlines() if "70-net-dl.job" in ln)
        assert line.startswith("  -  70-net-dl.job  (running") and line.endswith(
            ": keeps running; --stop-retired ends it)"
        )
        assert "  +  99-net-dl.job" in out
        assert (root / "running/70-net-dl.job").exists()

        code, out = plan_cli("push", str(root), str(moved), "--json", "--dry-run")
        changes = _json(out)["changes"]
        retired = next(c for c in changes if c["job"] == "70-net-dl.job")
        assert retired["mark"] == "-" and retired["state"] == "running" and "keeps running" in retired["note"]

        code, out = plan_cli("push", str(root), str(moved), "--stop-retired")
        assert code == 0, out
        assert "ended by --stop-retired, as plan cancel" in out and "stopping 70-net-dl.job" in out
        cancelled = runner.wait_event("cancelled", job="70-net-dl.job")
        assert cancelled["was"] == "running" and "push --stop-retired" in cancelled["by"]
        wait_for(lambda: (root / "failed/70-net-dl.job").exists())
        runner.wait_event("start", job="99-net-dl.job")  # the lane it held is free for the job that replaced it
    finally:
        runner.stop()


# -- 4. a held failed job says what changed and what to do -------------------------------------------------
def test_a_held_failed_job_says_its_attempts_its_failure_and_that_it_changed(tmp_path: Path) -> None:
    root = tmp_path / "q"
    job = "  - name: 10-cpu-intake\n    retries: 2\n    run: |\n      echo 'unsupported sampler flag: {flag}' >&2; exit 1\n"
    bad = write_plan(tmp_path / "p.yaml", "plan: p\njobs:\n" + job.format(flag="-b"))
    assert plan_cli("push", str(root), str(bad))[0] == 0
    runner = RunnerProcess(root).start("--backoff-base", "0.1")
    try:
        runner.wait_event("failed", job="10-cpu-intake.job")
    finally:
        runner.stop()
    code, out = plan_cli("push", str(root), str(bad), "--dry-run")
    assert "  !  10-cpu-intake.job  (failed 2/2: " in out and "unsupported sampler flag: -b" in out
    assert out.count("unchanged: --retry-failed runs it again") == 1
    fixed = write_plan(tmp_path / "p.yaml", "plan: p\njobs:\n" + job.format(flag="-s"))
    code, out = plan_cli("push", str(root), str(fixed))
    assert code == 0, out
    line = next(ln for ln in out.splitlines() if "10-cpu-intake.job" in ln)
    assert line.startswith("  !  10-cpu-intake.job  (failed 2/2: ")
    assert line.endswith("unsupported sampler flag: -b; changed since: --retry-failed runs the new version)")


# -- 5. what a rerun costs, and ordering gates that never make a job stale --------------------------------
def _chain(tmp_path: Path, says: str) -> Path:
    """a -> (data) b, a 3 MB download marked by dl/.ok; g runs after a only as a gate."""
    out, dl = tmp_path / "out", tmp_path / "dl"
    return write_plan(
        tmp_path / "p.yaml",
        "plan: p\njobs:\n"
        f"  - name: a\n    run: echo {says} > {out}/a\n    outputs: [{out}/a]\n"
        f"  - name: b\n    requires: [{out}/a]\n    outputs: [{dl}/.ok]\n"
        f"    run: mkdir -p {dl} && truncate -s 3000000 {dl}/blob && touch {dl}/.ok\n"
        f"  - name: g\n    requires: [{{after: a}}]\n    run: touch {out}/g\n    outputs: [{out}/g]\n",
    )


def test_reruns_are_grouped_last_with_their_cost_and_an_after_gate_never_goes_stale(tmp_path: Path) -> None:
    root = tmp_path / "q"
    (tmp_path / "out").mkdir()
    assert plan_cli("push", str(root), str(_chain(tmp_path, "v1")))[0] == 0
    runner = RunnerProcess(root).start()
    try:
        wait_for(lambda: all(_done(root, f"{j}.job") for j in "abg"), 20)
        code, out = plan_cli("push", str(root), str(_chain(tmp_path, "v2")))
        assert code == 0, out
        lines = out.splitlines()
        at = lines.index("  runs again (2 jobs, 3.0 MB of outputs to redo):")
        assert lines[at + 1] == "  ^  b.job  (stale because a.job changed)  [3.0 MB]"  # the costliest first
        assert lines[at + 2] == "  ~  a.job  (changed, will run again: its output is stale)  [3 B]"
        assert "g.job" not in out  # {after: a} orders g after a; a's rerun does not make g stale
        assert "will run again: a.job, b.job" in out
        wait_for(lambda: _done(root, "b.job", 2), 20)
    finally:
        runner.stop()
    assert len([e for e in read_events(root) if e["event"] == "start" and e["job"] == "g.job"]) == 1


def test_the_a9_plan_gates_its_slow_download_on_the_arm_without_reading_it() -> None:
    from plancompiler.compile import compile_plan, manifest

    jobs = manifest(compile_plan(REPO / "plans/a9.yaml", lint=False))["jobs"]
    download = jobs["92c-net-mai-code.job"]
    assert download["after"] == [] and download["order"] == ["98-gpu-bench-s2-fnmtpcx-flashnext-iq4xs.job"]
    assert download["requires"] == [
        "/home/user/work/a9-agent-bench/agent-playground/bench/a9-results/matrix/.done-s2-fnmtpcx-flashnext-iq4xs"
    ]
    assert jobs["65-gpu-intake-z-kimi-linear-q8.job"]["after"] == ["60-net-fetch-kimi-linear-q8.job"]


# -- 3. outputs two plans share --------------------------------------------------------------------------
def test_an_output_two_plans_write_is_refused_naming_both_jobs(tmp_path: Path) -> None:
    root, gate = tmp_path / "q", tmp_path / "intake/gate-mai.json"
    one = write_plan(
        tmp_path / "a9.yaml",
        f"plan: a9\njobs:\n  - name: 98a-gpu-intake-mai\n    run: echo 98a > {gate}\n    outputs: [{gate}]\n",
    )
    other = write_plan(
        tmp_path / "intakes.yaml",
        f"plan: intakes\njobs:\n  - name: 66-gpu-intake-z-mai\n    run: echo 66 > {gate}\n    outputs: [{gate}]\n",
    )
    assert plan_cli("push", str(root), str(one))[0] == 0
    code, out = plan_cli("push", str(root), str(other))
    assert code == 1, out
    assert f"{gate} is written by intakes/66-gpu-intake-z-mai.job and by a9/98a-gpu-intake-mai.job" in out
    assert f"--allow-shared-output {gate}" in out
    assert sorted(os.listdir(root / "queue")) == ["98a-gpu-intake-mai.job"]
    code, out = plan_cli("push", str(root), str(other), "--allow-shared-output", str(gate))
    assert code == 0, out
    assert sorted(os.listdir(root / "queue")) == ["66-gpu-intake-z-mai.job", "98a-gpu-intake-mai.job"]


# -- 2. two operators, two clones, an older client ---------------------------------------------------------
def test_two_clones_and_an_older_client_over_ssh(tmp_path: Path, sshd: Sshd) -> None:
    root = tmp_path / "box"
    hosts = sshd.hosts_file(root)
    made = tmp_path / "out"
    made.mkdir()
    jobs = "".join(
        f"  - name: g{i}\n    lane: gpu\n    run: echo {{v}}{i} > {made}/g{i}\n    outputs: [{made}/g{i}]\n"
        for i in range(5)
    )
    mine = write_plan(tmp_path / "clone-a/plans/a9.yaml", "plan: a9\njobs:\n" + jobs.format(v="a"))
    theirs = write_plan(tmp_path / "clone-b/plans/a9.yaml", "plan: a9\njobs:\n" + jobs.format(v="b"))
    assert plan_cli("push", "testbox", str(mine), "--hosts", str(hosts))[0] == 0
    manifest = json.loads((root / "manifest.json").read_text())
    source = manifest["plans"]["a9"]["source"]
    assert source["path"] == str(mine.resolve()) and "@" in source["by"] and len(source["sha"]) == 12
    assert manifest["version"] == runner.MANIFEST_VERSION and manifest["written_by"]["formats"]["manifest"] == 3

    serving = RunnerProcess(root).start()
    try:
        wait_for(lambda: all(_done(root, f"g{i}.job") for i in range(5)), 20)
        code, out = plan_cli("push", "testbox", str(theirs), "--hosts", str(hosts), "--json", "--dry-run")
        previous = _json(out)["previous_push"]
        assert previous["path"] == str(mine.resolve()) and previous["replaces"] == 5
        code, out = plan_cli("push", "testbox", str(theirs), "--hosts", str(hosts))
        assert code == 0, out
        assert f"warning: plan a9 was last pushed by {source['by']} from {mine.resolve()} " in out
        assert "ago; this push replaces 5 of its jobs" in out
        # The summary is exact: what it says will run again is what the runner runs again.
        assert "will run again: g0.job, g1.job, g2.job, g3.job, g4.job" in out and "nothing will run" not in out
        assert "  runs again (5 jobs, 15 B of outputs to redo):" in out  # measured by the box, over ssh
        wait_for(lambda: all(_done(root, f"g{i}.job", 2) for i in range(5)), 20)
    finally:
        serving.stop()
    assert len([e for e in read_events(root) if e["event"] == "start"]) == 10

    # An older client (it says it writes manifest format 2) is refused by the box, naming both versions.
    host = resolve("testbox", hosts)
    old = {"version": "0.0.9", "commit": "0ldc0mm17", "formats": {"manifest": 2, "events": 1, "job": 1}}
    assert "writes format 2" in host.call("probe", {**host.context(), "client": old})["refused"]  # first contact
    assert host.call("probe", {**host.context(), "client": runner.identity()})["refused"] is None
    answer = host.call("install", {**host.context(), "files": {}, "client": old, "by": "old@clone"})
    assert "0.0.9 (commit 0ldc0mm17) writes format 2" in answer["error"]
    assert f"format 3, written by plancompiler {runner.describe(runner.identity())}" in answer["error"]
    assert runner.UPGRADE in answer["error"]
    assert json.loads((root / "manifest.json").read_text())["generation"] == manifest["generation"] + 1

    # A box whose manifest a newer plancompiler wrote refuses this one before anything is sent.
    newer = {**json.loads((root / "manifest.json").read_text()), "version": 99}
    newer["written_by"] = {"version": "9.0.0", "commit": "f00dfeed"}
    (root / "manifest.json").write_text(json.dumps(newer))
    before = sorted(os.listdir(root / "queue"))
    code, out = plan_cli("push", "testbox", str(mine), "--hosts", str(hosts))
    assert code == 1, out
    assert "manifest.json on testbox is format 99, written by plancompiler 9.0.0 (commit f00dfeed)" in out
    assert "upgrade it first: python3 -m pip install -U plancompiler" in out
    assert sorted(os.listdir(root / "queue")) == before

    # The box says which code it runs: the zipapp carries the commit it was built from.
    probe = host.call("probe", host.context())
    assert probe["box"]["commit"] == runner.commit() and probe["box"]["formats"] == runner.formats()


def test_version_says_the_commit_in_both_entry_points() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for argv, name in (
        ([sys.executable, "-m", "plancompiler.cli", "--version"], "plan"),
        ([sys.executable, "-S", "-m", "runner", "--version"], "runner"),
    ):
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60).stdout
        assert out.startswith(f"{name} {runner.identity()['version']}")
        assert f"formats: manifest 3, events 1, job {runner.FORMAT_VERSION}" in out
        if runner.commit():
            assert f"(commit {runner.commit()})" in out

"""`plan push` to a local path and over a real sshd: every diff rule, atomic install, bounded failure."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plancompiler.backends.queue import QueueBackend
from plancompiler.cli import app
from plancompiler.compile import compile_plan
from plancompiler.hosts import Host
from plancompiler.push import PushOptions
from plancompiler.push import push as push_to
from tests.conftest import RunnerProcess, wait_for, write_job
from tests.sshd import Sshd

cli = CliRunner()


pytestmark = pytest.mark.usefixtures("plan_env")  # a shellcheck cache of its own, no hosts file from outside


def make_plan(tmp_path: Path, jobs: dict[str, str], name: str = "p", external: list[str] | None = None) -> Path:
    lines = [f"plan: {name}\n"]
    if external:
        lines.append(f"external: {json.dumps(external)}\n")
    lines.append("jobs:\n")
    for job, body in jobs.items():
        lines.append(f"  - name: {job}\n    run: {json.dumps(body)}\n    outputs: [{tmp_path}/out/{job}]\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text("".join(lines))
    return path


def push(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, ["push", *args])
    return result.exit_code, result.output


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_diff_rule_on_a_local_queue(tmp_path: Path) -> None:
    root = tmp_path / "q"
    out = tmp_path / "out"
    plan = make_plan(tmp_path, {"a": f"touch {out}/a", "b": f"touch {out}/b", "c": f"touch {out}/c"})
    code, output = push(str(root), str(plan))
    assert code == 0, output
    assert "3 new" in output and sorted(os.listdir(root / "queue")) == ["a.job", "b.job", "c.job"]
    manifest = json.loads((root / "manifest.json").read_text())
    assert set(manifest["jobs"]) == {"a.job", "b.job", "c.job"}
    code, output = push(str(root), str(plan))
    assert code == 0 and "3 unchanged" in output
    # hand-written and other-plan jobs are never touched; a is done, b failed, c changes
    write_job(root, "zz-hand.job", "echo hand\n")
    write_job(root, "zz-other.job", "# PLAN=other@123\necho other\n")
    os.replace(root / "queue/a.job", root / "done/a.job")
    os.replace(root / "queue/b.job", root / "failed/b.job")
    plan = make_plan(
        tmp_path, {"a": f"touch {out}/a", "b": f"touch {out}/b", "c": f"touch {out}/c2", "d": f"touch {out}/d"}
    )
    code, output = push(str(root), str(plan))
    assert code == 0, output
    assert "  ~  c.job" in output and "  +  d.job" in output and "  !  b.job" in output
    assert "1 done" in output
    assert (root / "failed/b.job").exists() and not (root / "queue/b.job").exists()
    assert "c2" in (root / "queue/c.job").read_text()
    # retire d: removed from queue/, spared with --no-prune
    plan = make_plan(tmp_path, {"a": f"touch {out}/a", "b": f"touch {out}/b", "c": f"touch {out}/c2"})
    code, output = push(str(root), str(plan), "--no-prune")
    assert "kept (--no-prune)" in output and (root / "queue/d.job").exists()
    code, output = push(str(root), str(plan))
    assert "  -  d.job" in output and not (root / "queue/d.job").exists()
    assert (root / "queue/zz-hand.job").exists() and (root / "queue/zz-other.job").exists()
    # --retry-failed re-queues b and asks the runner to reset its attempts
    code, output = push(str(root), str(plan), "--retry-failed")
    assert "  r  b.job" in output and (root / "queue/b.job").exists() and not (root / "failed/b.job").exists()
    assert (root / "control/reset-b.job").exists()
    assert not [n for n in os.listdir(root) if n.startswith(".plan-stage-")]


def test_retry_failed_resets_attempts_through_the_runner(tmp_path: Path) -> None:
    root = tmp_path / "q"
    plan = make_plan(tmp_path, {"a": "exit 1"})
    assert push(str(root), str(plan))[0] == 0
    runner = RunnerProcess(root).start()
    try:
        runner.wait_event("failed", job="a.job")
        assert push(str(root), str(plan), "--retry-failed")[0] == 0
        wait_for(lambda: len([e for e in runner.events("failed") if e["job"] == "a.job"]) == 2)
        starts = [e["attempt"] for e in runner.events("start") if e["job"] == "a.job"]
        assert starts == [1, 1]  # the retry started again at attempt 1: its attempts were reset
    finally:
        runner.stop()


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "q"
    plan = make_plan(tmp_path, {"a": "true"})
    assert push(str(root), str(plan))[0] == 0
    write_job(root, "x.job", "# PLAN=p@1\necho retired\n")
    before = tree(root)
    plan = make_plan(tmp_path, {"a": "true ", "b": "true"})
    code, output = push(str(root), str(plan), "--dry-run")
    assert code == 0 and "  -  x.job" in output and "  +  b.job" in output
    assert tree(root) == before


def test_missing_external_refuses_the_push(tmp_path: Path) -> None:
    root = tmp_path / "q"
    script = tmp_path / "fetch.sh"
    plan = make_plan(tmp_path, {"a": f"bash {script}"}, external=[str(script)])
    code, output = push(str(root), str(plan))
    assert code == 1 and f"external path {script} does not exist" in output
    assert not (root / "queue").exists() or not os.listdir(root / "queue")
    code, output = push(str(root), str(plan), "--no-verify-external")
    assert code == 0
    script.write_text("true\n")
    assert push(str(root), str(plan))[0] == 0


def test_plan_with_errors_sends_nothing(tmp_path: Path) -> None:
    root = tmp_path / "q"
    plan = tmp_path / "bad.yaml"
    plan.write_text("plan: bad\njobs:\n  - name: a\n    run: exit $rc\n")
    code, output = push(str(root), str(plan))
    assert code == 1 and "SC2154" in output and "nothing was sent" in output
    assert not root.exists()


def test_json_output(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, {"a": "true"})
    result = cli.invoke(app, ["push", str(tmp_path / "q"), str(plan), "--json", "--dry-run"])
    data = json.loads(result.stdout)
    assert data["counts"] == {"+": 1} and data["changes"][0]["job"] == "a.job"


def test_push_over_ssh(tmp_path: Path, sshd: Sshd) -> None:
    root = tmp_path / "remote-q"
    hosts = sshd.hosts_file(root)
    plan = make_plan(tmp_path, {"a": "true", "b": "true"})
    code, output = push("testbox", str(plan), "--hosts", str(hosts))
    assert code == 0, output
    assert sorted(os.listdir(root / "queue")) == ["a.job", "b.job"]
    code, output = push("testbox", str(plan), "--hosts", str(hosts))
    assert code == 0 and "2 unchanged" in output and "nothing to push" in output
    os.replace(root / "queue/a.job", root / "failed/a.job")
    code, output = push("testbox", str(plan), "--hosts", str(hosts), "--retry-failed")
    assert "  r  a.job" in output and (root / "queue/a.job").exists()


def test_unreachable_port_exits_3_quickly(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        f"hosts:\n  dead:\n    ssh: 127.0.0.1\n    root: /tmp/x\n    connect_timeout: 2\n"
        f"    ssh_options: [-p, '{port}', -o, StrictHostKeyChecking=no]\n"
    )
    plan = make_plan(tmp_path, {"a": "true"})
    started = time.monotonic()
    code, output = push("dead", str(plan), "--hosts", str(hosts))
    assert code == 3 and "unreachable" in output
    assert time.monotonic() - started < 10


def test_stopped_sshd_exits_3_within_bound(tmp_path: Path, sshd: Sshd) -> None:
    hosts = sshd.hosts_file(tmp_path / "q", connect_timeout=2, timeout=6)
    plan = make_plan(tmp_path, {"a": "true"})
    os.kill(sshd.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        code, output = push("testbox", str(plan), "--hosts", str(hosts))
        took = time.monotonic() - started
    finally:
        os.kill(sshd.proc.pid, signal.SIGCONT)
    assert code == 3 and "unreachable" in output
    assert took < 12


@pytest.mark.long
def test_runner_ticking_during_50_pushes_never_sees_a_partial_job(tmp_path: Path) -> None:
    root = tmp_path / "q"
    out = tmp_path / "out"
    out.mkdir()
    jobs = {f"j{i:03d}": f"touch {out}/j{i:03d}" for i in range(200)}
    plan = make_plan(tmp_path, jobs)
    compiled = compile_plan(plan, lint=False)  # what is pushed is the point here, not its lint (200 shellchecks)
    assert compiled.clean()
    host = Host(name=str(root), root=str(root))
    runner = RunnerProcess(root).start("--tick", "0.1", "--slots", "cpu=4")
    try:
        for _ in range(50):
            push_to(compiled, host, PushOptions(), lambda diff: None)
        wait_for(lambda: len(os.listdir(root / "done")) == 200, 60)
    finally:
        runner.stop()
    events = runner.events()
    assert not [e for e in events if e["event"] == "invalid"]
    starts = [e["job"] for e in events if e["event"] == "start"]
    assert len(starts) == len(set(starts)) == 200


def test_a_changed_job_the_runner_started_meanwhile_is_not_queued_again(tmp_path: Path) -> None:
    root = tmp_path / "q"
    plan = make_plan(tmp_path, {"a": "echo one"})
    assert push(str(root), str(plan))[0] == 0
    plan = make_plan(tmp_path, {"a": "echo two"})
    compiled = compile_plan(plan)
    host = Host(name=str(root), root=str(root))
    with QueueBackend(host).push_session(PushOptions()) as session:
        diff = session.diff(compiled, PushOptions())
        assert [c.mark for c in diff.changes] == ["~"]
        os.replace(root / "queue/a.job", root / "running/a.job")  # the runner starts the old version now
        outcome = session.apply(diff)
    assert outcome.notes == [
        "note: queue/a.job had already moved (the runner took it) when the push came to change it",
        "pushed: 0 installed, 0 removed",
    ]
    assert not (root / "queue/a.job").exists()

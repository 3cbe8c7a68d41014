"""Operating a box: park/unpark, bootstrap, the runner check on push, logs -f, retry and cancel."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner import FORMAT_VERSION
from tests.conftest import RunnerProcess, pid_alive, plan_cli, wait_for, write_job
from tests.sshd import Sshd

cli = CliRunner()


pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli


def test_park_starts_nothing_reports_parked_then_resumes(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    runner.start()
    code, out = plan("park", str(queue_root), "--reason", "IOMMU A/B, reboot per side")
    assert code == 0, out
    runner.wait_event("parked")
    write_job(queue_root, "1-gpu-bench.job", f"# LANE=gpu\ntouch {tmp_path}/ran\n")
    wait_for(lambda: any(q["job"] == "1-gpu-bench.job" for q in runner.status()["queued"]))
    reason = next(q for q in runner.status()["queued"] if q["job"] == "1-gpu-bench.job")
    assert reason["reason"] == "parked" and "IOMMU A/B" in reason["detail"]
    assert not (tmp_path / "ran").exists()
    state = tmp_path / "w.json"
    code, out = plan("watch", str(queue_root), "--once", "--state", str(state), "--idle", "0")
    assert code == 17 and out.startswith("PARKED: ") and "IDLE" not in out
    code, out = plan("watch", str(queue_root), "--once", "--state", str(state), "--idle", "0")
    assert code == 0, "PARKED is reported once, not on every probe"
    status = plan("status", str(queue_root))[1]
    assert "PARKED: parked since" in status
    assert plan("unpark", str(queue_root))[0] == 0
    runner.wait_event("unparked")
    runner.wait_event("done", job="1-gpu-bench.job")


def test_park_now_requeues_running_without_an_attempt(queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "1-gpu-long.job", "# LANE=gpu\nsleep 300\n")
    runner.start()
    runner.wait_event("start")
    assert plan("park", str(queue_root), "--now")[0] == 0
    recovered = runner.wait_event("recovered", job="1-gpu-long.job")
    assert "parked --now" in recovered["why"]
    wait_for(lambda: (queue_root / "queue/1-gpu-long.job").exists())
    runner.wait_ticks(2)  # parked: it does not start again
    assert len(runner.events("start")) == 1
    assert json.loads((queue_root / "state.json").read_text())["attempts"]["1-gpu-long.job"] == 0


def _bootstrap_and_start(host_args: list[str], root: Path) -> None:
    code, out = plan("bootstrap", *host_args, "--python", sys.executable, "--no-cgroup")
    assert code == 0, out
    # Over ssh the host is this machine: where systemd runs, the test's sshd (UsePAM no) gives a login without
    # a user manager, and bootstrap --user says so; in neither case is a unit written or started.
    no_systemd = "systemd is not running on " in out or "no systemd user manager for this login on " in out
    assert no_systemd and ": no unit written" in out, out
    assert (root / ".plan-runner/runner/service/runner.py").exists()
    command = next(line.strip() for line in out.splitlines() if "-m runner run --root" in line)
    proc = subprocess.Popen(
        command,
        shell=True,
        start_new_session=True,
        env={"PATH": os.environ["PATH"]},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (root / "status.json").exists(), 15)
        status = json.loads((root / "status.json").read_text())
        assert status["runner"]["format_version"] == FORMAT_VERSION
        assert str(root / ".plan-runner") in Path(f"/proc/{status['runner']['pid']}/environ").read_text()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait()
    from plancompiler.transport import runner_sources

    again = plan("bootstrap", *host_args, "--python", sys.executable)[1]
    assert f"wrote 0 files, {len(runner_sources())} unchanged" in again  # idempotent


@pytest.fixture
def unit_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The in-process agent's bootstrap looks for systemd and writes units under the test's directory (where
    systemd does not run unless the test makes it), never this machine's /run and /etc."""
    from runner.agent import bootstrap as box

    where = tmp_path / "systemd"
    monkeypatch.setattr(box, "SYSTEMD_RUNNING", str(where / "run"))
    monkeypatch.setattr(box, "UNIT_DIRS", {"system": str(where / "system"), "user": str(where / "user")})
    return where


def test_a_user_unit_is_written_only_where_the_login_has_a_user_manager(
    tmp_path: Path, unit_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where systemd runs but this login has no user manager (ssh with UsePAM no, no lingering), `--user` writes no
    unit and calls no systemctl, and says why; where the login has one ($XDG_RUNTIME_DIR/systemd/private), the
    unit is written and systemctl --user is asked (a stand-in here, which fails: the error names the unit)."""
    (unit_dirs / "run").mkdir(parents=True)  # systemd runs
    bin_, calls = tmp_path / "bin", tmp_path / "systemctl.calls"
    bin_.mkdir()
    (bin_ / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho no bus >&2\nexit 1\n')
    (bin_ / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    root = tmp_path / "box"
    code, out = plan("bootstrap", str(root), "--user", "--no-cgroup", "--python", sys.executable)
    assert code == 0, out
    assert f"no systemd user manager for this login on {root}: no unit written" in out, out
    assert "loginctl enable-linger" in out and "-m runner run --root" in out
    assert not calls.exists() and not (unit_dirs / "user").exists()
    runtime = tmp_path / "runtime"
    (runtime / "systemd").mkdir(parents=True)
    (runtime / "systemd" / "private").touch()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    code, out = plan("bootstrap", str(root), "--user", "--no-cgroup", "--python", sys.executable)
    assert code == 1 and "systemctl failed" in out, out
    assert calls.read_text().splitlines() == ["--user daemon-reload"]
    from runner.agent.unit import unit_name

    assert [p.name for p in (unit_dirs / "user").iterdir()] == [unit_name(str(root))]


def test_bootstrap_into_an_empty_directory(tmp_path: Path, unit_dirs: Path) -> None:
    from runner.agent.unit import unit_name

    root = tmp_path / "box"
    code, out = plan("bootstrap", str(root), "--dry-run")
    assert code == 0 and "Restart=always" in out and not root.exists()
    assert shlex.quote(unit_name(str(root))) in out  # the root's own
    unit = out[out.index("[Unit]") :]
    for line in ("KillMode=control-group", "LimitMEMLOCK=infinity", f'--root "{root}"'):
        assert line in unit
    if shutil.which("systemd-analyze"):
        path = tmp_path / "plan-runner.service"
        path.write_text(unit)
        check = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
        assert "Unknown key" not in check.stderr and "Invalid" not in check.stderr, check.stderr
    _bootstrap_and_start([str(root)], root)


def test_a_dry_run_to_a_root_under_the_hosts_home_does_not_guess_its_unit_name(tmp_path: Path) -> None:
    """The host names the unit from the path `~` expands to there: the dry run, which reaches no host, says so
    rather than a name escaped from `~` that the host would never write."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  box:\n    ssh: nobody@127.0.0.1\n    root: ~/jobs\n")
    code, out = plan("bootstrap", "box", "--hosts", str(hosts), "--dry-run")
    assert code == 0, out
    assert "unit plan-runner-<~/jobs as the host expands it>.service (this root's own)" in out, out


def test_bootstrap_writes_no_unit_without_systemd_and_each_root_its_own_with_it(
    tmp_path: Path, unit_dirs: Path
) -> None:
    """Without systemd, --start starts the runner detached and writes no unit; with it, each root has its own unit
    (named as systemd-escape names the path), and a unit of that name that serves another root, or that plan did not
    write, is left as it is and named. An earlier bootstrap's plan-runner.service is kept for the root it serves."""
    from runner.agent.bootstrap import place_unit
    from runner.agent.unit import unit_text

    root = tmp_path / "q-4"
    code, out = plan("bootstrap", str(root), "--start", "--no-cgroup", "--python", sys.executable, "--tick", "0.2")
    started = json.loads((root / "status.json").read_text())["runner"]["pid"] if code == 0 else None
    if started:
        os.kill(started, 15)
        wait_for(lambda: not pid_alive(started))
    assert code == 0, out
    assert f"systemd is not running on {root}: no unit written" in out and "started the runner detached" in out
    assert not unit_dirs.exists()

    system = str(unit_dirs / "system")
    first, second = str(root), str(tmp_path / "q5")
    one = place_unit(system, first, unit_text(first, sys.executable, "lib"))
    two = place_unit(system, second, unit_text(second, sys.executable, "lib"))
    assert one[2] is None and two[2] is None and one[0] != two[0]
    assert sorted(os.listdir(system)) == sorted([one[0], two[0]])
    if shutil.which("systemd-escape"):
        escaped = subprocess.run(["systemd-escape", "--path", first], capture_output=True, text=True).stdout
        assert one[0] == f"plan-runner-{escaped.strip()}.service"
    assert place_unit(system, first, unit_text(first, sys.executable, "lib2")) == one  # its own: rewritten
    assert 'Environment="PYTHONPATH=lib2"' in Path(one[1]).read_text()

    theirs = unit_text(second, sys.executable, "lib")  # a unit named as FIRST's serving SECOND: refused, kept
    Path(one[1]).write_text(theirs)
    name, path, error = place_unit(system, first, unit_text(first, sys.executable, "lib"))
    assert (name, path) == one[:2] and error == f"it serves another root, {second}: not replaced " + (
        "(remove it by hand if that root is gone)"
    )
    assert Path(path).read_text() == theirs
    Path(path).write_text("[Service]\nExecStart=/bin/true\n")
    assert "it serves a unit plan bootstrap did not write" in str(place_unit(system, first, theirs)[2])

    legacy = Path(system) / "plan-runner.service"  # what bootstraps wrote before units were named per root
    legacy.write_text(unit_text(second, sys.executable, "old"))
    assert place_unit(system, second, unit_text(second, sys.executable, "lib"))[:2] == (
        "plan-runner.service",
        str(legacy),
    )
    assert "PYTHONPATH=lib" in legacy.read_text()


def test_bootstrap_over_ssh(tmp_path: Path, sshd: Sshd) -> None:
    root = tmp_path / "remote-box"
    hosts = sshd.hosts_file(root)
    _bootstrap_and_start(["testbox", "--hosts", str(hosts), "--user"], root)


def test_push_refuses_an_old_format_and_warns_on_a_stale_heartbeat(tmp_path: Path) -> None:
    root = tmp_path / "q"
    for state in ("queue", "running", "done", "failed"):
        (root / state).mkdir(parents=True)
    plan_file = tmp_path / "p.yaml"
    plan_file.write_text("plan: p\njobs:\n  - name: a\n    run: echo a\n")
    status = {"runner": {"pid": 1, "format_version": 0, "heartbeat": time.time()}}
    (root / "status.json").write_text(json.dumps(status))
    code, out = plan("push", str(root), str(plan_file))
    assert code == 1 and "reads job-file format 0" in out and "plan bootstrap" in out
    assert not os.listdir(root / "queue")
    status["runner"].update(format_version=1, heartbeat=time.time() - 3 * 3600)
    (root / "status.json").write_text(json.dumps(status))
    code, out = plan("push", str(root), str(plan_file))
    assert code == 0 and "1 job queued on" in out and "no runner has ticked there for 3h00m" in out
    plan_file.write_text("plan: p\njobs:\n  - name: a\n    run: echo a\n    priority: 3\n")  # format 2's header
    code, out = plan("push", str(root), str(plan_file))
    assert code == 1 and "reads job-file format 1, this plan needs 2" in out


def test_logs_follow_ends_when_the_job_ends(queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "1-cpu-talk.job", "for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done\n")
    runner.start()
    runner.wait_event("start")
    code, out = plan("logs", str(queue_root), "1-cpu-talk", "-f", "--interval", "0.2")
    assert code == 0
    assert [ln for ln in out.splitlines() if ln.startswith("line")] == [f"line {i}" for i in range(1, 6)]
    assert "1-cpu-talk.job is done" in out  # it ended because the job did (a follow that never ends hangs here)
    code, out = plan("logs", str(queue_root), "1-cpu-talk", "-n", "2")
    assert out.splitlines() == ["line 4", "line 5"]
    assert plan("logs", str(queue_root), "nope")[0] == 1


def test_logs_of_a_queued_job_say_it_has_not_started(queue_root: Path) -> None:
    """A queued job has no log yet: said, where `plan logs` printed nothing and exited 0 (and -f waited without a
    word)."""
    write_job(queue_root, "1-cpu-waits.job", "# REQUIRES=test -f /nonexistent/never\necho hi\n")
    code, out = plan("logs", str(queue_root), "1-cpu-waits")
    assert code == 0 and out == "-- 1-cpu-waits.job is queued and has not started: no log yet\n", out


def test_retry_and_cancel_race_a_fast_tick(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    for i in range(20):
        write_job(queue_root, f"{i:02d}-cpu-fail.job", "exit 1\n", state="failed")
    write_job(queue_root, "50-gpu-long.job", "# LANE=gpu\nsleep 300 &\nwait\n")
    write_job(queue_root, "60-gpu-queued.job", "# LANE=gpu\necho never\n")
    runner.start("--tick", "0.1")
    runner.wait_event("start", job="50-gpu-long.job")
    for i in range(20):
        code, out = plan("retry", str(queue_root), f"{i:02d}-cpu-fail")
        assert code == 0, out
    code, out = plan("cancel", str(queue_root), "60-gpu-queued")
    assert code == 0 and "queue -> removed" in out
    code, out = plan("cancel", str(queue_root), "50-gpu-long.job")
    assert code == 0 and "running -> failed" in out
    wait_for(lambda: len([e for e in runner.events("failed")]) == 20, 20)
    events = runner.events()
    retries = [e for e in events if e["event"] == "retry" and e.get("by")]
    assert len(retries) == 20 and all("@" in e["by"] for e in retries)
    starts = [e["job"] for e in events if e["event"] == "start"]
    assert sorted(starts) == sorted([f"{i:02d}-cpu-fail.job" for i in range(20)] + ["50-gpu-long.job"])
    assert sorted(os.listdir(queue_root / "failed")) == sorted(
        [f"{i:02d}-cpu-fail.job" for i in range(20)] + ["50-gpu-long.job"]
    )
    cancelled = [e for e in events if e["event"] == "cancelled"]
    assert {e["job"]: e["was"] for e in cancelled} == {"60-gpu-queued.job": "queued", "50-gpu-long.job": "running"}
    assert not os.listdir(queue_root / "queue") and not os.listdir(queue_root / "running")


def test_park_and_unpark_over_ssh(tmp_path: Path, queue_root: Path, runner: RunnerProcess, sshd: Sshd) -> None:
    hosts = sshd.hosts_file(queue_root)
    runner.start()
    code, out = plan("park", "testbox", "--hosts", str(hosts), "--reason", "kernel A/B")
    assert code == 0, out
    parked = runner.wait_event("parked")
    assert "kernel A/B" in parked["why"]
    assert json.loads((queue_root / "parked.json").read_text())["reason"] == "kernel A/B"
    code, out = plan("unpark", "testbox", "--hosts", str(hosts))
    assert code == 0 and "unparked" in out
    runner.wait_event("unparked")

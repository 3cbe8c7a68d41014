"""The box trusts no other user: a second local user (made here, removed after) tries to get a job run as root,
to have the runner write through its symlinks, or to drop files into a queue made under umask 000."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, RunnerProcess, plan_cli, read_events, wait_for, write_job

IN_CI = os.environ.get("CI") == "true"


@dataclass(frozen=True)
class Attacker:
    name: str
    uid: int
    gid: int

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        """COMMAND in sh as this user (setpriv: real and effective ids, its own groups), under umask 000."""
        return subprocess.run(
            [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--init-groups",
                "sh",
                "-c",
                f"umask 000; {command}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    """A throwaway local user with a unique name, removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        if IN_CI:
            pytest.fail("CI runs as root with useradd and setpriv: the second-user tests must run there")
        pytest.skip("needs root, useradd and setpriv to make a second local user")
    name = f"plan-evil-{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        import pwd

        entry = pwd.getpwnam(name)
        yield Attacker(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory both users can write to, as /tmp (pytest's tmp_path is root's 0700): root's, 1777."""
    path = Path(tempfile.mkdtemp(prefix="plan-trust-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_runner(root: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """A runner that is expected to refuse ROOT and exit at once."""
    return subprocess.run(
        [sys.executable, "-S", "-m", "runner", "run", "--root", str(root), "--tick", "0.2", *flags],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


def agent(mode: str, root: Path, request: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "agent", mode, str(root)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_root_made_by_another_user_is_refused_by_runner_agent_and_push(
    attacker: Attacker, shared_tmp: Path, tmp_path: Path, plan_env: None
) -> None:
    """1a: the user makes the root before the first push and drops a job in it: nothing of it ever runs."""
    root = shared_tmp / "q"
    proof = shared_tmp / "proof"
    made = attacker.run(
        f"mkdir -p {root}/queue && chmod 755 {root} {root}/queue && "
        f"printf 'id -u > {proof}\\n' > {root}/queue/zz-evil.job"
    )
    assert made.returncode == 0, made.stderr
    refused = run_runner(root)
    assert refused.returncode == 2, refused.stderr
    assert f"{root} (owner {attacker.name} (uid {attacker.uid}), mode 0755)" in refused.stderr
    assert "belongs to another user" in refused.stderr and "fix: " in refused.stderr
    assert not proof.exists() and not (root / "events.jsonl").exists()

    answer = agent("status", root, {})
    assert "refusing the queue root" in answer["error"] and attacker.name in answer["error"]

    plan = tmp_path / "p.yaml"
    plan.write_text(f"plan: p\njobs:\n  - name: a\n    run: touch {tmp_path}/a\n    outputs: [{tmp_path}/a]\n")
    code, output = plan_cli("push", str(root), str(plan))
    assert code == 1, output
    assert "refusing the queue root" in output and "belongs to another user" in output
    assert sorted(os.listdir(root / "queue")) == ["zz-evil.job"], "nothing installed"

    # Only queue/ is the user's (the root is ours): still refused, naming queue/.
    shutil.rmtree(root)
    root.mkdir(mode=0o700)
    (root / "queue").mkdir()
    os.chown(root / "queue", attacker.uid, attacker.gid)
    refused = run_runner(root)
    assert refused.returncode == 2 and f"{root}/queue (owner {attacker.name}" in refused.stderr


def test_under_umask_000_everything_is_0700_or_0600_and_the_other_user_cannot_drop_jobs(
    attacker: Attacker, shared_tmp: Path, tmp_path: Path, plan_env: None
) -> None:
    """1b: a runner started under umask 000 still makes 0700 directories and 0600 files; another user can
    neither add a job nor a control request."""
    root = shared_tmp / "q"
    runner = RunnerProcess(root)
    root.mkdir(mode=0o700)
    (root / "queue").mkdir(mode=0o700)
    write_job(root, "a.job", "echo hello\n").chmod(0o600)  # the test's own file; the runner makes the rest
    old = os.umask(0)
    try:
        runner.start()
        runner.wait_event("done", job="a.job")
    finally:
        os.umask(old)
    try:
        assert mode_of(root) == 0o700, oct(mode_of(root))
        for name in ("running", "done", "failed", "logs", "control"):
            assert mode_of(root / name) == 0o700, (name, oct(mode_of(root / name)))
        for name in ("events.jsonl", "status.json", "state.json", "heartbeat.json", "logs/a.job.log"):
            assert mode_of(root / name) == 0o600, (name, oct(mode_of(root / name)))
        assert mode_of(root / "running/.a.job.exit") == 0o600 if (root / "running/.a.job.exit").exists() else True
        dropped = attacker.run(f"echo 'id > {shared_tmp}/proof' > {root}/queue/evil.job")
        assert dropped.returncode != 0 and "Permission denied" in dropped.stderr
        dropped = attacker.run(f"echo '{{}}' > {root}/control/cancel-a.job")
        assert dropped.returncode != 0
    finally:
        runner.stop()
    assert not (shared_tmp / "proof").exists()

    # A push under umask 000 makes its root and what it installs 0700 and 0600 too.
    pushed = shared_tmp / "pushed" / "q"
    plan = tmp_path / "p.yaml"
    plan.write_text(f"plan: p\njobs:\n  - name: a\n    run: touch {tmp_path}/a\n    outputs: [{tmp_path}/a]\n")
    old = os.umask(0)
    try:
        code, output = plan_cli("push", str(pushed), str(plan))
    finally:
        os.umask(old)
    assert code == 0, output
    assert mode_of(pushed.parent) == 0o755 and mode_of(pushed) == 0o700
    assert mode_of(pushed / "queue") == 0o700 and mode_of(pushed / "control") == 0o700
    assert mode_of(pushed / "queue/a.job") == 0o600 and mode_of(pushed / "manifest.json") == 0o600


@pytest.mark.parametrize(
    ("mode", "words"),
    [(0o777, "world-writable"), (0o770, "group-writable"), (0o703, "world-writable")],
)
def test_a_directory_others_may_write_is_refused_with_the_fix(tmp_path: Path, mode: int, words: str) -> None:
    root = tmp_path / "q"
    (root / "queue").mkdir(parents=True)
    os.chmod(root / "queue", mode)
    refused = run_runner(root)
    assert refused.returncode == 2
    assert f"{root}/queue (owner root (uid 0), mode {mode:04o}) is {words}" in refused.stderr
    assert f"fix: chmod 700 {root}/queue" in refused.stderr
    assert not (root / "events.jsonl").exists()


@pytest.mark.parametrize("name", ["queue", "logs", "control", "running", ".plan-runner"])
def test_a_symlinked_directory_inside_the_root_is_refused(tmp_path: Path, name: str) -> None:
    """1c: queue/ or logs/ as a symlink would make the runner run or write wherever it points."""
    root = tmp_path / "q"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / name)
    refused = run_runner(root)
    assert refused.returncode == 2
    assert f"{root}/{name} (owner root (uid 0), mode 0777) is a symlink to {elsewhere}" in refused.stderr
    assert "refusing the queue root" in agent("status", root, {})["error"]


def test_a_planted_log_symlink_is_never_written_through(tmp_path: Path) -> None:
    """1c: logs/a.job.log pointing at a root-only file: the job does not start (its log cannot be opened),
    the file keeps its bytes, and nothing new appears in logs/."""
    root = tmp_path / "q"
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    (root / "logs").mkdir(parents=True)
    os.symlink(secret, root / "logs/a.job.log")
    write_job(root, "a.job", "echo SHOULD-NOT-APPEAR\n")
    runner = RunnerProcess(root)
    try:
        runner.start()
        failed = runner.wait_event("start-failed", job="a.job")
        assert failed["errno"] == "ELOOP", failed
    finally:
        runner.stop()
    assert secret.read_text() == "root only\n" and mode_of(secret) == 0o600
    assert os.listdir(root / "logs") == ["a.job.log"] and os.path.islink(root / "logs/a.job.log")


def test_a_root_under_another_users_directory_is_refused(attacker: Attacker, shared_tmp: Path) -> None:
    """Whoever owns the directory above the root can rename the root away and put their own in its place."""
    parent = shared_tmp / "theirs"
    assert attacker.run(f"mkdir {parent} && chmod 755 {parent}").returncode == 0
    root = parent / "q"
    root.mkdir(mode=0o700)
    refused = run_runner(root)
    assert refused.returncode == 2
    assert f"{parent} (owner {attacker.name}" in refused.stderr and f"above {root}" in refused.stderr


def test_group_share_makes_2770_and_0660(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    runner = RunnerProcess(root)
    write_job(root, "a.job", "echo hi\n")
    root.chmod(0o700)
    try:
        runner.start("--group-share")
        runner.wait_event("done", job="a.job")
    finally:
        runner.stop()
    assert mode_of(root) == 0o2770
    assert mode_of(root / "logs") == 0o2770 and mode_of(root / "control") == 0o2770
    assert mode_of(root / "logs/a.job.log") == 0o660 and mode_of(root / "status.json") == 0o660


def test_runner_help_states_the_modes() -> None:
    out = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "run", "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    ).stdout
    flat = " ".join(out.split())
    assert "directories it creates are 0700 and files 0600 whatever the umask" in flat
    assert "--group-share" in flat and "2770" in flat


def test_events_file_is_never_opened_through_a_symlink(tmp_path: Path) -> None:
    root = tmp_path / "q"
    root.mkdir()
    target = tmp_path / "target"
    target.write_text("")
    os.symlink(target, root / "events.jsonl")
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "runner", "run", "--root", str(root), "--tick", "0.1"],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (root / "status.json").exists())
        status = json.loads((root / "status.json").read_text())
        assert "events.jsonl" in json.dumps(status.get("write_errors") or status)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert target.read_text() == "", "nothing written through the link"
    assert read_events(root) == []

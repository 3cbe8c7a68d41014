"""A push of 10 000 jobs: over ssh its bundle goes compressed and lands exactly; a push cut off while it sends
leaves nothing; a push killed with -9 at random moments leaves the old queue or the new one, each whole.

The roots are on /dev/shm where there is one: 10 000 file creations on this VM's disk take ~5 s under load, and
what is tested here (framing, the lock, the order of the install) does not depend on the file system's speed."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runner as runner_pkg
from plancompiler.errors import RemoteFailed, Unreachable
from plancompiler.hosts import AgentSession, resolve
from plancompiler.transport import upload
from runner import pushlock
from runner.agent import delivery, wire
from tests.conftest import wait_for
from tests.sshd import Sshd
from tests.ticking import Ticking

JOBS = 10_000


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs (/dev/shm) where there is one, else under tmp_path."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = Path(tempfile.mkdtemp(prefix="push-scale-", dir=base))
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def version(tag: str, first: int, count: int = JOBS) -> dict[str, str]:
    """COUNT job files, as a compiled plan's look, named from FIRST on, their bodies saying TAG."""
    return {
        f"j-{i:06d}.job": (
            f"# PLAN=p\n# LANE=cpu\n# DONE_IF=test -f /srv/out/{i:06d}.txt\nset -euo pipefail\n"
            f"echo {tag} > /srv/out/{i:06d}.txt\n"
        )
        for i in range(first, first + count)
    }


def install_request(files: dict[str, str], old: dict[str, str], generation: int | None) -> dict[str, object]:
    """What a push sends for FILES over a queue holding OLD: the new files, the retired ones removed, the record."""
    return {
        "files": files,
        "remove": [["queue", name] for name in sorted(set(old) - set(files))],
        "record": {"plan": "p", "jobs": {name: {} for name in files}},
        "generation": generation,
        "create": True,
    }


def queue_of(root: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in (root / "queue").iterdir() if p.name.endswith(".job")}


def ssh_host(sshd: Sshd, directory: Path, root: Path, python: str) -> Path:
    hosts = directory / "hosts.yaml"
    hosts.write_text(
        f"hosts:\n  testbox:\n    ssh: testbox\n    root: {root}\n    python: {python}\n"
        f"    ssh_options: [-F, {sshd.config}]\n    timeout: 120\n"
    )
    return hosts


def test_a_10k_push_over_ssh_goes_compressed_and_installs_exactly(sshd: Sshd, fast_dir: Path) -> None:
    """Through a `python3` on the box that copies what the session receives: 10 000 job files go as one
    compressed frame, a small part of their JSON, and land with their exact bytes, the manifest naming them."""
    root, wire_copy = fast_dir / "q", fast_dir / "received"
    tee = fast_dir / "python3"
    tee.write_text(
        '#!/bin/sh\nfor a; do [ "$a" = session ] && exec sh -c \'tee -a "$0" | "$@"\' '
        f'{wire_copy} {sys.executable} "$@"; done\nexec {sys.executable} "$@"\n'
    )
    tee.chmod(0o755)
    files = version("v1", 0)
    host = resolve("testbox", ssh_host(sshd, fast_dir, root, str(tee)))
    upload(host.endpoint())  # the runner there first: the loader never exits before reading (tee would wait on)
    session = host.session()
    try:
        assert session.ask("lock", {"wait_s": 10, "create": True}) == {"locked": True}
        probe = session.ask("probe", {"allow_missing": True})
        answer = session.ask("install", install_request(files, {}, probe["generation"]))
    finally:
        session.close()
    assert sorted(answer["installed"]) == sorted(files) and answer["generation"] == 1
    assert queue_of(root) == files
    assert set(json.loads((root / "manifest.json").read_text())["jobs"]) == set(files)
    assert not [p for p in root.iterdir() if p.name.startswith(".plan-stage-")]
    sent = wire_copy.read_bytes()
    assert b"\nz " in sent, "the bundle went as a compressed frame"
    assert len(sent) < len(json.dumps(files)) / 5, f"{len(sent)} bytes on the wire"


def test_a_push_cut_off_while_it_sends_its_bundle_leaves_nothing(sshd: Sshd, fast_dir: Path) -> None:
    """ssh killed with half the frame sent: the agent never acts on it and ends, and the root it made for the
    push is gone again (no job, stage, manifest or lock file left)."""
    root = fast_dir / "q"
    host = resolve("testbox", ssh_host(sshd, fast_dir, root, sys.executable))
    session = host.session()
    try:
        assert session.ask("lock", {"wait_s": 10, "create": True}) == {"locked": True}
        frame = wire.encode({**install_request(version("v1", 0), {}, 0), "mode": "install"})
        assert frame.startswith(wire.FRAME)
        assert session.proc.stdin is not None
        os.set_blocking(session.proc.stdin.fileno(), True)
        os.write(session.proc.stdin.fileno(), frame[: len(frame) // 2])
        os.killpg(session.proc.pid, signal.SIGKILL)
    finally:
        session.close()
    # The agent ended without installing: it let its lock go and removed the root it made for the push.
    wait_for(lambda: not root.exists(), 20)


# A push as `plan push` makes it, in a process of its own: lock, probe, install of the version named.
_PUSH = """
import json, sys, time
from pathlib import Path
from plancompiler.errors import RemoteFailed, Unreachable
from plancompiler.hosts import AgentSession, resolve
spec, hosts, path = sys.argv[1:4]
request = json.loads(open(path).read())
session = resolve(spec, Path(hosts) if hosts else None).session()
session.ask("lock", {"wait_s": 60, "create": True})
request["generation"] = session.ask("probe", {"allow_missing": True})["generation"]
print("installing", flush=True)
session.ask("install", request)
session.close()
"""


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.long
@pytest.mark.parametrize("where", ["local", "ssh"])
def test_a_10k_push_killed_at_random_moments_leaves_the_old_or_the_new_queue_whole(
    where: str, fast_dir: Path, request: pytest.FixtureRequest
) -> None:
    """kill -9 of the push (and of its ssh) at a random moment of its lock and probe, its sending and its
    install, twice over a queue of 10 000 jobs, each push replacing the other version (500 jobs retired, 500 new, the rest
    changed): the queue, once the install that may go on without the push has ended, is one version whole."""
    root = fast_dir / "q"
    if where == "ssh":
        sshd: Sshd = request.getfixturevalue("sshd")
        spec, hosts = "testbox", str(ssh_host(sshd, fast_dir, root, sys.executable))
    else:
        spec, hosts = str(root), ""
    host = resolve(spec, Path(hosts) if hosts else None)
    versions = [version("v1", 0), version("v2", 500)]
    env = dict(os.environ, PYTHONPATH=str(Path(runner_pkg.__file__).resolve().parent.parent))
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)

    def push(new: int, kill_at: float | None) -> tuple[float, float]:
        """Push version NEW and kill it (and its ssh) KILL_AT seconds after its start; else (the seconds to its
        install, the seconds the install took)."""
        path = fast_dir / f"request-{new}.json"
        path.write_text(json.dumps(install_request(versions[new], versions[1 - new], None)))
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _PUSH, spec, hosts, str(path)], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            if kill_at is None:
                assert proc.stdout is not None and proc.stdout.readline() == "installing\n"
                lead = time.monotonic() - started
                assert proc.wait(timeout=120) == 0
                return lead, time.monotonic() - started - lead
            try:
                proc.wait(timeout=kill_at)
            except subprocess.TimeoutExpired:
                ssh = _children(proc.pid) if where == "ssh" else []  # local: the install's own process lives on
                proc.kill()
                for pid in ssh:
                    os.kill(pid, signal.SIGKILL)
            return kill_at, 0.0
        finally:
            proc.kill()
            proc.wait()

    lead, install = push(0, None)  # the old queue, and how long a push takes here to its install and in it
    current = 0
    for round_ in range(2):
        new = 1 - current
        moment = rng.uniform(lead / 2, lead + install)  # its lock and probe, the bundle sent, the install
        push(new, moment)
        # Whatever install went on without the push has ended once its lock is free.
        assert host.call("lock", {"wait_s": 60})["locked"]
        files = queue_of(root)
        what = (
            f"{where}, seed {seed}, round {round_}, killed at {moment:.2f}s (install at {lead:.2f}s for {install:.2f}s)"
        )
        assert files in (versions[current], versions[new]), f"{what}: a mixed queue of {len(files)} jobs"
        manifest = json.loads((root / "manifest.json").read_text())
        assert set(manifest["jobs"]) == set(files), what
        assert not [p for p in root.iterdir() if p.name.startswith(".plan-stage-")], what
        current = new if files == versions[new] else current


@pytest.mark.parametrize(
    ("sent", "answer"),
    [
        (b"z 12\nnot a zlib s", "does not inflate"),
        (b"z many\n", "bad frame header"),
        (b"z 0\n", "a frame of 0 bytes"),
        (wire.FRAME + b"%d\n" % len(zlib.compress(b"{}")) + zlib.compress(b"{}")[:-2], None),  # cut short
        (b'{"mode": "probe"', None),  # a line cut short
    ],
)
def test_the_agent_session_answers_a_bad_frame_with_an_error_and_never_acts_on_a_cut_one(
    tmp_path: Path, sent: bytes, answer: str | None
) -> None:
    root = tmp_path / "q"
    root.mkdir(mode=0o700)
    env = dict(os.environ, PYTHONPATH=str(Path(runner_pkg.__file__).resolve().parent.parent))
    done = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "agent", "session", str(root)],
        input=sent,
        capture_output=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    if answer is None:
        assert done.stdout == b""
    else:
        assert answer in json.loads(done.stdout)["error"]
    assert os.listdir(root) == []


def _count(directory: Path) -> int:
    try:
        return len(os.listdir(directory))
    except FileNotFoundError:
        return 0


_INSTALL = """
import json, sys
from runner.agent import delivery
print(json.dumps(delivery.install(sys.argv[1], json.load(open(sys.argv[2])))), flush=True)
"""


def test_an_install_killed_during_its_renames_is_finished_before_any_job_starts(fast_dir: Path) -> None:
    """kill -9 of the installing process itself at a random moment of its renames, over a queue of 10 000 jobs
    (500 retired, 500 new, the rest changed): the runner's start finishes it (round 0), or the next push does
    (round 1), before anything reads the queue; the queue is one version whole and every job started is of it."""
    root = fast_dir / "q"
    versions = [version("v1", 0), version("v2", 500)]
    env = dict(os.environ, PYTHONPATH=str(Path(runner_pkg.__file__).resolve().parent.parent))
    record = root / ".install.json"
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)

    def install(new: int, kill: bool) -> float:
        """Install version NEW in a process of its own; kill it -9 a random moment into its renames (KILL), else
        the seconds from its first rename to its end."""
        path = fast_dir / f"request-{new}.json"
        path.write_text(json.dumps(install_request(versions[new], versions[1 - new], None)))
        queue = root / "queue"
        # The file its removes and renames change first (each goes in name order): the first retired one goes, or
        # on an empty queue the first new one lands. One stat a poll: a listing of 10 000 names every ms kept a
        # core busy through the whole staging.
        retired = sorted(set(versions[1 - new]) - set(versions[new]))
        first = queue / (retired[0] if _count(queue) else min(versions[new]))
        was = first.exists()
        assert was == bool(_count(queue)), "the queue holds the other version whole, or nothing"
        proc = subprocess.Popen([sys.executable, "-c", _INSTALL, str(root), str(path)], env=env, text=True)
        try:
            # Its removes and renames have begun: the queue no longer holds the other version's 10 000 jobs.
            wait_for(lambda: first.exists() != was or proc.poll() is not None, 60, 0.001)
            began = time.monotonic()
            if kill:
                time.sleep(rng.uniform(0, renames))
                os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=120) == 0 or kill
            return time.monotonic() - began
        finally:
            proc.kill()
            proc.wait()

    renames = 0.0
    renames = install(0, kill=False)  # the first version, and how long its renames take
    assert not record.exists()
    current = 0
    for round_ in range(2):
        new = 1 - current
        install(new, kill=True)
        what = f"seed {seed}, round {round_}, the renames took {renames:.2f}s"
        pending = record.exists()
        if round_ == 0:  # a runner starts: it finishes the install before it starts any job
            ticking = Ticking(root, slots={"cpu": 4})
            try:
                ticking.start(1000.0).tick(1000.0)
            finally:
                ticking.close()
            started = {p.name: p.read_text() for p in (root / "running").iterdir() if p.name.endswith(".job")}
            assert started, what
        else:  # the next push: it finishes the install before it looks
            try:
                assert "installed" in delivery.install(str(root), {"files": {}}), what
            finally:
                pushlock.release_lock()
            started = {}
        files = {**queue_of(root), **started}
        assert not record.exists(), what
        assert files in (versions[current], versions[new]), f"{what} (pending: {pending}): a mixed queue"
        manifest = json.loads((root / "manifest.json").read_text())
        assert set(manifest["jobs"]) == set(files), what
        assert not [p for p in root.iterdir() if p.name.startswith(".plan-stage-")], what
        current = new if files == versions[new] else current
        for job in started:  # the next round compares queues only
            (root / "running" / job).unlink()


def test_no_moment_after_an_install_record_is_gone_leaves_its_stage(
    fast_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage is removed before the install record: an install killed at any moment after its record is gone
    has left no stage that no record names (before, a kill between the two left one of 10 000 files for an hour)."""
    root = fast_dir / "q"
    stages_when_the_record_went: list[list[str]] = []
    unlink = os.unlink

    def watched(path: Any, *args: Any, **kwargs: Any) -> None:
        if os.path.basename(path) == ".install.json":
            stages_when_the_record_went.append([p.name for p in root.iterdir() if p.name.startswith(".plan-stage-")])
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", watched)
    try:
        delivery.install(str(root), install_request(version("v1", 0, 300), {}, None))
    finally:
        pushlock.release_lock()
    assert stages_when_the_record_went == [[]]
    assert len(queue_of(root)) == 300


def test_the_box_agent_killed_during_its_renames_leaves_an_install_the_next_push_finishes(
    sshd: Sshd, fast_dir: Path
) -> None:
    """kill -9 of the agent on the box (by the pid its `python3` wrote) the moment its install's first rename is
    done, over a queue of 3 000 jobs (500 retired, 500 new, the rest changed): the next push over ssh finishes
    that install from .install.json before its probe looks, so it sees the new version whole (no job partly
    written, none of the old version, none dropped), and its own install is not refused as one that came
    after another."""
    root, marker = fast_dir / "q", fast_dir / "agent.pid"
    python = fast_dir / "python3"  # the agent session's pid, written before it becomes the box's python
    python.write_text(
        f'#!/bin/sh\nfor a; do [ "$a" = session ] && echo $$ > {marker}; done\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    host = resolve("testbox", ssh_host(sshd, fast_dir, root, str(python)))
    old = version("v1", 0, 3000)  # 3 000 renames: tens of ms to stop it in

    def push() -> tuple[AgentSession, dict[str, Any]]:
        session = host.session()
        assert session.ask("lock", {"wait_s": 10, "create": True}) == {"locked": True}
        return session, session.ask("probe", {"allow_missing": True})

    delivery.install(str(root), install_request(old, {}, None))  # the old queue, put there directly
    pushlock.release_lock()
    record = root / ".install.json"
    for attempt in range(1, 6):  # an install that ended its renames before it could be stopped (loaded): again
        new = version(f"v{attempt + 1}", 500 * attempt, 3000)
        first = min(set(new) - set(old))  # renamed first (in name order), after the removes
        session, probe = push()
        agent = int(marker.read_text())
        answers: list[object] = []
        request = install_request(new, old, probe["generation"])
        sending = threading.Thread(target=_send, args=(answers, session, request))
        sending.start()
        try:
            # The agent runs in slices: stopped, looked at, let go. Killed while stopped, the kill lands exactly
            # in the state the test saw (a kill after a poll came late under load, after the last rename).
            while sending.is_alive():
                os.kill(agent, signal.SIGSTOP)
                wait_for(functools.partial(_stopped, agent), 10, 0.0002)
                if record.exists() and not (root / json.loads(record.read_text())["stage"] / first).exists():
                    break  # its first rename is done, and it is stopped there
                os.kill(agent, signal.SIGCONT)
                time.sleep(0 if record.exists() else 0.002)  # while it stages: slices of a few ms
        finally:
            os.kill(agent, signal.SIGKILL)  # (also on a failure: never a stopped agent left behind)
            sending.join(60)
            session.close()
        if record.exists() and queue_of(root) != new:
            break  # stopped part-way through its renames: killed there
        # It ended before it could be stopped, or ran all its renames in one slice (a loaded machine: its record
        # is left for the next push to finish): either way every file of it landed whole.
        assert queue_of(root) == new, "an install that ended before it was stopped landed whole"
        old = new
    assert answers and isinstance(answers[0], (RemoteFailed, Unreachable)), answers
    assert record.exists(), "killed during its renames: the install is left pending"
    files = queue_of(root)
    assert files != new and files.get(first) == new[first], "part of it landed"

    session, probe = push()  # the next push: it finishes the install before it looks
    try:
        assert not record.exists() and not [p for p in root.iterdir() if p.name.startswith(".plan-stage-")]
        shas = {name: entry["sha"] for name, entry in probe["files"]["queue"].items()}
        assert shas == {name: hashlib.sha256(text.encode()).hexdigest() for name, text in new.items()}
        assert queue_of(root) == new and probe["generation"] == attempt + 1
        assert set(json.loads((root / "manifest.json").read_text())["jobs"]) == set(new)
        # what it diffed is what it installs against: no other install comes between
        answer = session.ask("install", {"files": {"x.job": "# LANE=cpu\ntrue\n"}, "generation": attempt + 1})
        assert answer["installed"] == ["x.job"] and answer["generation"] == attempt + 2
    finally:
        session.close()


def _send(answers: list[object], session: AgentSession, request: dict[str, object]) -> None:
    answers.append(_asked(session, request))


def _stopped(pid: int) -> bool:
    """Whether PID is stopped (its state in /proc is T), or gone (nothing left to wait for)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"
    except (OSError, IndexError):
        return True


def _asked(session: AgentSession, request: dict[str, object]) -> object:
    """SESSION's answer to an install of REQUEST, or what it raised (its agent killed: ssh's exit 255 reads as
    Unreachable)."""
    try:
        return session.ask("install", request)
    except (RemoteFailed, Unreachable) as failed:
        return failed


def test_the_runner_starts_no_job_while_a_live_install_is_pending(tmp_path: Path) -> None:
    """A record whose push still holds the lock (an install during its renames): the runner starts nothing and
    leaves it alone; once the lock is free it finishes the install, then starts the jobs. A record that is
    not one an install wrote (a path for a stage) is removed, renaming nothing."""
    root = tmp_path / "q"
    delivery.install(str(root), {"files": {"a.job": "# LANE=cpu\ntrue\n"}, "record": {"plan": "p", "jobs": {}}})
    pushlock.release_lock()
    stage = root / ".plan-stage-killed"
    stage.mkdir()
    (stage / "b.job").write_text("# LANE=cpu\ntrue\n")
    record = root / ".install.json"
    record.write_text(json.dumps({"stage": stage.name, "files": ["b.job"], "remove": [["queue", "a.job"]]}))
    held = os.open(root / ".push.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # the push that wrote it, alive
    ticking = Ticking(root)
    try:
        ticking.start(1000.0).tick(1000.0)
        assert record.exists() and not list((root / "running").iterdir())
        assert (root / "queue" / "a.job").exists(), "left to the push that holds the lock"
        os.close(held)
        ticking.tick(1001.0)
        assert not record.exists() and not stage.exists()
        assert [p.name for p in (root / "running").iterdir()] == ["b.job"], "finished, then started"
        for planted in (
            {"stage": "../elsewhere", "files": ["c.job"]},
            {"stage": stage.name, "remove": [["..", "x"]]},
            {"files": 7},
            [1],
        ):
            (tmp_path / "x").write_text("kept\n")
            record.write_text(json.dumps(planted))
            ticking.tick(1002.0)
            assert not record.exists() and (tmp_path / "x").exists()
    finally:
        ticking.close()


def test_an_install_that_fails_part_way_keeps_its_staged_files_for_the_next_to_finish(tmp_path: Path) -> None:
    """An install whose renames stop on an error (here a directory where a job file lands) keeps its record and
    its staged files: the next install finishes it, and no job of it is lost (a missing staged file is read as
    one that landed, so a stage removed with its record left would have dropped every job not yet renamed)."""
    root = tmp_path / "q"
    delivery.install(str(root), {"files": {"old.job": "# LANE=cpu\ntrue\n"}, "record": {"plan": "p", "jobs": {}}})
    pushlock.release_lock()
    (root / "queue" / "b.job").mkdir()  # where b.job would land: its rename fails
    files = {name: "# LANE=cpu\ntrue\n" for name in ("a.job", "b.job", "c.job")}
    request = {"files": files, "remove": [["queue", "old.job"]], "record": {"plan": "p", "jobs": {}}}
    with pytest.raises(OSError):
        delivery.install(str(root), request)
    pushlock.release_lock()
    assert (root / ".install.json").exists(), "the record stays: the install is not finished"
    assert sorted(p.name for p in root.glob(".plan-stage-*/*")) == ["b.job", "c.job"], "what had not landed"
    (root / "queue" / "b.job").rmdir()
    delivery.install(str(root), {"files": {}, "record": None})
    pushlock.release_lock()
    assert sorted(p.name for p in (root / "queue").iterdir()) == ["a.job", "b.job", "c.job"]
    assert not (root / ".install.json").exists() and not list(root.glob(".plan-stage-*"))

"""Delivery v2: pushes that serialize and compare-and-swap, plans that own their jobs, pushes that say what the
host's runner is doing, and the runner package cached on the host by its hash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import runner as runner_pkg
from plancompiler.backends.protocol import Refused
from plancompiler.backends.queue import CHANGED, QueueBackend
from plancompiler.compile import Compiled, compile_plan
from plancompiler.hosts import Host, resolve
from plancompiler.push import PushOptions, push
from plancompiler.transport import runner_zip
from tests.conftest import RunnerProcess, plan_cli, runner_lock_held, wait_for, write_job
from tests.sshd import Sshd

pytestmark = pytest.mark.usefixtures("plan_env")


def make_plan(path: Path, name: str, jobs: dict[str, str]) -> Path:
    lines = [f"plan: {name}\njobs:\n"]
    lines += [f"  - name: {job}\n    run: {json.dumps(body)}\n" for job, body in jobs.items()]
    path.write_text("".join(lines))
    return path


def as_json(out: str) -> dict:
    """The --json document in OUT (typer's test runner mixes stderr's summary line in)."""
    return json.loads(out[out.index("\n{") + 1 : out.rindex("}") + 1])


def queue_of(root: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((root / "queue").iterdir()) if p.name.endswith(".job")}


def _pair_race(tmp_path: Path, host_for: callable, pairs: int) -> None:  # type: ignore[valid-type]
    """PAIRS times: v1 and v2 of one plan pushed at the same moment; the queue must end as exactly one of them."""
    v1 = compile_plan(make_plan(tmp_path / "v1.yaml", "p", {"a": "echo v1", "b": "echo v1", "c": "echo v1"}))
    v2 = compile_plan(make_plan(tmp_path / "v2.yaml", "p", {"b": "echo v2", "c": "echo v2", "d": "echo v2"}))
    assert v1.clean() and v2.clean()
    versions = {"v1": {j.filename: j.text for j in v1.jobs}, "v2": {j.filename: j.text for j in v2.jobs}}
    for i in range(pairs):
        root = tmp_path / f"race-{i}"
        host = host_for(root)
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def one(
            compiled: Compiled,
            host: Host = host,
            start: threading.Barrier = start,
            errors: list[BaseException] = errors,
        ) -> None:
            start.wait()
            try:
                outcome = push(compiled, host, PushOptions(), lambda diff: None)
                assert outcome.applied or outcome.notes == ["nothing to push"], outcome.notes
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(c,)) for c in (v1, v2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        files = queue_of(root)
        assert files in (versions["v1"], versions["v2"]), f"pair {i}: mixed queue {sorted(files)}"
        manifest = json.loads((root / "manifest.json").read_text())
        assert set(manifest["jobs"]) == set(files) == set(manifest["plans"]["p"]["jobs"])
        assert manifest["generation"] == 2  # both installed, one after the other
        assert not [n for n in os.listdir(root) if n.startswith(".plan-stage-")]


def test_twenty_simultaneous_push_pairs_never_mix_a_local_queue(tmp_path: Path) -> None:
    _pair_race(tmp_path, lambda root: Host(name=str(root), root=str(root)), 20)


@pytest.mark.long
def test_twenty_simultaneous_push_pairs_never_mix_a_queue_over_ssh(tmp_path: Path, sshd: Sshd) -> None:
    hosts = sshd.hosts_file(tmp_path / "unused")
    base = resolve("testbox", hosts)
    _pair_race(tmp_path, lambda root: Host(**{**base.__dict__, "root": str(root)}), 20)


def test_a_push_that_looked_at_an_older_queue_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "q"
    host = Host(name=str(root), root=str(root))
    v1 = compile_plan(make_plan(tmp_path / "v1.yaml", "p", {"a": "echo one"}))
    v2 = compile_plan(make_plan(tmp_path / "v2.yaml", "p", {"a": "echo two", "b": "echo two"}))
    v3 = compile_plan(make_plan(tmp_path / "v3.yaml", "p", {"a": "echo three"}))
    push(v1, host, PushOptions(), lambda diff: None)
    with QueueBackend(host).push_session(PushOptions(dry_run=True)) as session:  # looks, holds no lock
        stale = session.diff(v2, PushOptions())
        push(v3, host, PushOptions(), lambda diff: None)  # the queue changes meanwhile
        with pytest.raises(Refused, match=CHANGED):
            session.apply(stale)
    assert queue_of(root) == {"a.job": v3.jobs[0].text}


def test_a_second_push_waits_for_the_lock_then_names_its_holder(tmp_path: Path) -> None:
    root = tmp_path / "q"
    plan = make_plan(tmp_path / "p.yaml", "p", {"a": "true"})
    host = Host(name=str(root), root=str(root))
    holder = host.session()
    try:
        assert holder.ask("lock", {"wait_s": 1, "by": "ann@box", "create": True}) == {"locked": True}
        started = time.monotonic()
        code, out = plan_cli("push", str(root), str(plan), "--lock-wait", "1")
        assert code == 1 and time.monotonic() - started < 30
        assert f"another push to {root} is in progress (pid {os.getpid()}, ann@box, since 20" in out
        assert not (root / "queue").exists() or not os.listdir(root / "queue")
    finally:
        holder.close()  # its locks are released
    code, out = plan_cli("push", str(root), str(plan), "--lock-wait", "1")
    assert code == 0 and (root / "queue/a.job").exists(), out


def test_staging_dirs_of_other_pushes_are_left_alone_until_an_hour_old(tmp_path: Path) -> None:
    root = tmp_path / "q"
    fresh, old = root / ".plan-stage-4242-fresh", root / ".plan-stage-4243-old"
    for stage in (fresh, old):
        stage.mkdir(parents=True)
        (stage / "x.job").write_text("echo staged\n")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    code, out = plan_cli("push", str(root), str(make_plan(tmp_path / "p.yaml", "p", {"a": "true"})))
    assert code == 0, out
    assert (fresh / "x.job").exists() and not old.exists()
    assert sorted(n for n in os.listdir(root) if n.startswith(".plan-stage-")) == [fresh.name]


def test_a_plan_may_not_take_another_plans_job_without_take_over(tmp_path: Path) -> None:
    root = tmp_path / "q"
    alpha = make_plan(tmp_path / "alpha.yaml", "alpha", {"10-cpu-shared": "echo alpha", "20-cpu-alpha": "true"})
    beta = make_plan(tmp_path / "beta.yaml", "beta", {"10-cpu-shared": "echo beta"})
    assert plan_cli("push", str(root), str(alpha))[0] == 0
    before = queue_of(root)
    code, out = plan_cli("push", str(root), str(beta))
    assert code == 1
    assert "10-cpu-shared.job in queue/ belongs to plan alpha, pushed by " in out and "--take-over" in out
    assert queue_of(root) == before
    code, out = plan_cli("push", str(root), str(beta), "--take-over")
    assert code == 0, out
    assert "~  10-cpu-shared.job  (taken over from plan alpha; attempts reset)" in out
    assert "# PLAN=beta@" in (root / "queue/10-cpu-shared.job").read_text()
    assert (root / "control/reset-10-cpu-shared.job").exists()
    manifest = json.loads((root / "manifest.json").read_text())
    assert set(manifest["plans"]["alpha"]["jobs"]) == {"20-cpu-alpha.job"}
    assert set(manifest["plans"]["beta"]["jobs"]) == {"10-cpu-shared.job"}
    assert set(manifest["jobs"]) == {"10-cpu-shared.job", "20-cpu-alpha.job"}
    # alpha pushing again is now the one refused; it keeps its other job, and prunes nothing of beta's
    code, out = plan_cli("push", str(root), str(alpha))
    assert code == 1 and "belongs to plan beta" in out
    code, out = plan_cli("push", str(root), str(make_plan(tmp_path / "alpha.yaml", "alpha", {"20-cpu-alpha": "true"})))
    assert code == 0 and "10-cpu-shared.job" not in out, out
    assert set(queue_of(root)) == {"10-cpu-shared.job", "20-cpu-alpha.job"}


def test_hand_written_jobs_are_never_replaced_or_pruned(tmp_path: Path) -> None:
    root = tmp_path / "q"
    # A blank line ends the header: to the runner this job has no PLAN=, so it is hand-written.
    write_job(root, "a.job", "# LANE=cpu\n\n# PLAN=p@1\necho by hand\n")
    write_job(root, "b.job", "# PLAN=p@1\necho pushed once\n")
    code, out = plan_cli("push", str(root), str(make_plan(tmp_path / "p.yaml", "p", {"a": "true"})))
    assert code == 1 and "a.job in queue/ is a hand-written job (no PLAN= header)" in out
    assert (root / "queue/a.job").read_text().endswith("echo by hand\n")
    code, out = plan_cli("push", str(root), str(make_plan(tmp_path / "p.yaml", "p", {"c": "true"})))
    assert code == 0 and "-  b.job" in out and "a.job" not in out
    assert set(queue_of(root)) == {"a.job", "c.job"}


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C is Python's KeyboardInterrupt in this process, as at a terminal, whatever started the suite: a
    shell's background job (`pytest &`) has SIGINT ignored in every worker, and a Ctrl-C the push held back
    until its install ended was then dropped (the push exited 0)."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_ctrl_c_during_a_push_says_whether_it_was_applied(tmp_path: Path) -> None:
    """A SIGINT while the install runs is held until the install ends (it lands whole), then the push says it was
    applied and exits 130; one while the diff is shown says nothing was changed, and nothing was."""
    from plancompiler.errors import Interrupted
    from tests.inprocess import plan_main

    root = tmp_path / "q"
    plan = make_plan(tmp_path / "p.yaml", "p", {f"j{i:03d}": "true" for i in range(200)})  # an install of ~0.1 s
    landed = threading.Event()

    def interrupt_the_install() -> None:  # the push's one deferred request is its install (localagent._Deferred)
        while not landed.is_set():
            held_by = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
            if type(held_by).__name__ == "_Deferred":
                os.kill(os.getpid(), signal.SIGINT)
                landed.set()
            time.sleep(0.0002)

    interrupter = threading.Thread(target=interrupt_the_install, daemon=True)
    interrupter.start()
    try:
        ran = plan_main("push", str(root), str(plan), cwd=tmp_path, cache=tmp_path / "cache")
    finally:
        landed.set()
        interrupter.join()
    assert ran.returncode == 130, ran.stdout + ran.stderr
    assert ran.stderr.endswith(
        f"plan: interrupted after the install: the push was applied on {root} (`plan status` shows its queue)\n"
    ), ran.stderr
    assert len(queue_of(root)) == 200

    def interrupt(diff: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    again = compile_plan(make_plan(tmp_path / "p2.yaml", "p", {"j000": "echo changed"}))
    with pytest.raises(Interrupted) as stopped:
        push(again, resolve(str(root)), PushOptions(), interrupt)
    assert str(stopped.value) == f"interrupted before the push was applied: nothing was changed on {root}"
    assert stopped.value.code == 130 and len(queue_of(root)) == 200


def test_a_ctrl_c_while_the_push_session_closes_says_the_push_was_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the install, the session still closes (the push lock released): a Ctrl-C there is after a push that
    was applied, not before one."""
    from plancompiler.errors import Interrupted
    from plancompiler.localagent import LocalSession

    root = tmp_path / "q"
    real = LocalSession.close

    def close_then_ctrl_c(self: LocalSession) -> None:
        real(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalSession, "close", close_then_ctrl_c)
    with pytest.raises(Interrupted) as stopped:
        push(compile_plan(make_plan(tmp_path / "p.yaml", "p", {"a": "true"})), resolve(str(root)), PushOptions(), print)
    assert str(stopped.value).startswith(f"interrupted after the install: the push was applied on {root}")
    assert len(queue_of(root)) == 1


def test_push_says_when_the_runner_is_not_running_it(tmp_path: Path) -> None:
    root = tmp_path / "q"
    plan = make_plan(tmp_path / "p.yaml", "p", {"a": "sleep 60"})
    code, out = plan_cli("push", str(root), str(plan), "--dry-run", "--json")
    assert code == 0 and as_json(out)["host_state"]["runner"] == "never-started"
    code, out = plan_cli("push", str(root), str(plan))
    assert code == 0 and "warning: 1 job queued on " in out and "but no runner has ever ticked there" in out
    changed = make_plan(tmp_path / "p2.yaml", "p", {"a": "sleep 61", "b": "true", "c": "true"})
    code, out = plan_cli("push", str(root), str(changed))  # a changed job is counted once, with the new ones
    assert code == 0 and "warning: 3 jobs queued on " in out
    code, out = plan_cli("push", str(root), str(plan))  # the pruned ones not at all
    assert code == 0 and "warning: 1 job queued on " in out and len(queue_of(root)) == 1
    runner = RunnerProcess(root).start()
    try:
        code, out = plan_cli("push", str(root), str(plan), "--dry-run")
        assert code == 0 and "warning:" not in out, out
        assert plan_cli("park", str(root), "--reason", "BIOS update")[0] == 0
        code, out = plan_cli("push", str(root), str(plan), "--dry-run")
        assert f"warning: {root} is parked since " in out and ": BIOS update; no job starts until `plan unpark" in out
    finally:
        runner.stop()
    code, out = plan_cli("push", str(root), str(plan), "--dry-run", "--json")
    data = as_json(out)
    assert data["host_state"]["runner"] == "stopped" and data["host_state"]["parked"]["reason"] == "BIOS update"
    assert any("(runner-stop) and has not started since" in w for w in data["warnings"])
    # a runner killed without a word: its pid is gone, its heartbeat still fresh (status.json's alone: as an
    # older runner, without heartbeat.json, leaves it)
    (root / "heartbeat.json").unlink()
    status = json.loads((root / "status.json").read_text())
    status["runner"].update(pid=2**22 + 7, heartbeat=time.time())
    (root / "status.json").write_text(json.dumps(status))
    with (root / "events.jsonl").open("a") as events:
        events.write(json.dumps({"ts": "2099-01-01 00:00:00", "job": "-", "event": "runner-start"}) + "\n")
    code, out = plan_cli("push", str(root), str(plan), "--dry-run")
    assert f"its runner (pid {2**22 + 7}) is not running" in out
    status["runner"]["heartbeat"] = time.time() - 900
    (root / "status.json").write_text(json.dumps(status))
    code, out = plan_cli("push", str(root), str(plan), "--dry-run", "--dead", "600")
    assert "no runner has ticked there for 15m" in out


def test_the_runner_package_is_sent_once_per_content_hash(tmp_path: Path, sshd: Sshd) -> None:
    root = tmp_path / "box"
    root.mkdir()
    host = resolve("testbox", sshd.hosts_file(root))
    digest, data = runner_zip()
    assert runner_zip()[1] == data  # built the same way every time: the hash is the content
    # this worker's sshd user cache may hold it from a push to a root that did not exist yet (found there, never sent)
    (sshd.directory / "cache" / "plan-runner" / f"runner-{digest}.pyz").unlink(missing_ok=True)
    shutil.rmtree(sshd.directory / "cache" / "plan-runner" / f"runner-{digest}.d", ignore_errors=True)
    assert "error" not in host.call("status", {"offset": -1})
    cached = root / ".plan-runner" / f"runner-{digest}.pyz"
    first = cached.stat()
    assert cached.read_bytes() == data
    host.call("status", {"offset": -1})
    assert cached.stat().st_mtime_ns == first.st_mtime_ns and cached.stat().st_ino == first.st_ino
    # unpacked once beside the zip, so the host's Python caches the runner's bytecode instead of compiling it
    # on every call (a zip import never writes any); where it cannot unpack, the zip is imported as it is
    unpacked = root / ".plan-runner" / f"runner-{digest}.d"
    agent = Path("agent", "dispatch.py")
    assert (unpacked / "runner" / agent).read_text() == (Path(runner_pkg.__file__).parent / agent).read_text()
    assert list((unpacked / "runner" / "agent" / "__pycache__").glob("dispatch.*.pyc"))
    assert not list((root / ".plan-runner").glob(".runner-*"))  # no unpacking left behind
    shutil.rmtree(unpacked)
    unpacked.write_text("not a directory\n")
    assert "error" not in host.call("status", {"offset": -1})
    assert not list((root / ".plan-runner").glob(".runner-*"))
    assert (unpacked / "runner" / "agent" / "dispatch.py").is_file(), (
        "the stray file is replaced by the checked package"
    )
    shutil.rmtree(unpacked)
    # a host where `plan bootstrap` installed this same runner uses that copy: nothing is uploaded
    code, out = plan_cli("bootstrap", "testbox", "--hosts", str(sshd.hosts_file(root)), "--user")
    assert code == 0, out
    cached.unlink()
    assert (root / ".plan-runner/runner.hash").read_text().strip() == digest
    assert "error" not in host.call("status", {"offset": -1})
    assert not cached.exists()


def test_a_package_cached_before_the_root_existed_is_not_sent_again(tmp_path: Path, sshd: Sshd) -> None:
    root = tmp_path / "new-box"
    host = resolve("testbox", sshd.hosts_file(root))
    digest, data = runner_zip()
    user_cache = sshd.directory / "cache" / "plan-runner" / f"runner-{digest}.pyz"
    user_cache.unlink(missing_ok=True)
    shutil.rmtree(user_cache.with_suffix(".d"), ignore_errors=True)  # its unpacked copy would be used as it is
    host.call("status", {"offset": -1})  # no root yet: the package can only go to the user's cache
    assert user_cache.read_bytes() == data and not root.exists()
    root.mkdir()
    stored = user_cache.stat()
    assert "error" not in host.call("status", {"offset": -1})
    # found in the user's cache: neither uploaded again there nor under the root that now exists
    assert not (root / ".plan-runner" / f"runner-{digest}.pyz").exists()
    assert user_cache.stat().st_ino == stored.st_ino


def test_a_local_agent_call_is_bounded_by_the_hosts_timeout(tmp_path: Path) -> None:
    """A local root's agent runs in-process; a request that does not end in time is `Unreachable`, as a hung
    agent process was (here: a control request no runner takes, waiting 3 s, under a 0.5 s limit)."""
    from plancompiler.transport import Unreachable

    root = tmp_path / "q"
    (root / "queue").mkdir(parents=True)
    host = Host(name=str(root), root=str(root), timeout=0.5)
    started = time.monotonic()
    with runner_lock_held(root), pytest.raises(Unreachable, match=r"no answer within 0\.5s"):
        host.call("control", {"job": "a.job", "action": "cancel", "wait_s": 3})
    assert time.monotonic() - started < 2.5
    assert host.call("control", {"job": "a.job", "action": "cancel", "wait_s": 0}, timeout=5)["taken"] is False


# A shell's background job starts with SIGINT ignored, and Python then keeps it so: these children are the user
# at a terminal pressing Ctrl-C, whatever started the suite.
_CTRL_C = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"

_INSTALL = (
    _CTRL_C + "import sys\n"
    "from plancompiler.hosts import Host\n"
    "host = Host(name=sys.argv[1], root=sys.argv[1])\n"
    "session = host.session()\n"
    "assert session.ask('lock', {'wait_s': 5, 'create': True}) == {'locked': True}\n"
    "files = {f'j{i:04d}.job': 'echo %d\\n' % i for i in range(3000)}\n"
    "print('ready', flush=True)\n"
    "try:\n"
    "    session.ask('install', {'files': files, 'create': True})\n"
    "except KeyboardInterrupt:\n"
    "    sys.exit(130)\n"
    "finally:\n"
    "    session.close()\n"
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_local_push_killed_or_interrupted_during_install_lands_whole(tmp_path: Path, sig: int) -> None:
    """Ctrl-C or kill -9 of `plan` while a local install of 3000 files runs: the install (an agent process in a
    session of its own, holding the push lock through the descriptor it inherited) lands every file, and the
    next push gets the lock."""
    root = tmp_path / "q"
    env = dict(os.environ, PYTHONPATH=str(Path(runner_pkg.__file__).resolve().parent.parent))
    proc = subprocess.Popen([sys.executable, "-c", _INSTALL, str(root)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        wait_for(lambda: any(p.name.startswith(".plan-stage-") for p in root.iterdir()), 10, 0.002)
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL)
    wait_for(lambda: len(os.listdir(root / "queue")) == 3000, 30)
    assert Host(name=str(root), root=str(root)).call("lock", {"wait_s": 10})["locked"]
    assert not [p for p in root.iterdir() if p.name.startswith(".plan-stage-")]


def test_ctrl_c_ends_a_local_wait_for_the_runner_at_once(tmp_path: Path) -> None:
    """Waiting (for the push lock, for the runner to take a request) writes nothing half-way: Ctrl-C ends it."""
    root = tmp_path / "q"
    (root / "queue").mkdir(parents=True)
    script = (
        _CTRL_C + "import sys\n"
        "from plancompiler.hosts import Host\n"
        "print('ready', flush=True)\n"
        "try:\n"
        "    Host(name=sys.argv[1], root=sys.argv[1]).call('control', {'job': 'a.job', 'action': 'cancel', 'wait_s': 20})\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(runner_pkg.__file__).resolve().parent.parent))
    with runner_lock_held(root):  # a runner that takes nothing: the request waits
        proc = subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            wait_for(lambda: (root / "control").is_dir() and any((root / "control").iterdir()))  # dropped: now it waits
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=15) == 130
            assert time.monotonic() - started < 5
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_an_install_of_many_files_lands_each_whole_with_the_usual_mode(tmp_path: Path) -> None:
    """The staged files are written all, then made durable by one barrier: each lands with its exact bytes (a
    multi-byte text too), mode 0600 whatever the umask (docs/trust.md), no stage left behind, the manifest after."""
    root = tmp_path / "q"
    files = {f"j{i:04d}.job": f"# LANE=cpu\necho {i} é {'x' * (i % 97)}\n" for i in range(2000)}
    host = Host(name=str(root), root=str(root))
    session = host.session()
    try:
        assert session.ask("lock", {"wait_s": 5, "create": True}) == {"locked": True}
        answer = session.ask("install", {"files": files, "create": True})
    finally:
        session.close()
    assert sorted(answer["installed"]) == sorted(files) and answer["generation"] == 1
    assert {p.name: p.read_text() for p in (root / "queue").iterdir()} == files
    assert {p.stat().st_mode for p in (root / "queue").iterdir()} == {stat.S_IFREG | 0o600}
    assert not [p for p in root.iterdir() if p.name.startswith(".plan-stage-")]


def test_the_manifest_is_written_sorted_and_compact_its_jobs_table_encoded_once(tmp_path: Path) -> None:
    """A plan's jobs table is encoded once and spliced into the install record and the manifest's two places:
    manifest.json stays exactly json.dumps(sort_keys=True) of what it holds, with one plan or two, and a value
    that holds the splice's marker text is encoded whole instead."""
    root = tmp_path / "q"
    host = Host(name=str(root), root=str(root))
    compiled = compile_plan(make_plan(tmp_path / "p.yaml", "p", {f"j{i}": f"echo {i}" for i in range(30)}))
    other = compile_plan(make_plan(tmp_path / "o.yaml", "o", {"k": "echo k"}))
    assert compiled.clean() and other.clean()

    def canonical() -> dict:
        text = (root / "manifest.json").read_text()
        assert text == json.dumps(json.loads(text), sort_keys=True) + "\n"
        return json.loads(text)

    assert push(compiled, host, PushOptions(), lambda diff: None).applied
    assert set(canonical()["plans"]["p"]["jobs"]) == set(canonical()["jobs"]) == {f"j{i}.job" for i in range(30)}
    assert push(other, host, PushOptions(), lambda diff: None).applied
    assert set(canonical()["jobs"]) == {f"j{i}.job" for i in range(30)} | {"k.job"}
    session = host.session()
    try:  # a record that holds the marker's text beside its table: sent as a client could send it
        assert session.ask("lock", {"wait_s": 5, "create": True}) == {"locked": True}
        probe = session.ask("probe", {"allow_missing": True})
        spec = {"lane": "cpu", "requires": [], "outputs": [], "after": [], "sha": "0"}
        marker = {"\0a table encoded once\0": ["m.job"]}
        record = {"plan": "m", "hash": "0", "jobs": {"m.job": spec}, "producers": marker, "external": []}
        files = {"m.job": "# LANE=cpu\n\necho m\n"}
        answer = session.ask("install", {"files": files, "record": record, "generation": probe["generation"]})
    finally:
        session.close()
    assert answer["installed"] == ["m.job"]
    assert canonical()["plans"]["m"]["producers"] == marker and "\0a table encoded once\0" in canonical()["producers"]


def test_a_local_install_is_sent_as_json_would_carry_it() -> None:
    """The forked install takes the request as it is only where JSON would carry it unchanged; a tuple, a key
    that is not a string, an object, or one list in two places goes through JSON first, as over a pipe."""
    from plancompiler.localagent import _plain

    assert _plain({"files": {"a.job": "echo é\n"}, "record": {"jobs": {"a.job": {"after": [], "n": 1.5}}}, "x": None})
    assert _plain([True, 0, "", [], {}])
    shared: list[str] = []
    for sent in ({"a": ("t",)}, {1: "a"}, {"a": {"b": object()}}, {"a": shared, "b": shared}, (1,), {"a": b"x"}):
        assert not _plain(sent), sent

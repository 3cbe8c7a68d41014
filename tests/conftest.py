"""Shared fixtures: a real runner process on a tmp queue, and helpers to write jobs and read events."""

from __future__ import annotations

import fcntl
import functools
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runner.queue import fresh_status

REPO = Path(__file__).resolve().parent.parent

# Bytecode is written during the suite even where PYTHONDONTWRITEBYTECODE is set (as on CI's machines): without
# it every xdist worker compiled every test module again (pytest's rewritten modules are cached only where
# bytecode may be written) and every runner, agent and Slurm wrapper the suite starts compiled its modules from
# source: the suite 61-65 s instead of ~52. It goes to the __pycache__ folders git ignores, as Python's default.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def write_job(root: Path, name: str, text: str, state: str = "queue") -> Path:
    path = root / state / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all, as a push lands it: RunnerProcess runs with --settle 0, and a runner that is already
    # up could read a file written in place while it is still empty (`invalid: empty file`).
    part = path.with_name(f".{name}.part")
    part.write_text(text)
    os.replace(part, path)
    return path


def read_events(root: Path) -> list[dict]:
    try:
        lines = (root / "events.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


class RunnerProcess:
    """`python3 -m runner run` on ROOT as a real subprocess."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *flags: str) -> RunnerProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        # --settle 0: these tests write a job and start the runner at once; the settle rule has its own tests.
        # -S: no site-packages, as on a login node (the runner is standard library only, and `site` with this
        # machine's .pth files was half of each runner's start-up; the suite starts ~160 runners).
        args = [
            sys.executable,
            "-S",
            "-m",
            "runner",
            "run",
            "--root",
            str(self.root),
            "--tick",
            "0.2",
            "--kill-grace",
            "1",
            "--settle",
            "0",
            *flags,
        ]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.stderr = open(self.root.parent / f"runner-{time.monotonic_ns()}.err", "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self.stderr, stderr=self.stderr)
        wait_for(lambda: any(e["event"] == "runner-start" for e in self.events()[self._skip :]), 10)
        wait_for(self._ticked, 10)  # its first status.json: a probe never finds a runner that has not ticked yet
        return self

    def _ticked(self) -> bool:
        try:
            status = json.loads((self.root / "status.json").read_text())
        except (OSError, ValueError, RecursionError):  # RecursionError: one planted by a test, not yet rewritten
            return False
        return self.proc is not None and (status.get("runner") or {}).get("pid") == self.proc.pid

    _skip = 0

    def events(self, kind: str | None = None) -> list[dict]:
        events = read_events(self.root)
        return [e for e in events if kind is None or e["event"] == kind]

    def wait_event(self, kind: str, timeout: float = 10.0, **match: object) -> dict:
        def found() -> dict | None:
            for event in self.events(kind):
                if all(event.get(k) == v for k, v in match.items()):
                    return event
            return None

        return wait_for(found, timeout)  # type: ignore[return-value]

    def wait_ticks(self, ticks: int, timeout: float = 10.0) -> None:
        """Until the runner has ticked TICKS more times (its heartbeat's tick count): what it would do in that
        time, it has done."""
        first = self.status()["runner"]["tick"]
        wait_for(lambda: self.status()["runner"]["tick"] >= first + ticks, timeout)

    def status(self) -> dict:
        """status.json, waiting for the runner's first one (it is replaced atomically, never partial)."""
        path = self.root / "status.json"
        wait_for(path.exists, 10)
        # its heartbeat from heartbeat.json, every waiting job from waiting.json
        return fresh_status(self.root, json.loads(path.read_text()), every=True)

    def __enter__(self) -> RunnerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stopped when the block is left, however (`with small_tmpfs(...), runner:` stops it before the unmount)."""
        self.stop()

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        self._skip = len(self.events())
        return self.proc.returncode


def pytest_sessionstart(session: pytest.Session) -> None:
    """The project's modules compiled to bytecode once, before the workers start (and not by six workers and their
    children at once). Only what is stale is compiled."""
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller has done it
    import compileall

    for package in ("runner", "plancompiler"):
        compileall.compile_dir(REPO / package, quiet=1)
    if getattr(session.config.option, "numprocesses", None):
        _rewrite_test_modules_once()


def _rewrite_test_modules_once() -> None:
    """Each test module whose assertion-rewritten bytecode is missing or older than it, imported once before the
    workers start: on a fresh checkout (as CI's) every worker rewrote and compiled every test module at once,
    ~20 s of CPU and ~10 s of the suite's wall on 2 cores. Nothing is imported where all of it is cached. Half of
    them (on 2 cores or more) are rewritten by a `pytest --collect-only` of their own meanwhile: one process took
    ~2.5 s of the first run's wall, before any test."""
    import importlib

    cached = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"
    stale = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        try:
            if (path.parent / "__pycache__" / f"{path.stem}.{cached}").stat().st_mtime >= path.stat().st_mtime:
                continue
        except OSError:
            pass
        stale.append(path)
    helper = None
    if len(stale) >= 16 and (os.cpu_count() or 1) > 1:
        theirs, stale = stale[1::2], stale[0::2]
        argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
        helper = subprocess.Popen(
            [*argv, *map(str, theirs)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    try:
        for path in stale:
            try:
                importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
            except Exception:  # a module that does not import: the workers' collection reports it
                pass
    finally:
        if helper is not None:
            helper.wait()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection made (every test module, the packages they import) is kept out of the garbage collector's
    full passes: it lives as long as the process, and each pass walked it again (~8 % of the tests' own CPU)."""
    gc.collect()
    gc.freeze()


SCRATCH_FREE = 2 << 30  # what /dev/shm must have free to take the suite's scratch (a run writes ~0.3 GB)


def _scratch_in_memory(config: pytest.Config) -> None:
    """The suite's scratch files (tmp_path, every mkdtemp and every `mktemp` of the processes it starts) in memory
    (/dev/shm) where it has room: the suite makes ~0.3 GB of queues, job files and logs, renamed and synced
    thousands of times, and on this machine's disk that was ~10 s of its ~130 s of CPU (system time) and ~7 s of
    its wall. The files, renames, locks and syncs are the same calls; only the disk's latency is gone. Set by
    the controller before its workers start (they inherit TMPDIR). PLAN_TEST_TMP=disk keeps the system's temp
    directory; so does --basetemp, a /dev/shm with little room, or a directory there that is not ours alone."""
    import stat
    import tempfile

    if hasattr(config, "workerinput") or config.option.basetemp or os.environ.get("PLAN_TEST_TMP") == "disk":
        return
    try:
        shm = os.statvfs("/dev/shm")
        if shm.f_bavail * shm.f_frsize < SCRATCH_FREE:
            return
        scratch = Path("/dev/shm") / f"plantest-{os.getuid()}"
        try:
            scratch.mkdir(mode=0o755)
        except FileExistsError:
            pass
        st = os.lstat(scratch)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return  # made by someone else (or open to them): the system's temp directory instead
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = None  # asked again, of TMPDIR


def pytest_configure(config: pytest.Config) -> None:
    """typer's CliRunner builds plan's click command from every command's signature on each invoke (~25 ms;
    the suite invokes ~400 times); `plan` itself builds it once a process (cli.command), and the tests invoke
    that same command."""
    _scratch_in_memory(config)
    _cache_of_the_run(config)
    import typer.main
    import typer.testing

    def command(app: typer.Typer) -> Any:
        from plancompiler import cli

        return cli.command() if app is cli.app else typer.main.get_command(app)

    if hasattr(typer.testing, "_get_command"):
        typer.testing._get_command = command  # type: ignore[assignment]


def _cache_of_the_run(config: pytest.Config) -> None:
    """plan's cache (shellcheck's answers, the check memo) for the tests that name none of their own: one of this
    run's, made by the controller (its workers inherit PLAN_CACHE_DIR) under the run's scratch, not the user's
    ~/.cache/plancompiler, which the suite filled (25 MB) and then read warm: each run's cache starts empty, as a
    fresh machine's (CI's) does. A PLAN_CACHE_DIR already set is kept."""
    if hasattr(config, "workerinput") or os.environ.get("PLAN_CACHE_DIR"):
        return
    import tempfile

    os.environ["PLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="plan-cache-")
    config.add_cleanup(functools.partial(shutil.rmtree, os.environ["PLAN_CACHE_DIR"], ignore_errors=True))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: three workers a core and one more, 2 to 8. Many tests wait on real processes, sshd or Slurm
    rather than compute, so a worker per core leaves the cores idle (on 2 cores, 4 runs at ~1.4 cores busy: suite
    65-77 s; 6: 58-63 s, 4 runs each); the one more stands in for the worker the Slurm time-limit test holds for
    ~45 s of the run (2 cores, alternated pairs: 6 workers 61.0 and 67.0 s, 7 57.0 and 61.2 s, 8 like 7); more
    than 8 only adds sshd daemons, clusters and start-up."""
    return max(2, min(8, 3 * (os.cpu_count() or 1) + 1))


# Fixtures whose tests mostly wait: on a Slurm cluster's scheduler, on sshd round trips, on a real runner's ticks.
_WAITING = (("accounted", "aging", "enforced"), ("slurm", "slurm_alone", "limited", "shaky"), ("sshd",), ("runner",))


def _shuffle(item: pytest.Item) -> int:
    """A checksum of ITEM's name, or of its xdist group's: the tests of one group keep their order (a module's
    cluster, filled by one test and judged by the next)."""
    group = item.get_closest_marker("xdist_group")
    return zlib.crc32(str(group.args[0] if group and group.args else item.nodeid).encode())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first, so that none starts last on a worker while the others have finished: those that
    wait for a Slurm controller to forget finished jobs (its purge comes 10 s after it starts at the earliest) or
    for its time-limit pass (`enforced`: every 30 s),
    then those marked `long` (2-15 s each, mostly computing). The tests that mostly wait (on a Slurm cluster's
    scheduler, on sshd round trips, on a real runner's ticks) are then spread evenly through the first 85 % of the
    rest, each kind on its own and in no file's order, rather than run together: all workers waiting at once left
    the cores idle for seconds (the 32 Slurm tests, 2-10 s each, were once all in the first third: a quarter of
    the cores idle from 20 s to 45 s). Every worker starts its own Slurm cluster (a fraction of a second; its own
    directory, ports and munged) and its own sshd, so these tests spread over all workers (`--dist loadgroup`)
    instead of queueing on one."""

    def rank(item: pytest.Item) -> int:
        names = getattr(item, "fixturenames", ())
        waits = next((i for i, group in enumerate(_WAITING) if any(n in names for n in group)), len(_WAITING))
        if waits == 0:
            return 0
        return 1 if item.get_closest_marker("long") else waits + 1

    ranked = [(rank(item), i, item) for i, item in enumerate(items)]  # i: the first and the plain keep their order
    first = [item for r, _, item in sorted(ranked, key=lambda x: x[:2]) if r <= 1]
    plain = [item for r, _, item in ranked if r == len(_WAITING) + 1]
    placed: list[tuple[float, int, pytest.Item]] = [(float(j), 0, item) for j, item in enumerate(plain)]
    for kind in range(2, len(_WAITING) + 1):
        # In an order of their own (by a checksum of the name: the same in every worker, as xdist requires), not
        # file by file: the tests of one file often wait alike (tests/watch's for timeouts, 2-5 s each), and
        # together they left the cores idle near the end.
        waiting = [item for _, _, item in sorted((_shuffle(item), i, item) for r, i, item in ranked if r == kind)]
        span = 0.85 * len(plain)
        placed += [((k + kind / len(_WAITING)) * span / len(waiting), kind, item) for k, item in enumerate(waiting)]
    items[:] = first + [item for _, _, item in sorted(placed, key=lambda x: x[:2])]


@contextmanager
def runner_lock_held(root: Path) -> Iterator[None]:
    """ROOT's runner lock held by this test process while the block runs: a runner that serves the root but
    takes no request (hung). With no runner at all, an agent answers a control request or an ack at once."""
    root.mkdir(parents=True, exist_ok=True)
    lock = os.open(root / ".runner.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(lock, str(os.getpid()).encode())
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


@pytest.fixture
def no_hosts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No hosts file from the environment (PLAN_HOSTS) and the watcher's state in the test's own directory:
    `plan` reads what the test gives it. A module uses it with `pytestmark = pytest.mark.usefixtures("no_hosts")`."""
    monkeypatch.delenv("PLAN_HOSTS", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def stand_in() -> Iterator[int]:
    """The pid of a live process whose command line names the runner (all the agent checks of a status.json
    pid): a `sleep` under another name, for tests whose runner is in-process or written by hand."""
    proc = subprocess.Popen(["bash", "-c", "exec -a plan-runner-stand-in sleep 600"])
    # Until bash has exec'd, the pid's command line is the forking test process's: no runner (a report read it
    # as a dead runner's root on a loaded machine, and counted its lanes down since the heartbeat)
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    wait_for(lambda: cmdline.read_bytes().startswith(b"plan-runner-stand-in\0"))
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def queue_root(tmp_path: Path) -> Path:
    root = tmp_path / "q"
    for state in ("queue", "running", "done", "failed", "logs"):
        (root / state).mkdir(parents=True)
    return root


@pytest.fixture
def runner(queue_root: Path) -> Iterator[RunnerProcess]:
    proc = RunnerProcess(queue_root)
    yield proc
    proc.stop()


@pytest.fixture
def ticking(queue_root: Path) -> Iterator[Callable[..., Any]]:
    """Make a started in-process runner on queue_root (fake processes; time passed to tick): ticking(**config)."""
    from tests.ticking import Ticking

    made: list[Ticking] = []

    def make(now: float = 1_000_000.0, **config: Any) -> Ticking:
        made.append(Ticking(queue_root, **config).start(now))
        return made[-1]

    yield make
    for one in made:
        one.close()


def plan_cli(*args: str) -> tuple[int, str]:
    """`plan ARGS...` through typer's runner: (exit code, stdout and stderr)."""
    from typer.testing import CliRunner

    from plancompiler.cli import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture
def plan_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No hosts file from the environment, and a shellcheck cache of the test's own."""
    monkeypatch.delenv("PLAN_HOSTS", raising=False)
    monkeypatch.setenv("PLAN_CACHE_DIR", str(tmp_path / "cache"))


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


from tests.slurm.cluster import slurm  # noqa: E402,F401 - the session fixture for the Slurm backend tests
from tests.sshd import IN_CI, sshd  # noqa: E402,F401 - the session fixture, shared by push/status/watch tests

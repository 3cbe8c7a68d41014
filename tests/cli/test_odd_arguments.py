"""Odd arguments to every `plan` and `python3 -m runner` command: a clear error and its exit code, never an internal
error or a traceback (issue 28: a symlink loop, a name too long, a directory or FIFO where a file is written, a
hosts file's root with a newline, a tick the runner refuses, a file name that is not UTF-8)."""

from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.inprocess import Ran, plan_main

pytestmark = pytest.mark.usefixtures("plan_env")  # no hosts file from outside, a shellcheck cache of its own

PLAN = "plan: t\njobs:\n  - name: a\n    run: 'true'\n"
LONG = "a" * 300  # longer than a file name may be (NAME_MAX 255)


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    """A working directory holding a plan, a queue, and the odd things: a symlink loop, a FIFO, a directory."""
    (tmp_path / "p.yaml").write_text(PLAN)
    (tmp_path / "loop").symlink_to("loop")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "adir").mkdir()
    for state in ("queue", "running", "done", "failed", "logs"):
        (tmp_path / "q" / state).mkdir(parents=True)
    (tmp_path / "q" / "events.jsonl").write_text("")
    for name, entry in {
        "newline-root": '{root: "q\\nx"}',
        "empty-root": "{root: ''}",
        "dash-ssh": '{root: /q, ssh: "-oProxyCommand=touch PWNED"}',
        "space-ssh": '{root: /q, ssh: "a b"}',
    }.items():
        (tmp_path / f"{name}.yaml").write_text(f"hosts:\n  h: {entry}\n")
    return tmp_path


def _plan(cwd: Path, *args: str) -> Ran:
    return plan_main(*args, cwd=cwd, cache=cwd / "cache")


# (argv, exit code, what the error says): each once ended in "internal error", a traceback, a hang or a unit that
# could never start.
PLAN_CASES = [
    (["check", LONG], 2, "cannot read the plan file: File name too long"),
    (["check", "loop"], 2, "cannot read the plan file: Too many levels of symbolic links"),
    (["check", "p.yaml/x"], 2, "cannot read the plan file: Not a directory"),
    (["check", "--templates", "loop", "p.yaml"], 0, ""),  # not a directory: not searched, as a missing one
    (["check", "--templates", LONG, "p.yaml"], 0, ""),
    (["render", "p.yaml", "-o", "loop"], 2, "cannot write loop"),
    (["status", "./loop"], 1, "is not a directory"),
    (["add", "./loop", "--", "true"], 1, "is not a directory"),
    # a job all of whose attempts would be ended as they start: refused as a plan's `timeout: 0` is (a finding)
    (["add", "./q", "--timeout", "0", "--", "true"], 1, "plan add:1:1: error[P004]: --timeout: '0' would end every"),
    (["push", "./loop", "p.yaml", "--dry-run"], 1, "is not a directory"),
    (["report", "./q", "--html", "adir"], 2, "--html 'adir': a directory, not a file"),
    (["report", "./q", "--html", "fifo"], 2, "--html fifo: not a regular file"),  # the write would block
    (["report", "./q", "--html", "loop"], 2, "--html loop: not a regular file"),
    (["report", "./q", "--html", "nodir/r.html"], 2, "--html 'nodir/r.html': no directory"),
    (["report", LONG], 2, "unknown host"),
    (["watch", "./q", "--once", "--state", "adir"], 2, "--state 'adir': a directory, not a file"),
    (["watch", "./q", "--once", "--state", ""], 2, "a directory, not a file"),
    (["watch", "./q", "--once", "--state", LONG], 2, "a name too long"),
    (["ack", "./q", "EVENT", "--state", "adir", "--wait", "0"], 2, "--state 'adir': a directory, not a file"),
    (["status", "--hosts", LONG, "h"], 2, "not found"),
    (["status", "h", "--hosts", "newline-root.yaml"], 2, "H001]: hosts.h.root: a directory path on one line"),
    (["add", "h", "--hosts", "empty-root.yaml", "--", "true"], 2, "H001]: hosts.h.root: a directory path"),
    (["status", "h", "--hosts", "dash-ssh.yaml"], 2, "H001]: hosts.h.ssh: a destination"),
    (["status", "h", "--hosts", "space-ssh.yaml"], 2, "H001]: hosts.h.ssh: a destination"),
    (["bootstrap", "./q", "--dry-run", "--tick", "x"], 2, "--tick: not a duration: 'x'"),
    (["bootstrap", "./q", "--dry-run", "--tick", "0"], 2, "--tick: --tick must be above 0"),
    (["run", "p.yaml", "--root", "rq", "--tick", "0"], 2, "--tick must be above 0"),  # waited, saying nothing
    (["run", "p.yaml", "--root", "rq", "--tick", "nan"], 2, "--tick must be above 0"),
]


@pytest.mark.parametrize(
    ("argv", "code", "says"), PLAN_CASES, ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None
)
def test_odd_arguments_to_plan_end_in_a_clear_error(odd: Path, argv: list[str], code: int, says: str) -> None:
    ran = _plan(odd, *argv)
    both = ran.stdout + ran.stderr
    assert "internal error" not in both and "Traceback" not in both, both
    assert ran.returncode == code and says in both, (ran.returncode, both[-600:])
    assert not (odd / "PWNED").exists()


RUNNER_CASES = [
    (["status", "--root", LONG], 2, "does not exist"),
    (["status", "--root", "loop"], 2, "is not a directory"),
    (["unit", "--root", "loop"], 0, "ExecStart="),
    (["unit", "--root", "q", "--tick", "0"], 2, "--tick must be above 0"),
    (["run", "--root", "q", "--metrics", "adir"], 2, "--metrics: adir: not a regular file"),
    (["run", "--root", "q", "--metrics", "nodir/m.prom"], 2, "--metrics nodir/m.prom: no directory"),
    (["run", "--root", "q", "--tick", "99999999999999999999999"], 2, "is more than 366d00h"),  # select() overflowed
    (["run", "--root", "q", "--idle", "999999999d"], 2, "is more than 366d00h"),
    (["run", "--root", "q", "--gpu-memory", "inf"], 2, "not a size: 'inf'"),  # an OverflowError
    (["run", "--root", "q", "--gpu-memory", "nan"], 2, "not a size: 'nan'"),
]


@pytest.mark.parametrize(
    ("argv", "code", "says"), RUNNER_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_odd_arguments_to_the_runner_end_in_a_clear_error(
    odd: Path,
    argv: list[str],
    code: int,
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runner.__main__ import main

    monkeypatch.chdir(odd)
    try:
        ended = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        ended = exc.code
    assert ended == code
    out = capsys.readouterr()
    assert says in out.out + out.err and "Traceback" not in out.err, (out.out[-300:], out.err)


def test_a_file_name_that_is_not_utf8_is_printed_back_under_a_strict_utf8_terminal(odd: Path) -> None:
    """Under a UTF-8 locale Python's stdout refuses the surrogate a non-UTF-8 file name decodes to: printing
    a finding of that file ended in an internal error. It is written back as the same bytes."""
    name = os.fsdecode(b"p\xff.yaml")
    (odd / name).write_text(PLAN + "bogus: 1\n")
    run = subprocess.run(
        [sys.executable, "-m", "plancompiler.cli", "check", name, os.fsdecode(b"gone\xff.yaml")],
        cwd=odd,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8:strict", "PLAN_CACHE_DIR": str(odd)},
    )
    assert run.returncode == 2, run.stderr
    assert run.stdout.startswith(b"p\xff.yaml:5:1: error[P003]: unknown key 'bogus'"), run.stdout
    assert b"plan file not found" in run.stderr, run.stderr
    assert b"internal error" not in run.stderr and b"Traceback" not in run.stderr


# The seeded sweep: commands × their slots × odd values, a fixed draw of them, each bounded by an alarm.
ODD = ["", "\n", "a\nb", "\x1b]0;x\x07", "-1", "0", "-0.5", "1e309", "nan", "inf", "é", ".", "..", "/dev/null",
       "fifo", "loop", "adir", "missing", LONG, "a:b", ":", "-", " ", "%s", "$(touch PWNED)", "10x", "a=b", "-5m"]  # fmt: skip
GRID = [
    ["check", "@"],
    ["graph", "@"],
    ["render", "p.yaml", "-o", "@"],
    ["check", "--set", "@", "p.yaml"],
    ["top", "@", "--once"],
    ["status", "@"],
    ["status", "./q", "--history", "-n", "@"],
    ["status", "./q", "--history", "--outcome", "@"],
    ["add", "./q", "--lane", "@", "--", "true"],
    ["add", "./q", "--timeout", "@", "--", "true"],
    ["add", "./q", "--name", "@", "--", "true"],
    ["add", "./q", "--after", "@", "--", "true"],
    ["add", "./q", "--shell", "@"],
    ["hold", "./q", "@", "--wait", "0"],
    ["move", "./q", "a", "--before", "@", "--wait", "0"],
    ["park", "./q", "--lane", "@"],
    ["retry", "./q", "@", "--wait", "0"],
    ["cancel", "./q", "@", "--wait", "0"],
    ["logs", "./q", "@"],
    ["logs", "./q", "a", "-n", "@"],
    ["bootstrap", "./q", "--dry-run", "--python", "@"],
    ["push", "./q", "p.yaml", "--dry-run", "--allow-shared-output", "@"],
    ["push", "./q", "p.yaml", "--dry-run", "--lock-wait", "@"],
    ["report", "@"],
    ["report", "./q", "--since", "@"],
    ["report", "./q", "--html", "@"],
    ["watch", "./q", "--once", "--waiting", "@"],
    ["watch", "./q", "--once", "--state", "@"],
    ["watch", "./q", "--once", "--events", "@"],
    ["watch", "./q", "--once", "--heartbeat-every", "@"],
    ["ack", "./q", "@", "--wait", "0"],
    ["ack", "./q", "EVENT", "--for", "@", "--wait", "0"],
]


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _bounded(seconds: int) -> Iterator[None]:
    def alarm(signum: int, frame: object) -> None:
        raise _Hang()

    before = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def test_a_seeded_sweep_of_odd_arguments_never_ends_in_an_internal_error(odd: Path) -> None:
    rng = random.Random(28)
    draws = [(argv, value) for argv in GRID for value in rng.sample(ODD, 3)]
    bad = []
    for argv, value in draws:
        args = [value if a == "@" else a for a in argv]
        try:
            with _bounded(20), contextlib.redirect_stdout(io.StringIO()):
                ran = _plan(odd, *args)
        except _Hang:
            bad.append((args, "hang"))
            continue
        both = ran.stdout + ran.stderr
        if (
            "internal error" in both
            or "Traceback" in both
            or ran.returncode not in (0, 1, 2, 3)
            and ran.returncode < 10
        ):
            bad.append((args, ran.returncode, both[-300:]))
    assert not bad, bad[:5]
    assert not (odd / "PWNED").exists()

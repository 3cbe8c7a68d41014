"""REQUIRES and DONE_IF: `test -e/-f/-s/-d PATH` chains by stat() in-process, anything else in a bounded `bash -c`."""

from __future__ import annotations

import functools
import os
import re
import signal
import stat as stat_mod
from collections.abc import Callable
from typing import NamedTuple

# One word of a fast condition: a single-quoted string, a double-quoted string with nothing
# bash would expand, or a bare word of characters bash leaves alone.
_WORD = r"""(?:'[^']*'|"[^"$`\\!]*"|[A-Za-z0-9_./+:,@%=-]+)"""
_TEST = rf"(?:test\s+-([efsd])\s+({_WORD})|\[\s+-([efsd])\s+({_WORD})\s+\])"


@functools.lru_cache(maxsize=None)
def _test_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(one test, a chain of them), compiled at the first condition judged (~5.7 M instructions): a runner's
    start with no condition queued never pays for them."""
    return re.compile(_TEST), re.compile(rf"^\s*{_TEST}(?:\s*&&\s*{_TEST})*\s*$")


# A condition run in bash is killed after this (`runner run --condition-timeout`; a Slurm attempt's always)
CONDITION_TIMEOUT_S = 10.0


class Condition:
    """A compiled condition: `fast` when it can be decided by stat() alone, its `tests` then (op, path) each;
    `checks` (when compiled for a root) the same tests flat, the `stat_flags` bit each asks for then the path
    resolved against the root: (bit, path, bit, path, ...). Immutable, in slots (each queued job's DONE_IF is one,
    often its own: its tests are found again from its text when asked for, which is seldom; and its text, where
    it is what its checks say in the words the compiler writes, `test -f /abs/path`, from them)."""

    __slots__ = ("_text", "fast", "checks")
    _text: str | None
    fast: bool
    checks: tuple[int | str, ...] | None

    def __init__(self, text: str, fast: bool, checks: tuple[int | str, ...] | None = None) -> None:
        object.__setattr__(self, "_text", None if checks is not None and text == _written(checks) else text)
        object.__setattr__(self, "fast", fast)
        object.__setattr__(self, "checks", checks)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Condition is immutable: cannot set {name}")

    @property
    def text(self) -> str:
        return self._text if self._text is not None else _written(self.checks)  # type: ignore[arg-type]

    @property
    def tests(self) -> tuple[tuple[str, str], ...] | None:
        return _tests(self.text) if self.fast else None

    def _fields(self) -> tuple[object, ...]:
        return (self.text, self.fast, self.checks)

    def __eq__(self, other: object) -> bool:
        return self._fields() == other._fields() if isinstance(other, Condition) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Condition({self.text!r}, {self.fast!r}, {self.checks!r})"

    def paths(self) -> tuple[str, ...]:
        return tuple(path for _, path in self.tests or ())


def _written(checks: tuple[int | str, ...]) -> str:
    """CHECKS as the compiler writes them: `test -f PATH && test -s PATH2`."""
    return " && ".join(f"test -{_OP[checks[i]]} {checks[i + 1]}" for i in range(0, len(checks), 2))  # type: ignore[index]


def _unquote(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        return word[1:-1]
    return word


def _tests(text: str) -> tuple[tuple[str, str], ...] | None:
    """TEXT's tests as (op, path), when stat() alone decides it; None when bash must."""
    one, chain = _test_patterns()
    if not chain.match(text):
        return None
    tests = []
    for m in one.finditer(text):
        op = m.group(1) or m.group(3)
        word = m.group(2) or m.group(4)
        path = _unquote(word)
        if path.startswith("~") or "*" in word or "?" in word or "[" in word:
            return None  # bash would expand it: let bash decide
        tests.append((op, path))
    return tuple(tests)


def compile_condition(text: str, root: str | None = None, paths: Callable[[str], str] = str) -> Condition:
    """TEXT compiled; with ROOT (where it runs), a fast one's `checks` are resolved against it. PATHS: what
    keeps each resolved path (sys.intern: the queue's jobs then share one string per path)."""
    tests = _tests(text)
    if tests is None:
        return Condition(text, False)
    if root is None:
        return Condition(text, True)
    return Condition(text, True, tuple(x for op, path in tests for x in (OP_BIT[op], paths(os.path.join(root, path)))))


def failed_test(cond: Condition, index: int) -> str:
    """Why a fast condition is false: its test at INDEX is."""
    op, path = cond.tests[index]  # type: ignore[index]
    return f"test -{op} {path} is false"


def test_path(op: str, path: str) -> bool:
    """What `test -OP PATH` answers, by stat() (following symlinks, as test does)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    if op == "e":
        return True
    if op == "f":
        return stat_mod.S_ISREG(st.st_mode)
    if op == "d":
        return stat_mod.S_ISDIR(st.st_mode)
    return st.st_size > 0  # -s


# What `stat_flags` finds, one bit each; OP_BIT: the bit `test -OP` asks for.
EXISTS, REGULAR, DIRECTORY, NONEMPTY = 1, 2, 4, 8
OP_BIT = {"e": EXISTS, "f": REGULAR, "d": DIRECTORY, "s": NONEMPTY}
_OP = {bit: op for op, bit in OP_BIT.items()}


def stat_flags(path: str) -> int:
    """One stat() of PATH (following symlinks, as test does) as the bits every `test -OP PATH` reads; 0: none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return 0
    mode = st.st_mode
    return (
        EXISTS
        | (REGULAR if stat_mod.S_ISREG(mode) else 0)
        | (DIRECTORY if stat_mod.S_ISDIR(mode) else 0)
        | (NONEMPTY if st.st_size > 0 else 0)
    )


class Outcome(NamedTuple):
    holds: bool
    detail: str = ""  # why it could not be decided, e.g. "timed out after 10s"


def evaluate(cond: Condition, cwd: str, timeout_s: float) -> Outcome:
    if cond.tests is not None:
        for op, path in cond.tests:
            if not test_path(op, path if path.startswith("/") else os.path.join(cwd, path)):
                return Outcome(False, f"test -{op} {path} is false")
        return Outcome(True)
    return _run_bash(cond.text, cwd, timeout_s)


def _run_bash(text: str, cwd: str, timeout_s: float) -> Outcome:
    import subprocess  # here: a queue of fast conditions only never needs it (memory of a long-lived runner)

    try:
        proc = subprocess.Popen(
            ["bash", "-c", text],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        return Outcome(False, f"could not run bash: {exc}")
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        return Outcome(False, f"condition timed out after {timeout_s:g}s")
    return Outcome(rc == 0, "" if rc == 0 else f"exited {rc}")

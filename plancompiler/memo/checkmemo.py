"""A whole `plan check` result kept under everything it depends on: an unchanged plan checks in one read.

The key covers the plan's bytes, every file of every template directory the compile would search, the
overrides, --templates and --max-size, the working directory (paths are printed relative to it), this
package's and the runner's sources, the libraries' and tools' files (python, jinja2, pydantic, yaml, bash,
shellcheck). Only YAML plans: a Python plan runs code whose result nothing here can vouch for. Any doubt
(an unreadable file, a very large template tree) means no memo, and the check runs as usual.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Protocol

from plancompiler.diagnostics import Diagnostic
from plancompiler.tools import find_tool

_MAX_FILES = 2000
_MAX_BYTES = 8 << 20
_PACKAGES = Path(__file__).resolve().parent.parent, Path(__file__).resolve().parent.parent.parent / "runner"


def cache_dir() -> Path:
    base = os.environ.get("PLAN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "plancompiler"
    )
    return Path(base)


@dataclass(frozen=True)
class Remembered:
    """What `plan check` prints of one plan, as the last full check of the same inputs found it."""

    diagnostics: list[Diagnostic]
    job_count: int


class Checked(Protocol):
    """A plan's check as `plan check` prints it: a compile's result, or one remembered."""

    @property
    def diagnostics(self) -> list[Diagnostic]: ...

    @property
    def job_count(self) -> int: ...


def checked(
    plan: Path,
    sets: Sequence[str],
    templates: Sequence[Path],
    max_size: str | None,
    use_memo: bool,
    compile_plan: Callable[[], Checked],
) -> Checked:
    """PLAN's check: remembered where every input is as the last full check found it, else COMPILE_PLAN()
    (and remembered for the next one)."""
    memo_key = key(plan, sets, templates, max_size) if use_memo else None
    remembered = load(memo_key) if memo_key else None
    if remembered is not None:
        return remembered
    compiled = compile_plan()
    if memo_key:
        store(memo_key, compiled.diagnostics, compiled.job_count)
    return compiled


def _stat_line(path: str) -> str:
    st = os.stat(path)
    return f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n"


@functools.lru_cache(maxsize=1)
def code_identity() -> str:
    """The compiler's own inputs: its sources, the runner's, the libraries it calls and the tools it runs."""
    lines = [sys.version, sys.executable]
    for base in _PACKAGES:
        for root, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            lines.extend(_stat_line(os.path.join(root, f)) for f in sorted(files) if f.endswith(".py"))
    for module in ("jinja2", "pydantic", "pydantic_core", "yaml", "markupsafe"):
        spec = find_spec(module)
        lines.append(_stat_line(spec.origin) if spec and spec.origin else f"{module}: none\n")
    for tool in ("bash", "shellcheck"):
        found = shutil.which(tool) if tool == "bash" else find_tool(tool)
        lines.append(_stat_line(os.path.realpath(found)) if found else f"{tool}: none\n")
    return "".join(lines)


def _template_dirs(plan: Path, extra: Sequence[Path]) -> list[Path]:
    """compile.template_dirs, without importing the compiler."""
    found: list[Path] = []
    for directory in (*extra, plan.parent / "templates", plan.parent.parent / "templates", Path.cwd() / "templates"):
        resolved = Path(os.path.realpath(directory))
        if os.path.isdir(resolved) and resolved not in found:  # never raises: a name too long is no directory
            found.append(resolved)
    return found


def key(plan: Path, sets: Sequence[str], templates: Sequence[Path], max_size: str | None) -> str | None:
    """The memo key of checking PLAN with these options, or None where no memo may be used."""
    if plan.suffix not in (".yaml", ".yml"):
        return None
    try:
        facts = os.stat(plan)
    except OSError:
        return None
    if not stat.S_ISREG(facts.st_mode) or facts.st_size > _MAX_BYTES:
        return None  # a FIFO, device or huge file: the loader says what it is, without a read that hangs
    digest = hashlib.sha256()
    try:
        digest.update(
            json.dumps(
                [os.getcwd(), str(plan), os.path.realpath(plan), list(sets), [str(t) for t in templates], max_size]
            ).encode()
        )
        digest.update(plan.read_bytes())
        digest.update(code_identity().encode())
        count = size = 0
        for directory in _template_dirs(plan, templates):
            digest.update(f"\0dir {directory}\0".encode())
            for root, dirs, files in os.walk(directory, followlinks=True):
                dirs.sort()
                for name in sorted(files):
                    if not os.path.isfile(os.path.join(root, name)):
                        return None  # a FIFO among the templates: no memo, and no read that could hang
                    data = Path(root, name).read_bytes()
                    count, size = count + 1, size + len(data)
                    if count > _MAX_FILES or size > _MAX_BYTES:
                        return None
                    digest.update(f"\0{os.path.relpath(os.path.join(root, name), directory)}\0".encode())
                    digest.update(hashlib.sha256(data).digest())
    except (OSError, ValueError, RuntimeError):
        return None
    return digest.hexdigest()


def _entry(memo_key: str) -> Path:
    return cache_dir() / "check" / memo_key[:2] / f"{memo_key}.json"


def load(memo_key: str) -> Remembered | None:
    try:
        data = json.loads(_entry(memo_key).read_text())
        return Remembered([Diagnostic(**d) for d in data["diagnostics"]], int(data["jobs"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(memo_key: str, diagnostics: Sequence[Diagnostic], jobs: int) -> None:
    from runner.files import atomic_write

    entry = _entry(memo_key)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        memo = {"diagnostics": [asdict(d) for d in diagnostics], "jobs": jobs}
        atomic_write(entry, json.dumps(memo).encode(), durable=False)  # a cache: a lost entry is checked again
    except OSError:
        pass  # a read-only cache costs time, never correctness

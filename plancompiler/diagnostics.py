"""Findings as values with a source location; sorted and formatted once, at the CLI edge."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from plancompiler.errors import PlanError as PlanError  # its home is plancompiler/errors.py


@dataclass(frozen=True, order=True)
class Diagnostic:
    path: str
    line: int
    col: int
    severity: str
    code: str
    message: str

    def text(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.severity}[{self.code}]: {self.message}"

    def github(self) -> str:
        kind = {"error": "error", "warning": "warning"}.get(self.severity, "notice")
        message = self.message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return f"::{kind} file={self.path},line={self.line},col={self.col},title={self.code}::{message}"


def error(path: str, line: int, col: int, code: str, message: str) -> Diagnostic:
    return Diagnostic(str(path), max(line, 1), max(col, 1), "error", code, message)


def warning(path: str, line: int, col: int, code: str, message: str) -> Diagnostic:
    return Diagnostic(str(path), max(line, 1), max(col, 1), "warning", code, message)


def has_errors(diagnostics: Iterable[Diagnostic], strict: bool = False) -> bool:
    return any(d.severity == "error" or (strict and d.severity == "warning") for d in diagnostics)


def format_all(diagnostics: Iterable[Diagnostic], fmt: str) -> str:
    ordered = sorted(set(diagnostics))
    if fmt == "json":
        return json.dumps([asdict(d) for d in ordered], indent=1)
    if fmt == "github":
        return "\n".join(d.github() for d in ordered)
    return "\n".join(d.text() for d in ordered)


def summary(diagnostics: Iterable[Diagnostic], jobs: int) -> str:
    items = list(set(diagnostics))
    errors = sum(d.severity == "error" for d in items)
    warnings = sum(d.severity == "warning" for d in items)
    return (
        f"{jobs} job{'s' * (jobs != 1)}, {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    )


def display_path(path: Path | str) -> str:
    """PATH as a finding names it: relative to the working directory where it is under it, else whole (a
    template under /tmp was `../../tmp/t.sh.j2`)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("..") else str(path)

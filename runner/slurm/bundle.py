"""A push's bundle (ROOT/scripts/PLAN/bundle.SHA.json, written by runner.slurm.wrapper): one element per job,
everything its attempts need. Read once where it is used (the attempt's wrapper, a retry or a gate the agent
submits or releases) into a frozen Element, or a located error; written with Element.to_json."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runner.config import Config
from runner.files import read_json
from runner.slurm.jsonfields import (
    OPT_FLOAT,
    OPT_STR,
    STRINGS,
    Bad,
    Field,
    RecordError,
    kind_of,
    optional,
    read_fields,
    read_float,
    read_int,
    read_object,
    read_str,
)

KILL_AFTER_S = 10  # the grace a timed-out body has between TERM and KILL


@dataclass(frozen=True)
class Element:
    """One job's entry in a bundle. `bundle` and `entry` say where it was read from (not written: the bundle is
    named by its content); `script` is a job submitted before bundles, whose own wrapper file takes a retry."""

    root: str
    plan: str
    name: str
    body: str
    log: str
    hash: str | None = None
    text: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    slurm_conf: str | None = None
    retries: int = 1
    timeout_s: float | None = None
    kill_after_s: float = KILL_AFTER_S
    done_if: str | None = None
    gate: str | None = None
    gate_interval_s: float = 60.0
    backoff_base_s: float = Config.backoff_base_s
    backoff_max_s: float = Config.backoff_max_s
    sbatch: tuple[str, ...] = ()
    bundle: str | None = None
    entry: int | None = None
    script: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The element as the bundle holds it: every key written, its values as given."""
        out = {name: getattr(self, name) for name in _WRITTEN}
        out.update(env=dict(self.env), sbatch=list(self.sbatch))
        return out


_WRITTEN = (
    "root",
    "plan",
    "name",
    "hash",
    "text",
    "body",
    "log",
    "env",
    "slurm_conf",
    "retries",
    "timeout_s",
    "kill_after_s",
    "done_if",
    "gate",
    "gate_interval_s",
    "backoff_base_s",
    "backoff_max_s",
    "sbatch",
)


def _env(value: Any) -> dict[str, str]:
    found = read_object(value or {})
    for key, item in found.items():
        if not isinstance(item, str):
            raise Bad(key, f"a string was expected, not {kind_of(item)}")
    return dict(found)


_STR = Field((str,), read_str)
_NUMBER = Field((float, int), read_float)
_READ: dict[str, Field] = {
    "root": _STR,
    "plan": _STR,
    "name": _STR,
    "body": _STR,
    "log": _STR,
    "hash": OPT_STR,
    "text": OPT_STR,
    "env": Field((), _env),
    "slurm_conf": OPT_STR,
    "retries": Field((), lambda v: optional(read_int)(v) or 1),
    "timeout_s": OPT_FLOAT,
    "kill_after_s": _NUMBER,
    "done_if": OPT_STR,
    "gate": OPT_STR,
    "gate_interval_s": _NUMBER,
    "backoff_base_s": _NUMBER,
    "backoff_max_s": _NUMBER,
    "sbatch": STRINGS,
    "script": OPT_STR,
}
_KEYS = frozenset(_READ)
_NEEDED = ("root", "plan", "name", "body", "log")


def parse_element(value: Any, where: str = "") -> Element | RecordError:
    """The bundle element in VALUE, or where and why it is not one."""
    try:
        raw = read_object(value, _KEYS)
        missing = [key for key in _NEEDED if key not in raw]
        if missing:
            raise Bad("", f"no {missing[0]!r}")
        return Element(**read_fields(raw, _READ))
    except Bad as bad:
        return bad.within(where).error


def read_element(bundle: str, entry: int) -> Element | RecordError:
    """Element ENTRY of the bundle at BUNDLE, located there, or why it cannot be read."""
    try:
        found = read_json(Path(bundle))
    except (OSError, ValueError) as exc:
        return RecordError(bundle, f"unreadable ({exc})")
    elements = found.get("elements") if isinstance(found, dict) else None
    if not isinstance(elements, list) or not 0 <= entry < len(elements):
        return RecordError(bundle, f"no element {entry}")
    element = parse_element(elements[entry], f"{bundle}: elements[{entry}]")
    return element if isinstance(element, RecordError) else replace(element, bundle=bundle, entry=entry)


def find_element(bundle: str, name: str, content: str | None) -> Element | None:
    """The element of job NAME with hash CONTENT in the bundle at BUNDLE (located there), if it holds one that
    reads; only that element is parsed, however many the bundle holds."""
    try:
        found = read_json(Path(bundle))
    except (OSError, ValueError):
        return None
    elements = found.get("elements") if isinstance(found, dict) else None
    for entry, raw in enumerate(elements if isinstance(elements, list) else []):
        if isinstance(raw, dict) and raw.get("name") == name and raw.get("hash") == content:
            element = parse_element(raw)
            if isinstance(element, Element):
                return replace(element, bundle=bundle, entry=entry)
    return None

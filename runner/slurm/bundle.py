"""A push's jobs, as the push request names them (PushJob, read once where the agent takes the request), and
its bundle (ROOT/scripts/PLAN/bundle.SHA.json, written by runner.slurm.wrapper): one element per job, everything
its attempts need. Each is read into a frozen value or a located error; an Element is written with to_json."""

from __future__ import annotations

from pathlib import Path

from runner import backoff
from runner.files import read_json
from runner.records import Frozen, fill_all, replaced
from runner.slurm.jsonfields import (
    OPT_FLOAT,
    OPT_ID,
    OPT_INT,
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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from runner.slurm.jsonfields import SlurmId

KILL_AFTER_S = 10  # the grace a timed-out body has between TERM and KILL


class PushJob(Frozen):
    """One job of a push request (plancompiler.backends.slurm): its name and content, producers, lane, and what
    its attempts run with. `replaces` is the agent's: the pending Slurm job a new content replaces."""

    __slots__ = (
        "name",
        "hash",
        "text",
        "deps",
        "lane",
        "group",
        "family",
        "done_if",
        "gate",
        "retries",
        "timeout_s",
        "default_time",
        "env",
        "sbatch",
        "replaces",
    )
    name: str
    hash: str
    text: str
    deps: tuple[str, ...]
    lane: str
    group: int | None  # its foreach group's index: one job array where its dependencies allow
    family: str | None  # that group's name, the array's
    done_if: str | None
    gate: str | None
    retries: int
    timeout_s: float | None
    default_time: str | None  # the lane's --time for a job without a timeout
    env: dict[str, str]
    sbatch: tuple[str, ...]
    replaces: SlurmId | None

    def __init__(
        self,
        name: str,
        hash: str,
        text: str,
        deps: tuple[str, ...] = (),
        lane: str = "",
        group: int | None = None,
        family: str | None = None,
        done_if: str | None = None,
        gate: str | None = None,
        retries: int = 1,
        timeout_s: float | None = None,
        default_time: str | None = None,
        env: dict[str, str] | None = None,
        sbatch: tuple[str, ...] = (),
        replaces: SlurmId | None = None,
    ) -> None:
        env = {} if env is None else env
        fill_all(self, locals())

    def to_json(self) -> dict[str, Any]:
        """The job as a push request carries it (`replaces` is the agent's own, never sent)."""
        out = {name: getattr(self, name) for name in _SENT}
        out.update(deps=list(self.deps), env=dict(self.env), sbatch=list(self.sbatch))
        return out


_SENT = (
    "name",
    "group",
    "family",
    "text",
    "hash",
    "deps",
    "lane",
    "done_if",
    "gate",
    "retries",
    "timeout_s",
    "default_time",
    "env",
    "sbatch",
)


class Element(Frozen):
    """One job's entry in a bundle. `bundle` and `entry` say where it was read from (not written: the bundle is
    named by its content); `script` is a job submitted before bundles, whose own wrapper file takes a retry."""

    __slots__ = (
        "root",
        "plan",
        "name",
        "body",
        "log",
        "hash",
        "text",
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
        "bundle",
        "entry",
        "script",
    )
    root: str
    plan: str
    name: str
    body: str
    log: str
    hash: str | None
    text: str | None
    env: dict[str, str]
    slurm_conf: str | None
    retries: int
    timeout_s: float | None
    kill_after_s: float
    done_if: str | None
    gate: str | None
    gate_interval_s: float
    backoff_base_s: float
    backoff_max_s: float
    sbatch: tuple[str, ...]
    bundle: str | None
    entry: int | None
    script: str | None

    def __init__(
        self,
        root: str,
        plan: str,
        name: str,
        body: str,
        log: str,
        hash: str | None = None,
        text: str | None = None,
        env: dict[str, str] | None = None,
        slurm_conf: str | None = None,
        retries: int = 1,
        timeout_s: float | None = None,
        kill_after_s: float = KILL_AFTER_S,
        done_if: str | None = None,
        gate: str | None = None,
        gate_interval_s: float = 60.0,
        backoff_base_s: float = backoff.BASE_S,
        backoff_max_s: float = backoff.MAX_S,
        sbatch: tuple[str, ...] = (),
        bundle: str | None = None,
        entry: int | None = None,
        script: str | None = None,
    ) -> None:
        env = {} if env is None else env
        fill_all(self, locals())

    def to_json(self) -> dict[str, Any]:
        """The element as the bundle holds it: every key written, its values as given."""
        out = {name: getattr(self, name) for name in _WRITTEN}
        out.update(env=dict(self.env), sbatch=list(self.sbatch))
        return out


# Every field but where the element was read from and a pre-bundle job's own wrapper (read, never written); the
# bundle's JSON is written with sorted keys, so this order is no file's.
_WRITTEN = tuple(name for name in Element.__slots__ if name not in ("bundle", "entry", "script"))


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


_JOB_READ: dict[str, Field] = {
    "name": Field((str,), read_str),
    "hash": Field((str,), read_str),
    "text": Field((str,), read_str),
    "deps": STRINGS,
    "lane": Field((str,), lambda v: optional(read_str)(v) or ""),
    "group": OPT_INT,
    "family": OPT_STR,
    "done_if": OPT_STR,
    "gate": OPT_STR,
    "retries": Field((), lambda v: optional(read_int)(v) or 1),
    "timeout_s": Field((float, int, type(None)), optional(read_float)),
    "default_time": OPT_STR,
    "env": Field((), lambda v: _env(v)),
    "sbatch": STRINGS,
    "replaces": OPT_ID,
}
_JOB_KEYS = frozenset(_JOB_READ)


def parse_jobs(value: Any) -> tuple[PushJob, ...] | RecordError:
    """The push request's `jobs` (a list of job objects), or where and why they are not."""
    try:
        if not isinstance(value, list):
            raise Bad("", f"a list was expected, not {kind_of(value)}")
        jobs = []
        for i, raw in enumerate(value):
            try:
                found = read_object(raw, _JOB_KEYS)
                missing = [key for key in ("name", "hash", "text") if key not in found]
                if missing:
                    raise Bad("", f"no {missing[0]!r}")
                jobs.append(PushJob(**read_fields(found, _JOB_READ)))
            except Bad as bad:
                raise bad.within(f"[{i}]") from None
        return tuple(jobs)
    except Bad as bad:
        return bad.within("jobs").error


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
    return element if isinstance(element, RecordError) else replaced(element, bundle=bundle, entry=entry)


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
                return replaced(element, bundle=bundle, entry=entry)
    return None

"""The hosts file as a strict model: every key known, per backend, every mistake located with a suggestion."""

from __future__ import annotations

import difflib
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from plancompiler.diagnostics import PlanError
from plancompiler.load import Source, load_yaml
from runner import backoff


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QueueLane(_Strict):
    """A lane of a queue host: how many of its jobs the runner there runs at once."""

    slots: int = Field(1, ge=1, le=1024, description="jobs of this lane that run at once")


class HostEntry(_Strict):
    """A host whose queue a stdlib runner serves (the default backend)."""

    backend: Literal["queue"] = "queue"
    root: str = Field(description="the queue root on the host")
    ssh: str | None = Field(None, description="ssh destination (an alias from ~/.ssh/config); none for a local queue")
    ssh_options: list[str] = Field(default_factory=list, description="extra ssh arguments, as a list: [-F, cfg]")
    # Finite, above 0, at most a day (transport.MAX_TIMEOUT_S): ssh takes whole seconds, inf is no limit.
    connect_timeout: float = Field(10.0, gt=0, le=86400, allow_inf_nan=False, description="seconds for ssh to connect")
    timeout: float = Field(60.0, gt=0, le=86400, allow_inf_nan=False, description="seconds for a whole round trip")
    python: str = Field("python3", description="the interpreter on the host")
    max_answer_mb: float = Field(
        16.0, gt=0, le=4096, allow_inf_nan=False, description="the most MiB one answer from the host may hold"
    )

    @field_validator("root")
    @classmethod
    def _root(cls, value: str) -> str:
        if not value.strip() or any(ord(c) < 32 or c == "\x7f" for c in value):
            raise ValueError(f"a directory path on one line, not empty, got {value!r}")
        return value

    @field_validator("ssh")
    @classmethod
    def _ssh(cls, value: str | None) -> str | None:
        # ssh reads a destination that starts with - as an option (-oProxyCommand=... runs a command here)
        if value is not None and (not value or value.startswith("-") or any(c.isspace() or ord(c) < 32 for c in value)):
            raise ValueError(
                f"a destination (user@host or an ~/.ssh/config alias), one word, not starting with -, got {value!r}"
            )
        return value


class QueueHostEntry(HostEntry):
    """A queue host (the default backend): a runner there runs each lane's slots at once."""

    lanes: dict[str, QueueLane] = Field(default_factory=dict, description="lane -> {slots: N} (pushed to the runner)")
    gpus: list[int] | None = Field(
        None,
        description="the GPUs of this box the gpu lane gives its jobs, one each (e.g. [0, 1]; pushed to the runner)",
    )

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or len(set(value)) != len(value) or not all(0 <= d < 1024 for d in value)):
            raise ValueError(f"gpus: GPU indexes such as [0, 1], each once, got {value!r}")
        return value


class SlurmLane(_Strict):
    """How one lane maps to Slurm resources."""

    gres: str | None = None
    licenses: list[str] = Field(default_factory=list)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    mem: str | None = Field(default=None, description="--mem for each job of the lane, e.g. 4G")
    cpus: int | None = Field(default=None, ge=1, description="--cpus-per-task")
    time: str | None = Field(
        default=None,
        description="--time for a job of the lane without `timeout:` (Slurm's forms, e.g. 2:00:00 or 1-00:00:00)",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="the only environment its jobs get, with Slurm's SLURM_* and a plain PATH, HOME, USER",
    )
    extra: list[str] = Field(default_factory=list, description="more sbatch options, as a list")


DEFAULT_SLURM_LANES = {"gpu": SlurmLane(gres="gpu:1"), "net": SlurmLane(licenses=["net:1"]), "cpu": SlurmLane()}


class SlurmHostEntry(HostEntry):
    """A Slurm cluster, submitting on its login node (or locally)."""

    backend: Literal["slurm"] = "slurm"  # type: ignore[assignment]
    slurm_conf: str | None = Field(None, description="SLURM_CONF for the client commands")
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gate_interval: float = Field(
        60.0, gt=0, le=86400, allow_inf_nan=False, description="seconds before a closed external gate is checked again"
    )
    backoff_base: float = Field(
        backoff.BASE_S,
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="seconds before the first retry (then doubling, as the runner's --backoff-base)",
    )
    backoff_max: float = Field(
        backoff.MAX_S, gt=0, le=86400 * 7, allow_inf_nan=False, description="longest wait between retries"
    )
    lanes: dict[str, SlurmLane] = Field(default_factory=dict, description="lane -> gres, licenses, partition, ...")
    exclusive: list[str] = Field(default_factory=lambda: ["net", "gpu"], description="lanes that share a license")
    exclusive_license: str | None = Field("netgpu:1", description="the license the exclusive lanes share")


BACKENDS: dict[str, type[HostEntry]] = {"queue": QueueHostEntry, "slurm": SlurmHostEntry}


def _model_for(entry: dict[str, Any]) -> type[HostEntry] | str:
    backend = entry.get("backend", "queue")
    if backend in BACKENDS:
        return BACKENDS[backend]
    hint = difflib.get_close_matches(str(backend), BACKENDS, n=1)
    return (
        f"unknown backend {backend!r}"
        + (f"; did you mean {hint[0]!r}?" if hint else "")
        + f" (known: {', '.join(BACKENDS)})"
    )


def _fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at LOC inside MODEL (for did-you-mean)."""
    if loc and loc[0] == "lanes":
        lane = SlurmLane if model is SlurmHostEntry else QueueLane
        return list(lane.model_fields) if len(loc) == 2 else []
    return list(model.model_fields)


def _located(path: str, source: Source, loc: tuple[Any, ...], message: str, key: bool = False) -> str:
    line, col = source.key(loc) if key else source.where(loc)
    return f"{path}:{line}:{col}: error[H001]: {message}"


def _dotted(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def load_hosts(path: Path) -> dict[str, HostEntry]:
    """Every host of the file at PATH, validated; PlanError (exit 2) listing every mistake with its line."""
    display = str(path)
    data, source, problems = load_yaml(path, display, "hosts")
    if problems:  # the loader's findings, under the hosts file's own code
        raise PlanError("\n".join(replace(d, code="H001").text() for d in problems))
    if data is None:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("hosts", {}), dict):
        raise PlanError(f"{display}:1:1: error[H001]: a hosts file is a mapping `hosts:` of name -> host")
    errors: list[str] = []
    if "hosts" not in data:
        raise PlanError(f"{display}:1:1: error[H001]: no `hosts:` mapping in this file")
    for key in data:
        if key != "hosts":
            hint = " ; did you mean 'hosts'?" if difflib.get_close_matches(str(key), ["hosts"], n=1) else ""
            errors.append(_located(display, source, (key,), f"unknown top-level key {key!r}{hint}", key=True))
    hosts: dict[str, HostEntry] = {}
    for name, entry in (data.get("hosts") or {}).items():
        base = ("hosts", name)
        if not isinstance(entry, dict):
            errors.append(_located(display, source, base, f"host {name!r} must be a mapping with at least `root:`"))
            continue
        model = _model_for(entry)
        if isinstance(model, str):
            errors.append(_located(display, source, (*base, "backend"), f"hosts.{name}.backend: {model}"))
            continue
        try:
            hosts[str(name)] = model.model_validate(entry)
        except ValidationError as exc:
            errors += [_error(display, source, base, model, err) for err in exc.errors()]
    if errors:
        raise PlanError("\n".join(errors))
    return hosts


def _error(display: str, source: Source, base: tuple[Any, ...], model: type[HostEntry], err: Any) -> str:
    loc = tuple(err["loc"])
    where = _dotted(base + loc[:-1]) if loc else _dotted(base)
    if err["type"] == "extra_forbidden":
        bad = str(loc[-1])
        hint = difflib.get_close_matches(bad, _fields(model, loc[:-1]), n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return _located(display, source, base + loc, f"unknown key {bad!r} in {where}{suggestion}", key=True)
    if err["type"] == "missing":
        return _located(display, source, base + loc[:-1], f"{where}: missing required key {loc[-1]!r}")
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "list_type":
        message += " (write a YAML list, e.g. [-F, ~/.ssh/config.d/box])"
    return _located(display, source, base + loc, f"{_dotted(base + loc)}: {message}")

"""The plan format (contract 6) as strict, frozen pydantic models; YAML and Python plans both build these."""

from __future__ import annotations

import difflib
import re
import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from runner import jobfile
from runner.durations import parse_duration, parse_limit

if TYPE_CHECKING:
    from pydantic import GetJsonSchemaHandler
    from pydantic_core import CoreSchema

REQUIREMENT_KINDS = ("path", "nonempty", "dir", "exists", "after", "sh")
_FORMS = "a path, {nonempty: P}, {dir: P}, {exists: P}, {after: JOB} or {sh: CMD, external: true}"
_OUTPUT_FORMS = "a path, {nonempty: P}, {dir: P} or {exists: P}"


# The file of the Python plan being loaded, while it is: jobs built then record their line in it.
RECORDING: ContextVar[str | None] = ContextVar("plancompiler_recording", default=None)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


_LANE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TEST_OPS = {"path": "f", "nonempty": "s", "dir": "d", "exists": "e"}


def _short_form(data: Any, kinds: tuple[str, ...], forms: str, what: str) -> Any:
    """`P` is {kind: path, value: P}; `{nonempty: P}` is {kind: nonempty, value: P}; anything else is explained."""
    if isinstance(data, str):
        return {"kind": "path", "value": data}
    if not isinstance(data, dict) or "kind" in data:
        return data
    keys = [k for k in data if k != "external"]
    if len(keys) != 1 or keys[0] not in kinds:
        bad = keys[0] if keys else "?"
        hint = difflib.get_close_matches(str(bad), kinds, n=1)
        suggestion = f" (did you mean {hint[0]}?)" if hint else ""
        raise ValueError(f"unknown {what} form {data!r}{suggestion}; use {forms}")
    value = data[keys[0]]
    if not isinstance(value, str):
        raise ValueError(f"{keys[0]}: expected a string, got {type(value).__name__}")
    result = {"kind": keys[0], "value": value}
    if "external" in data:
        result["external"] = data["external"]  # an Output has no `external`: strict validation says so
    return result


# `plan schema` (for editors) describes what a plan file may say: the short forms above, the durations as
# parse_duration reads them (a number is seconds), not only the {kind, value} models they become.
_ONE_LINE = r"^(?!.*\n)"  # Python's `$` (jsonschema's) also matches before a final newline
_DURATION = _ONE_LINE + r" *[0-9]+(\.[0-9]+)? *[smhd]? *$"
_LIMIT = _ONE_LINE + r"(?= *[0-9.]*[1-9]) *[0-9]+(\.[0-9]+)? *[smhd]? *$"  # a duration of more than 0
_WAIT_SCHEMA: list[Any] = [{"type": "string", "pattern": _DURATION}, {"type": "number", "minimum": 0}]
_NONE: dict[str, Any] = {"type": "null"}  # the key given no value: as if left out
_LIMIT_SCHEMA: dict[str, Any] = {
    "anyOf": [{"type": "string", "pattern": _LIMIT}, {"type": "number", "exclusiveMinimum": 0}, _NONE]
}
_KINDS = {
    "nonempty": "a file that is not empty (test -s)",
    "dir": "a directory (test -d)",
    "exists": "any file or directory (test -e)",
    "after": "the job of this name: its outputs (an ordering gate: its reruns never make this job stale)",
    "sh": "a shell command, true when it exits 0; only with `external: true`",
}
_EXTERNAL = {"type": "boolean", "description": "made true outside this plan: no job need produce it"}


def _forms_schema(kinds: tuple[str, ...], external: bool) -> list[dict[str, Any]]:
    """A path, or {KIND: VALUE} (with `external:` where a requirement may say it), as JSON Schema."""
    forms: list[dict[str, Any]] = [{"type": "string", "description": "a path: a file (test -f)"}]
    for kind in kinds:
        properties: dict[str, Any] = {kind: {"type": "string", "description": _KINDS[kind]}}
        required = [kind]
        if kind == "sh":
            properties["external"], required = {"const": True}, [kind, "external"]
        elif external:
            properties["external"] = _EXTERNAL
        forms.append({"type": "object", "properties": properties, "required": required, "additionalProperties": False})
    return forms


def _lane_names_schema(schema: dict[str, Any]) -> None:
    """The lanes' names as Plan._lane_names checks them: single words, each once."""
    name = {"type": "string", "pattern": _ONE_LINE + _LANE_RE.pattern + "$"}
    for form in schema["anyOf"]:
        form.update({"items": name, "uniqueItems": True} if form["type"] == "array" else {"propertyNames": name})


def _any_of(core_schema: CoreSchema, handler: GetJsonSchemaHandler, before: list[Any], after: list[Any]) -> Any:
    """The model's definition made one of BEFORE, its own form (for Requirement and Output the {kind, value} one
    that Python plans build), or AFTER; its title and description kept on the whole."""
    json_schema = handler(core_schema)
    definition = handler.resolve_ref_schema(json_schema)
    own = {k: v for k, v in definition.items() if k not in ("title", "description")}
    title, description = definition.get("title"), definition.get("description")
    definition.clear()
    definition.update(title=title, description=description, anyOf=[*before, own, *after])
    return json_schema


class Requirement(Strict):
    """One gate: `path` is a file (test -f), `nonempty` (test -s), `dir` (test -d), `exists` (test -e),
    `after` another job's outputs, `sh` raw shell (allowed only with external: true)."""

    kind: Literal["path", "nonempty", "dir", "exists", "after", "sh"]
    value: str
    external: bool = False

    @model_validator(mode="before")
    @classmethod
    def _from_short_form(cls, data: Any) -> Any:
        return _short_form(data, REQUIREMENT_KINDS[1:], _FORMS, "requirement")

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        return _any_of(core_schema, handler, _forms_schema(REQUIREMENT_KINDS[1:], external=True), [])

    def test_op(self) -> str | None:
        return _TEST_OPS.get(self.kind)


class Output(Strict):
    """A path the job promises to create, and how DONE_IF tests it (default: a file, test -f)."""

    kind: Literal["path", "nonempty", "dir", "exists"]
    value: str

    @model_validator(mode="before")
    @classmethod
    def _from_short_form(cls, data: Any) -> Any:
        return _short_form(data, ("nonempty", "dir", "exists"), _OUTPUT_FORMS, "output")

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        return _any_of(core_schema, handler, _forms_schema(("nonempty", "dir", "exists"), external=False), [])

    def test_op(self) -> str:
        return _TEST_OPS[self.kind]


def _check_duration(value: str | None) -> str | None:
    """The duration as the job header will carry it: checked, stripped, and one line."""
    if value is None:
        return None
    text = str(value)
    if not text.isprintable():  # parse_duration allows any whitespace around the number, newlines too
        raise ValueError(f"not a duration: {text!r} (one line: 90, 90s, 10m, 6h or 2d)")
    parse_duration(text)
    return text.strip()


class Job(Strict):
    # exactly one body, as _one_body says (a `null` one is none)
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [{"required": [k], "properties": {k: {"type": "string"}}} for k in ("template", "run")]
        }
    )

    name: str = Field(description="job name (a jinja2 template over vars and the foreach row)")
    lane: str = Field("cpu", description="net, gpu, cpu, or a lane of the host")
    template: str | None = Field(None, description="a template file under templates/")
    run: str | None = Field(None, description="an inline bash body (a jinja2 template)")
    with_: dict[str, Any] = Field(default_factory=dict, alias="with", description="values for the template")
    foreach: dict[str, list[Any] | str | dict[str, Any]] | list[dict[str, Any]] | str | None = Field(
        None,
        description="a product of lists (or of vars holding lists, or of {range: [start, stop, step]}), a list of "
        "rows, or a var holding rows",
    )
    requires: list[Requirement] = Field(default_factory=list)
    outputs: list[Output] = Field(default_factory=list)
    done_if: Requirement | list[Requirement] | None = Field(None, description="defaults to the outputs")
    retries: int = Field(1, ge=1, description="attempts allowed in all, the first one included (1: run once, no retry)")
    priority: int = Field(
        0,
        ge=-1_000_000,
        le=1_000_000,
        description="within its lane the job with the higher priority starts first (equal ones in name order); "
        "written as the # PRIORITY= header",
    )
    timeout: str | None = Field(
        None, description="wall-clock limit: 90, 90s, 10m, 6h (more than 0)", json_schema_extra=_LIMIT_SCHEMA
    )
    gpus: int | None = Field(
        None,
        ge=1,
        le=64,
        description="GPUs the job takes where its host's gpu lane gives each job its own (--gpus); on a Slurm "
        "host its GRES count (--gres=gpu:N)",
    )
    warn_after: str | None = Field(
        None, description="running longer raises long-running (more than 0)", json_schema_extra=_LIMIT_SCHEMA
    )
    expect_wait: str | dict[str, str] | None = Field(
        None,
        description="how long a wait is normal, so nothing alerts before it: a duration (any wait) or one per "
        "reason, e.g. {requires: 2d, gpu-foreign: 1h}",
        json_schema_extra={
            "anyOf": [*_WAIT_SCHEMA, {"type": "object", "additionalProperties": {"anyOf": _WAIT_SCHEMA}}, _NONE]
        },
    )
    shellcheck_disable: list[str] = Field(default_factory=list, description="shellcheck codes to ignore, e.g. SC2034")
    rerun: Literal["on-change", "never"] = Field(
        "on-change",
        description="on-change: a done job whose job file changed since it ran (its stamp under "
        "ROOT/stamps/ says so), or whose producers ran again, runs again, and so do the jobs downstream of it; "
        "never: its DONE_IF alone decides, as for a download whose command text changes without changing the result",
    )

    _source: tuple[str, int] | None = PrivateAttr(default=None)

    @field_validator("timeout", "warn_after", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return _check_duration(None if value is None else str(value))

    @field_validator("timeout", "warn_after")
    @classmethod
    def _limit(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Checked as the runner reads TIMEOUT and WARN_AFTER (runner.durations.parse_limit): a TIMEOUT of 0 would end
        every attempt at once, a WARN_AFTER of 0 call every run long-running as it starts."""
        if value is not None:
            parse_limit(str(info.field_name).upper(), value)
        return value

    @field_validator("retries", mode="before")
    @classmethod
    def _attempts(cls, value: Any) -> Any:
        # The seed's RETRIES= counts attempts, not retries after the first: `retries: 0` reads as "no retry" and
        # "Input should be greater than or equal to 1" does not say what it counts.
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(f"counts attempts in all, the first one included: at least 1 (1: no retry), got {value}")
        return value

    @field_validator("expect_wait", mode="before")
    @classmethod
    def _expect_wait(cls, value: Any) -> Any:
        """Checked as the runner reads it (runner.jobfile.parse_expect_wait); kept as the header will carry it."""
        if value is None:
            return None
        if isinstance(value, dict):
            text = ",".join(f"{reason}={_check_duration(str(v))}" for reason, v in value.items())
        else:
            text = str(_check_duration(str(value)))
        if not text.isprintable():
            raise ValueError(f"not one line: {text!r}")
        jobfile.parse_expect_wait(text)
        return text

    @field_validator("shellcheck_disable")
    @classmethod
    def _codes(cls, value: list[str]) -> list[str]:
        for code in value:
            if not re.fullmatch(r"SC\d{4}", code):
                raise ValueError(f"{code!r} is not a shellcheck code like SC2034")
        return value

    @model_validator(mode="after")
    def _one_body(self) -> Job:
        if (self.template is None) == (self.run is None):
            raise ValueError("give exactly one of `template` or `run`")
        return self

    def model_post_init(self, context: Any) -> None:
        # Only while a Python plan is being loaded: the line in it that built this job, found by walking
        # up the frames to the plan's file (a YAML plan knows its lines from the YAML marks instead).
        path = RECORDING.get()
        if path is None:
            return
        frame = sys._getframe(1)
        for _ in range(64):
            if frame is None:
                return
            if frame.f_code.co_filename == path:
                self._source = (path, frame.f_lineno)
                return
            frame = frame.f_back  # type: ignore[assignment]


class Lane(Strict):
    """A lane given as a mapping: `lanes: {cpu: {slots: 4}, net: {slots: 2}}` (the list form has 1 slot each)."""

    slots: int = Field(1, ge=1, le=1024, description="jobs of this lane that run at once")
    devices: list[int] | None = Field(
        None,
        description="the GPUs this lane gives its jobs, one slot each (e.g. [0, 1]): each job gets its own in "
        "CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES and PLAN_GPU (the runner's gpu lane)",
    )

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> Any:
        """`lanes: {cpu: {slots: 4}, net: }`: a lane given no settings (null) has 1 slot."""
        return _any_of(core_schema, handler, [], [_NONE])

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value or len(set(value)) != len(value) or not all(0 <= d < 1024 for d in value):
            raise ValueError(f"devices: GPU indexes such as [0, 1], each once, got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_count(self) -> Lane:
        if self.devices is not None and "slots" in self.model_fields_set and self.slots != len(self.devices):
            raise ValueError("give `devices` or `slots`, not both: a lane of GPUs has one slot per GPU")
        return self


PLAN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Plan(Strict):
    plan: str = Field(
        description="the plan's name, written into each job's PLAN= header",
        json_schema_extra={"pattern": PLAN_NAME},  # what _plan_name takes, for editors
    )
    vars: dict[str, Any] = Field(default_factory=dict, description="jinja2 variables; may use each other")
    external: list[str] = Field(default_factory=list, description="paths made outside this plan")
    # The names, in the order lanes pick jobs in; or a mapping of them to their settings (counted slots).
    lanes: list[str] | dict[str, Lane] = Field(
        default_factory=lambda: ["net", "gpu", "cpu"], json_schema_extra=_lane_names_schema
    )
    jobs: list[Job] = Field(default_factory=list)

    @property
    def slots(self) -> dict[str, int]:
        """Lane -> jobs it runs at once, as the plan's mapping form gives them ({} for the list form)."""
        if not isinstance(self.lanes, dict):
            return {}
        return {lane: len(spec.devices) if spec.devices else spec.slots for lane, spec in self.lanes.items()}

    @property
    def gpus(self) -> dict[str, list[int]]:
        """Lane -> the GPUs it gives its jobs (`devices:`), where the plan names them."""
        if not isinstance(self.lanes, dict):
            return {}
        return {lane: list(spec.devices) for lane, spec in self.lanes.items() if spec.devices}

    @field_validator("lanes", mode="before")
    @classmethod
    def _lane_specs(cls, value: Any) -> Any:
        """The mapping form's mistakes said plainly (the list-or-mapping union would also say "not a list")."""
        if not isinstance(value, dict):
            return value
        for lane, spec in value.items():
            spec = {} if spec is None else spec
            if not isinstance(spec, dict):
                raise ValueError(f"{lane}: a mapping such as {{slots: 2}}, got {type(spec).__name__}")
            for key in spec:
                if key not in Lane.model_fields:
                    hint = difflib.get_close_matches(str(key), list(Lane.model_fields), n=1)
                    raise ValueError(f"{lane}: unknown key {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
            slots = spec.get("slots", 1)
            if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= 1024:
                raise ValueError(f"{lane}.slots: a whole number >= 1 (at most 1024), got {slots!r}")
            devices = spec.get("devices")
            if devices is not None:
                whole = isinstance(devices, list) and all(type(d) is int and 0 <= d < 1024 for d in devices)
                if not whole or not devices or len(set(devices)) != len(devices):
                    raise ValueError(f"{lane}.devices: GPU indexes such as [0, 1], each once, got {devices!r}")
                if "slots" in spec and spec["slots"] != len(devices):
                    raise ValueError(
                        f"{lane}: give `devices` or `slots`, not both: a lane of GPUs has one slot per GPU"
                    )
        return {lane: spec or {} for lane, spec in value.items()}

    @field_validator("lanes")
    @classmethod
    def _lane_names(cls, value: list[str] | dict[str, Lane]) -> list[str] | dict[str, Lane]:
        for lane in value:
            if not _LANE_RE.fullmatch(lane):
                raise ValueError(
                    f"lane name {lane!r}: use letters, digits, '.', '_' and '-' (the runner reads LANE= as one word)"
                )
        if len(set(value)) != len(value):
            raise ValueError("a lane is listed twice")
        return value

    @field_validator("plan")
    @classmethod
    def _plan_name(cls, value: str) -> str:
        if not re.fullmatch(PLAN_NAME, value):
            said = "use letters, digits, '.', '_' and '-', starting with a letter or digit"
            raise ValueError(f"plan name {value!r}: {said}")
        return value


def fields_of(loc: tuple[Any, ...]) -> list[str]:
    """The valid keys at LOC (a pydantic error location), for "did you mean" suggestions."""
    if len(loc) <= 1:
        return [f.alias or name for name, f in Plan.model_fields.items()]
    if loc[0] == "jobs" and len(loc) == 2:
        return [f.alias or name for name, f in Job.model_fields.items()]
    return []

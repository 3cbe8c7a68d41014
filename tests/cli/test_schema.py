"""`plan schema` describes what a plan file may say: every plan of plans/ and of the tests' fixtures that the
compiler takes validates against it, and what the models refuse it refuses too.

Validated with jsonschema (the test extra) where it is installed, else with the small check below of the
keywords the schema uses; where both are there, each case is checked by both and they must agree."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from plancompiler.cli import app
from plancompiler.models import Plan
from tests import sources
from tests.conftest import REPO

Check = Callable[[Any], bool]
# Beside the other tests that read the source (tests/sources.py: tests/ parsed once a process), and all on that one
# worker, so that the module's schema checks (`valid`) are built once, not on each worker that ran one of them.
pytestmark = pytest.mark.xdist_group("architecture")


def _schema() -> dict[str, Any]:
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _structural(schema: dict[str, Any]) -> Check:
    """Whether a value is valid under SCHEMA, for the keywords `plan schema` writes (Draft 2020-12 meanings)."""
    types: dict[str, Callable[[Any], bool]] = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }

    def ok(s: Any, v: Any) -> bool:
        if s is True or s is False:
            return s
        if "$ref" in s and not ok(schema["$defs"][s["$ref"].rsplit("/", 1)[1]], v):
            return False
        if "type" in s and not types[s["type"]](v):
            return False
        if "enum" in s and v not in s["enum"] or "const" in s and v != s["const"]:
            return False
        if "anyOf" in s and not any(ok(sub, v) for sub in s["anyOf"]):
            return False
        if "oneOf" in s and sum(ok(sub, v) for sub in s["oneOf"]) != 1:
            return False
        if isinstance(v, str) and "pattern" in s and not re.search(s["pattern"], v):
            return False
        if types["number"](v) and not _in_range(s, v):
            return False
        if isinstance(v, list):
            return all(ok(s.get("items", True), x) for x in v) and not (
                s.get("uniqueItems") and len({json.dumps(x) for x in v}) != len(v)
            )
        if isinstance(v, dict):
            props = s.get("properties", {})
            return (
                all(k in v for k in s.get("required", ()))
                and all(ok(s.get("propertyNames", True), k) for k in v)
                and all(
                    ok(props[k], x) if k in props else ok(s.get("additionalProperties", True), x) for k, x in v.items()
                )
            )
        return True

    return lambda value: ok(schema, value)


def _in_range(s: dict[str, Any], v: float) -> bool:
    return (
        v >= s.get("minimum", v)
        and v <= s.get("maximum", v)
        and ("exclusiveMinimum" not in s or v > s["exclusiveMinimum"])
    )


def _checks() -> list[Check]:
    schema = _schema()
    found = [_structural(schema)]
    try:
        import jsonschema
    except ImportError:
        return found
    jsonschema.Draft202012Validator.check_schema(schema)
    return [*found, jsonschema.Draft202012Validator(schema).is_valid]


@pytest.fixture(scope="module")
def valid() -> Check:
    checks = _checks()

    def check(value: Any) -> bool:
        said = {c(value) for c in checks}
        assert len(said) == 1, f"the structural check and jsonschema disagree on {value!r}"
        return said.pop()

    return check


def _bare_sh(plan: dict[str, Any]) -> bool:
    """A `{sh: CMD}` gate without `external: true`: the model takes it, the graph refuses it (G006), and so does the
    schema."""
    gates = []
    for job in plan.get("jobs") or ():
        done_if = job.get("done_if")
        gates += [*(job.get("requires") or ()), *(done_if if isinstance(done_if, list) else [done_if])]
    return any(isinstance(g, dict) and "sh" in g and g.get("external") is not True for g in gates)


def _fixture_plans() -> dict[str, Any]:
    """Each YAML plan the tests write, from their string literals: `where -> data`."""
    plans = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        for line, text in sources.facts(path).strings:
            if "jobs:" not in text:
                continue
            try:
                data = yaml.safe_load(textwrap.dedent(text))
            except yaml.YAMLError:
                continue
            if isinstance(data, dict) and "plan" in data:
                plans[f"{path.relative_to(REPO)}:{line}"] = data
    return plans


def test_every_plan_of_plans_validates(valid: Check) -> None:
    plans = [p for p in sorted((REPO / "plans").glob("*.yaml")) if "jobs" in yaml.safe_load(p.read_text())]
    assert {p.name for p in plans} >= {"demo.yaml", "a9.yaml"}
    for path in plans:
        assert valid(yaml.safe_load(path.read_text())), path


def test_the_schema_takes_the_fixtures_plans_the_compiler_takes_and_refuses_the_others(valid: Check) -> None:
    plans = _fixture_plans()
    assert len(plans) > 50
    wrong = []
    for where, data in plans.items():
        try:
            Plan.model_validate(data)
            takes = not _bare_sh(data)
        except ValidationError:
            takes = False
        if valid(data) != takes:
            wrong.append((where, "refused" if takes else "taken"))
    assert not wrong


def _plan(**job: Any) -> dict[str, Any]:
    return {"plan": "p", "jobs": [{"name": "a", "run": "true", **job}]}


TAKEN = [
    {"requires": ["/a", {"nonempty": "/b"}, {"dir": "/c"}, {"exists": "/d"}, {"after": "b"}]},
    {"requires": [{"sh": "pgrep x", "external": True}, {"nonempty": "/b", "external": True}]},
    {"requires": [{"kind": "path", "value": "/a", "external": True}]},  # the long form, as Python plans build it
    {"outputs": ["/o", {"nonempty": "/p"}, {"dir": "/q/"}, {"exists": "/r"}, {"kind": "dir", "value": "/s"}]},
    {"done_if": {"nonempty": "/o"}},
    {"done_if": ["/o", {"sh": "test -s /o", "external": True}]},
    {"timeout": 90, "warn_after": "6h"},
    {"timeout": "10m", "warn_after": 90, "expect_wait": "2d"},
    {"timeout": 0.5, "expect_wait": {"requires": "2d", "gpu-foreign": 3600}},
    {"timeout": None, "template": None},
    {"template": "t.sh.j2", "run": None, "with": {"x": 1}, "foreach": {"i": {"range": [0, 3]}}},
]
REFUSED = [
    {"requirs": ["/a"]},  # an unknown job key
    {"requires": [{"nonemtpy": "/a"}]},
    {"requires": [{"sh": "pgrep x"}]},  # no external: true
    {"requires": [{"nonempty": "/a", "dir": "/b"}]},
    {"requires": "/a"},
    {"outputs": [{"after": "b"}]},
    {"outputs": [{"nonempty": "/a", "external": True}]},
    {"timeout": 0},
    {"timeout": "0s"},
    {"timeout": "0.0m"},
    {"timeout": "10m\n"},
    {"timeout": "soon"},
    {"timeout": -5},
    {"warn_after": "-1"},
    {"warn_after": 0},
    {"warn_after": "0.0h"},
    {"expect_wait": {"requires": "later"}},
    {"template": "t.sh.j2"},  # and run: both bodies
    {"run": None},  # neither
    {"retries": 0},
    {"rerun": "always"},
]


@pytest.mark.parametrize("job", TAKEN, ids=[json.dumps(j) for j in TAKEN])
def test_the_documented_forms_are_taken(valid: Check, job: dict[str, Any]) -> None:
    Plan.model_validate(_plan(**job))
    assert valid(_plan(**job))


@pytest.mark.parametrize("job", REFUSED, ids=[json.dumps(j) for j in REFUSED])
def test_what_the_compiler_refuses_is_refused(valid: Check, job: dict[str, Any]) -> None:
    if not _bare_sh(_plan(**job)):
        with pytest.raises(ValidationError):
            Plan.model_validate(_plan(**job))
    assert not valid(_plan(**job))


def test_lanes_in_either_form() -> None:
    checks = _checks()
    for lanes, takes in (
        (["net", "gpu", "cpu"], True),
        ({"cpu": {"slots": 4}, "gpu": {"devices": [0, 1]}, "net": None}, True),
        (["a b"], False),
        (["cpu", "cpu"], False),
        ({"a b": {}}, False),
        ({"cpu": {"slot": 2}}, False),
    ):
        assert {c({"plan": "p", "lanes": lanes, "jobs": []}) for c in checks} == {takes}, lanes
    assert not any(c({"plan": "p", "jobs": [], "job": []}) for c in checks)  # an unknown top-level key

"""Stage 2's rows: a job's `foreach` (a product of lists or ranges, a list of rows, or a var holding either) as the
rows it is expanded over, bounded before any row is made."""

from __future__ import annotations

import difflib
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from plancompiler.models import Job

# Names every job's template gets from the compiler; a `with:` or foreach key may not replace them.
RESERVED = ("name", "lane", "plan", "plan_name", "job_outputs")
MAX_JOBS = 100_000


class LocatedError(Exception):
    """A foreach that cannot be expanded, at LOC in the plan: expand turns it into a finding (never raised past it)."""

    def __init__(self, loc: tuple[Any, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def rows(job: Job, index: int, variables: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = job.foreach
    if spec is None:
        return [{}]
    where = ("jobs", index, "foreach")
    if isinstance(spec, str):
        name = spec.strip().removeprefix("{{").removesuffix("}}").strip()
        if name not in variables:
            raise LocatedError(where, f"foreach names var {name!r}, which is not defined")
        spec = variables[name]
        if not isinstance(spec, (list, dict)):
            raise LocatedError(where, f"foreach var {name!r} must hold a list of rows or a mapping of lists")
    if isinstance(spec, dict):
        keys = list(spec)
        lists: list[Sequence[Any]] = []
        for key in keys:
            values: Any = spec[key]
            if isinstance(values, str):
                values = variables.get(values.strip().removeprefix("{{").removesuffix("}}").strip(), values)
            if isinstance(values, dict):
                values = _range(values, key, (*where, key))
            if not isinstance(values, (list, range)):
                raise LocatedError((*where, key), f"foreach.{key} must be a list or {{range: [start, stop]}}")
            lists.append(values)
        count = math.prod(len(v) for v in lists)
        if count > MAX_JOBS:
            raise LocatedError(where, f"foreach makes {count:,} jobs, more than the {MAX_JOBS:,} a plan may have")
        rows = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*lists)]
    else:
        rows = []
        for i, row in enumerate(spec):
            if not isinstance(row, dict):
                raise LocatedError((*where, i), "each foreach row must be a mapping")
            rows.append(row)
    for i, row in enumerate(rows[:1] if isinstance(spec, dict) else rows):
        for key in row:
            if not isinstance(key, str) or not key.isidentifier():
                raise LocatedError((*where, i), f"foreach key {key!r} must be a name (letters, digits, _)")
            if key in RESERVED:
                raise LocatedError((*where, i), f"foreach key {key!r} would replace the built-in {key!r}; rename it")
    return rows


def _range(spec: dict[Any, Any], key: str, loc: tuple[Any, ...]) -> range:
    """`{range: [start, stop]}` or `{range: [start, stop, step]}`: whole numbers, as Python's range (stop left out);
    lazy, so its length is checked against the plan's bound before a row is made."""
    if set(spec) != {"range"}:
        bad = next((str(k) for k in spec if k != "range"), "?")
        hint = " (did you mean 'range'?)" if difflib.get_close_matches(bad, ["range"], n=1) else ""
        raise LocatedError(loc, f"foreach.{key}: unknown form {bad!r}{hint}; use {{range: [start, stop, step]}}")
    bounds = spec["range"]
    if not isinstance(bounds, list) or len(bounds) not in (2, 3):
        raise LocatedError(loc, f"foreach.{key}.range: give [start, stop] or [start, stop, step], not {bounds!r:.60}")
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
        raise LocatedError(loc, f"foreach.{key}.range: start, stop and step must be whole numbers, not {bounds!r:.60}")
    if len(bounds) == 3 and bounds[2] == 0:
        raise LocatedError(loc, f"foreach.{key}.range: the step must not be 0")
    return range(*bounds)


def _counted(name: str) -> list[Any]:
    """NAME with each run of digits as its number: the order a person counts in (j-2 before j-10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def text_order_breaks_count(names: Sequence[str]) -> tuple[str, str] | None:
    """Two neighbouring rows' names, earlier then later, that count up but sort down as text (j-9 then j-10: the
    runner starts j-10 first, since a lane runs its jobs in name order); None when text order keeps the rows'
    counting. A roster in any order is left alone: only names that differ in their numbers are compared."""
    for earlier, later in itertools.pairwise(names):
        if later > earlier:
            continue  # text order keeps them (most neighbours of a 100,000-row range): no parsing
        a, b = _counted(earlier), _counted(later)
        alike = len(a) == len(b) and all(type(x) is type(y) for x, y in zip(a, b, strict=True))
        if alike and a < b:
            return earlier, later
    return None

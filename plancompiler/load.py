"""Stage 1, load: a YAML or Python plan file into a Plan, with the source line of every key and value."""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from plancompiler.diagnostics import Diagnostic, error
from plancompiler.errors import PlanFileError
from plancompiler.models import RECORDING, Plan, fields_of
from plancompiler.sandbox import DEFAULT_MAX_SIZE
from plancompiler.userfile import Unreadable, read_limited

Loc = tuple[Any, ...]


@dataclass
class Source:
    """Where a plan came from: the file, and (line, col) of each value and key by its path in the data."""

    path: str
    values: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    job_lines: dict[int, int] = field(default_factory=dict)

    def where(self, loc: Loc) -> tuple[int, int]:
        """The position of LOC, or of the nearest enclosing value that has one."""
        loc = tuple(loc)
        while loc:
            if loc in self.values:
                return self.values[loc]
            loc = loc[:-1]
        return self.values.get((), (1, 1))

    def key(self, loc: Loc) -> tuple[int, int]:
        return self.keys.get(tuple(loc)) or self.where(loc)

    def job_line(self, index: int) -> int:
        return self.job_lines.get(index) or self.where(("jobs", index))[0]


@dataclass
class Loaded:
    plan: Plan | None
    source: Source
    diagnostics: list[Diagnostic]


MAX_DEPTH = 100  # nesting of mappings and lists: plans need a handful; C libyaml crashes past ~100,000


MERGE_TAG = "tag:yaml.org,2002:merge"
STR_TAG = "tag:yaml.org,2002:str"  # a plain string's tag: its value is the node's text, as SafeConstructor makes it


MAX_NODES = 500_000  # values built, aliases counted each time they are used (a billion laughs stops here)


class _Refused(Exception):
    """A document the loader will not build: too deep, too large once aliases expand, a recursive alias."""

    def __init__(self, mark: yaml.Mark | None, message: str) -> None:
        super().__init__(message)
        self.mark = mark


class _Duplicate(Exception):
    def __init__(self, key: str, first: yaml.Mark, second: yaml.Mark) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def _pos(mark: yaml.Mark) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


class _Walk:
    """What building one document has cost so far, and which nodes are being built (to catch `&x [*x]`).

    SIZES (from _sizes, given only for a document that is refused whatever happens: it expands past MAX_NODES)
    lets the walk count a collection it has already built once without building it again, where doing so
    could neither pass MAX_NODES nor MAX_DEPTH inside it: every check in it passed the first time and would
    pass again, so the first refusal, and its place, are the ones a full walk meets; only sooner.
    """

    def __init__(self, sizes: dict[int, tuple[int, int]] | None = None) -> None:
        self.nodes = 0
        self.path: set[int] = set()
        self.sizes = sizes
        self.built: set[int] = set()


class _GiveUp(Exception):
    pass


_SIZES_DEPTH = 400  # levels of aliases and merges _sizes follows; past them it gives up (Python's stack is ~1,000)


def _sizes(root: yaml.Node) -> dict[int, tuple[int, int]] | None:
    """For each collection of the document, by id: how many values _build visits in it with every alias
    expanded, and how many levels below it the deepest goes, as a walk without findings would (merged
    mappings at the mapping's own level). None for a recursive alias or a graph deeper than _SIZES_DEPTH."""
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()

    def visit(node: yaml.Node, level: int) -> tuple[int, int]:
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return 1, 0
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in open_ or level > _SIZES_DEPTH:
            raise _GiveUp
        open_.add(id(node))
        count, deepest = 1, 0
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                n, d = visit(item, level + 1)
                count, deepest = count + n, max(deepest, d + 1)
        else:
            for key_node, value_node in node.value:
                if key_node.tag != MERGE_TAG:
                    n, d = visit(value_node, level + 1)
                    count, deepest = count + n, max(deepest, d + 1)
                    continue
                for merged in value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]:
                    n, d = visit(merged, level + 1)
                    count, deepest = count + n, max(deepest, d)
        open_.discard(id(node))
        sizes[id(node)] = (count, deepest)
        return count, deepest

    try:
        visit(root, 0)
    except _GiveUp:
        return None
    return sizes


def _walk_for(root: yaml.Node, text: str) -> _Walk:
    """A walk for ROOT: one that may skip what it has built (see _Walk) where ROOT expands past MAX_NODES."""
    if "*" not in text:  # no alias: nothing is built twice, and nothing to skip
        return _Walk()
    sizes = _sizes(root)
    refused = sizes is not None and sizes.get(id(root), (1, 0))[0] > MAX_NODES
    return _Walk(sizes if refused else None)


def _build(node: yaml.Node, loader: Any, loc: Loc, source: Source, walk: _Walk) -> Any:
    if walk.sizes is not None and id(node) in walk.built:
        count, deepest = walk.sizes[id(node)]
        if walk.nodes + count <= MAX_NODES and len(loc) + deepest <= MAX_DEPTH:
            walk.nodes += count  # the document is refused: what this would have built is never used
            return {} if isinstance(node, yaml.MappingNode) else []
    walk.nodes += 1
    if walk.nodes > MAX_NODES:
        raise _Refused(
            node.start_mark,
            f"the plan expands to more than {MAX_NODES:,} values (aliases that "
            "refer to aliases, such as a billion-laughs document?)",
        )
    if len(loc) > MAX_DEPTH:
        raise _Refused(node.start_mark, f"values nested more than {MAX_DEPTH} deep")
    if len(source.values) < MAX_NODES:
        source.values[loc] = _pos(node.start_mark)
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        if id(node) in walk.path:
            raise _Refused(node.start_mark, "an alias refers to the value that contains it (a recursive alias)")
        walk.path.add(id(node))
        try:
            built = _build_collection(node, loader, loc, source, walk)
        finally:
            walk.path.discard(id(node))
        if walk.sizes is not None:
            walk.built.add(id(node))
        return built
    value = (
        node.value
        if node.tag == STR_TAG and type(node) is yaml.ScalarNode
        else loader.construct_object(node, deep=True)
    )
    if isinstance(node, yaml.ScalarNode) and node.style in ("|", ">"):
        # A block scalar's text starts on the line after its indicator.
        source.values[loc] = (node.start_mark.line + 2, 1)
    return value


def _build_collection(node: yaml.Node, loader: Any, loc: Loc, source: Source, walk: _Walk) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, loader, (*loc, i), source, walk) for i, item in enumerate(node.value)]
    result: dict[Any, Any] = {}
    seen: dict[Any, yaml.Mark] = {}
    # `<<: *defaults` (YAML merge keys) first, so the mapping's own keys override what they bring and keep
    # their own lines; aliases merged this way count against the same budget as any other alias.
    merges = [pair for pair in node.value if pair[0].tag == MERGE_TAG]
    for key_node, value_node in merges:
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for merged in reversed(sources):  # the first mapping listed wins, as the YAML spec says
            if not isinstance(merged, yaml.MappingNode):
                raise _Refused(key_node.start_mark, "`<<` merges a mapping (`<<: *name`) or a list of them")
            result.update(_build(merged, loader, loc, source, walk))
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG:
            if key_node is not merges[0][0]:
                raise _Duplicate("<<", merges[0][0].start_mark, key_node.start_mark)
            continue
        if not isinstance(key_node, yaml.ScalarNode):
            raise _Refused(key_node.start_mark, "a key must be a plain value such as a name, not a list or mapping")
        key = key_node.value if key_node.tag == STR_TAG else loader.construct_object(key_node, deep=True)
        if key in seen:
            raise _Duplicate(str(key), seen[key], key_node.start_mark)
        seen[key] = key_node.start_mark
        if len(source.keys) < MAX_NODES:
            source.keys[loc + (key,)] = _pos(key_node.start_mark)
        result[key] = _build(value_node, loader, (*loc, key), source, walk)
    return result


def _check_depth(text: str) -> None:
    """Nesting is measured on the event stream first: composing a very deep document crashes libyaml."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    depth = 0
    get = loader.get_event  # None after the last: one call an event (10 000 jobs: 40 000 events)
    try:
        while (event := get()) is not None:
            kind = type(event)
            if kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                depth += 1
                if depth > MAX_DEPTH:
                    raise _Refused(event.start_mark, f"values nested more than {MAX_DEPTH} deep")
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                depth -= 1
    finally:
        loader.dispose()


def load_yaml(
    path: Path, display: str, what: str = "plan", max_size: int = DEFAULT_MAX_SIZE
) -> tuple[Any, Source, list[Diagnostic]]:
    """The data of the YAML file PATH (a WHAT: plan or hosts), or located findings about why there is none."""
    source = Source(display)
    try:
        text = read_limited(path, max_size, what).decode("utf-8")
    except Unreadable as exc:
        return None, source, [error(display, 1, 1, "P001", str(exc))]
    except UnicodeDecodeError as exc:  # located at the first bad byte (its column counted in bytes)
        data, at = bytes(exc.object), exc.start
        line, col = data.count(b"\n", 0, at) + 1, at - data.rfind(b"\n", 0, at)
        bad = data[at : exc.end].hex(" ")
        return None, source, [error(display, line, col, "P001", f"{what} file is not valid UTF-8: byte {bad} here")]
    except FileNotFoundError:
        raise PlanFileError(display, f"{what} file not found") from None
    except OSError as exc:
        raise PlanFileError(display, f"cannot read the {what} file: {exc.strerror or exc}") from None
    try:
        _check_depth(text)
    except _Refused as exc:
        line, col = _pos(exc.mark) if exc.mark else (1, 1)
        return None, source, [error(display, line, col, "P001", str(exc))]
    except yaml.YAMLError:
        pass  # reported with its place by the load below
    # libyaml's loader when present: same nodes and marks, several times faster on big plans.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, source, [error(display, 1, 1, "P001", f"{what} file is empty")]
        data = _build(node, loader, (), source, _walk_for(node, text))
    except _Refused as exc:
        line, col = _pos(exc.mark) if exc.mark else (1, 1)
        return None, source, [error(display, line, col, "P001", str(exc))]
    except _Duplicate as dup:
        first = _pos(dup.first)
        line, col = _pos(dup.second)
        return (
            None,
            source,
            [error(display, line, col, "P002", f"duplicate key {dup.key!r} (first on line {first[0]})")],
        )
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = _pos(mark) if mark else (1, 1)
        problem = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        return None, source, [error(display, line, col, "P001", f"YAML syntax error: {problem}")]
    except yaml.YAMLError as exc:
        return None, source, [error(display, 1, 1, "P001", f"YAML error: {exc}")]
    finally:
        loader.dispose()
    return data, source, []


def _clean_loc(loc: Loc) -> Loc:
    # pydantic adds union member names to locations; they are not in the data.
    return tuple(
        p
        for p in loc
        if not isinstance(p, str)
        or ("[" not in p and p not in ("Requirement", "Output", "function-after", "function-before"))
    )


def _dotted(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "plan"


def validation_diagnostics(exc: ValidationError, source: Source) -> list[Diagnostic]:
    found = []
    present: dict[Loc, set[Any]] | None = None  # the keys each mapping has, made at the first unknown key
    for err in exc.errors():
        loc = _clean_loc(err["loc"])
        if err["type"] == "extra_forbidden" and loc:
            line, col = source.key(loc)
            bad = str(loc[-1])
            if present is None:
                present = {}
                for key in source.keys:
                    present.setdefault(key[:-1], set()).add(key[-1])
            # a key the mapping already has is no suggestion (`lnae:` beside `name:` is `lane`, not `name`)
            fields = [f for f in fields_of(loc[:-1]) if f not in present.get(tuple(loc[:-1]), set())]
            hint = difflib.get_close_matches(bad, fields, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            where = _dotted(loc[:-1])
            found.append(error(source.path, line, col, "P003", f"unknown key {bad!r} in {where}{suggestion}"))
            continue
        line, col = source.where(loc)
        message = err["msg"].removeprefix("Value error, ")
        code = "P004"
        if err["type"] == "missing" and loc:
            line, col = source.where(loc[:-1])
            message = f"missing required key {loc[-1]!r}"
        found.append(error(source.path, line, col, code, f"{_dotted(loc)}: {message}"))
    return found


def load_plan(path: Path, display: str | None = None, max_size: int = DEFAULT_MAX_SIZE) -> Loaded:
    display = display or str(path)
    try:
        path.stat()
    except FileNotFoundError:
        raise PlanFileError(display, "plan file not found") from None
    except OSError as exc:  # a name too long, a symlink loop, a part that is not a directory
        raise PlanFileError(display, f"cannot read the plan file: {exc.strerror}") from None
    if path.is_dir():
        raise PlanFileError(display, "a directory, not a plan file")
    if path.suffix == ".py":
        try:
            read_limited(path, max_size)  # a FIFO or a device would hang the import; a huge file fill memory
        except Unreadable as exc:
            return Loaded(None, Source(display), [error(display, 1, 1, "P001", str(exc))])
        except OSError as exc:
            raise PlanFileError(display, f"cannot read the plan file: {exc.strerror or exc}") from None
        return _load_python(path, display)
    data, source, diagnostics = load_yaml(path, display, "plan", max_size)
    if diagnostics:
        return Loaded(None, source, diagnostics)
    if not isinstance(data, dict):
        return Loaded(None, source, [error(display, 1, 1, "P004", "a plan is a mapping with `plan:` and `jobs:`")])
    if set(data) == {"hosts"}:
        # `plan check plans/*.yaml` meets plans/hosts.yaml: say what it is instead of calling it a broken plan.
        return Loaded(None, source, [Diagnostic(display, 1, 1, "info", "P006", "a hosts file, not a plan: skipped")])
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        return Loaded(None, source, validation_diagnostics(exc, source))
    for index in range(len(plan.jobs)):
        source.job_lines[index] = source.where(("jobs", index))[0]
    return Loaded(plan, source, [])


def _load_python(path: Path, display: str) -> Loaded:
    """A Python plan defines `plan` (a Plan) or `build()` returning one; it may define its own models."""
    source = Source(display)
    name = f"_plan_{abs(hash(os.path.realpath(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PlanFileError(display, "cannot import this Python plan")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    recording = RECORDING.set(spec.origin or str(path))
    try:
        spec.loader.exec_module(module)
        plan = getattr(module, "plan", None)
        if plan is None and callable(getattr(module, "build", None)):
            plan = module.build()
    except SyntaxError as exc:
        return Loaded(
            None, source, [error(display, exc.lineno or 1, exc.offset or 1, "P001", f"Python syntax error: {exc.msg}")]
        )
    except ValidationError as exc:
        line = _plan_line(exc, path)
        return Loaded(
            None,
            source,
            [
                error(
                    display,
                    line,
                    1,
                    "P004",
                    f"{_dotted(_clean_loc(e['loc']))}: {e['msg'].removeprefix('Value error, ')}",
                )
                for e in exc.errors()
            ],
        )
    except (Exception, SystemExit) as exc:
        line = _plan_line(exc, path)
        return Loaded(None, source, [error(display, line, 1, "P005", f"{type(exc).__name__}: {exc}")])
    finally:
        RECORDING.reset(recording)
        sys.modules.pop(name, None)
    if not isinstance(plan, Plan):
        return Loaded(
            None,
            source,
            [error(display, 1, 1, "P004", "a Python plan must define `plan = Plan(...)` or `def build() -> Plan`")],
        )
    resolved = os.path.realpath(path)
    for index, job in enumerate(plan.jobs):
        where = job._source
        if where and Path(os.path.realpath(where[0])) == Path(resolved):
            source.job_lines[index] = where[1]
            source.values[("jobs", index)] = (where[1], 1)
    return Loaded(plan, source, [])


def _plan_line(exc: BaseException, path: Path) -> int:
    resolved = Path(os.path.realpath(path))
    line = 1
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(os.path.realpath(frame.filename)) == resolved and frame.lineno:
            line = frame.lineno
    return line

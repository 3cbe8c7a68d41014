"""The jinja2 sandbox YAML plans render in: no Python reachable from a value, and bounded in size and loops."""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from plancompiler.sizes import _KEEPS_ITEMS, ESTIMATED, estimate_filter, estimate_method, text_size

MiB = 1 << 20
DEFAULT_MAX_SIZE = MiB
DEFAULT_MAX_LOOPS = 1_000_000
_MAX_INT_BITS = 1 << 16
_PRINTF_WIDTH = re.compile(r"%[-#0 +]*(\d+)?(?:\.(\d+))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*?:[^{}]*?(\d+)")


@dataclass(frozen=True)
class Limits:
    """What one rendering may produce: MAX_SIZE bytes per value and per job, MAX_LOOPS loop turns."""

    max_size: int = DEFAULT_MAX_SIZE
    max_loops: int = DEFAULT_MAX_LOOPS


class LimitExceeded(Exception):
    """A template that would produce more than the limits allow (`{{ 'a' * 10**10 }}`, a 10⁹-turn loop)."""


def parse_size(text: str) -> int:
    """`1048576`, `512K`, `4M`, `1G` (binary units), for the --max-size flag."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not match:
        raise ValueError(f"size {text!r}: write a number of bytes, or with K, M or G (e.g. 4M)")
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2).upper()]


class _Budget:
    """Loop turns and bytes produced while rendering one value or job; reset before each."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.loops = 0
        self.produced = 0

    def reset(self) -> None:
        self.loops = self.produced = 0

    def charge(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple, dict)):
            size = len(value)
            if size > self.limits.max_size:
                raise LimitExceeded(
                    f"a value of {size:,} items or bytes passes the limit of "
                    f"{self.limits.max_size:,} (raise it with plan --max-size)"
                )
            self.produced += size
            if self.produced > 16 * self.limits.max_size:
                raise LimitExceeded(
                    f"rendering produced more than {16 * self.limits.max_size:,} bytes in all "
                    "(raise the limit with plan --max-size)"
                )
        elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_INT_BITS:
            raise LimitExceeded(f"a number of {value.bit_length():,} bits is too large")
        return value

    def check_args(self, args: Iterable[Any]) -> None:
        for arg in args:
            if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > self.limits.max_size:
                raise LimitExceeded(f"the argument {arg:,} passes the size limit of {self.limits.max_size:,}")

    def check_text(self, value: Any, what: str) -> None:
        if isinstance(value, str) and len(value) <= self.limits.max_size:
            return  # the common case, without the walk
        size = text_size(value, self.limits.max_size)
        if size > self.limits.max_size:
            raise LimitExceeded(
                f"{what} would be more than {self.limits.max_size:,} bytes as text "
                "(raise the limit with plan --max-size)"
            )

    def refuse(self, size: int, what: str) -> None:
        """Raise before computing a result estimated at SIZE items or bytes, if that passes the limit."""
        if size > self.limits.max_size:
            raise LimitExceeded(
                f"{what} would make a value of {size:,} items or bytes, over the limit of "
                f"{self.limits.max_size:,} (raise it with plan --max-size)"
            )

    def loop(self, iterable: Any) -> Iterator[Any]:
        for item in iterable:
            self.loops += 1
            if self.loops > self.limits.max_loops:
                raise LimitExceeded(f"loops ran more than {self.limits.max_loops:,} times")
            yield item


def _check_format(text: str, pattern: re.Pattern[str], limit: int) -> None:
    for match in pattern.finditer(text):
        for number in match.groups():
            if number and int(number) > limit:
                raise LimitExceeded(f"a format width of {int(number):,} passes the size limit of {limit:,}")


class _BoundedFilters(dict[str, Any]):
    """The filter table: every filter in it is bounded, also those an environment adds after it is made."""

    def __init__(
        self, wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]], filters: Mapping[str, Callable[..., Any]]
    ) -> None:
        super().__init__()
        self._wrap = wrap
        self.raw: dict[str, Callable[..., Any]] = {}  # each filter as given, unwrapped: what a compile may fold
        for name, func in filters.items():
            self[name] = func

    def __setitem__(self, name: str, func: Callable[..., Any]) -> None:
        self.raw[name] = func
        super().__setitem__(name, self._wrap(name, func))


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with every operator, call and filter that can grow a value bounded."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, limits: Limits | None = None, **kwargs: Any) -> None:
        self.budget = _Budget(limits or Limits())
        kwargs["finalize"] = self._finalizer(kwargs.get("finalize"))
        super().__init__(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True, **kwargs)
        self.compiled: dict[str, jinja2.Template] = {}  # each distinct value's text, compiled once
        # cycler, joiner, lipsum and namespace are left out: none is needed to write a path or a job,
        # and namespace is the one way to mutate state across loop turns.
        self.globals = {
            "range": self._range,
            "dict": dict,
            "_plan_loop": self.budget.loop,
            "_plan_concat": self._concat,
        }
        self.filters = _BoundedFilters(self._bounded, self.filters)

    @property
    def limits(self) -> Limits:
        return self.budget.limits

    def compile(  # type: ignore[override]  # jinja's overloads on `raw`; this takes and returns the same
        self,
        source: str | nodes.Template,
        name: str | None = None,
        filename: str | None = None,
        raw: bool = False,
        defer_init: bool = False,
    ) -> str | CodeType:
        """Jinja's compile, each distinct template once a process (see _CODE). What constant folding charges the
        budget (a filter it runs) is handed back: a template included or imported while a job renders is compiled
        then, and a first compile must not count against that job what code kept from before never charges."""
        budget = self.budget
        loops, produced = budget.loops, budget.produced
        try:
            return self._compiled(source, name, filename, raw, defer_init)
        finally:
            budget.loops, budget.produced = loops, produced

    def _compiled(
        self, source: str | nodes.Template, name: str | None, filename: str | None, raw: bool, defer_init: bool
    ) -> str | CodeType:
        if raw or not isinstance(source, str):
            return super().compile(source, name, filename, raw, defer_init)  # type: ignore[call-overload]
        filters = self.filters
        folds = _folded(filters.raw if isinstance(filters, _BoundedFilters) else filters, self.tests)
        if folds is None:  # a filter of this environment's own: its code is its own too
            return super().compile(source, name, filename, False, defer_init)
        key = (source, name, defer_init, self.limits, type(self), folds, self.loader is None)
        kept = _CODE.get(key)
        if kept is not None:
            return _named(kept[0], filename or "<template>")
        code = super().compile(source, name, filename, False, defer_init)
        _CODE.put(key, code)
        return code

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        """Jinja's parse, then every loop counted and every `~` chain bounded before it is joined."""
        tree = super()._parse(source, name, filename)
        _bound(tree)
        return tree

    def _finalizer(self, inner: Callable[..., Any] | None) -> Callable[..., Any]:
        """Each `{{ value }}` is measured before it becomes text: str() of a list can be far larger than it."""
        budget = self.budget

        limit = budget.limits.max_size

        def finalize(value: Any) -> Any:
            if not (isinstance(value, str) and len(value) <= limit):
                budget.check_text(value, "a value written out")
            return value if inner is None else inner(value)

        return finalize

    def _concat(self, parts: list[Any]) -> str:
        for part in parts:
            self.budget.check_text(part, "a part of a joined value")
        texts = [str(p) for p in parts]
        if sum(map(len, texts)) > self.limits.max_size:
            raise LimitExceeded(
                f"a joined value passes the size limit of {self.limits.max_size:,} (raise it with plan --max-size)"
            )
        return self.budget.charge("".join(texts))

    def _range(self, *args: int) -> range:
        self.budget.check_args(args)
        return range(*args)

    def _bounded(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        budget = self.budget

        skip = 2 if hasattr(func, "jinja_pass_arg") else 1  # the value, and the context it may take

        makes_text = name not in _KEEPS_ITEMS
        estimated = name in ESTIMATED
        what = f"the value given to | {name}"
        limit = budget.limits.max_size

        def bounded(*args: Any, **kwargs: Any) -> Any:
            if len(args) > skip:
                budget.check_args(args[skip:])
            if kwargs:
                budget.check_args(kwargs.values())
            if func is jinja2.filters.do_format and args and isinstance(args[0], str):
                _check_format(args[0], _PRINTF_WIDTH, limit)
            if makes_text and len(args) >= skip:
                # A filter that makes text of its value: measured first (str() of a list can be huge).
                value = args[skip - 1]
                if not (isinstance(value, str) and len(value) <= limit):
                    budget.check_text(value, what)
            if estimated:
                args = estimate_filter(name, func, args, kwargs, skip, budget)
            return budget.charge(func(*args, **kwargs))

        # Filters that take the environment or context keep doing so.
        for attr in ("jinja_pass_arg",):
            if hasattr(func, attr):
                setattr(bounded, attr, getattr(func, attr))
        return bounded

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        limit = self.limits.max_size
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > limit:
                    raise LimitExceeded(
                        f"a repetition of {len(seq) * times:,} items passes the size limit of "
                        f"{limit:,} (raise it with plan --max-size)"
                    )
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and left.bit_length() + right.bit_length() > _MAX_INT_BITS
            ):
                raise LimitExceeded("a product too large to compute")
        elif operator == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
            if abs(left) > 1 and right > 0 and right * math.log2(abs(left)) > _MAX_INT_BITS:
                raise LimitExceeded(f"{left} ** {right} is too large to compute")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, _PRINTF_WIDTH, limit)
            self.budget.check_text(right, "the values given to %")
        return self.budget.charge(super().call_binop(context, operator, left, right))

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = __self.budget
        budget.check_args(args)
        budget.check_args(kwargs.values())
        if getattr(__obj, "__name__", "") in ("format", "format_map") and isinstance(
            getattr(__obj, "__self__", None), str
        ):
            _check_format(__obj.__self__, _FORMAT_WIDTH, budget.limits.max_size)
        if isinstance(getattr(__obj, "__self__", None), str):
            args = estimate_method(__obj.__self__, __obj.__name__, args, kwargs, budget)
        return budget.charge(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text, limit = value.__self__, self.limits.max_size

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format(str(text), _FORMAT_WIDTH, limit)
            self.budget.check_args(args)
            self.budget.check_text([args, kwargs], "the values given to format")
            return self.budget.charge(wrapped(*args, **kwargs))

        return checked

    def render_bounded(self, template: jinja2.Template, context: Mapping[str, Any], what: str = "") -> str:
        """TEMPLATE over CONTEXT, stopped as soon as its output passes the size limit."""
        self.budget.reset()
        limit = self.limits.max_size
        parts: list[str] = []
        size = 0
        for chunk in template.generate(context):
            size += len(chunk)
            if size > limit:
                raise LimitExceeded(
                    f"{what or 'the rendered text'} passes the size limit of {limit:,} bytes "
                    "(raise it with plan --max-size)"
                )
            parts.append(chunk)
        return "".join(parts)


class BySource:
    """What was made of a template's source, kept by a key whose first part is that source: the most recently
    used ENTRIES, at most TOTAL bytes of source in all, none of a source over LARGEST bytes."""

    def __init__(self, entries: int = 512, total: int = 4 * MiB, largest: int = 64 * 1024) -> None:
        self.entries, self.total, self.largest = entries, total, largest
        self._kept: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self.held = 0  # bytes of source kept now
        self._lock = threading.Lock()  # kept whole where compiles run in threads of their own

    def get(self, key: tuple[Any, ...]) -> tuple[Any] | None:
        """(what was kept for KEY,), or None where nothing is."""
        with self._lock:
            if key not in self._kept:
                return None
            self._kept.move_to_end(key)
            return (self._kept[key],)

    def put(self, key: tuple[Any, ...], value: Any) -> None:
        if len(key[0]) > self.largest:
            return
        with self._lock:
            if key not in self._kept:
                self.held += len(key[0])
            self._kept[key] = value
            while len(self._kept) > self.entries or self.held > self.total:
                self.held -= len(self._kept.popitem(last=False)[0][0])

    def keys(self) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._kept)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self.held = 0


# Each template's code, compiled once a process: a compile (the shell reader's rewrite, jinja's parse and code
# generation, Python's compile) is most of rendering a plan, and a test session compiles the same templates hundreds
# of times. The code is the same in every environment of one configuration: the budget, the globals and the
# filters' functions are looked up when it runs, never compiled in. What the compile itself reads is the key: the
# source, its name, the limits and the filters and tests constant folding runs (_folded), and whether a loader is
# there (the shell reader takes each `{{`'s column from the loader's copy of the source); the file it was read from
# is put in the code handed out. The lint's shapes (an escaper of their own) compile apart. A compile that fails is
# not kept: it fails again, and says so.
_CODE = BySource()


def _folded(*tables: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What of the filter and test TABLES a compile reads: each one's name, and of its function what constant
    folding would run (`{{ 'a b' }}` is folded through the _esc filter to its escaped text when the template
    compiles). Equal code, defaults and markers: equal results in every environment. None where a function is a
    closure made at run time (the lint's shape escaper, of the escaper's name): what it folds to is its own, so
    code it folded is never handed to another environment, nor another's to it."""
    found: list[Any] = []
    for table in tables:
        for name, func in table.items():
            code = getattr(func, "__code__", None)
            if code is not None and func.__closure__ is None:  # a plain function: equal code, equal results
                found.append((name, code, func.__defaults__, getattr(func, "jinja_pass_arg", None)))
            elif "<locals>" in getattr(func, "__qualname__", ""):  # a closure made at run time
                return None
            else:  # a builtin, a class, a module's own closure (jinja's async variants): itself, never freed
                found.append((name, func))
    return tuple(found)


def _named(code: CodeType, filename: str) -> CodeType:
    """CODE as compiled from FILENAME: the same template found under another directory (a copy of the plan) is
    the same code, but its errors and tracebacks name the file they came from."""
    if code.co_filename == filename:
        return code
    consts = tuple(_named(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _bound(tree: nodes.Node) -> None:
    """Every loop in TREE counted (its iterable through _plan_loop) and every `~` chain made a _plan_concat call
    on the list of its parts, in one walk (a chain's parts, other chains among them, are walked in the call)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.For):
            node.iter = nodes.Call(nodes.Name("_plan_loop", "load"), [node.iter], [], None, None, lineno=node.lineno)
        for field in node.fields:  # jinja nodes keep their children in named fields and lists
            value = getattr(node, field, None)
            if isinstance(value, nodes.Node):
                value = _joined(value)
                setattr(node, field, value)
                stack.append(value)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, nodes.Node):
                        value[i] = item = _joined(item)
                        stack.append(item)


def _joined(node: nodes.Node) -> nodes.Node:
    if not isinstance(node, nodes.Concat):
        return node
    return nodes.Call(nodes.Name("_plan_concat", "load"), [nodes.List(node.nodes)], [], None, None, lineno=node.lineno)

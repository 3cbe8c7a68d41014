"""Sizes of what a filter or string method would build, estimated from its arguments before it runs."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any, Protocol

import jinja2

# Filters that pick or count items rather than make text of their whole value: `biglist | length` is fine
# even where `biglist | string` would be gigabytes (a list can hold one long string a million times).
_KEEPS_ITEMS = frozenset(
    {
        "abs",
        "attr",
        "batch",
        "bool",
        "count",
        "d",
        "default",
        "dictsort",
        "first",
        "float",
        "groupby",
        "int",
        "items",
        "join",
        "last",
        "length",
        "list",
        "map",
        "max",
        "min",
        "q",
        "random",
        "reject",
        "rejectattr",
        "reverse",
        "round",
        "select",
        "selectattr",
        "slice",
        "sort",
        "sum",
        "unique",
    }
)


# The filters whose result can be far larger than their arguments: estimated before they run.
ESTIMATED = frozenset({"indent", "replace", "join", "wordwrap", "tojson", "sum"})


class Budget(Protocol):
    """What sandbox._Budget offers: the limits, and the checks that raise LimitExceeded."""

    @property
    def limits(self) -> Any: ...

    def check_text(self, value: Any, what: str) -> None: ...

    def refuse(self, size: int, what: str) -> None: ...


def text_size(value: Any, limit: int) -> int:
    """About how many characters str(VALUE) has (at least that many), counted only until past LIMIT."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            if total <= limit:
                stack.extend(item)
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            if total <= limit:
                for key, inner in item.items():
                    stack.extend((key, inner))
        else:
            total += 1
        if total > limit:
            break
    return total


@lru_cache(maxsize=256)
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _materialize(
    value: Iterable[Any], getter: Callable[[Any], Any] | None, sep: int, budget: Budget, what: str
) -> tuple[list[Any], int]:
    """VALUE's items as a list, and the text they join to, refused as soon as that passes the limit."""
    limit = budget.limits.max_size
    items: list[Any] = []
    total = 0
    for item in value:
        part = getter(item) if getter is not None else item
        total += text_size(part, limit) + (sep if items else 0)
        budget.refuse(total, what)
        items.append(item)
    return items, total


def _replace_size(text: str, old: Any, new: Any, count: Any, budget: Budget, what: str) -> None:
    budget.check_text(old, what)
    budget.check_text(new, what)
    old_s, new_s = str(old), str(new)
    found = text.count(old_s) if old_s else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    budget.refuse(len(text) + found * (len(new_s) - len(old_s)), what)


def _json_indent_size(value: Any, indent: int, limit: int) -> int:
    """At least how many bytes of indentation json.dumps(VALUE, indent=INDENT) writes."""
    total = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and total <= limit:
        item, depth = stack.pop()
        inner: Iterable[Any] = ()
        if isinstance(item, Mapping):
            inner = item.values()
        elif isinstance(item, (list, tuple)):
            inner = item
        for child in inner:
            total += indent * depth
            if total > limit:
                break
            stack.append((child, depth + 1))
    return total


def estimate_filter(
    name: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], skip: int, budget: Budget
) -> tuple[Any, ...]:
    """Refuse filter NAME before it builds a value past the limit; ARGS back, an iterable made a list."""
    if name not in ESTIMATED:
        return args
    signature = _signature(func)
    if signature is None:
        return args
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return args  # the filter itself says what is wrong with its arguments
    given = bound.arguments
    what = f"| {name}"
    value = args[skip - 1]
    if name == "indent" and isinstance(value, str):
        width = given.get("width", 4)
        width_size = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        lines = value.count("\n") + (1 if given.get("first") else 0)
        budget.refuse(len(value) + lines * max(width_size, 0), what)
    elif name == "replace":
        _replace_size(str(value), given.get("old", ""), given.get("new", ""), given.get("count"), budget, what)
    elif name == "wordwrap" and isinstance(value, str):
        _wordwrap_size(value, given, budget, what)
    elif name == "tojson":
        indent = given.get("indent")
        size = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        if size > 0:
            budget.refuse(_json_indent_size(value, size, budget.limits.max_size), what)
    elif name in ("join", "sum"):
        return _join_or_sum(name, args, given, skip, budget, what)
    return args


def _wordwrap_size(value: str, given: Mapping[str, Any], budget: Budget, what: str) -> None:
    width = given.get("width", 79)
    wrap = given.get("wrapstring") or "\n"
    budget.check_text(wrap, what)
    lines = value.count("\n") + len(value.split()) + len(value) // max(width if isinstance(width, int) else 1, 1)
    budget.refuse(len(value) + (lines + 1) * len(str(wrap)), what)


def _join_or_sum(
    name: str, args: tuple[Any, ...], given: Mapping[str, Any], skip: int, budget: Budget, what: str
) -> tuple[Any, ...]:
    """`| join` and `| sum` of sequences: the items made a list (counted as they come) and the result sized."""
    value = args[skip - 1]
    attribute = given.get("attribute")
    getter = None
    if attribute is not None and isinstance(args[0], (jinja2.Environment, jinja2.nodes.EvalContext)):
        environment = args[0] if isinstance(args[0], jinja2.Environment) else args[0].environment
        getter = jinja2.filters.make_attrgetter(environment, attribute)
    if name == "join":
        sep = given.get("d", "")
        budget.check_text(sep, what)
        items, _ = _materialize(value, getter, len(str(sep)), budget, what)
        return (*args[: skip - 1], items, *args[skip:])
    start = given.get("start", 0)
    if isinstance(start, (str, list, tuple)):  # sum() of sequences concatenates them, copying each time
        items, _ = _materialize(value, getter, 0, budget, what)
        budget.refuse(
            len(start)
            + sum(len(getter(i) if getter else i) for i in items if hasattr(getter(i) if getter else i, "__len__")),
            what,
        )
        return (*args[: skip - 1], items, *args[skip:])
    return args


def estimate_method(
    text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], budget: Budget
) -> tuple[Any, ...]:
    """The same for a string method called in a template: `s.replace(a, b)`, `s.join(xs)`, ..."""
    what = f"str.{name}"
    if name == "replace" and len(args) >= 2:
        _replace_size(text, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count"), budget, what)
    elif name == "join" and len(args) == 1:
        items, _ = _materialize(args[0], None, len(text), budget, what)
        return (items,)
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tabsize, int):
            budget.refuse(len(text) + text.count("\t") * tabsize, what)
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((text_size(v, budget.limits.max_size) for v in args[0].values()), default=1)
        budget.refuse(len(text) * max(longest, 1), what)
    return args

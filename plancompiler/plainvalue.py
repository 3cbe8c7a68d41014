"""Stages 2 and 4's shortcut: a field, or a job's body, of text and `{{ name }}` / `{{ name.key }}` rendered without
jinja, as jinja would.

Most fields of a plan are paths and names built from vars and foreach rows (`{{ work }}/models/{{ model }}`),
rendered once per job: through jinja each costs a new context and a generator. Here such a field is read
once into its pieces and filled by lookups. Anything else (a filter, an expression, a keyword, a name that
is not a str or int in the context, a key that is also a dict method, a value over the size limit) returns
None and is left to jinja, which then renders it, or says what is wrong, exactly as before. A body is read
from its template's tree as the shell escaper rewrote it (each `{{ }}` passed through `_esc` with its quoting
context): each value goes through the same escaper with the same arguments; a body with any other tag, or a
value the escaper refuses, is left to jinja in the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
from jinja2 import nodes

from plancompiler.sandbox import BySource

_PIECE = re.compile(r"\{\{ *([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))? *\}\}")
_OPENER = re.compile(r"\{[{%#]")
# Names jinja reads as constants or operators, or gives a meaning of its own (`self`), never as a variable.
_KEYWORDS = frozenset(
    {"true", "false", "none", "True", "False", "None", "not", "and", "or", "in", "is", "if", "else", "recursive"}
    | {"self", "loop", "caller", "varargs", "kwargs", "super"}
)
_MAX_INT_BITS = 64
Pieces = tuple[tuple[str, str, str | None], ...]  # (text before, name, key or None) ...; the tail is separate

_PARSED: dict[str, tuple[Pieces, str] | None] = {}


def _parse(value: str) -> tuple[Pieces, str] | None:
    """VALUE as (text, name, key) pieces and the text after them, or None where jinja must read it."""
    pieces = []
    at = 0
    starts = set()
    for match in _PIECE.finditer(value):
        if match.group(1) in _KEYWORDS or match.group(2) in _KEYWORDS:
            return None
        pieces.append((value[at : match.start()], match.group(1), match.group(2)))
        starts.add(match.start())
        at = match.end()
    if not pieces or any(m.start() not in starts for m in _OPENER.finditer(value)):
        return None  # a `{%`, a `{#`, or a `{{` of anything but a plain name: jinja's to read
    return tuple(pieces), value[at:]


def _lookup(context: Mapping[str, Any], name: str, key: str | None) -> str | None:
    """NAME (or NAME.KEY, as jinja's sandbox reads a dict's key) as jinja writes it; None where unsure."""
    if name not in context:
        return None  # undefined: jinja says so, with its own message
    value = context[name]
    if key is not None:
        if type(value) is not dict or hasattr(dict, key) or key not in value:
            return None  # `row.items` is dict's method to jinja; anything but a plain dict is left to it
        value = value[key]
    if type(value) is str:
        return value
    if type(value) is int and value.bit_length() <= _MAX_INT_BITS:
        return str(value)
    return None


def render_plain(value: str, context: Mapping[str, Any], limit: int) -> str | None:
    """VALUE rendered over CONTEXT as jinja would render it; None where jinja must."""
    if value in _PARSED:
        parsed = _PARSED[value]
    else:
        if len(_PARSED) > 20000:
            _PARSED.clear()
        parsed = _PARSED[value] = _parse(value)
    if parsed is None:
        return None
    pieces, tail = parsed
    out: list[str] = []
    for text, name, key in pieces:
        found = _lookup(context, name, key)
        if found is None or len(found) > limit:
            return None
        out += (text, found)
    out.append(tail)
    result = "".join(out)
    return result if len(result) <= limit else None


# (text before, name, key or None, the escaper's arguments) ...; the tail; the largest number among the arguments
Body = tuple[tuple[tuple[str, str, str | None, tuple[Any, ...]], ...], str, int]


# Each template's body as pieces, read once a process (a test session renders the same templates hundreds of
# times, each from a new environment): the tree they come from is the source as the shell environment parses it,
# which takes each `{{`'s column from its loader's copy (hence whether it has one, as sandbox._CODE keys it).
_BODIES = BySource()


def body_of(env: jinja2.Environment, source: str, name: str) -> Body | None:
    """body_pieces of template NAME's SOURCE as ENV (a shell environment) parses it; None also where it does not
    parse (jinja reads it, and says what is wrong with it)."""
    key = (source, name, type(env), tuple(env.extensions), env.loader is None)
    kept = _BODIES.get(key)
    if kept is not None:
        return kept[0]
    try:
        body = body_pieces(env.parse(source, name))
    except Exception:
        body = None
    _BODIES.put(key, body)
    return body


def body_pieces(tree: nodes.Template) -> Body | None:
    """A job body's template TREE (as the shell escaper rewrote it) as pieces, or None where jinja must render it."""
    pieces = []
    text: list[str] = []
    largest = 0
    for node in tree.body:
        if type(node) is not nodes.Output:
            return None  # a tag: {% if %}, {% set %}, {% for %}, a macro, an include ...
        for child in node.nodes:
            if type(child) is nodes.TemplateData:
                text.append(child.data)
                continue
            if type(child) is not nodes.Filter or child.name != "_esc" or child.kwargs or child.dyn_args:
                return None
            consts = [arg for arg in child.args if isinstance(arg, nodes.Const)]
            if child.dyn_kwargs or len(consts) != len(child.args):
                return None
            target, key = child.node, None
            if isinstance(target, nodes.Getattr) and type(target.node) is nodes.Name:
                key = target.attr
                target = target.node
            if not isinstance(target, nodes.Name) or target.name in _KEYWORDS or key in _KEYWORDS:
                return None
            args = tuple(arg.value for arg in consts)
            largest = max([largest, *(abs(a) for a in args if type(a) is int)])
            pieces.append(("".join(text), target.name, key, args))
            text = []
    return tuple(pieces), "".join(text), largest


def render_body(parsed: Body, context: Mapping[str, Any], escape: Callable[..., str], limit: int) -> str | None:
    """A body's PARSED pieces filled from CONTEXT, each value through ESCAPE; None where jinja must render it."""
    pieces, tail, largest = parsed
    if largest > limit:
        return None  # the sandbox refuses such an argument: jinja says so
    out: list[str] = []
    try:
        for text, name, key, args in pieces:
            found = _lookup(context, name, key)
            if found is None or len(found) > limit:
                return None
            value = context[name] if key is None else context[name][key]
            written = escape(value, *args)
            if len(written) > limit:
                return None
            out += (text, written)
    except Exception:  # a value the escaper refuses: jinja's render raises it, where it is told apart
        return None
    out.append(tail)
    result = "".join(out)
    return result if len(result) <= limit else None

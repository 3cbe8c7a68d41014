"""The shortcut for plain fields (`{{ work }}/m/{{ row.model }}`) renders exactly what jinja renders, or leaves it
to jinja: over generated fields and contexts, every shortcut result equals jinja's, and jinja never fails there."""

from __future__ import annotations

import random

from plancompiler.expand import _env, _template, render_value
from plancompiler.plainvalue import render_plain
from plancompiler.sandbox import Limits

PIECES = [
    "{{ a }}",
    "{{a}}",
    "{{  n  }}",
    "{{ row.model }}",
    "{{ row.items }}",
    "{{ row.missing }}",
    "{{ row }}",
    "{{ undefined_name }}",
    "{{ true }}",
    "{{ none }}",
    "{{ self }}",
    "{{ loop }}",
    "{{ big }}",
    "{{ flag }}",
    "{{ lst }}",
    "{{ a | upper }}",
    "{{ a ~ 'x' }}",
    "{{- a }}",
    "{{ a -}}",
    "{% if a %}y{% endif %}",
    "{# c #}",
    "{{{ a }}",
    "{",
    "}",
    "}}",
    "{ a }",
    "/srv/",
    " ",
    "\n",
    "x",
    "-",
    "é",
    "{{ long }}",
    "{{ range }}",
]
CONTEXT = {
    "a": "m0001",
    "n": 40001,
    "row": {"model": "m7", "items": "shadowed"},
    "true": "not-a-bool",
    "none": "x",
    "self": "me",
    "loop": "l",
    "big": 10**30,
    "flag": True,
    "lst": ["a", "b"],
    "long": "y" * 600,
    "range": "r",
}


def _jinja(value: str, limits: Limits) -> str | None:
    env = _env(limits)
    try:
        return env.render_bounded(_template(value, env), CONTEXT, "the value")
    except Exception:
        return None


def test_the_shortcut_renders_what_jinja_renders() -> None:
    rng = random.Random(7)
    limits = Limits(max_size=1000)
    taken = 0
    for _ in range(4000):
        value = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 5)))
        plain = render_plain(value, CONTEXT, limits.max_size)
        if plain is None:
            continue
        taken += 1
        assert plain == _jinja(value, limits), value
    assert taken > 300  # the common forms do take the shortcut: the comparison is not empty


def test_forms_left_to_jinja() -> None:
    for value in (
        "{{ undefined_name }}",
        "{{ true }}",
        "{{ row.items }}",
        "{{ row.missing }}",
        "{{ flag }}",
        "{{ lst }}",
        "{{ big }}",
        "{{ a | upper }}",
        "{{- a }}",
        "{% if a %}y{% endif %}",
        "{{{ a }}",
        "x{# c #}",
        "{{ long }}{{ long }}",
    ):
        assert render_plain(value, CONTEXT, 1000) is None, value


def test_render_value_keeps_its_errors() -> None:
    """An undefined name still fails through jinja, with jinja's message."""
    try:
        render_value("{{ work }}/{{ nope }}", {"work": "/w"}, Limits())
    except Exception as exc:
        assert "'nope' is undefined" in str(exc)
    else:
        raise AssertionError("an undefined name rendered")
    assert render_value("{{ work }}/{{ row.model }}", {"work": "/w", "row": {"model": "m"}}) == "/w/m"

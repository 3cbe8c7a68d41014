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


BODY_PIECES = [
    "echo ",
    "{{ a }}",
    '"{{ a }}"',
    "'{{ a }}'",
    "{{ n }}",
    "{{ row.model }}",
    "{{ row.items }}",
    "{{ lst }}",
    "{{ flag }}",
    "{{ big }}",
    "{{ undefined_name }}",
    "{{ self }}",
    "{{ a | upper }}",
    "{{ a | sh }}",
    "{{ cr }}",
    "{{ long }}",
    "{{ spaced }}",
    "{% if a %}y{% endif %}",
    "{%- set z = a %}{{ z }}",
    "# {{ a }}\n",
    "{# c #}",
    "{{- a }}",
    "\n",
    " ",
    "; ",
    "x=",
    "$((1 + {{ n }}))",
    "cat <<EOF\n{{ a }} {{ spaced }}\nEOF\n",
    "cat <<'EOF'\n{{ a }}\nEOF\n",
    "-v",
]
BODY_CONTEXT = {**CONTEXT, "cr": "a\rb", "spaced": "two words", "long": "y" * 300}


def test_the_body_shortcut_renders_what_jinja_renders() -> None:
    """A job body of text and escaped names: the shortcut's text is jinja's, escaped alike, for the bodies it
    takes; the others (tags, filters, values the escaper refuses, sizes over the limit) it leaves to jinja."""
    from plancompiler.plainvalue import body_pieces, render_body
    from plancompiler.render import Renderer
    from plancompiler.shell import escape

    rng = random.Random(11)
    renderer = Renderer([], [], Limits(max_size=400))
    taken = left = 0
    for i in range(600):
        name = f"inline:{i}"
        renderer.inline[name] = "".join(rng.choice(BODY_PIECES) for _ in range(rng.randint(1, 4)))
        try:
            template = renderer.env.get_template(name)
            tree = renderer.env.parse(renderer.inline[name], name)
        except Exception:
            continue  # a body the escaper cannot place (an unclosed quote): never rendered
        try:
            expected: str | None = renderer.env.render_bounded(template, BODY_CONTEXT)
        except Exception:
            expected = None
        parsed = body_pieces(tree)
        found = None if parsed is None else render_body(parsed, BODY_CONTEXT, escape, 400)
        if found is None:
            left += 1
            continue
        taken += 1
        assert found == expected, renderer.inline[name]
        assert renderer.render(name, template, BODY_CONTEXT, "the body") == expected
    assert taken > 50 and left > 25, (taken, left)  # both kinds are met: the comparison is not empty


def test_bodies_left_to_jinja() -> None:
    from plancompiler.plainvalue import body_pieces, render_body
    from plancompiler.render import Renderer
    from plancompiler.shell import escape

    renderer = Renderer([], [], Limits(max_size=400))
    for i, body in enumerate(
        [
            "echo {{ a | upper }}",
            "{% if a %}echo {{ a }}{% endif %}",
            "echo {{ undefined_name }}",
            "echo {{ cr }}",  # the escaper refuses a carriage return
            "echo {{ long }} {{ long }}",  # over the size limit together
            "echo {{ row.items }}",
            "echo {{ self }}",
            "echo {{ flag }}",
            "echo {{ lst }}",
        ]
    ):
        renderer.inline[f"inline:{i}"] = body
        parsed = body_pieces(renderer.env.parse(body, f"inline:{i}"))
        assert parsed is None or render_body(parsed, BODY_CONTEXT, escape, 400) is None, body
    parsed = body_pieces(renderer.env.parse("echo {{ a }} 'x' {{ n }}\n", "p"))
    assert parsed is not None and render_body(parsed, BODY_CONTEXT, escape, 400) == "echo m0001 'x' 40001\n"

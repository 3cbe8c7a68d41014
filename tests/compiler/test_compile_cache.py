"""Templates are compiled once a process (plancompiler.sandbox._CODE) and once a compile when they fail: what a
compile says is the same as without either."""

from __future__ import annotations

from pathlib import Path

from plancompiler import sandbox
from plancompiler.compile import compile_plan
from plancompiler.sandbox import Limits

PLAN = (
    "plan: p\njobs:\n  - name: j{{ i }}\n    foreach: {i: [1, 2, 3]}\n    template: t.sh.j2\n    with: {n: '{{ i }}'}\n"
)
# line 3 fails when it runs (a number plus text), after two lines that render
TEMPLATE = "set -eu\necho {{ n }}\necho {{ n | int + 'x' }}\n"


def _copy(directory: Path) -> Path:
    (directory / "templates").mkdir(parents=True)
    (directory / "templates" / "t.sh.j2").write_text(TEMPLATE)
    (directory / "p.yaml").write_text(PLAN)
    return directory / "p.yaml"


def _found(plan: Path, **kwargs: object) -> list[tuple[str, int, str]]:
    compiled = compile_plan(plan, lint=False, **kwargs)  # type: ignore[arg-type]
    return [(d.path, d.line, d.code) for d in compiled.diagnostics]


def test_one_template_under_two_directories_is_located_in_each(tmp_path: Path) -> None:
    """The second copy's code comes from the cache, and its errors still name its own file and line."""
    first, second = _copy(tmp_path / "a"), _copy(tmp_path / "b")
    sandbox._CODE.clear()
    a = _found(first)
    kept = len(sandbox._CODE.keys())
    b = _found(second)
    assert kept and len(sandbox._CODE.keys()) == kept, "the second copy compiled nothing new"
    assert [line for _, line, _ in a] == [line for _, line, _ in b] == [3, 3, 3], (a, b)
    assert all("/a/" in path for path, _, _ in a) and all("/b/" in path for path, _, _ in b), (a, b)


def test_under_other_limits_a_compile_says_what_it_says_without_the_cache(tmp_path: Path) -> None:
    """Constant folding runs a filter when a template compiles, checked against that compile's limits: the code
    folded under the default limits is not the code for smaller ones."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.sh.j2").write_text("echo {{ 'x' | center(3000) }}\n")
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: p\njobs:\n  - name: j\n    template: t.sh.j2\n")
    small = Limits(max_size=2048)
    sandbox._CODE.clear()
    fresh = compile_plan(plan, lint=False, limits=small).diagnostics
    sandbox._CODE.clear()
    assert not compile_plan(plan, lint=False).diagnostics  # folded, under the default limits
    warm = compile_plan(plan, lint=False, limits=small).diagnostics
    assert [d.message for d in fresh] == [d.message for d in warm] and fresh, warm


def test_a_refused_body_in_a_foreach_is_refused_for_every_row_alike(tmp_path: Path) -> None:
    """Compiled once and raised again per row: each of the 40 rows gets the same located finding."""
    plan = tmp_path / "p.yaml"
    plan.write_text(
        f'plan: p\njobs:\n  - name: "j{{{{ i }}}}"\n    foreach: {{i: {list(range(40))}}}\n    run: "eval {{{{ i }}}}"\n'
    )
    found = [f for f in _found(plan) if f[2].startswith("R")]
    assert len(found) == 40 and len(set(found)) == 1 and found[0][1:] == (5, "R005"), found[:3]


def test_a_cache_keeps_at_most_its_entries_and_bytes_and_never_a_large_source() -> None:
    kept = sandbox.BySource(entries=8, total=100, largest=30)
    for n in range(20):
        kept.put((f"s{n}",), n)
    assert [key[0] for key in kept.keys()] == [f"s{n}" for n in range(12, 20)]
    assert kept.get(("s12",)) == (12,) and kept.get(("s3",)) is None
    kept.put(("x" * 31,), "large")
    assert kept.get(("x" * 31,)) is None
    for n in range(5):
        kept.put((f"{n}".ljust(30, "x"),), None)  # a kept None is found, as (None,)
    assert kept.get(("4".ljust(30, "x"),)) == (None,)
    assert kept.held == sum(len(key[0]) for key in kept.keys()) <= 100 and len(kept.keys()) == 3


def test_the_template_cache_holds_no_template_past_its_bounds() -> None:
    env = sandbox.BoundedSandbox()
    sandbox._CODE.clear()
    for n in range(sandbox._CODE.entries + 20):
        env.from_string(f"echo {n}")
    assert len(sandbox._CODE.keys()) == sandbox._CODE.entries
    env.from_string("x" * (sandbox._CODE.largest + 1))
    assert all(len(key[0]) <= sandbox._CODE.largest for key in sandbox._CODE.keys())


def test_two_plans_bodies_of_the_same_name_render_their_own(tmp_path: Path) -> None:
    """Every plan's first inline body is template `inline:0`: kept by its text, each plan's is its own."""
    texts = []
    for word in ("first", "second", "first"):
        plan = tmp_path / f"{word}-{len(texts)}.yaml"
        plan.write_text(f"plan: p\nvars: {{w: {word}}}\njobs:\n  - name: j\n    run: echo {word} {{{{ w }}}}\n")
        compiled = compile_plan(plan, lint=False)
        assert not compiled.diagnostics, compiled.diagnostics
        texts.append(compiled.jobs[0].text.rstrip("\n").rsplit("\n", 1)[-1])
    assert texts == ["echo first first", "echo second second", "echo first first"], texts

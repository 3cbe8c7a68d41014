"""A plan compiled after others in one process says what it says compiled alone in a fresh one: the process-wide
caches (sandbox._CODE, plainvalue._BODIES) change no job file, no shape the lint reads, and no finding.

Seeded: the plans share body texts under other names (`inline:N` is a job's index), one name has other texts in
other plans, the same template names include and import other texts in two directories, and some plans compile
under a smaller --max-size or with --set. Each plan is compiled, then its lint shapes made (a second environment
of the same filter names, whose escaper is its own); the caches are shrunk so that entries are evicted and
compiled again between the two."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from plancompiler import plainvalue, sandbox
from plancompiler.compile import compile_plan, template_dirs
from plancompiler.memo.shapes import shapes
from plancompiler.sandbox import Limits

ROOT = Path(__file__).resolve().parents[2]
BODIES = [
    "echo {{ 'a b' }} {{ v }}",  # folded when it compiles, through the escaper
    "echo {{ v }}",  # plain text and values: the pieces, without jinja
    "echo {{ v }}\necho {{ v | int + 'x' }}",  # fails on line 2 when it runs
    "eval {{ v }}",  # refused: no quoting makes a value data there
    "echo {{ nope }}",  # undefined
    "{% include 'inc.sh' %}\necho {{ v }}",
    "{% import 'mac.j2' as m %}echo {{ m.say(v) }}",
    "echo {{ 'x' | center(3000) | length }}",  # folded under the default limits, refused under 2K
    "{% for i in range(3) %}echo {{ i ~ v ~ (i ~ 'y') }}\n{% endfor %}",
]
ADDED = ["0", "'z'"]  # the second directory's macro fails when it runs (a number plus text)
TEMPLATE = "set -eu\n{% include 'inc.sh' %}\n{% import 'mac.j2' as m %}\necho {{ m.say(v) }} {{ 'c d' }}\n"


def _tree(base: Path, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """Two directories of templates alike in names, unlike in text, and plans over them."""
    rng = random.Random(seed)
    plans = []
    for d in range(2):
        root = base / f"d{d}"
        (root / "templates").mkdir(parents=True)
        (root / "templates" / "inc.sh").write_text(f"echo included-{d} {{{{ v }}}}\n")
        (root / "templates" / "mac.j2").write_text(
            "\n" * d + f"{{% macro say(x) %}}said-{d} {{{{ x ~ 'K' }}}} {{{{ x | int + {ADDED[d]} }}}}{{% endmacro %}}"
        )
        (root / "templates" / "t.sh").write_text(TEMPLATE + "echo {{ v | int + 'x' }}\n" * d)
        for p in range(8):
            jobs = []
            for i in range(rng.randint(1, 4)):
                if rng.random() < 0.25:
                    jobs.append(f"  - name: j{i}\n    template: t.sh\n")
                else:
                    jobs.append(f"  - name: j{i}\n    run: {json.dumps(rng.choice(BODIES))}\n")
            plan = root / f"p{p}.yaml"
            plan.write_text(f"plan: p{p}\nvars: {{v: '{rng.randint(1, 9)}'}}\njobs:\n" + "".join(jobs))
            options: dict[str, Any] = {}
            if rng.random() < 0.3:
                options["max_size"] = 2048
            if rng.random() < 0.3:
                options["overrides"] = {"v": rng.choice(["7", "a b", "x'y"])}
            plans.append((str(plan), options))
    return plans


def outcome(plan: str, options: dict[str, Any]) -> list[Any]:
    """PLAN's job files, origins, lint shapes and findings, as plain data."""
    limits = Limits(max_size=options["max_size"]) if "max_size" in options else None
    compiled = compile_plan(Path(plan), options.get("overrides"), lint=False, limits=limits)
    jobs = [[j.name, j.text, j.origin, j.origin_line] for j in compiled.jobs]
    views = [[v.text, list(v.parts), list(v.reals)] for v in shapes(compiled.jobs, template_dirs(Path(plan)), limits)]
    found = [[d.path, d.line, d.col, d.severity, d.code, d.message] for d in compiled.diagnostics]
    return [jobs, views, found]


def test_plans_compiled_in_any_order_say_what_each_says_in_a_fresh_process(tmp_path: Path, monkeypatch) -> None:
    plans = _tree(tmp_path, 20260515)
    child = subprocess.run(
        [sys.executable, __file__, json.dumps(plans)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    fresh = json.loads(child.stdout)
    monkeypatch.chdir(ROOT)
    rng = random.Random(7)
    for entries in (sandbox._CODE.entries, 3):  # as shipped, then small enough to evict between compiles
        monkeypatch.setattr(sandbox, "_CODE", sandbox.BySource(entries=entries))
        monkeypatch.setattr(plainvalue, "_BODIES", sandbox.BySource(entries=entries))
        order = [rng.randrange(len(plans)) for _ in range(2 * len(plans))]
        for n in order:
            assert outcome(*plans[n]) == fresh[n], (entries, plans[n], order)


def test_a_shape_escapers_code_never_reaches_a_job(tmp_path: Path, monkeypatch) -> None:
    """The lint's shape escaper has the escaper's name but writes placeholders: a template it compiled (where the
    job's own code was evicted meanwhile) folded `{{ 'a b' }}` into a placeholder, which the next plan with that
    body at that index wrote into its job file."""
    monkeypatch.setattr(sandbox, "_CODE", sandbox.BySource(entries=3))
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.sh").write_text("echo t\n")
    body = "echo {{ 'a b' }} {{ v }}"
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(
        "plan: a\nvars: {v: x}\njobs:\n" + "".join(f"  - name: j{i}\n    run: {body!r}\n" for i in range(4))
    )
    second.write_text(
        "plan: b\nvars: {v: x}\njobs:\n"
        + "".join(f"  - name: j{i}\n    template: t.sh\n" for i in range(3))
        + f"  - name: j3\n    run: {body!r}\n"
    )
    alone = [j.text for j in compile_plan(second, lint=False).jobs]
    shapes(compile_plan(first, lint=False).jobs, template_dirs(first), None)
    after = [j.text for j in compile_plan(second, lint=False).jobs]
    assert after == alone and after[-1].endswith("echo 'a b' x\n"), after[-1]


if __name__ == "__main__":  # the fresh process: each plan with the caches empty
    for_each = []
    for plan, options in json.loads(sys.argv[1]):
        sandbox._CODE.clear()
        plainvalue._BODIES.clear()
        for_each.append(outcome(plan, options))
    print(json.dumps(for_each))


def test_an_included_templates_folding_is_not_charged_to_the_job_that_first_includes_it(tmp_path: Path) -> None:
    """An included template compiles while a job renders; constant folding runs its filters then (17 values of
    512 bytes, each within --max-size 512): charged to that job, they took it past 16 x 512 bytes in all, so
    the first job of a fresh process was refused and every later one (the code kept) was not."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "inc.sh").write_text("echo {{ ('x' | center(512)) | length }}\n" * 17)
    (tmp_path / "templates" / "t.sh").write_text("{% include 'inc.sh' %}")
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: p\njobs:\n  - name: j{{ i }}\n    foreach: {i: [1, 2]}\n    template: t.sh\n")
    sandbox._CODE.clear()
    for _ in range(2):
        compiled = compile_plan(plan, lint=False, limits=Limits(max_size=512))
        assert [j.name for j in compiled.jobs] == ["j1", "j2"] and not compiled.diagnostics, compiled.diagnostics

"""Lint once per shape is sound: over generated plans of awkward values and every plan in plans/, the
findings of linting each shape once, mapped back, equal those of linting every job file on its own."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from plancompiler.compile import compile_plan, template_dirs
from plancompiler.lint import Finding, lint_findings
from plancompiler.memo.shapes import shapes

REPO = Path(__file__).resolve().parents[2]

# Words shellcheck may judge by their text (commands, keywords, options, numbers and their range,
# system paths, quotes, `$`, printf formats, globs) next to the names and paths most plans hold.
POOL = [
    "m0001",
    "m0002",
    "a1",
    "a2",
    "cd",
    "done",
    "if",
    "then",
    "true",
    "echo",
    "python3",
    "a=b",
    "-rf",
    "-n",
    "/",
    "/usr",
    "/usr/local",
    "/srv/work/m1",
    "/srv/work/m2",
    "config.json",
    ".",
    "..",
    "0",
    "7",
    "255",
    "256",
    "40001",
    "007",
    "000123",
    "000009",
    "0089",
    "0400",
    "-1",
    "1.5",
    "a b",
    "a  b",
    " lead",
    "it's",
    'say "hi"',
    "$HOME",
    "`id`",
    "%s %s",
    "%d",
    "\\n",
    "*",
    "*.txt",
    "~",
    "~/x",
    "shellcheck disable=SC2086",
    "",
    "x;y",
    "https://x.y/z",
    "a,b",
    "user@host",
    "a:b",
    "x\ny",
    "é",
    "A1",
    "_1",
]

TEMPLATES = {
    "words.sh.j2": """\
# job {{ a }}: {{ c }}
set -eu
{{ a | program }} {{ b }}
cd {{ b }}
rm -rf {{ b }}
rm -rf "{{ a }}"/
x={{ a }}
y="{{ b }}"
z='{{ c }}'
args="{{ c }}"
echo $args "$x$y$z"
printf {{ c }}
printf %s {{ a }}
printf "{{ c }}\\n" x
echo {{ a }}={{ b }} '{{ a }}' "{{ a }}"
exit {{ n }}
""",
    "tests.sh.j2": """\
set -u
for f in {{ l }}; do echo "$f"; done
for g in {{ a }}; do echo "$g"; done
if [ {{ n }} -gt 3 ]; then echo big; fi
if [ "{{ a }}" = "{{ b }}" ]; then echo same; fi
[[ {{ a }} == {{ b }} ]] && echo eq
[ -n "{{ c }}" ] && echo nonempty
[ -z {{ a }} ] || true
cat <<EOF
value {{ a }} and {{ c }} \\$x
EOF
cat <<'EOF'
literal {{ b }} $y
EOF
sleep {{ n }}
return {{ n }}
""",
    "names.sh.j2": """\
declare {{ a }}=1
echo "${m0001:-}" "${m0003:-}" "$a1"
[ "{{ a }}" = "m0005" ] && echo literal
read -r {{ a }} </dev/null || true
export {{ a }}
""",
    "blocks.sh.j2": """\
{% set p %}{{ a | program }}/x{% endset %}
echo {{ p }} "{{ p }}"
{% macro m(v) %}echo {{ v }}{% endmacro %}
{{ m(b) | program }}
{{ m(c) | sh }}
{% for w in l %}
touch {{ w }}
{% endfor %}
""",
}


def _plan(tmp_path: Path, seed: int, rows: int, regular: int | None = None) -> Path:
    """A plan (written as JSON, which YAML reads) of ROWS rows per template, values drawn by SEED; of its regular
    rows (every other one) only the first REGULAR where given (the random rows are the same either way)."""
    rng = random.Random(seed)
    (tmp_path / "templates").mkdir(exist_ok=True)
    for name, body in TEMPLATES.items():
        (tmp_path / "templates" / name).write_text(body)
    roster = []
    for i in range(rows):
        if i % 2:  # names, paths and numbers as most plans have them: these rows share shapes
            if regular is not None and i // 2 >= regular:
                continue
            roster.append(
                {
                    "i": i,
                    "a": f"m{i:04d}",
                    "b": f"/srv/work/m{i:04d}",
                    "c": f"c{i % 3}.json",
                    "n": str(40000 + i),
                    "l": f"m{i:04d}.gguf config.json",
                }
            )
            continue
        roster.append(
            {
                "i": i,
                "a": rng.choice(POOL),
                "b": rng.choice(POOL),
                "c": rng.choice(POOL),
                "n": rng.choice(["3", "7", "255", "256", "40001", "m0001", "007", "000123", "0089", "0400", "000300"]),
                "l": rng.sample(POOL, rng.randint(1, 3)),
            }
        )
    jobs = [
        {
            "name": f"{stem}-{{{{ i }}}}",
            "foreach": "roster",
            "template": name,
            "with": {"a": "{{ a }}", "b": "{{ b }}", "c": "{{ c }}", "n": "{{ n }}", "l": "{{ l }}"},
        }
        for stem, name in (("w", "words.sh.j2"), ("t", "tests.sh.j2"), ("k", "blocks.sh.j2"), ("v", "names.sh.j2"))
    ]
    plan = tmp_path / f"gen{seed}.yaml"
    plan.write_text(json.dumps({"plan": f"gen{seed}", "vars": {"roster": roster}, "jobs": jobs}, indent=1))
    return plan


def _key(f: Finding) -> tuple[str, int, int, str, str, str]:
    return (f.job.name, f.line, f.col, f.severity, f.code, f.message)


def _differential(plan: Path) -> tuple[int, int, int]:
    """Asserts per-shape == per-job findings for PLAN; returns (jobs, shapes, findings)."""
    compiled = compile_plan(plan, lint=False)
    assert compiled.plan is not None, [d.text() for d in compiled.diagnostics]
    dirs = template_dirs(plan)
    per_shape = sorted(map(_key, lint_findings(compiled.jobs, use_cache=False, template_dirs=dirs)))
    per_job = sorted(map(_key, lint_findings(compiled.jobs, use_cache=False)))
    assert per_shape == per_job, (
        sorted(set(per_shape) - set(per_job))[:10],
        sorted(set(per_job) - set(per_shape))[:10],
    )
    views = shapes(compiled.jobs, dirs)
    return len(compiled.jobs), len({v.text for v in views}), len(per_job)


pytestmark = pytest.mark.usefixtures("plan_env")  # a shellcheck cache of its own, no hosts file from outside


@pytest.mark.long
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generated_plans_lint_the_same_per_shape_as_per_job(tmp_path: Path, seed: int) -> None:
    # 20 rows of random values and 4 regular ones, which share shapes in a group of 4 a template: 16 more of
    # those were each linted on its own as the reference, ~40 % of its shellcheck time, for the same groups.
    jobs, distinct, findings = _differential(_plan(tmp_path, seed, 40, regular=4))
    # the plans do render (the escaper refuses a few generated forms outright, e.g. a value as a name
    # argument, so not all 96 jobs), and the awkward values do draw findings
    assert jobs >= 60 and distinct < jobs and findings > 50, (jobs, distinct, findings)


def test_generated_plans_share_shapes(tmp_path: Path) -> None:
    """The regular rows share shapes in every template that has no set block and no value as a name (the
    escaper refusing a template outright once left these plans with nothing to share, unnoticed)."""
    # The same plan as the differential of seed 1 (which lints it both ways): here only its shapes are counted.
    plan = _plan(tmp_path, 1, 40)
    compiled = compile_plan(plan, lint=False)
    rendered = {j.job.job.template for j in compiled.jobs}
    assert rendered == set(TEMPLATES)
    views = shapes(compiled.jobs, template_dirs(plan))
    for template in ("words.sh.j2", "tests.sh.j2"):
        texts = [v.text for v in views if v.job.job.job.template == template]
        assert len(set(texts)) < len(texts) - 10, template
    assert len({v.text for v in views}) < len(compiled.jobs)


@pytest.mark.parametrize("plan", sorted(p.name for p in (REPO / "plans").glob("*.yaml") if p.name != "hosts.yaml"))
def test_shipped_plans_lint_the_same_per_shape_as_per_job(plan: str) -> None:
    jobs, _, _ = _differential(REPO / "plans" / plan)
    assert jobs > 0


def test_zero_padded_row_numbers_share_one_shape(tmp_path: Path) -> None:
    """Row numbers padded with zeros (`000123`, how rows are named so that name order is number order) share a
    shape per class of what shellcheck judges of them; a cold check of 10,000 such rows linted each alone."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.sh.j2").write_text(
        "echo {{ i }} > /srv/out/{{ i }}.txt\n[ {{ i }} -eq 3 ] && exit {{ i }}\nsleep {{ i }}\n"
    )
    rows = [f"{i:06d}" for i in range(0, 300, 7)] + [f"{i:04d}" for i in (8, 64, 255, 256, 377, 999)] + ["08", "0100"]
    plan = tmp_path / "p.yaml"
    plan.write_text(
        json.dumps(
            {
                "plan": "p",
                "vars": {"rows": [{"i": i} for i in rows]},
                "jobs": [{"name": "r-{{ i }}", "foreach": "rows", "template": "t.sh.j2"}],
            }
        )
    )
    jobs, distinct, findings = _differential(plan)
    assert jobs == len(rows) and findings > 40  # `exit 000123`: over 5 digits is no exit status to shellcheck
    # a shape per class: 6 digits or fewer than 6, <= 255 or more, with an 8 or 9 or without (08 is 0008's,
    # 0100 is 0064's); per row before (each kept as itself)
    assert distinct == 8, (distinct, findings)


def test_one_template_of_many_rows_is_one_shape(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.sh.j2").write_text(
        "set -eu\nmkdir -p {{ dest }}\ncurl -o \"{{ dest }}/m\" {{ url }}\necho '{{ model }}' >{{ dest }}/.ok\n"
    )
    roster = [
        {"model": f"m{i:04d}", "dest": f"/srv/w/m{i:04d}", "url": f"https://h.invalid/m{i:04d}"} for i in range(200)
    ]
    plan = tmp_path / "p.yaml"
    plan.write_text(
        json.dumps(
            {
                "plan": "p",
                "vars": {"roster": roster},
                "jobs": [
                    {
                        "name": "f-{{ model }}",
                        "foreach": "roster",
                        "template": "t.sh.j2",
                        "with": {"dest": "{{ dest }}", "url": "{{ url }}"},
                    }
                ],
            }
        )
    )
    compiled = compile_plan(plan, lint=False)
    views = shapes(compiled.jobs, template_dirs(plan))
    assert len({v.text for v in views}) == 1
    assert all(v.reals for v in views)


def test_a_finding_quotes_the_jobs_own_text_at_its_own_column(tmp_path: Path) -> None:
    """`cd` without `|| exit` (SC2164) after a placeholder: the column and the message are the job's."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "t.sh.j2").write_text("echo {{ dest }}; cd {{ dest }}\n")
    roster = [{"dest": "/srv/short/m1"}, {"dest": "/srv/a_much_longer_path/m22"}]
    plan = tmp_path / "p.yaml"
    plan.write_text(
        json.dumps(
            {
                "plan": "p",
                "vars": {"roster": roster},
                "jobs": [
                    {
                        "name": "j{{ loop_index | default('') }}{{ dest | length }}",
                        "foreach": "roster",
                        "template": "t.sh.j2",
                        "with": {"dest": "{{ dest }}"},
                    }
                ],
            }
        )
    )
    compiled = compile_plan(plan, lint=False)
    assert len(compiled.jobs) == 2, [d.text() for d in compiled.diagnostics]
    dirs = template_dirs(plan)
    assert len({v.text for v in shapes(compiled.jobs, dirs)}) == 1
    found = lint_findings(compiled.jobs, use_cache=False, template_dirs=dirs)
    cols = sorted((f.code, f.col, len(f.job.text)) for f in found)
    assert [c[0] for c in cols] == ["SC2164", "SC2164"]
    for f in found:
        line = f.job.text.split("\n")[f.line - 1]
        assert line[f.col - 1 :].startswith("cd ")
    assert sorted(map(_key, found)) == sorted(map(_key, lint_findings(compiled.jobs, use_cache=False)))

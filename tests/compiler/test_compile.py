"""The compiler's rules, each shown by a plan that breaks it: exact code, location and message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import weakref
from pathlib import Path
from typing import Any

import pytest

from plancompiler.compile import Compiled, compile_plan, cycles_unsearched, display_path


def compile_text(
    tmp_path: Path, text: str, templates: dict[str, str] | None = None, name: str = "p.yaml", **kwargs
) -> Compiled:
    plan = tmp_path / name
    plan.write_text(textwrap.dedent(text))
    if templates:
        (tmp_path / "templates").mkdir(exist_ok=True)
        for tname, body in templates.items():
            (tmp_path / "templates" / tname).write_text(textwrap.dedent(body))
    return compile_plan(plan, **kwargs)


def found(compiled: Compiled) -> list[str]:
    return [
        f"{Path(d.path).name}:{d.line}:{d.col}: {d.severity}[{d.code}]: {d.message}"
        for d in sorted(compiled.diagnostics)
    ]


pytestmark = pytest.mark.usefixtures("plan_env")  # a shellcheck cache of its own, no hosts file from outside


def test_misspelt_key_names_line_and_closest_key(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        jobs:
          - name: a
            run: echo a
            requirs: [/x]
        """,
    )
    assert found(c) == ["p.yaml:5:5: error[P003]: unknown key 'requirs' in jobs[0]; did you mean 'requires'?"]


def test_a_misspelt_key_is_never_told_to_be_a_key_its_job_already_has(tmp_path: Path) -> None:
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: a\n    lnae: net\n    run: echo a\n")
    assert found(c) == ["p.yaml:4:5: error[P003]: unknown key 'lnae' in jobs[0]; did you mean 'lane'?"]  # not 'name'


def test_a_plan_name_starting_with_a_dot_or_dash_is_refused_saying_why(tmp_path: Path) -> None:
    c = compile_text(tmp_path, "plan: .hidden\njobs: []\n")
    assert found(c) == [
        "p.yaml:1:7: error[P004]: plan: plan name '.hidden': use letters, digits, '.', '_' and '-', starting with a "
        "letter or digit"
    ]


def test_a_plan_that_is_not_utf8_is_located_at_its_first_bad_byte(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(b"plan: t\njobs:\n  - name: a\n    run: |\n      echo \xff\xfe\n")
    c = compile_plan(path, lint=False)
    assert [d.text() for d in c.diagnostics] == [
        f"{display_path(path)}:5:12: error[P001]: plan file is not valid UTF-8: byte ff here"
    ]


def test_top_level_misspelt_key(tmp_path: Path) -> None:
    c = compile_text(tmp_path, "plan: t\nvar: {a: 1}\njobs: []\n")
    assert found(c) == ["p.yaml:2:1: error[P003]: unknown key 'var' in plan; did you mean 'vars'?"]


def test_yaml_syntax_error_is_located(tmp_path: Path) -> None:
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: [a\n    run: x\n")
    assert len(c.diagnostics) == 1
    d = c.diagnostics[0]
    assert d.code == "P001" and d.line >= 3 and "YAML syntax error" in d.message


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: a\n    run: echo\n    lane: gpu\n    lane: net\n")
    assert found(c) == ["p.yaml:6:5: error[P002]: duplicate key 'lane' (first on line 5)"]


def test_wrong_type_is_located(tmp_path: Path) -> None:
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: a\n    run: echo\n    retries: many\n")
    assert [d.code for d in c.diagnostics] == ["P004"]
    assert c.diagnostics[0].line == 5 and "jobs[0].retries" in c.diagnostics[0].message
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: a\n    run: echo\n    retries: 0\n")
    assert found(c) == [
        "p.yaml:5:14: error[P004]: jobs[0].retries: counts attempts in all, the first one included: at least 1 "
        "(1: no retry), got 0"
    ]


def test_a_timeout_of_0_is_an_error_at_its_line(tmp_path: Path) -> None:
    """A limit of 0 passed every check, and then the runner ended each attempt as it started."""
    for written, read in (("0", "0"), ("0s", "0s"), ("0.0m", "0.0m"), ("0.0", "0.0")):
        c = compile_text(tmp_path, f"plan: t\njobs:\n  - name: a\n    run: sleep 2\n    timeout: {written}\n")
        assert found(c) == [
            f"p.yaml:5:14: error[P004]: jobs[0].timeout: {read!r} would end every attempt at once: give more than 0, "
            "or none for no limit"
        ]
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: a\n    run: sleep 2\n    timeout: 0.5\n")
    assert c.diagnostics == [] and "# TIMEOUT=0.5\n" in c.jobs[0].text


def test_bad_requirement_form_suggests(tmp_path: Path) -> None:
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: a\n    run: echo\n    requires: [{nonemtpy: /x}]\n")
    assert c.diagnostics[0].line == 5 and "did you mean nonempty?" in c.diagnostics[0].message


def test_var_cycle_and_undefined(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        vars:
          a: "{{ b }}/x"
          b: "{{ a }}/y"
          c: "{{ nope }}"
        jobs: []
        """,
    )
    assert found(c) == [
        "p.yaml:3:3: error[P010]: vars refer to each other in a cycle: a -> b -> a",
        "p.yaml:5:6: error[P011]: var 'c': undefined variable: 'nope' is undefined",
    ]


def test_vars_chain_and_set_override(tmp_path: Path) -> None:
    text = """\
        plan: t
        vars:
          home: /home/user
          models: "{{ home }}/models"
        jobs:
          - name: a
            run: echo {{ models }}
        """
    c = compile_text(tmp_path, text, overrides={"home": "/srv"})
    assert c.clean()
    assert "echo /srv/models\n" in c.jobs[0].text


def test_foreach_product_rows_and_var_rows(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        vars:
          roster: [{m: x}, {m: y}]
        jobs:
          - name: "p-{{ tag }}-{{ mode }}"
            foreach: {tag: [a, b], mode: [fast, slow]}
            run: echo {{ tag }} {{ mode }}
          - name: "r-{{ m }}"
            foreach: [{m: one}, {m: two}]
            run: echo {{ m }}
          - name: "v-{{ m }}"
            foreach: roster
            run: echo {{ m }}
        """,
    )
    assert c.clean(), found(c)
    assert [j.name for j in c.jobs] == ["p-a-fast", "p-a-slow", "p-b-fast", "p-b-slow", "r-one", "r-two", "v-x", "v-y"]


def test_rows_whose_numbers_sort_out_of_count_order_as_text_are_a_warning_at_the_name(tmp_path: Path) -> None:
    """A lane runs in name order, which is text order: j-10 before j-9. Said once per plan job, at its name;
    padded numbers, a roster in any order and one row are left alone."""
    c = compile_text(
        tmp_path,
        """\
        plan: t
        jobs:
          - name: "j-{{ i }}"
            foreach: {i: {range: [0, 12]}}
            run: echo {{ i }}
          - name: "k-{{ '%02d' | format(i) }}"
            foreach: {i: {range: [0, 12]}}
            run: echo {{ i }}
          - name: "m-{{ m }}"
            foreach: {m: [llama, gemma, qwen2, qwen10]}
            run: echo {{ m }}
          - name: "n-{{ m }}"
            foreach: {m: [llama, gemma, mistral]}
            run: echo {{ m }}
          - name: "s-{{ i }}"
            foreach: {i: [10]}
            run: echo {{ i }}
        """,
    )
    said = [(d.code, d.line, d.col, d.severity) for d in c.diagnostics]
    assert said == [("P014", 3, 11, "warning"), ("P014", 9, 11, "warning")], found(c)
    assert "'j-10' starts before 'j-9'" in c.diagnostics[0].message
    assert "'m-qwen10' starts before 'm-qwen2'" in c.diagnostics[1].message
    assert len(c.jobs) == 32  # a warning: every job is still made


def test_duplicate_job_names_name_both_sources(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        jobs:
          - name: a
            run: echo 1
          - name: "{{ x }}"
            foreach: {x: [b, a]}
            run: echo 2
        """,
    )
    assert found(c) == ["p.yaml:5:11: error[P020]: duplicate job name 'a' (also made by the job on line 3)"]


SEED_STRATA = """\
    plan: a9
    vars: {st: /home/user/tools/strata, res: /r}
    jobs:
      - name: 84b-cpu-strata-setup
        run: echo '{}' > {{ st }}/strata-q2_0.json
        outputs: ["{{ st }}/strata-q2_0.json"]
      - name: "84c-gpu-strata-{{ tag }}-{{ mode }}"
        foreach: {tag: [qwen-q2_0], mode: [fast]}
        lane: gpu
        run: echo {{ tag }} {{ mode }} > {{ res }}/m.jsonl
        requires: ["{{ st }}/strata-{{ tag }}.json"]
        outputs: [{nonempty: "{{ res }}/m.jsonl"}]
    """


def test_seed_strata_typo_is_an_error_with_suggestion(tmp_path: Path) -> None:
    c = compile_text(tmp_path, SEED_STRATA)
    assert found(c) == [
        "p.yaml:11:16: error[G001]: job 84c-gpu-strata-qwen-q2_0-fast requires "
        "/home/user/tools/strata/strata-qwen-q2_0.json, which no job produces and which is not listed in "
        "`external`; did you mean /home/user/tools/strata/strata-q2_0.json?"
    ]


def test_graph_rules(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        external: [/ext/]
        jobs:
          - name: a
            run: touch /o/a
            requires: [/o/b, /ext/script.sh]
            outputs: [/o/a]
          - name: b
            run: touch /o/b /o/a
            requires: [{after: a}]
            outputs: [/o/b, /o/a]
          - name: c
            run: echo c
            requires: [{after: aa}, {sh: "pgrep x"}]
            outputs: [/o/c]
            done_if: /o/elsewhere
        """,
    )
    assert found(c) == [
        "p.yaml:6:15: error[G002]: dependency cycle: a -> b -> a",
        "p.yaml:11:14: warning[G003]: /o/a is produced by both a and b",
        "p.yaml:14:16: error[G005]: job c: after: 'aa' is not a job of this plan; did you mean 'a'?",
        "p.yaml:14:29: error[G006]: job c: a shell REQUIRES cannot be checked against the plan; mark it "
        "`external: true` if something outside the plan makes it true",
        "p.yaml:16:14: error[G004]: job c: DONE_IF tests /o/elsewhere, which is not among its outputs, so this "
        "job can never make it true",
    ]


def test_template_undefined_variable_at_template_line(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        jobs:
          - name: a
            template: fetch.sh.j2
            with: {url: "http://x"}
        """,
        templates={"fetch.sh.j2": "set -eu\ncurl -o {{ dest }} {{ url }}\n"},
    )
    assert found(c) == ["fetch.sh.j2:2:12: error[R002]: job a: undefined variable: 'dest' is undefined"]


def test_template_not_found_and_double_quoted_value_is_escaped_not_flagged(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        jobs:
          - name: a
            template: nope.sh.j2
          - name: b
            run: |
              echo "value: {{ plan_name }}"
        """,
        templates={"other.sh.j2": "true\n"},
    )
    assert [(d.code, d.line) for d in sorted(c.diagnostics)] == [("R001", 4)]
    assert 'echo "value: t"\n' in c.jobs[0].text


INERT = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "a; touch PWNED",
    'it\'s "quoted"',
    "two  spaces",
    "line1\nline2",
    "$HOME",
    "*",
    "--flag=x y",
    "",
]


def test_values_reach_the_job_as_inert_literals(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        jobs:
          - name: "v{{ i }}"
            foreach: {i: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}
            template: show.sh.j2
        """,
        templates={"show.sh.j2": "printf '%s\\0' {{ values[i] }} {{ values }}\n"},
        overrides={},
    )
    # values come in through a var so that every one is a plain string
    plan = tmp_path / "p.yaml"
    plan.write_text(plan.read_text().replace("plan: t\n", "plan: t\nvars:\n  values: " + json.dumps(INERT) + "\n"))
    c = compile_plan(plan)
    assert c.clean(), found(c)
    for job in c.jobs:
        i = int(job.name[1:])
        script = tmp_path / job.filename
        script.write_text(job.text)
        out = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, check=True).stdout
        words = out.decode().split("\0")[:-1]
        assert words == [INERT[i], *INERT]
    assert not (tmp_path / "PWNED").exists()


def test_lint_findings_are_mapped_to_their_lines(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        jobs:
          - name: empty
            template: empty.sh.j2
          - name: leftover
            run: |
              echo {% raw %}{{ x }}{% endraw %}
          - name: syntax
            run: |
              if true; then
                echo never closed
          - name: unassigned
            run: |
              echo typo
              exit $rc
          - name: disabled
            run: |
              exit $rc
            shellcheck_disable: [SC2154]
        """,
        templates={"empty.sh.j2": "{# nothing #}\n"},
    )
    codes = {(Path(d.path).name, d.line, d.code) for d in c.diagnostics}
    assert ("empty.sh.j2", 1, "L001") in codes  # at the template that rendered nothing
    assert ("p.yaml", 7, "L002") in codes
    # bash reports the missing `fi` one line past the body's end (the next job's line): it is said at its last line
    assert ("p.yaml", 11, "L005") in codes and ("p.yaml", 10, "SC1046") in codes
    assert ("p.yaml", 12, "L005") not in codes and ("p.yaml", 11, "SC1072") in codes
    sc2154 = [d for d in c.diagnostics if d.code == "SC2154"]
    assert len(sc2154) == 1 and sc2154[0].severity == "error" and sc2154[0].line == 15
    assert "job unassigned: rc is referenced but not assigned" in sc2154[0].message
    assert not c.clean()


def test_bash_n_error_points_at_plan(tmp_path: Path) -> None:
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: s\n    run: |\n      if true; then\n        echo x\n")
    l005 = [d for d in c.diagnostics if d.code == "L005"]
    assert l005 and l005[0].path.endswith("p.yaml") and "syntax error" in l005[0].message
    # at the run's last line, not at line 7 of this 6-line file (bash says the line after the last)
    assert {(d.line, d.col) for d in c.diagnostics if d.code in ("L005", "SC1047", "SC1072")} == {(6, 1)}


def test_bash_n_s_two_lines_of_one_syntax_error_are_one_finding(tmp_path: Path) -> None:
    """bash says a syntax error, then the source it could not read (`if then fi'): one finding with both."""
    c = compile_text(tmp_path, "plan: t\njobs:\n  - name: a\n    run: if then fi\n")
    l005 = [d.message for d in c.diagnostics if d.code == "L005"]
    assert l005 == ["job a: bash -n: syntax error near unexpected token `then' in `if then fi'"], l005


def test_a_finding_in_a_template_outside_the_working_directory_names_its_whole_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a plan outside it is named: whole, not `../../tmp/t.sh.j2`."""
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "t.sh.j2").write_text("#!/bin/bash\necho {{ x }\n")
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: tp\njobs:\n  - name: a\n    template: t.sh.j2\n    with: {x: 1}\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    c = compile_plan(plan, templates=[tmp_path / "tpl"], lint=False)
    assert [d.path for d in c.diagnostics] == [str(tmp_path / "tpl" / "t.sh.j2")], c.diagnostics


def test_same_plan_renders_byte_identical(tmp_path: Path) -> None:
    a = compile_text(tmp_path, SEED_STRATA.replace("strata-{{ tag }}.json", "strata-q2_0.json"))
    b = compile_plan(tmp_path / "p.yaml")
    assert a.clean() and [j.text for j in a.jobs] == [j.text for j in b.jobs]


def test_shellcheck_results_are_cached_by_content(tmp_path: Path) -> None:
    text = "plan: t\njobs:\n  - name: a\n    run: echo a\n  - name: b\n    run: echo b\n"
    first = compile_text(tmp_path, text)
    assert first.clean()
    entries = list((tmp_path / "cache" / "shellcheck").rglob("*.json"))
    assert len(entries) == 2
    # Plant a finding in one entry: a second check must read it from the cache, not re-run shellcheck.
    planted = {"line": 5, "column": 1, "level": "warning", "code": 2086, "message": "planted"}
    for entry in entries:
        entry.write_text(json.dumps([planted]))
    shutil.rmtree(tmp_path / "cache" / "lint-jobs")  # the per-job memo in front of it (tests/compiler/test_lintmemo.py)
    second = compile_plan(tmp_path / "p.yaml")
    planted_found = sorted(d.message for d in second.diagnostics if d.code == "SC2086")
    assert planted_found == ["job a: planted", "job b: planted"]
    third = compile_plan(tmp_path / "p.yaml", use_cache=False)
    assert third.clean()


PY_PLAN = """
from pydantic import BaseModel, field_validator
from plancompiler.models import Job, Plan

ALLOWED_SHORT = {"-ctk", "-ctv"}


class Model(BaseModel):
    name: str
    serve_args: list[str] = []

    @field_validator("serve_args")
    @classmethod
    def _router_flags(cls, args):
        for arg in args:
            if arg.startswith("-") and not arg.startswith("--") and arg not in ALLOWED_SHORT:
                raise ValueError(f"unsupported sampler flag: {arg} (the router accepts -ctk and -ctv)")
        return args


ROSTER = [
    Model(name="qwen", serve_args=["-ctk", "q8_0"]),
    Model(name="mai-code", serve_args=[__ARGS__]),
]

plan = Plan(plan="intakes", jobs=[
    Job(name=f"65-gpu-intake-{m.name}", lane="gpu", run="echo {{ args }}", with_={"args": m.serve_args})
    for m in ROSTER
])
"""


def test_python_plan_with_its_own_typed_roster(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(PY_PLAN.replace("__ARGS__", '"--flash-attn"'))
    c = compile_plan(good)
    assert c.clean(), found(c)
    assert [j.name for j in c.jobs] == ["65-gpu-intake-qwen", "65-gpu-intake-mai-code"]
    assert "echo -ctk q8_0\n" in c.jobs[0].text
    bad = tmp_path / "bad.py"
    bad.write_text(PY_PLAN.replace("__ARGS__", '"-b", "2048"'))
    c = compile_plan(bad)
    assert [(d.code, d.line) for d in c.diagnostics] == [("P004", 23)]
    assert "unsupported sampler flag: -b" in c.diagnostics[0].message


HOSTILE_PLANS = [
    # (plan text, expected code, line, col, part of the message)
    ("plan: t\nvars: &x {a: *x}\njobs: []\n", "P001", 2, 7, "recursive alias"),
    ("plan: t\nvars:\n  x: " + "[" * 900 + "]" * 900 + "\njobs: []\n", "P001", 3, 104, "nested more than 100 deep"),
    (
        "plan: t\nvars:\n  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10))
        + "jobs: []\n",
        "P001",
        3,
        22,
        "expands to more than 500,000 values",
    ),
    ("plan: t\nvars:\n  ? [a, b]\n  : 1\njobs: []\n", "P001", 3, 5, "a key must be a plain value"),
    (
        "plan: t\njobs:\n  - name: a\n    run: |\n      {% macro m() %}x {{ m() }}{% endmacro %}\n      echo {{ m() }}\n",
        "R003",
        5,
        7,
        "recursion too deep",
    ),
    (
        "plan: t\nvars: {x: \"{{ 'a' * 10**10 }}\"}\njobs: []\n",
        "P011",
        2,
        11,
        "a repetition of 10,000,000,000 items passes the size limit of 1,048,576",
    ),
    (
        'plan: t\nvars: {x: "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"}\n'
        "jobs: []\n",
        "P011",
        2,
        11,
        "loops ran more than 1,000,000 times",
    ),
    (
        'plan: t\njobs:\n  - name: a\n    run: echo\n    outputs: ["a\\nb"]\n',
        "P011",
        5,
        15,
        "outputs.0: the path 'a\\nb' holds a newline",
    ),
    ('plan: t\njobs:\n  - name: a\n    run: echo\n    lane: " "\n', "P022", 5, 11, "lane ' ' is not one of"),
    ('plan: t\nlanes: ["a b"]\njobs: []\n', "P004", 2, 8, "lane name 'a b'"),
    (
        "plan: t\nvars:\n  rows: [{1: a}]\njobs:\n  - name: a\n    foreach: rows\n    run: echo\n",
        "P012",
        6,
        14,
        "foreach key 1 must be a name",
    ),
    (
        "plan: t\njobs:\n  - name: a\n    run: echo {{ n | length }}\n    with: {n: 5}\n",
        "R003",
        4,
        10,
        "TypeError: object of type 'int' has no len()",
    ),
    (
        "plan: t\njobs:\n  - name: a\n    run: echo {{ name }}\n    with: {name: x}\n",
        "P023",
        5,
        12,
        "with: 'name' would replace the built-in 'name'",
    ),
    (
        "plan: t\njobs:\n  - name: a\n    run: echo {{ 'a' * 2000000 }}\n",
        "R007",
        4,
        10,
        "a repetition of 2,000,000 items passes the size limit",
    ),
    (
        "plan: t\nvars: {d: &d [1]}\njobs:\n  - <<: *d\n    name: a\n    run: echo\n",
        "P001",
        4,
        5,
        "`<<` merges a mapping",
    ),
    (
        "plan: t\nvars: {d: &d {lane: net}}\njobs:\n  - <<: *d\n    name: a\n    <<: *d\n    run: echo\n",
        "P002",
        6,
        5,
        "duplicate key '<<' (first on line 4)",
    ),
    (
        "plan: t\nvars:\n  a0: &a0 {x: [lol, lol, lol, lol, lol, lol, lol, lol, lol]}\n"
        + "".join(
            f"  a{i}: &a{i} {{" + ", ".join(f"k{j}: {{<<: *a{i - 1}}}" for j in range(9)) + "}\n" for i in range(1, 10)
        )
        + "jobs: []\n",
        "P001",
        3,
        16,
        "expands to more than 500,000 values",
    ),
]


@pytest.mark.parametrize(
    "text, code, line, col, message", HOSTILE_PLANS, ids=[f"{c}-{m[:30]}" for _, c, _, _, m in HOSTILE_PLANS]
)
def test_hostile_and_odd_plans_are_located_findings(
    tmp_path: Path, text: str, code: str, line: int, col: int, message: str
) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(text)
    c = compile_plan(plan, lint=False)
    assert [(d.code, d.line, d.col) for d in c.diagnostics] == [(code, line, col)], found(c)
    assert message in c.diagnostics[0].message, found(c)
    assert not c.jobs


def test_jinja_in_a_value_cannot_reach_python(tmp_path: Path) -> None:
    marker = tmp_path / "X"
    c = compile_text(
        tmp_path,
        f"""\
        plan: t
        vars:
          x: "{{{{ cycler.__init__.__globals__.os.system('touch {marker}') }}}}"
          y: "{{{{ ''.__class__.__mro__[1].__subclasses__() }}}}"
          z: "{{{{ range.__self__ }}}}"
        jobs: []
        """,
        lint=False,
    )
    assert [d.code for d in c.diagnostics] == ["P011", "P011", "P011"], found(c)
    assert all("not allowed in a plan" in d.message or "undefined" in d.message for d in c.diagnostics), found(c)
    assert not marker.exists()


def test_with_key_the_template_never_reads_is_a_warning_with_a_suggestion(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        jobs:
          - name: a
            template: fetch.sh.j2
            with: {url: "http://x", quite: 1, dest: /d}
          - name: b
            run: echo {{ url }}
            with: {url: u, extra: 1}
        """,
        templates={"fetch.sh.j2": "curl -o {{ dest }} {{ url }} {% if quiet is defined %}-s{% endif %}\n"},
    )
    assert [d for d in found(c) if "R009" in d] == [
        "p.yaml:5:29: warning[R009]: with: 'quite' is not used by fetch.sh.j2; did you mean 'quiet'?",
        "p.yaml:8:20: warning[R009]: with: 'extra' is not used by the run: body",
    ]


def test_size_limit_is_raised_by_the_flag(tmp_path: Path) -> None:
    from plancompiler.sandbox import Limits

    text = "plan: t\nvars: {big: \"{{ 'a' * 2000000 }}\"}\njobs:\n  - name: a\n    run: test {{ big | length }} -gt 0\n"
    refused = compile_text(tmp_path, text, lint=False)
    assert "P011" in [d.code for d in refused.diagnostics] and not refused.jobs
    c = compile_plan(tmp_path / "p.yaml", lint=False, limits=Limits(max_size=4 << 20))
    assert c.clean(), found(c)


def test_yaml_plans_never_walk_the_stack_and_python_plans_record_job_lines(tmp_path: Path) -> None:
    from plancompiler.models import Job

    assert Job(name="a", run="echo")._source is None  # built outside a Python plan's loading: nothing recorded
    plan = tmp_path / "p.py"
    plan.write_text(
        "from plancompiler.models import Job, Plan\n\n\ndef job(n):\n    return Job(name=n, run='echo',\n"
        "               requires=['/nowhere'])\n\n\nplan = Plan(plan='t', jobs=[\n    job('a'),\n"
        "    Job(name='b', run='echo', requires=['/nowhere']),\n])\n"
    )
    c = compile_plan(plan, lint=False)
    assert [(d.code, d.line) for d in c.diagnostics] == [("G001", 5), ("G001", 11)], found(c)


def test_check_counts_every_job_and_max_size_is_a_global_flag(tmp_path: Path) -> None:
    from tests.inprocess import plan_main

    plan = tmp_path / "three.yaml"
    plan.write_text(
        "plan: t\njobs:\n  - name: a\n    run: echo a\n  - name: b\n    run: echo {{ nope }}\n"
        '  - name: "c{{ i }}"\n    foreach: {i: [1, 2]}\n    run: "true  # {{ \'x\' * 1100000 }}"\n'
    )
    where = {"cwd": tmp_path, "cache": tmp_path / "cache"}
    run = plan_main("check", str(plan), **where)
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == "4 jobs, 3 errors, 0 warnings"  # b, c1, c2 did not render: still counted
    raised = plan_main("--max-size", "2M", "check", str(plan), **where)
    assert raised.returncode == 1 and "R007" not in raised.stdout and "R002" in raised.stdout
    bad = plan_main("--max-size", "lots", "check", str(plan), **where)
    assert bad.returncode == 2 and "--max-size" in bad.stderr


def test_yaml_merge_keys_bring_defaults_that_a_job_overrides(tmp_path: Path) -> None:
    c = compile_text(
        tmp_path,
        """\
        plan: t
        vars:
          net_job: &net {lane: net, retries: 2, timeout: 1m}
        jobs:
          - <<: *net
            name: a
            run: echo a
          - name: b
            lane: cpu
            <<: [*net, {retries: 5}]
            run: echo b
            typo: 1
        """,
    )
    assert found(c) == ["p.yaml:12:5: error[P003]: unknown key 'typo' in jobs[1]"]
    del c
    c = compile_text(tmp_path, (tmp_path / "p.yaml").read_text().replace("    typo: 1\n", ""))
    assert c.clean(), found(c)
    a, b = (job.text for job in c.jobs)
    assert "# LANE=net\n# RETRIES=2\n# TIMEOUT=1m\n" in a
    # the job's own key wins over the merged ones, and the first mapping listed wins over the later one
    assert "# LANE=cpu\n# RETRIES=2\n# TIMEOUT=1m\n" in b


def test_an_inline_run_is_placed_once_per_plan_job_and_every_row_points_at_its_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a run's `{{` are written is found once per plan job, not once per row (each search read the rest
    of the plan: a foreach of N rows in a long plan was N times the plan's length), and only as far as needed."""
    from plancompiler import render

    searched: list[int] = []
    real = render._tag_places

    def counting(body: str, lines: list[str], line: int, col: int):  # type: ignore[no-untyped-def]
        searched.append(line)
        return real(body, lines, line, col)

    monkeypatch.setattr(render, "_tag_places", counting)
    rows = 300
    c = compile_text(
        tmp_path,
        'plan: t\njobs:\n  - name: "a{{ 1000 + i }}"\n    foreach: {i: ROWS}\n    run: "echo one\\n  eval {{ i }}"\n'
        '  - name: b\n    run: "echo {{ 1 }}\\n  eval {{ 2 }}"\n'.replace("ROWS", str(list(range(rows)))),
        lint=False,
    )
    assert searched == [5, 7]
    assert {(d.code, d.line, d.col) for d in c.diagnostics} == {("R005", 5, 28), ("R005", 7, 32)}
    assert sum(d.line == 5 for d in c.diagnostics) == rows


def _aliases(levels: int) -> str:
    """YAML vars a0..aLEVELS, each nine aliases of the one before: a3 is 7,381 values, a9 over a billion."""
    return "  a0: &a0 [w, w, w, w, w, w, w, w, w]\n" + "".join(
        f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, levels + 1)
    )


def _late(what: str) -> str:
    """377,000 values, WHAT (a var), then 221,000 more: refused, and WHAT comes after much has been skipped."""
    return (
        _aliases(3)
        + "  many: ["
        + ", ".join(["*a3"] * 50)
        + "]\n"
        + what
        + "  tail: ["
        + ", ".join(["*a3"] * 30)
        + "]\n"
    )


# name: (vars, the finding a full walk ends in: line, col, message)
ALIAS_HEAVY = {
    "laughs": (_aliases(9), "3:18", "the plan expands to more than 500,000 values"),
    "crosses-inside-a-copy": (_aliases(3) + "  many: [" + ", ".join(["*a3"] * 80) + "]\n", "3:12", "the plan expands"),
    "duplicate-late": (_late("  late: {x: 1, x: 2}\n"), "8:16", "duplicate key 'x'"),
    "deep-late": (_late("  deep: " + "[" * 97 + "*a3" + "]" * 97 + "\n"), "4:7", "values nested more than 100 deep"),
    "list-key-late": (_late("  late: {[a]: 1}\n"), "8:10", "a key must be a plain value"),
    "bad-merge-late": (_late("  late: {<<: *a0}\n"), "8:10", "`<<` merges a mapping"),
    "merges": (
        "  m0: &m0 {a: 1, b: 2, c: 3}\n"
        + "".join(
            f"  m{i}: &m{i} {{" + ", ".join(f"k{j}: {{<<: *m{i - 1}, z: 0}}" for j in range(9)) + "}\n"
            for i in range(1, 7)
        ),
        "3:21",
        "the plan expands",
    ),
    "recursive": ("  r: &r [1, *r]\n" + _aliases(9), "3:6", "an alias refers to the value that contains it"),
}


@pytest.mark.parametrize("name", sorted(ALIAS_HEAVY))
def test_a_refused_alias_document_ends_in_the_finding_a_full_walk_ends_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A document that expands past 500,000 values counts what it has built once instead of building it again.
    The finding, its place and its message are those of building every value: the expected ones were taken
    from a full walk, and one case (depth, the check that depends on where a copy lands) walks fully here too."""
    from plancompiler import load

    text, place, message = ALIAS_HEAVY[name]
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: t\nvars:\n" + text + "jobs: []\n")
    assert len(plan.read_bytes()) < 1 << 20
    built, real = [0], load._build

    def counting(*args: Any) -> Any:
        built[0] += 1
        return real(*args)

    monkeypatch.setattr(load, "_build", counting)
    quick = [d.text() for d in load.load_yaml(plan, "p.yaml")[2]]
    monkeypatch.setattr(load, "_build", real)
    assert built[0] < 20_000, built  # what was built once is counted, not built again
    assert len(quick) == 1 and quick[0].startswith(f"p.yaml:{place}: error[P00") and message in quick[0], quick
    if name == "deep-late" or os.environ.get("PLAN_FULL_WALK"):  # PLAN_FULL_WALK=1: every case, ~1 s each
        monkeypatch.setattr(load, "_walk_for", lambda root, text: load._Walk())
        assert [d.text() for d in load.load_yaml(plan, "p.yaml")[2]] == quick


def test_compile_holds_the_cycle_search_off_and_gives_it_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compile allocates hundreds of objects a job that live on: Python's cycle search is held off meanwhile
    (at 10 000 jobs it was a sixth of a push) and is on again after, or still off where the caller had it off.
    Objects the caller froze (gc.freeze(): this suite's own, after collection; a server's before it forks) stay
    frozen: the compile does not hand them back to every full search. What a compile made is moved past the young
    searches where it made MOVED_FROM objects or more (a 300-job plan here makes ~6 000: the bar is lowered)."""
    import gc

    from plancompiler import compile as stage

    monkeypatch.setattr(stage, "MOVED_FROM", 1000)

    items = "\n".join(f"    - {{i: '{i:04d}'}}" for i in range(300))
    plan = tmp_path / "p.yaml"
    plan.write_text(
        f"plan: t\nvars:\n  items:\n{items}\njobs:\n  - name: 'j-{{{{ i }}}}'\n    foreach: items\n    run: echo {{{{ i }}}}\n"
    )
    searches: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            searches.append(info["generation"])

    caller_froze = gc.get_freeze_count()  # the suite's (tests/conftest.py), given back at the end
    gc.unfreeze()
    gc.callbacks.append(count)
    try:
        gc.collect()
        del searches[:]
        c = compile_plan(plan, lint=False)  # without the hold: 12 searches here
        assert searches == [] and gc.isenabled()  # what it made went to the oldest generation, unsearched
        assert gc.get_freeze_count() == 0
        gc.disable()
        try:
            compile_plan(plan, lint=False)
            assert not gc.isenabled()
        finally:
            gc.enable()
        kept = [object() for _ in range(3)]  # noqa: F841 - alive while frozen
        gc.freeze()
        frozen = gc.get_freeze_count()
        compile_plan(plan, lint=False)
        assert gc.get_freeze_count() >= frozen and gc.isenabled()  # the caller's stay frozen
    finally:
        gc.callbacks.remove(count)
        if caller_froze:
            gc.freeze()
        else:
            gc.unfreeze()
    assert len(c.jobs) == 300

    class Node:
        pass

    with cycles_unsearched():  # a cycle left while the search is held off is still found by a full one
        node = Node()
        node.me = node  # type: ignore[attr-defined]
        gone = weakref.ref(node)
        del node
    gc.collect()
    assert gone() is None

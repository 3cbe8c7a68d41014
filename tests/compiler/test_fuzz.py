"""Seeded mutants of the real plans and the known bombs: the compiler ends each with a finding, never a crash or hang.

The mutants run in one child process under a memory limit (RLIMIT_AS), each under its own alarm; a few
of them, and every bomb, also go through the real `plan check` process: exit 0, 1 or 2, no traceback.
"""

from __future__ import annotations

import copy
import json
import os
import random
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

MEMORY_LIMIT = 3 << 30  # bytes of address space for each child: a bomb that expands hits this, not the box
HOSTILE = [
    "{{",
    "}}",
    "{%",
    "%}",
    "*x",
    "&x",
    "[",
    "]",
    "{",
    "}",
    '"',
    "'",
    "- ",
    ": ",
    "\t",
    "\\",
    "{{ 'a' * 10**10 }}",
    "{{ cycler.__init__ }}",
    "999999999999999999999",
    "-1",
    "null",
    "[a, b]",
    "{1: a}",
    '"\\n"',
    '" "',
    "$(touch PWNED)",
    "{{ x | length }}",
    "{% for i in range(10**9) %}",
    "!!python/object:os.system",
    "<<: *x",
    "? [a]",
    "\x00",
    "\r\n",
    "é",
    "0x10",
    "~",
    "|",
    ">",
    "{{ name }}",
    "{{ lane }}",
    "`touch PWNED`",
    "---",
    "...",
    "#",
    "&a [*a, *a]",
]

BOMBS = {
    "recursive-alias.yaml": "plan: t\nvars: &x {a: *x}\njobs: []\n",
    "deep.yaml": "plan: t\nvars:\n  x: " + "[" * 900 + "]" * 900 + "\njobs: []\n",
    "deeper.yaml": "plan: t\nvars:\n  x: " + "[" * 200_000 + "]" * 200_000 + "\njobs: []\n",
    "recursive-macro.yaml": "plan: t\njobs:\n  - name: a\n    run: |\n"
    "      {% macro m() %}{{ m() }}{% endmacro %}\n      echo {{ m() }}\n",
    "repeat.yaml": "plan: t\nvars: {x: \"{{ 'a' * 10**10 }}\"}\njobs: []\n",
    "repeat-in-run.yaml": "plan: t\njobs:\n  - name: a\n    run: echo {{ 'a' * 10**10 }}\n",
    "outputs-newline.yaml": 'plan: t\njobs:\n  - name: a\n    run: echo\n    outputs: ["a\\nb"]\n',
    "lane-space.yaml": 'plan: t\njobs:\n  - name: a\n    run: echo\n    lane: " "\n',
    "list-key.yaml": "plan: t\nvars:\n  ? [a, b]\n  : 1\njobs: []\n",
    "int-foreach-key.yaml": "plan: t\nvars:\n  rows: [{1: a}]\njobs:\n  - name: a\n    foreach: rows\n    run: echo\n",
    "length-of-int.yaml": "plan: t\njobs:\n  - name: a\n    run: echo {{ n | length }}\n    with: {n: 5}\n",
    "loops.yaml": 'plan: t\nvars: {x: "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}'
    '{% endfor %}"}\njobs: []\n',
    "sandbox-escape.yaml": "plan: t\nvars:\n  x: \"{{ cycler.__init__.__globals__.os.system('touch PWNED') }}\"\n"
    "jobs: []\n",
    "billion-laughs.yaml": "plan: t\nvars:\n  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10))
    + "jobs: []\n",
    "lanes-with-space.yaml": 'plan: t\nlanes: ["a b"]\njobs: []\n',
    "huge-foreach.yaml": 'plan: t\njobs:\n  - name: "a{{ i }}{{ j }}{{ k }}"\n    foreach: {i: '
    + str(list(range(100)))
    + ", j: "
    + str(list(range(100)))
    + ", k: "
    + str(list(range(100)))
    + "}\n    run: echo\n",
    "concat.yaml": 'plan: t\nvars:\n  a: "{{ \'x\' * 1000000 }}"\n  b: "{{ a ~ a ~ a ~ a }}"\njobs: []\n',
    "format-width.yaml": "plan: t\nvars: {x: \"{{ '%999999999d' % 1 }}\"}\njobs: []\n",
    "python-exit.py": "import sys\nsys.exit(1)\n",
}


HOSTILE_VALUES: list[object] = [
    "{{ 'a' * 10**10 }}",
    "$(touch PWNED)",
    "`touch PWNED`",
    "{{ cycler.__init__.__globals__ }}",
    "a\nb",
    " ",
    "",
    "{{ x | length }}",
    "{% for i in range(10**6) %}x{% endfor %}",
    "{{ name }}",
    "{{ 5 | length }}",
    "a b",
    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
    "EOF",
    "'\"",
    "{{ undefined_name }}",
    10**30,
    -1,
    0,
    None,
    True,
    [],
    {},
    ["a", 1],
    {"1": "a"},
    {"name": "x"},
    "../x",
    "/",
    "x\ry",
    "{{",
    "{{ roster }}",
]
TEMPLATE_SNIPPETS = [
    "{{ 'a' * 10**10 }}",
    "$(( {{ dest }} ))",
    '"{{ dest }}"',
    "'{{ dest }}'",
    "cat <<EOF\n{{ dest }}",
    '{% if dest %}"{% endif %}',
    "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
    "{{ dest | length }}",
    "\\",
    "$",
    "{{ dest",
    "}}",
    "eval {{ dest }}",
    "# {{ dest }}",
    "{% for i in range(10**7) %}{% endfor %}",
    "{% include 'fetch-hf.sh.j2' %}",
    "`{{ dest }}`",
]


def mutate_structure(data: Any, rng: random.Random) -> str:
    """A valid YAML plan (DATA, a loaded plan this changes) with one value, key or job replaced: it gets past
    loading, into expand and render."""
    for _ in range(rng.randint(1, 2)):
        node: Any = data
        while True:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            child = node[key]
            if isinstance(child, (dict, list)) and child and rng.random() < 0.7:
                node = child
                continue
            break
        if rng.random() < 0.15 and isinstance(node, dict):
            del node[key]
        else:
            strings = [v for v in HOSTILE_VALUES if isinstance(v, str)]
            node[key] = rng.choice(strings if rng.random() < 0.75 else HOSTILE_VALUES)
    # libyaml's emitter where PyYAML has it: the same text as the pure-Python one (checked over 100 mutants), 4x
    # faster (the mutants' dumping was a second of the suite's CPU)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, allow_unicode=True, width=1000)


def mutate(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(7)
        i = rng.randrange(len(lines)) if lines else 0
        if not lines:
            lines = [rng.choice(HOSTILE)]
        elif op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 2:
            words = lines[i].split(" ")
            words[rng.randrange(len(words))] = rng.choice(HOSTILE)
            lines[i] = " ".join(words)
        elif op == 3:
            lines[i] = " " * rng.randint(0, 8) + lines[i].lstrip()
        elif op == 4:
            at = rng.randint(0, len(lines[i]))
            lines[i] = lines[i][:at] + rng.choice(HOSTILE) + lines[i][at:]
        elif op == 5:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            return "\n".join(lines)[: rng.randint(0, len(text))]
    return "\n".join(lines)


DRIVER = r"""
import json, signal, sys, traceback
from pathlib import Path
from plancompiler.compile import compile_plan

class Hang(Exception):
    pass

def alarm(signum, frame):
    raise Hang()

signal.signal(signal.SIGALRM, alarm)
results = {}
for path in sys.argv[2:]:
    signal.alarm(20)
    try:
        dirs = [Path(path).parent / "templates", Path(sys.argv[1])]
        compiled = compile_plan(Path(path), templates=dirs, lint=False)
        results[path] = "ok " + ",".join(sorted({d.code for d in compiled.diagnostics}))
    except Hang:
        results[path] = "hang"
    except BaseException as exc:
        results[path] = "crash " + "".join(traceback.format_exception(exc))[-1500:]
    finally:
        signal.alarm(0)
print(json.dumps(results))
"""


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PLAN_CACHE_DIR": str(tmp_path / "cache")}


def _mutants(tmp_path: Path, count: int, seed: int = 20) -> list[Path]:
    rng = random.Random(seed)
    sources = {name: (REPO / "plans" / name).read_text() for name in ("demo.yaml", "a9.yaml")}
    # Loaded once and copied for each mutant: pure-Python YAML loading of the same text was most of the time.
    loaded = {name: yaml.safe_load(text) for name, text in sources.items()}
    templates = {p.name: p.read_text() for p in (REPO / "templates").glob("*.j2")}
    paths = []
    for n in range(count):
        name = "demo.yaml" if n % 2 else "a9.yaml"
        if n % 3 == 0:
            text = mutate(sources[name], rng)
            path = tmp_path / "mutants" / f"{n:03d}-{name}"
        else:
            # A valid plan with a hostile value, beside a copy of the templates with one of them mutated.
            text = mutate_structure(copy.deepcopy(loaded[name]), rng)
            path = tmp_path / "mutants" / f"{n:03d}" / name
            (path.parent / "templates").mkdir(parents=True)
            for tname, body in templates.items():
                lines = body.split("\n")
                if rng.random() < 0.3:
                    at = rng.randrange(len(lines))
                    lines[at] = lines[at] + " " + rng.choice(TEMPLATE_SNIPPETS)
                (path.parent / "templates" / tname).write_text("\n".join(lines))
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        paths.append(path)
    return paths


@pytest.mark.long
def test_mutants_and_bombs_end_in_findings_never_a_crash_or_hang(tmp_path: Path) -> None:
    (tmp_path / "mutants").mkdir()
    paths = _mutants(tmp_path, 300)
    for name, text in BOMBS.items():
        (tmp_path / "mutants" / name).write_text(text)
        paths.append(tmp_path / "mutants" / name)
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, str(REPO / "templates"), *map(str, paths)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
        preexec_fn=_limited,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout)
    bad = {Path(p).name: r for p, r in results.items() if not r.startswith("ok")}
    assert not bad, next(iter(bad.items()))
    assert len(results) == len(paths)
    # Every bomb is a finding (an error code), and none ran anything.
    for name in BOMBS:
        assert results[str(tmp_path / "mutants" / name)] != "ok ", name
    assert not (tmp_path / "PWNED").exists()
    # Mutants are not all trivially broken: some still compile clean, many end in findings.
    outcomes = [r for p, r in results.items() if Path(p).name not in BOMBS]
    assert any(r == "ok " for r in outcomes) and sum(r != "ok " for r in outcomes) > 100
    stages = {code[0] for r in outcomes for code in r[3:].split(",") if code}
    assert {"P", "G", "R"} <= stages, stages  # loading, the graph and rendering are all reached


def test_the_real_check_process_exits_0_1_or_2_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "mutants").mkdir()
    mutants = _mutants(tmp_path, 4)
    bombs = []
    for name in ("deeper.yaml", "billion-laughs.yaml", "repeat.yaml", "recursive-macro.yaml", "python-exit.py"):
        (tmp_path / "mutants" / name).write_text(BOMBS[name])
        bombs.append(tmp_path / "mutants" / name)
    # One process for the bombs together, one for the mutants together: each must end, and end well.
    for paths in [bombs, mutants]:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "plancompiler.cli",
                "check",
                "--templates",
                str(REPO / "templates"),
                *map(str, paths),
            ],
            capture_output=True,
            text=True,
            env=_env(tmp_path),
            cwd=tmp_path,
            timeout=120,
            preexec_fn=_limited,
        )
        assert run.returncode in (0, 1, 2), (paths, run.returncode, run.stdout[-500:], run.stderr[-2000:])
        assert "Traceback" not in run.stdout + run.stderr, (paths, run.stderr[-2000:])
        if paths == bombs:
            assert run.returncode == 1, run.stdout + run.stderr
            assert {Path(ln.split(":")[0]).name for ln in run.stdout.splitlines() if "error[" in ln} == {
                p.name for p in bombs
            }


def test_an_internal_error_is_one_line_exit_2_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    # A plan the compiler cannot handle because of a bug, simulated by a plan object that breaks
    # the pipeline from inside (a Python plan is code: it may hand over anything).
    plan = tmp_path / "broken.py"
    plan.write_text(
        "from plancompiler.models import Plan, Job\n"
        "class Odd(str):\n"
        "    def __hash__(self):\n"
        "        raise RuntimeError('boom')\n"
        "plan = Plan(plan='t', jobs=[Job(name='a', run='echo', requires=[{'after': 'x'}])])\n"
        "object.__setattr__(plan.jobs[0].requires[0], 'value', Odd('x'))\n"
    )
    argv = [sys.executable, "-m", "plancompiler.cli", "check", str(plan)]
    quiet = subprocess.run(argv, capture_output=True, text=True, env=_env(tmp_path), timeout=60)
    assert quiet.returncode == 2, quiet.stdout + quiet.stderr
    assert "Traceback" not in quiet.stderr
    line = [ln for ln in quiet.stderr.splitlines() if "internal error" in ln]
    assert line == [
        f"plan: {plan}: internal error, please report (RuntimeError: boom); run with --debug for the traceback"
    ]
    loud = subprocess.run(
        [sys.executable, "-m", "plancompiler.cli", "--debug", *argv[3:]],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert loud.returncode == 2 and "Traceback" in loud.stderr and "RuntimeError: boom" in loud.stderr

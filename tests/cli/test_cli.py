"""`plan` through typer's runner, plus one real subprocess run of the entry point."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from plancompiler.cli import app
from tests.conftest import REPO

cli = CliRunner()

# The seed's reduced repro: three jobs, the middle one missing its escapes. In a plan the
# missing backslash becomes an unassigned variable (SC2154), and a second slip a syntax error.
THREE = """\
plan: mini
jobs:
  - name: 10-gpu-first
    lane: gpu
    run: echo first
  - name: 20-gpu-typo
    lane: gpu
    run: |
      echo typo; exit $rc
  - name: 30-gpu-third
    lane: gpu
    run: |
      if [ -e /x ]; then echo third
"""


pytestmark = pytest.mark.usefixtures("plan_env")  # a shellcheck cache of its own, no hosts file from outside


def test_seed_three_jobs_all_errors_nothing_written(tmp_path: Path) -> None:
    plan = tmp_path / "mini.yaml"
    plan.write_text(THREE)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.job").write_text("echo old\n")
    result = cli.invoke(app, ["render", str(plan), "-o", str(out)])
    assert result.exit_code == 1
    assert "error[SC2154]: job 20-gpu-typo: rc is referenced but not assigned" in result.stdout
    assert "error[L005]" in result.stdout and "30-gpu-third" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["old.job"]
    check = cli.invoke(app, ["check", str(plan), "--format", "json"])
    assert check.exit_code == 1
    codes = sorted(d["code"] for d in json.loads(check.stdout))
    assert "SC2154" in codes and "L005" in codes


def test_render_replaces_the_directory_whole(tmp_path: Path) -> None:
    plan = tmp_path / "ok.yaml"
    plan.write_text("plan: ok\njobs:\n  - name: a\n    run: echo a\n  - name: b\n    run: echo b\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.job").write_text("echo stale\n")
    result = cli.invoke(app, ["render", str(plan), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["a.job", "b.job"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_check_formats_and_exit_codes(tmp_path: Path) -> None:
    plan = tmp_path / "w.yaml"
    plan.write_text("plan: w\njobs:\n  - name: a\n    run: |\n      echo $1\n      cd /tmp\n      ls\n")
    text = cli.invoke(app, ["check", str(plan)])
    assert text.exit_code == 0, text.output
    strict = cli.invoke(app, ["check", str(plan), "--strict"])
    assert strict.exit_code == 1 and "warning[SC2164]" in strict.stdout
    github = cli.invoke(app, ["check", str(plan), "--format", "github"])
    assert github.stdout.startswith("::warning file=")
    # A plan file that cannot be read is no finding but an error (exit 2, its file named), said after the other
    # plans' findings
    missing = cli.invoke(app, ["check", str(plan), str(tmp_path / "nope.yaml"), str(tmp_path), "--strict"])
    assert missing.exit_code == 2 and "warning[SC2164]" in missing.stdout, missing.output
    assert missing.stderr.endswith(
        f"plan: {tmp_path / 'nope.yaml'}: plan file not found\n{tmp_path}: a directory, not a plan file\n"
    ), missing.stderr
    assert missing.stderr.startswith("1 job, 0 errors, 1 warning\n"), missing.stderr  # the plans that were read
    alone = cli.invoke(app, ["render", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "out")])
    assert (alone.exit_code, alone.stderr) == (2, f"plan: {tmp_path / 'nope.yaml'}: plan file not found\n")
    alone = cli.invoke(app, ["check", str(tmp_path / "nope.yaml")])  # the error alone, no "0 jobs" before it
    assert (alone.exit_code, alone.output) == (2, f"plan: {tmp_path / 'nope.yaml'}: plan file not found\n")
    # For a machine (json, github) an unreadable plan is a finding too (P000), among the others: exit 2 still
    read = cli.invoke(app, ["check", str(plan), str(tmp_path / "nope.yaml"), "--format", "json"])
    found = {(d["path"], d["code"], d["message"]) for d in json.loads(read.stdout)}
    assert read.exit_code == 2 and (str(tmp_path / "nope.yaml"), "P000", "plan file not found") in found, found
    assert any(code == "SC2164" for _, code, _ in found)
    github = cli.invoke(app, ["check", str(tmp_path), "--format", "github"])
    assert (github.exit_code, github.stdout) == (
        2,
        f"::error file={tmp_path},line=1,col=1,title=P000::a directory, not a plan file\n",
    )


def test_graph_of_a_plan_with_errors_prints_what_it_could_build_and_the_errors_and_exits_1(tmp_path: Path) -> None:
    """A cycle and a job that cannot be expanded: the graph shows the cycle (what a user runs it to see), and the
    errors say what it left out; exit 1, never a silent 0 over a dropped job."""
    plan = tmp_path / "cyc.yaml"
    plan.write_text(
        "plan: cyc\njobs:\n"
        "  - {name: a, run: cat b.txt > a.txt, requires: [b.txt], outputs: [a.txt]}\n"
        "  - {name: b, run: cat a.txt > b.txt, requires: [a.txt], outputs: [b.txt]}\n"
        "  - {name: 'c-{{ x }}', foreach: nosuch, run: 'echo {{ x }}'}\n"
    )
    result = cli.invoke(app, ["graph", str(plan)])
    assert result.exit_code == 1, result.output
    assert '"b" -> "a";' in result.stdout and '"a" -> "b";' in result.stdout and "error" not in result.stdout
    assert "error[G002]: dependency cycle: a -> b -> a" in result.stderr
    assert "error[P012]: foreach names var 'nosuch'" in result.stderr


def test_set_override_and_bad_set(tmp_path: Path) -> None:
    result = cli.invoke(app, ["check", str(REPO / "plans/demo.yaml"), "--set", "work=/srv/demo"])
    assert result.exit_code == 0, result.output
    bad = cli.invoke(app, ["check", str(REPO / "plans/demo.yaml"), "--set", "work"])
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output


def test_graph_and_schema() -> None:
    dot = cli.invoke(app, ["graph", str(REPO / "plans/demo.yaml")])
    assert dot.exit_code == 0 and '"10-net-fetch-tiny-a" -> "30-gpu-intake-tiny-a";' in dot.stdout
    mermaid = cli.invoke(app, ["graph", str(REPO / "plans/demo.yaml"), "--format", "mermaid"])
    assert mermaid.stdout.startswith("flowchart LR") and "-->" in mermaid.stdout
    schema = json.loads(cli.invoke(app, ["schema"]).stdout)
    assert "jobs" in schema["properties"] and "Job" in schema["$defs"]
    assert schema["$defs"]["Job"]["additionalProperties"] is False


def test_every_command_has_help() -> None:
    import typer.main

    group = typer.main.get_command(app)
    names = list(group.commands)  # type: ignore[attr-defined]
    assert {"check", "render", "graph", "schema"} <= set(names)
    for name in names:
        result = cli.invoke(app, [name, "--help"])
        assert result.exit_code == 0, name
        command = group.commands[name]  # type: ignore[attr-defined]
        assert command.help or command.short_help, f"{name} has no help text"


def test_entry_point_runs_as_a_real_process(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "plancompiler.cli", "--help"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "check" in out.stdout
    plan = tmp_path / "mini.yaml"
    plan.write_text(THREE)
    run = subprocess.run(
        [sys.executable, "-m", "plancompiler.cli", "check", str(plan)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PLAN_CACHE_DIR": str(tmp_path / "c"), "PATH": _path()},
    )
    assert run.returncode == 1 and "SC2154" in run.stdout
    assert "Traceback" not in run.stderr


def test_the_program_leaves_what_it_made_out_of_the_last_cycle_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan` (its console script and `python -m plancompiler.cli`) returns main's code and freezes what the
    command made: the interpreter's search for cycles at exit walked all of it (a sixth of a 10k push's end)."""
    import gc

    from plancompiler.cli import entry

    monkeypatch.setattr(sys, "argv", ["plan", "--version"])
    caller_froze = gc.get_freeze_count()  # the suite's own (tests/conftest.py): frozen again below
    gc.unfreeze()
    try:
        assert entry() == 0
        assert gc.get_freeze_count() > 0
    finally:
        if not caller_froze:
            gc.unfreeze()
    assert "entry()" in (REPO / "plancompiler/cli/__main__.py").read_text()
    assert 'plan = "plancompiler.cli:entry"' in (REPO / "pyproject.toml").read_text()


def _path() -> str:
    import os

    return os.environ["PATH"]


def test_check_of_plans_glob_skips_the_hosts_file() -> None:
    result = cli.invoke(app, ["check", str(REPO / "plans/hosts.yaml"), str(REPO / "plans/demo.yaml")])
    assert result.exit_code == 0, result.output
    assert "info[P006]: a hosts file, not a plan: skipped" in result.stdout


# --- the light command-line reader (issue 18): same calls as typer, without typer's pydantic adapters ---

LIGHT_LINES = [
    ["status", "/q"],
    ["status", "/q", "--json", "--timeout", "5"],
    ["--debug", "status", "--hosts", "h.yaml", "q1"],
    ["check", "a.yaml", "b.yaml", "--set", "x=1", "--set=y=2", "--format", "json", "--strict"],
    ["check", "--no-cache", "--templates", "t", "a.yaml"],
    ["render", "p.yaml", "-o", "out"],
    [
        "watch",
        "/q",
        "--once",
        "--wake-on",
        "done",
        "--wake-on",
        "failed,cancelled",
        "--interval",
        "2.5",
        "--waiting",
        "30m",
        "--state",
        "s.json",
    ],
    ["logs", "/q", "j", "-f", "-n", "5"],
    ["park", "/q", "--reason", "--now"],  # an option's value may start with a dash, as in click
    ["push", "h", "p.yaml", "--dry-run", "--lock-wait", "3", "--take-over"],
    ["--max-size", "4M", "check", "p.yaml"],
    ["ack", "/q", "STALL:j", "--for", "8h"],
    ["graph", "p.yaml", "--format", "mermaid"],
    ["check", "--", "-odd.yaml"],
]


def _typer_calls(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict, dict]:
    """What typer passes the command and the root callback for ARGV (each recorded, nothing run)."""
    import functools

    import typer

    from plancompiler import cli as plan_cli

    calls: dict[str, Any] = {}

    def recorder(fn: Any, stop: bool) -> Any:
        @functools.wraps(fn)
        def record(**kwargs: Any) -> None:
            calls["root" if not stop else "command"] = (fn.__name__, kwargs)
            if stop:
                raise typer.Exit(0)

        return record

    for info in app.registered_commands:
        monkeypatch.setattr(info, "callback", recorder(info.callback, True))
    monkeypatch.setattr(app.registered_callback, "callback", recorder(app.registered_callback.callback, False))
    monkeypatch.setattr(plan_cli, "command", lambda: typer.main.get_command(app))  # built anew, with the recorders
    result = cli.invoke(app, argv)
    assert result.exit_code == 0, (argv, result.output)
    monkeypatch.undo()
    return calls["command"][0], calls["command"][1], calls["root"][1]


def test_usage_lines_say_each_argument_s_repeat_once() -> None:
    """typer writes a required argument {NAME}, an optional one [NAME], and ... after a list: a metavar of its own
    with ... read `{PLAN...}...` (`plan check`) and `[[HOST]...]...` (`plan top`)."""

    def usages(command: Any, name: str) -> list[str]:  # click's classes, as typer has them (it may vendor click)
        if hasattr(command, "commands"):
            return [u for sub, c in command.commands.items() for u in usages(c, f"{name} {sub}")]
        return [command.get_usage(command.context_class(command, info_name=name))]

    lines = usages(typer.main.get_command(app), "plan")
    assert "Usage: plan check [OPTIONS] {PLAN}..." in lines and "Usage: plan top [OPTIONS] [HOST]..." in lines
    assert [u for u in lines if re.search(r"\.\.\.[\]}]", u)] == []


@pytest.mark.parametrize("argv", LIGHT_LINES, ids=[" ".join(a) for a in LIGHT_LINES])
def test_light_reader_calls_each_command_as_typer_does(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from plancompiler.cli import _root
    from plancompiler.cli.light import read

    light = read(app, _root, argv)
    assert light is not None, argv
    command, kwargs, root = light
    name, typer_kwargs, typer_root = _typer_calls(argv, monkeypatch)
    assert command.__name__ == name
    assert kwargs == typer_kwargs
    assert {k: type(v) for k, v in kwargs.items()} == {k: type(v) for k, v in typer_kwargs.items()}
    assert root == typer_root


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--help"],
        ["status", "--help"],
        ["status"],
        ["status", "/q", "--bogus"],
        ["status", "/q", "--timeout", "soon"],
        ["status", "/q", "extra"],
        ["--version"],
        ["hooks", "install"],
        ["check", "-x", "p.yaml"],
        ["status", "/q", "--json=1"],
        ["graph", "p.yaml", "--format", "svg"],
    ],
)
def test_light_reader_leaves_help_mistakes_and_odd_forms_to_typer(argv: list[str]) -> None:
    from plancompiler.cli import _root
    from plancompiler.cli.light import read

    assert read(app, _root, argv) is None


def test_light_path_reports_a_mistake_in_typers_words(tmp_path: Path) -> None:
    from tests.inprocess import plan_main

    run = plan_main("status", str(tmp_path), "--bogus", cwd=REPO, cache=tmp_path / "cache")  # as the script runs
    typer_run = cli.invoke(app, ["status", str(tmp_path), "--bogus"])
    assert run.returncode == typer_run.exit_code == 2
    assert "No such option: --bogus" in run.stderr and "No such option: --bogus" in typer_run.output


_STEPS = """
import contextlib, io, json, sys
from pathlib import Path
from plancompiler.cli import main
real = sys.stdout
for step in json.loads(sys.argv[1]):
    if "write" in step:
        Path(step["write"]).write_text(step["text"])
        continue
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(step["argv"])
    found = {"rc": rc, "pydantic": "pydantic" in sys.modules, "jinja2": "jinja2" in sys.modules}
    print(json.dumps({**found, "output": out.getvalue()}), file=real, flush=True)
"""


def _modules_after(
    steps: list[list[str] | tuple[Path, str]], cwd: Path, env: dict[str, str] | None = None
) -> list[tuple[int, bool, bool, str]]:
    """Run each `plan ARGV` of STEPS in turn in one fresh interpreter (a (PATH, TEXT) step writes the file):
    for each, (exit code, pydantic imported by then, jinja2 imported by then, its output). Modules only
    accumulate, so one that a command imports shows after it, whatever ran before it in the same process."""
    given = [{"argv": s} if isinstance(s, list) else {"write": str(s[0]), "text": s[1]} for s in steps]
    run = subprocess.run(
        [sys.executable, "-c", _STEPS, json.dumps(given)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO), **(env or {})},
    )
    ran = [json.loads(line) for line in run.stdout.splitlines()]
    assert run.returncode == 0 and len(ran) == sum(isinstance(s, list) for s in steps), run.stdout + run.stderr
    return [(r["rc"], r["pydantic"], r["jinja2"], r["output"]) for r in ran]


def test_a_push_keeps_its_check_in_the_memo_and_honours_a_remembered_one(tmp_path: Path) -> None:
    """A push checks the plan once for `plan check` and the next push alike: its findings are remembered (the
    check after it needs no compile), and a push of the same inputs refuses on the remembered findings."""
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: p\njobs:\n  - name: a\n    lane: cpu\n    run: cd /tmp\n")  # SC2164: cd without || exit
    root, env = tmp_path / "q", {"PLAN_CACHE_DIR": str(tmp_path / "cache")}
    [(rc, _, _, out)] = _modules_after([["push", str(root), str(plan)]], tmp_path, env)
    assert rc == 0 and "SC2164" in out and "pushed: 1 installed" in out, out
    [(rc, _, jinja2, out)] = _modules_after([["check", str(plan), "--strict"]], tmp_path, env)
    assert rc == 1 and not jinja2 and "SC2164" in out, out  # what the push found, remembered
    [(rc, _, _, out)] = _modules_after([["push", str(root), str(plan), "--strict"]], tmp_path, env)
    assert rc == 1 and "SC2164" in out and "push refused" in out, out


def test_status_watch_logs_and_park_import_neither_pydantic_nor_jinja2(tmp_path: Path) -> None:
    root = tmp_path / "q"
    for state in ("queue", "running", "done", "failed", "logs"):
        (root / state).mkdir(parents=True)
    (root / "logs" / "j.log").write_text("hello\n")
    (root / "done" / "j.job").write_text("# LANE=cpu\n\necho hello\n")
    steps: list[list[str] | tuple[Path, str]] = [
        ["status", str(root)],
        ["status", str(root), "--json"],
        ["watch", str(root), "--once", "--state", str(tmp_path / "w.json")],
        ["logs", str(root), "j"],
        ["park", str(root), "--reason", "test"],
        ["unpark", str(root)],
    ]
    for argv, (rc, pydantic, jinja2, output) in zip(steps, _modules_after(steps, tmp_path), strict=True):
        assert rc in (0, 12, 14), (argv, output)  # watch --once may find the queue idle or its runner dead
        assert not pydantic and not jinja2, (argv, output)


def test_an_unchanged_plan_is_checked_from_the_memo_and_a_changed_template_is_not(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    template = tmp_path / "templates" / "t.sh.j2"
    template.write_text("echo {{ x }}\n")
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: p\njobs:\n  - name: a\n    template: t.sh.j2\n    with: {x: m1}\n")
    env = {"PLAN_CACHE_DIR": str(tmp_path / "cache")}
    # A step that must not compile starts a fresh process; one that must may follow it there (jinja2 shows).
    [(rc, _, jinja2, out)] = _modules_after([["check", str(plan)]], tmp_path, env)
    assert rc == 0 and jinja2, out  # the first check compiles
    cd = "cd {{ x }}\necho done\n"  # SC2164: cd without || exit
    remembered, changed = _modules_after(
        [["check", str(plan)], (template, cd), ["check", str(plan), "--strict"]], tmp_path, env
    )
    rc, _, jinja2, out = remembered
    assert rc == 0 and not jinja2 and "1 job, 0 errors" in out, out  # the same inputs: remembered
    rc, _, jinja2, out = changed
    assert rc == 1 and jinja2 and "SC2164" in out, out
    m2 = plan.read_text().replace("m1", "m2")
    remembered, changed = _modules_after(
        [["check", str(plan), "--strict"], (plan, m2), ["check", str(plan), "--strict"]], tmp_path, env
    )
    rc, _, jinja2, out = remembered
    assert rc == 1 and not jinja2 and "SC2164" in out, out  # a remembered finding is still printed
    rc, _, jinja2, out = changed
    assert rc == 1 and jinja2 and "SC2164" in out, out
    [(rc, _, jinja2, out)] = _modules_after([["check", str(plan), "--no-cache"]], tmp_path, env)
    assert jinja2, out  # --no-cache always checks afresh

"""`plan` through typer's runner, plus one real subprocess run of the entry point."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
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


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAN_CACHE_DIR", str(tmp_path / "cache"))


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
    missing = cli.invoke(app, ["check", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "plan file not found" in missing.stdout


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
    out = subprocess.run([sys.executable, "-m", "plancompiler.cli", "--help"], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0 and "check" in out.stdout
    plan = tmp_path / "mini.yaml"
    plan.write_text(THREE)
    run = subprocess.run([sys.executable, "-m", "plancompiler.cli", "check", str(plan)], capture_output=True,
                         text=True, cwd=REPO, env={"PLAN_CACHE_DIR": str(tmp_path / "c"), "PATH": _path()})
    assert run.returncode == 1 and "SC2154" in run.stdout
    assert "Traceback" not in run.stderr


def _path() -> str:
    import os

    return os.environ["PATH"]


def test_check_of_plans_glob_skips_the_hosts_file() -> None:
    result = cli.invoke(app, ["check", str(REPO / "plans/hosts.yaml"), str(REPO / "plans/demo.yaml")])
    assert result.exit_code == 0, result.output
    assert "info[P006]: a hosts file, not a plan: skipped" in result.stdout

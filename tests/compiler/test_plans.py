"""The real plans in plans/: they check clean, render to the checked-in golden files, and 92c is the seed's job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from plancompiler.compile import compile_plan
from tests.conftest import REPO
from tests.seed import SEED_92C

GOLDEN = REPO / "tests" / "golden"


@pytest.fixture(autouse=True)
def _in_repo(plan_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("name", ["a9.yaml", "demo.yaml", "a9_intakes.py"])
def test_plan_checks_clean_and_matches_golden(name: str) -> None:
    compiled = compile_plan(REPO / "plans" / name)
    name = name.split(".")[0]
    assert compiled.clean(strict=True), [d.text() for d in compiled.diagnostics]
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        golden.mkdir(parents=True, exist_ok=True)
        for old in golden.glob("*.job"):
            old.unlink()
        for job in compiled.jobs:
            (golden / job.filename).write_text(job.text)
    expected = {p.name: p.read_text() for p in golden.glob("*.job")}
    assert {j.filename: j.text for j in compiled.jobs} == expected


def test_a9_92c_renders_to_the_seed_job_plus_new_keys() -> None:
    compiled = compile_plan(REPO / "plans" / "a9.yaml", lint=False)  # linted by the golden test
    job = next(j for j in compiled.jobs if j.name == "92c-net-mai-code")
    lines = job.text.splitlines()
    seed = SEED_92C.splitlines()
    assert lines[:4] == seed[:4]
    assert lines[-1] == seed[-1]
    new = lines[4:-1]
    assert [ln.split("=")[0] for ln in new if "=" in ln] == ["# TIMEOUT", "# WARN_AFTER", "# OUTPUTS", "# PLAN"]
    # the header ends with a blank line, so no comment at the top of a body is read as a header key
    assert new[-2:] == ["# generated from a9.yaml by plan; do not edit", ""]


def test_a9_intakes_end_by_killing_their_own_server() -> None:
    compiled = compile_plan(REPO / "plans" / "a9.yaml", lint=False)
    intakes = [j for j in compiled.jobs if "-intake-" in j.name]
    assert len(intakes) >= 5
    for job in intakes:
        assert "trap stop_server EXIT" in job.text and 'kill -9 "$server"' in job.text


def test_a9_intakes_roster_refuses_the_seed_launch_flag(tmp_path: Path) -> None:
    text = (REPO / "plans/a9_intakes.py").read_text()
    bad = tmp_path / "a9_intakes.py"
    bad.write_text(text.replace('"--batch-size", "2048"', '"-b", "2048"'))
    compiled = compile_plan(bad, lint=False)
    assert [d.code for d in compiled.diagnostics] == ["P004"]
    line = bad.read_text().splitlines()[compiled.diagnostics[0].line - 1]
    assert line.strip().startswith('Model(name="mai-code-1.1-flash"')  # the roster entry with the flag
    assert "unsupported sampler flag: -b" in compiled.diagnostics[0].message


def test_demo_works_under_its_own_queue_root_by_default() -> None:
    # Relative paths: each queue (.plan/demo/ for `plan run`) has its own work files, so a newcomer's
    # first run never finds another run's outputs already there and skips every job.
    compiled = compile_plan(REPO / "plans" / "demo.yaml", lint=False)
    paths = [o.value for j in compiled.jobs for o in j.job.outputs]
    assert paths and all(p.startswith("work/") for p in paths)
    assert "/tmp" not in "".join(j.text for j in compiled.jobs)

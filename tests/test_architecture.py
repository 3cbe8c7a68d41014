"""The import rules of README's Architecture section, read from the source (a rule broken is a test failed)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTS = {
    "service",
    "core",
    "runstate",
    "scan",
    "facts",
    "schedule",
    "jobs",
    "outcomes",
    "reasons",
    "announce",
    "controls",
    "proctable",
    "problems",
    "manifest",
    "statusfile",
}
FOUNDATIONS = {
    "config",
    "records",
    "throttle",
    "queue",
    "files",
    "state",
    "jobfile",
    "conditions",
    "vocab",
    "procs",
    "leaks",
    "wrapper",
    "logs",
    "progress",
    "durations",
    "dirwatch",
}


def _imports(path: Path) -> set[str]:
    """Top-level module names imported by PATH (`runner.x` as `runner.x`), outside `if TYPE_CHECKING:`."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "runner":
                found.update(f"runner.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
    return found


def _runner(path: Path) -> set[str]:
    return {name.split(".")[1] for name in _imports(path) if name.startswith("runner.")}


def test_the_runner_imports_only_the_standard_library() -> None:
    for path in sorted((REPO / "runner").glob("*.py")):
        outside = {name.split(".")[0] for name in _imports(path)} - {"runner", "__future__"}
        assert outside <= set(sys.stdlib_module_names), f"{path.name} imports {outside - set(sys.stdlib_module_names)}"


def test_foundations_import_no_part_and_the_scheduler_does_no_io() -> None:
    for name in FOUNDATIONS:
        assert not _runner(REPO / "runner" / f"{name}.py") & PARTS, name
    assert _runner(REPO / "runner/schedule.py") <= {"procs", "queue", "runstate"}
    io = {"os", "subprocess", "shutil", "socket", "select", "signal", "fcntl", "time"}
    assert not _imports(REPO / "runner/schedule.py") & io


def test_the_plan_side_and_the_host_agents_use_contracts_not_the_service() -> None:
    users = [
        *sorted((REPO / "plancompiler").rglob("*.py")),
        REPO / "runner/agent.py",
        REPO / "runner/delivery.py",
        REPO / "runner/pushlock.py",
        REPO / "runner/bootstrap.py",
        REPO / "runner/slurm_agent.py",
    ]
    for path in users:
        assert not _runner(path) & PARTS - {"controls"}, f"{path.relative_to(REPO)} imports a part of the runner"

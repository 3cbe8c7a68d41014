"""The import rules of docs/architecture.md, read from the source (a rule broken is a test failed), and the
README that leads to it.

Every import counts: at the top, inside a function, and under `if TYPE_CHECKING:` (a circle that only the type
checker walks is still a circle a reader walks)."""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

import pytest

from tests import sources

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("plancompiler", "runner")
# One worker runs them all (`--dist loadgroup`), and the other tests that read the source (tests/sources.py: each
# file parsed once a process): spread over the workers, each that ran one of them parsed the files again (0.3-0.6 s
# of CPU each).
pytestmark = pytest.mark.xdist_group("architecture")
# The runner's parts (runner/service/, and the control requests it carries out) and its foundations: a
# foundation imports no part.
PARTS = {
    *(f"runner.service.{name}" for name in ("runner", "loop", "statusfile", "scan", "facts")),
    *(f"runner.service.{name}" for name in ("schedule", "dispatch", "jobs", "outcomes", "reasons", "announce")),
    *(f"runner.service.{name}" for name in ("proctable", "problems", "manifest", "gpu")),
    "runner.controls",
}
FOUNDATIONS = {
    f"runner.{name}"
    for name in (
        *("config", "records", "throttle", "queue", "files", "state", "jobfile", "conditions", "vocab"),
        *("procs", "wrapper", "logs", "progress", "durations", "readers", "runstate", "digest", "errors", "backoff"),
    )
} | {"runner.service.dirwatch", "runner.service.leaks", "runner.service.gpuread"}
# Each corridor (sub-package) and the modules of it that others may import: its door.
DOORS = {
    "plancompiler.shell": {"plancompiler.shell"},
    "plancompiler.watch": {"plancompiler.watch"},
    "plancompiler.report": {"plancompiler.report"},
    "plancompiler.top": {"plancompiler.top"},
    "plancompiler.cli": {"plancompiler.cli"},
    "plancompiler.commands": {
        "plancompiler.commands.add",
        "plancompiler.commands.operate",
        "plancompiler.commands.run",
        "plancompiler.commands.write",
    },
    # slurmstatus: the Slurm status reader, without the pydantic the rest of the Slurm backend needs (the watcher)
    "plancompiler.backends": {
        "plancompiler.backends",
        "plancompiler.backends.protocol",
        "plancompiler.backends.slurm",
        "plancompiler.backends.slurmstatus",
    },
    # wire: the session's framing, which the workstation writes and the agent reads (one implementation)
    "runner.agent": {"runner.agent.dispatch", "runner.agent.delivery", "runner.agent.unit", "runner.agent.wire"},
    # request and statusitems: the push request and the status answer, written on one side and read on the other
    "runner.slurm": {
        "runner.slurm.agent",
        "runner.slurm.attempt",
        "runner.slurm.ledger",
        "runner.slurm.wrapper",
        "runner.slurm.request",
        "runner.slurm.statusitems",
    },
    "runner.stamps": {"runner.stamps", "runner.stamps.judge", "runner.stamps.push"},
    "runner.alerts": {"runner.alerts.engine", "runner.alerts.book", "runner.alerts.notify"},
    "runner.estimates": {"runner.estimates"},
    "runner.views": {"runner.views.status", "runner.views.waiting"},
    "plancompiler.memo": {"plancompiler.memo.checkmemo", "plancompiler.memo.lintmemo", "plancompiler.memo.shapes"},
    # the service's own runner and loop, and for the control requests (a part kept at the top, beside the
    # other contracts) the two parts they act on
    "runner.service": {
        "runner.service.runner",
        "runner.service.loop",
        "runner.service.jobs",
        "runner.service.problems",
        "runner.service.gpu",  # `python3 -m runner gpus` reads the GPUs as the service does
    },
}
MAX_MODULES = 25  # modules in one folder, every .py counted (its door __init__.py and __main__.py too)
MAX_LINES = 450


def _name(path: Path) -> str:
    name = path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".")
    return name.removesuffix(".__init__")


@cache
def modules() -> dict[str, Path]:
    return {_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


@cache
def imports(module: str) -> frozenset[str]:
    """Every module MODULE imports (absolute or relative, top-level, in a function or for typing only): of
    ours, the module itself (`from runner import jobfile` is runner.jobfile); of others, the top-level name."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in sources.facts(path).imports:
        if node.module is None:
            found.update(node.names)
        else:
            base = node.module
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for name in node.names:
                full = f"{base}.{name}"
                found.add(full if full in modules() else base)
    return frozenset(found - {module})


def _ours(module: str) -> set[str]:
    return {name for name in imports(module) if name in modules()}


def test_the_runner_imports_only_the_standard_library() -> None:
    for module in modules():
        if module.split(".")[0] == "runner":
            outside = {name.split(".")[0] for name in imports(module)} - {"runner", "__future__"}
            assert outside <= set(sys.stdlib_module_names), f"{module} imports {outside - set(sys.stdlib_module_names)}"


def test_foundations_import_no_part_and_the_scheduler_does_no_io() -> None:
    assert FOUNDATIONS <= set(modules()) and PARTS <= set(modules())
    for module in FOUNDATIONS:
        assert not _ours(module) & PARTS, module
    assert _ours("runner.service.schedule") <= {"runner.procs", "runner.queue", "runner.runstate", "runner.records"}
    io = {"os", "subprocess", "shutil", "socket", "select", "signal", "fcntl", "time"}
    assert not imports("runner.service.schedule") & io


def test_the_plan_side_and_the_host_agents_use_contracts_not_the_service() -> None:
    users = [
        m for m in modules() if m.split(".")[0] == "plancompiler" or m.startswith(("runner.agent", "runner.slurm"))
    ]
    for module in [*users, "runner.pushlock"]:
        assert not _ours(module) & PARTS - {"runner.controls"}, f"{module} imports a part of the runner"


def test_no_import_circle_in_either_package() -> None:
    """An import walk that counts typing-only and function-level imports finds no circle."""
    assert "runner.service.statusfile" in modules() and "plancompiler.backends.queue" in modules()
    path: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        path.append(module)
        for target in sorted(_ours(module)):
            visit(target)
        path.pop()
        done.add(module)

    for module in modules():
        visit(module)


def test_each_corridor_is_entered_by_its_door() -> None:
    assert set(DOORS) == {m for m, p in modules().items() if p.name == "__init__.py" and "." in m}
    for module in modules():
        for target in _ours(module):
            for corridor, door in DOORS.items():
                inside = target == corridor or target.startswith(corridor + ".")
                if inside and not (module == corridor or module.startswith(corridor + ".")):
                    assert target in door, f"{module} imports {target}: enter {corridor} by {sorted(door)}"


def test_no_folder_holds_more_than_25_modules_and_no_module_more_than_450_lines() -> None:
    # every folder of Python in the repository, the tests' and the benches' too
    folders = {p.parent for top in (*PACKAGES, "tests", "bench") for p in (REPO / top).rglob("*.py")}
    assert REPO / "runner" in folders and REPO / "tests" / "watch" in folders
    for folder in folders:
        count = len(list(folder.glob("*.py")))
        assert count <= MAX_MODULES, f"{folder.relative_to(REPO)} holds {count} modules"
    for path in modules().values():
        rel = path.relative_to(REPO).as_posix()
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_LINES, f"{rel} is {lines} lines"


def test_no_test_module_imports_another() -> None:
    """What tests share lives in conftest.py and the helper modules (tests/sshd.py, tests/fullfs.py, ...): a test
    module imported by another runs its module-level code twice and ties one file's tests to the other's."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in sources.facts(path).imports:
            # `import tests.x.test_y`, `from tests.x.test_y import z`, and `from tests.x import test_y`
            names = (
                list(node.names) if node.module is None else [node.module, *(f"{node.module}.{n}" for n in node.names)]
            )
            found += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[-1].startswith("test_")]
    assert not found, found


def _part(word: str) -> str:
    name = word.split(".")[0]
    return "runner.controls" if name == "controls" else f"runner.service.{name}"


def test_the_architecture_table_says_what_each_part_imports() -> None:
    """docs/architecture.md's table: one row per part, naming exactly the other parts it imports."""
    text = (REPO / "docs/architecture.md").read_text()
    rows = re.findall(r"^\| `([\w.]+)`[^|]*\|[^|]*\| (.*) \|$", text, re.M)
    table = {_part(name): {_part(w) for w in re.findall(r"`([\w.]+)`", said)} for name, said in rows}
    assert set(table) == PARTS
    for part, said in table.items():
        assert _ours(part) & PARTS == said, (
            f"{part} imports {sorted(_ours(part) & PARTS)}; the table says {sorted(said)}"
        )


def test_the_readme_is_read_in_one_sitting_and_its_links_lead_somewhere() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)\)", readme + "".join(p.read_text() for p in (REPO / "docs").glob("*.md")))
    assert "docs/architecture.md" in links
    for link in links:
        if "://" not in link:
            assert (REPO / link).exists() or (REPO / "docs" / link).exists(), link

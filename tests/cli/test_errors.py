"""One error family (plancompiler/errors.py, runner/errors.py) and one handler at each command line's edge: every
error `plan` reports carries its exit code, the agent's error answers and Slurm's silent controller are typed,
and what a command raises is printed as `plan: MESSAGE` with that code, never a traceback."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from plancompiler import errors
from plancompiler.cli import app
from plancompiler.transport import Endpoint, classify
from tests.conftest import REPO, RunnerProcess, plan_cli

pytestmark = pytest.mark.usefixtures("plan_env")
# Exceptions that never reach the command line: each is caught where it is raised and becomes a finding or a
# value (a value refused by the escaper, a template error, a size limit, the light reader's doubt).
INTERNAL = {"Unreadable", "ContextError", "ValueRefused", "Unsure", "LimitExceeded", "WriteRefused", "LocatedError"}
FAMILY = {
    name for name, value in vars(errors).items() if isinstance(value, type) and issubclass(value, errors.PlanFailure)
}


def test_every_error_the_plan_side_reports_is_of_the_family() -> None:
    for path in sorted((REPO / "plancompiler").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id.endswith(("Exception", "Error")) for b in node.bases
            ):
                internal = node.name in INTERNAL or node.name.startswith("_")  # a module's own, caught in it
                kin = {b.id for b in node.bases if isinstance(b, ast.Name)} & FAMILY  # a kind of one of them
                assert internal or kin or path.name == "errors.py", f"{path.relative_to(REPO)}: {node.name}"
    codes = {cls: cls("x").code for cls in (errors.PlanError, errors.Unreachable, errors.AgentError)}
    assert codes == {errors.PlanError: 2, errors.Unreachable: 3, errors.AgentError: 1}
    assert errors.OperateError("x", 2).code == 2 and errors.AckError("x", 1).code == 1


def test_a_silent_slurm_controller_is_a_typed_error_not_a_message_to_match() -> None:
    endpoint = Endpoint(label="lab", root="/r")
    with pytest.raises(errors.ControllerDown) as raised:
        classify(endpoint, {"controller_down": "slurm_load_jobs error: Unable to contact slurm controller"})
    assert isinstance(raised.value, errors.Unreachable) and raised.value.code == 3  # every Unreachable path holds
    assert str(raised.value).startswith("lab: the Slurm controller did not answer: slurm_load_jobs")
    assert classify(endpoint, {"status": None}) == {"status": None}


def test_an_agent_error_answer_is_typed_with_where_it_came_from() -> None:
    assert errors.answered({"ok": 1}, "a9") == {"ok": 1}
    with pytest.raises(errors.AgentError) as raised:
        errors.answered({"error": "no queue at /x"}, "a9 (/x)")
    assert (str(raised.value), raised.value.where, raised.value.code) == ("a9 (/x): no queue at /x", "a9 (/x)", 1)
    with pytest.raises(errors.Refused):
        errors.answered({"error": "held"}, "a9", errors.Refused)


def test_every_command_is_behind_the_one_handler(tmp_path: Path) -> None:
    for info in app.registered_commands:
        assert info.callback is not None and hasattr(info.callback, "__wrapped__"), info.name
    # an error the command did not catch itself: printed by the edge with its code, nothing else
    code, out = plan_cli("status", str(tmp_path / "file"), "--timeout", "5")
    assert code == 1 and "plan: " in out and "Traceback" not in out
    (tmp_path / "file").write_text("not a queue\n")
    code, out = plan_cli("status", str(tmp_path / "file"))
    assert code == 1 and f"plan: {tmp_path / 'file'}" in out and "is not a directory" in out, out
    code, out = plan_cli("ack", str(tmp_path / "q"), "NOSUCH")
    assert code == 2 and "plan: unknown incident kind 'NOSUCH'" in out, out


def test_the_runner_ends_with_its_error_s_code(tmp_path: Path) -> None:
    serving = RunnerProcess(tmp_path / "q").start()
    try:
        second = subprocess.run(
            [sys.executable, "-m", "runner", "run", "--root", str(tmp_path / "q")],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            timeout=30,
        )
    finally:
        serving.stop()
    assert second.returncode == 3 and "runner: another runner (pid" in second.stderr, second.stderr

"""One error family (plancompiler/errors.py, runner/errors.py) and one handler at each command line's edge: every
error `plan` reports carries its exit code, the agent's error answers and Slurm's silent controller are typed,
and what a command raises is printed as `plan: MESSAGE` with that code, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plancompiler import errors
from plancompiler.cli import app
from plancompiler.transport import Endpoint, classify
from tests import sources
from tests.conftest import REPO, RunnerProcess, plan_cli

pytestmark = pytest.mark.usefixtures("plan_env")
# Exceptions that never reach the command line: each is caught where it is raised and becomes a finding or a
# value (a value refused by the escaper, a template error, a size limit, the light reader's doubt).
INTERNAL = {"Unreadable", "ContextError", "ValueRefused", "Unsure", "LimitExceeded", "WriteRefused", "LocatedError"}
FAMILY = {
    name for name, value in vars(errors).items() if isinstance(value, type) and issubclass(value, errors.PlanFailure)
}


@pytest.mark.xdist_group("architecture")  # beside the other tests that read the source: parsed once (tests/sources.py)
def test_every_error_the_plan_side_reports_is_of_the_family() -> None:
    for path in sorted((REPO / "plancompiler").rglob("*.py")):
        for node in sources.facts(path).classes:
            if any(base.endswith(("Exception", "Error")) for base in node.bases):
                internal = node.name in INTERNAL or node.name.startswith("_")  # a module's own, caught in it
                kin = set(node.bases) & FAMILY  # a kind of one of them
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
            [sys.executable, "-S", "-m", "runner", "run", "--root", str(tmp_path / "q")],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            timeout=30,
        )
    finally:
        serving.stop()
    assert second.returncode == 3 and "runner: another runner (pid" in second.stderr, second.stderr


@pytest.mark.xdist_group("architecture")
def test_the_agent_raises_its_errors_and_answers_them_in_one_place(tmp_path: Path) -> None:
    """A handler raises runner.errors.AgentError; runner.agent.dispatch.answer alone turns it into the answer,
    and the plan side types that answer into its family."""
    from runner.agent.dispatch import answer
    from runner.errors import AgentError, ControllerDown

    file, root = tmp_path / "file", tmp_path / "q"
    file.write_text("not a queue\n")
    root.mkdir()
    assert answer("status", str(file), {}) == {"error": f"no queue at {file} ({file} is not a directory)"}
    assert answer("logs", str(root), {"job": "../x"}) == {"error": "bad job name '../x'"}
    assert answer("nosuch", str(root), {}) == {"error": "the queue backend has no 'nosuch' request"}
    said = answer("control", str(root), {"job": "a.job", "action": "explode"})
    assert list(said) == ["error"] and "explode" in said["error"], said
    root.chmod(0o777)
    try:
        refused = answer("status", str(root), {})
    finally:
        root.chmod(0o700)
    assert refused["error"].startswith(f"refusing the queue root {root}: ") and refused["untrusted"], refused
    assert ControllerDown("squeue: timed out").answer() == {"controller_down": "squeue: timed out"}
    # no handler of the agent writes an error answer of its own: it raises (dispatch.py is the one place)
    handlers = [
        *(REPO / "runner/agent").glob("*.py"),
        *(REPO / "runner/slurm").glob("*.py"),
        REPO / "runner/pushlock.py",
    ]
    for path in sorted(handlers):
        for line, keys in sources.facts(path).dict_keys:
            if path.name != "dispatch.py":
                assert not keys & {"error", "controller_down"}, f"{path.relative_to(REPO)}:{line}"
    # the plan side: the same answers, typed
    endpoint = Endpoint(label="lab", root="/r")
    with pytest.raises(errors.ControllerDown):
        classify(endpoint, ControllerDown("squeue: timed out").answer())
    assert errors.agent_error(AgentError("no queue").answer()) == "no queue" and errors.agent_error({}) is None
    with pytest.raises(errors.Refused, match="^lab: no queue$"):
        errors.answered(AgentError("no queue").answer(), "lab", errors.Refused)

"""The processes started over and over load only what they use (bench/startup_bench.py times them): an agent
answering `status` loads neither the push's delivery nor the runner's command line (nor typing: its annotations
are never evaluated), a push's session no dataclasses, a Slurm attempt neither the runner's Config nor the
ledger's records (nor typing, nor dataclasses), `plan --version` not typer, `plan status` not the watcher's loop
and senders, and a runner's start neither the push side nor dataclasses (nor the GPU watch, where no gpu job
waits). Each is a real process whose sys.modules (or `-X importtime` list) is read; no timing is asserted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_for

REPO = Path(__file__).resolve().parent.parent


def _loaded(code: str, *args: str, stdin: str = "", site: bool = False) -> set[str]:
    """The modules a fresh interpreter running CODE (which ends by printing nothing else) had loaded at its end."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    argv = [sys.executable, *([] if site else ["-S"]), "-c", script, *args]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_an_agent_answering_status_loads_only_its_handler(queue_root: Path) -> None:
    code = "import sys\nfrom runner.__main__ import main\nmain(sys.argv[1:])\nprint()"
    loaded = _loaded(code, "agent", "status", str(queue_root), stdin="{}")
    assert "runner.agent.handlers" in loaded  # it did answer
    assert not loaded & {
        "runner.agent.delivery",
        "runner.agent.bootstrap",
        "runner.agent.adhoc",
        "runner.cli",
        "runner.config",
        "runner.jobfile",
        "argparse",
        "subprocess",
        "tempfile",
        "typing",
        "dataclasses",
        "shutil",
        "hashlib",
    }


def test_a_push_session_loads_no_dataclasses(queue_root: Path) -> None:
    """Probe, lock and install, one request a line as `plan push` sends them: the job file's parser and the
    stamps are the push's, the runner's Config and its dataclasses are not (nor OpenSSL: digests are builtin)."""
    requests = [
        {"mode": "probe", "create": True},
        {"mode": "lock", "wait_s": 5, "create": True},
        {"mode": "install", "files": {"a.job": "# LANE=cpu\ntrue\n"}, "create": True},
    ]
    code = "import sys\nfrom runner.__main__ import main\nmain(sys.argv[1:])"
    stdin = "".join(json.dumps(r) + "\n" for r in requests)
    loaded = _loaded(code, "agent", "session", str(queue_root), stdin=stdin)
    assert (queue_root / "queue" / "a.job").read_text() == "# LANE=cpu\ntrue\n"  # it did install
    assert {"runner.agent.delivery", "runner.jobfile", "runner.stamps"} <= loaded
    assert not loaded & {"dataclasses", "inspect", "runner.config", "runner.conditions", "hashlib", "argparse"}


def test_a_slurm_attempt_loads_neither_the_runners_config_nor_the_ledgers_records(tmp_path: Path) -> None:
    """A real attempt of a job with no DONE_IF or gate, outside Slurm (no squeue on its PATH: it cannot ask
    Slurm and takes its body's exit): its result written, what it imported read at its end."""
    from runner.slurm.bundle import Element
    from runner.slurm.wrapper import write_bundle

    root, out, bin_ = tmp_path / "root", tmp_path / "modules.json", tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "bash").symlink_to(shutil.which("bash") or "/bin/bash")
    body, log = root / "scripts" / "p" / "a.sh", root / "logs" / "p" / "a.log"
    element = Element(root=str(root), plan="p", name="a", body=str(body), log=str(log), text="true\n")
    bundle = write_bundle(str(root), "p", [element])
    code = (
        "import json, sys\nfrom runner.slurm.attempt import main\nrc = main(sys.argv[1:4])\n"
        "open(sys.argv[4], 'w').write(json.dumps([rc, sorted(sys.modules)]))"
    )
    argv = [sys.executable, "-S", "-c", code, str(bundle), "1", "0", str(out)]
    env = {"PATH": str(bin_), "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}
    subprocess.run(argv, cwd=REPO, env=env, timeout=60, check=True)
    rc, loaded = json.loads(out.read_text())
    assert rc == 0, log.read_text()
    assert json.loads((root / "results" / "p" / "a" / "0.json").read_text())["state"] == "COMPLETED"
    assert {"runner.slurm.bundle", "runner.slurm.result", "runner.pushlock"} <= set(loaded)
    assert not set(loaded) & {"runner.config", "runner.slurm.records", "runner.slurm.ledger", "hashlib", "typing"}
    assert not set(loaded) & {"dataclasses", "inspect"}  # its records are runner.records' Frozen
    assert "runner.conditions" not in loaded  # loaded by a job with a DONE_IF or a gate only


def test_plan_version_loads_no_typer() -> None:
    loaded = _loaded("from plancompiler.cli import main\nmain(['--version'])", site=True)
    assert "runner" in loaded  # the banner is the runner package's
    assert not {m for m in loaded if m.split(".")[0] in ("typer", "click", "pydantic", "jinja2", "yaml")}
    assert "plancompiler.cli.assembly" not in loaded


def test_plan_status_loads_no_watcher_loop_or_senders(queue_root: Path) -> None:
    loaded = _loaded(
        "import sys\nfrom plancompiler.cli import main\nmain(sys.argv[1:])", "status", str(queue_root), site=True
    )
    assert "plancompiler.watch.screen" in loaded  # it did print the status
    assert not loaded & {"plancompiler.watch.loop", "runner.alerts.notify", "http.client", "ssl", "apprise"}


def test_a_runner_start_loads_no_push_side(queue_root: Path) -> None:
    """A real runner to its first tick (status.json), then SIGTERM: what it imported, from `-X importtime`."""
    argv = [sys.executable, "-S", "-X", "importtime", "-m", "runner", "run", "--root", str(queue_root), "--settle", "0"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (queue_root / "status.json").exists() or proc.poll() is not None, 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert (queue_root / "status.json").exists(), err[-2000:]
    loaded = {line.rpartition("|")[2].strip() for line in err.splitlines() if line.startswith("import time:")}
    assert {"runner.service.runner", "runner.service.pending"} <= loaded
    assert not loaded & {"runner.agent.delivery", "runner.pushlock", "tempfile"}
    assert not loaded & {"dataclasses", "inspect", "ast"}  # its records are runner.records' (no class generated)
    assert not loaded & {"runner.service.gpu", "runner.service.gpuread"}  # made at a first look at the GPUs
    assert os.path.exists(queue_root / "events.jsonl")


def test_every_name_the_watch_door_offers_is_found_in_its_part() -> None:
    """The door lists its names three times (for mypy, for the lazy table, in __all__): none may drift."""
    import plancompiler.watch as door

    assert sorted(door._PARTS) == sorted(door.__all__)
    for name in door.__all__:
        assert getattr(door, name) is not None, name


def test_an_agent_answering_status_loads_no_pushlock_and_a_session_still_releases(queue_root: Path) -> None:
    """The agent releases its locks at its end through runner.pushlock only where a request loaded it (a lock,
    and a root made for a push, live in that module's state); a status answer takes none. A session's lock is
    still released at stdin's end: the root its lock made, never installed into, is removed."""
    code = "import sys\nfrom runner.__main__ import main\nmain(sys.argv[1:])\nprint()"
    loaded = _loaded(code, "agent", "status", str(queue_root), stdin="{}")
    assert "runner.agent.handlers" in loaded and "runner.pushlock" not in loaded
    made = queue_root.parent / "made-by-a-lock"
    stdin = json.dumps({"mode": "lock", "wait_s": 0, "create": True}) + "\n"
    argv = [sys.executable, "-S", "-m", "runner", "agent", "session", str(made)]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    assert json.loads(proc.stdout.splitlines()[0]) == {"locked": True}, proc.stdout
    assert not made.exists()

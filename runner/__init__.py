"""The box side: a standard-library queue runner for bash job files (contracts 1, 2, 3, 5); and who is talking:
the package version, the commit it was built from, the formats it reads and writes, how this runner was started.

A workstation and a box exchange these at the first contact of a push (the probe): the box answers with the
formats of what it holds (manifest.json's, and its runner's from status.json), and a client that would write an
older format than the box holds is refused, naming both versions and the upgrade command, instead of rewriting
manifest.json in its old shape (which dropped every other plan's ownership and the generation).
"""

from __future__ import annotations

import functools
import os

TYPE_CHECKING = False  # typing is not loaded at run time: an agent's start is ~10 % shorter without it
if TYPE_CHECKING:
    from typing import Any, Mapping

__version__ = "0.1.0"
# Bumped when a job file written by the compiler needs a newer runner to be read (2: the GPUS and PRIORITY
# headers). A job file that uses nothing newer needs only the format that introduced what it uses
# (runner.jobfile.format_needed).
FORMAT_VERSION = 2
# The oldest Python the runner package imports and runs under (a login node's own, often 3.8 or 3.9): the
# loader that starts it on a host checks this first (plancompiler/transport.py); tests/test_python_floor.py
# and vermin in .ci/run hold the package to it.
PYTHON_MIN = (3, 8)

# manifest.json's shape: 2 = every plan's record and `generation`; 3 = each record's `source` (who pushed it from
# where: user@host, the plan file's path and content hash) and the writer's identity (`written_by`).
MANIFEST_VERSION = 3
# events.jsonl's shape (contract 3): the seed's keys, `ts` `job` `event` then details.
EVENTS_VERSION = 1
# Set for a runner `plan bootstrap --start` (runner/agent/detach.py) or `plan run` started; status.json's
# `runner.started_by`.
STARTED_ENV = "PLAN_RUNNER_STARTED"
# The file beside this package that a build (the zipapp a push sends, `plan bootstrap`'s copy) bakes the commit into.
COMMIT_FILE = "COMMIT"
UPGRADE = "python3 -m pip install -U plancompiler (or `git pull` in its checkout)"


def formats() -> dict[str, int]:
    """The formats this package writes (and reads up to): manifest.json, events.jsonl, the job header."""
    return {"manifest": MANIFEST_VERSION, "events": EVENTS_VERSION, "job": FORMAT_VERSION}


@functools.lru_cache(maxsize=1)
def commit() -> str:
    """The commit this package was built from: baked in COMMIT (a zipapp, a bootstrapped copy), else read from
    git when it runs from a checkout; "" when neither can tell."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        with open(os.path.join(here, COMMIT_FILE), encoding="utf-8") as handle:
            baked = handle.read().strip()
        if baked:
            return baked[:40]
    except OSError:
        pass
    top = os.path.dirname(here)
    if not os.path.exists(os.path.join(top, ".git")):
        return ""
    import subprocess  # only to ask git, once: every Slurm wrapper imports this package

    try:
        proc = subprocess.run(
            ["git", "-C", top, "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def identity() -> dict[str, Any]:
    """What this side says about itself at the first contact."""
    return {"version": __version__, "commit": commit(), "formats": formats()}


def describe(who: Any) -> str:
    """`0.1.0 (commit 1a2b3c4d5e6f)` for an identity; `an unknown version` for anything else."""
    if not isinstance(who, dict) or not isinstance(who.get("version"), str):
        return "an unknown version"
    made = who.get("commit")
    return f"{who['version']}" + (f" (commit {made})" if isinstance(made, str) and made else "")


def banner(program: str) -> str:
    """`plan --version` and `runner --version`: the version, the commit and the formats."""
    own = identity()
    shapes = ", ".join(f"{k} {v}" for k, v in own["formats"].items())
    return f"{program} {describe(own)}; formats: {shapes}"


def refusal(holds: dict[str, Any], client: Any, where: str) -> str | None:
    """Why CLIENT (an identity) must not write to a root whose files are in the formats HOLDS ({"manifest": N,
    "written_by": identity}); None when it may. A request that says nothing of its client comes from this very
    code (the agent is the client's own package), so only a client that names an older format is refused."""
    theirs = client.get("formats") if isinstance(client, dict) else None
    writes = theirs.get("manifest") if isinstance(theirs, dict) else None
    if not isinstance(writes, int):
        return None
    held = holds.get("manifest")
    if not isinstance(held, int) or held <= writes:
        return None
    return (
        f"manifest.json on {where} is format {held}, written by plancompiler {describe(holds.get('written_by'))}; "
        f"this plancompiler {describe(client)} writes format {writes} and would drop what it does not know: "
        f"upgrade it first: {UPGRADE}"
    )


def how_started(env: Mapping[str, str]) -> str:
    """How this runner process was started, as `plan status` shows it."""
    if env.get(STARTED_ENV):
        return env[STARTED_ENV]
    if env.get("INVOCATION_ID"):  # systemd sets it for every unit it starts
        return "systemd unit"
    return "by hand"

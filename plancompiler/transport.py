"""One bounded call to `python3 -m runner agent` on a host over ssh, or to its handlers in this process for a
local root, classified by how it ended.

A remote host runs the runner package this workstation has: a zipapp built in memory, cached on the host
by its content hash (ROOT/.plan-runner/runner-HASH.pyz; ~/.cache/plan-runner/ while ROOT does not exist yet),
so an unchanged runner costs no bytes; or the copy `plan bootstrap` installed there when its hash is the same.
"Could not reach" (Unreachable, exit 3) and "the command there failed" (RemoteFailed) are different outcomes;
a queue the agent could not read is an answer.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import shlex
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import runner as runner_package
from plancompiler.diagnostics import PlanError
from plancompiler.errors import ControllerDown
from plancompiler.errors import RemoteFailed as RemoteFailed  # their home is plancompiler/errors.py
from plancompiler.errors import Unreachable as Unreachable
from plancompiler.tools import run_command

SSH_UNREACHABLE = 255
RUNNER_MISSING = 97  # the loader's exit when this runner's hash is not cached on the host
PYTHON_TOO_OLD = 96  # the loader's exit on an interpreter older than runner.PYTHON_MIN (stderr: VERSION EXECUTABLE)

# Run on the host as `python3 -c LOADER HASH MODE ROOT [SECONDS]` (or HASH --upload ROOT with the zip on stdin).
# SECONDS (one call, never a session): the call's own limit; the agent ends itself (SIGALRM) a little after it,
# so a call whose client gave up never leaves an agent process behind on the host.
# It only finds or stores the runner package; everything else is the package's own `runner.agent.dispatch`.
# It is plain enough for any Python 3 to run, so that an older one is named, not a SyntaxError's traceback.
LOADER = r"""
import hashlib, os, sys
if sys.version_info < PYTHON_MIN:
    sys.stderr.write("%d.%d.%d %s\n" % (tuple(sys.version_info[:3]) + (sys.executable,)))
    sys.exit(96)
h, mode, root = sys.argv[1:4]
if len(sys.argv) > 4:
    import signal
    signal.alarm(max(1, int(float(sys.argv[4])) + 2))
root = os.path.expanduser(root)
cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "plan-runner")
# Stored under the root once it exists; found under the root or in the user's cache (where a push to a
# root that did not exist yet left it), so no call uploads the same package twice.
bases = [os.path.join(root, ".plan-runner"), cache] if os.path.isdir(root) else [cache]
if mode == "--upload":
    data = sys.stdin.buffer.read()
    if hashlib.sha256(data).hexdigest()[:32] != h:
        sys.exit("plan: the runner package arrived damaged")
    for base in bases:
        try:
            os.makedirs(base, exist_ok=True)
            tmp = os.path.join(base, ".runner-%s.%d.tmp" % (h, os.getpid()))
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, os.path.join(base, "runner-%s.pyz" % h))
            sys.exit(0)
        except OSError as exc:
            error = exc
    sys.exit("plan: cannot store the runner package: %s" % error)
def unpacked(base, pyz):
    # A zip import compiles every module on every call; unpacked once beside the zip (renamed into place
    # whole, so never seen half-written), the runner's bytecode is cached there. Else the zip, as it is.
    d = os.path.join(base, "runner-%s.d" % h)
    if not os.path.isdir(d):
        import shutil, zipfile
        tmp = os.path.join(base, ".runner-%s.%d.d" % (h, os.getpid()))
        try:
            with zipfile.ZipFile(pyz) as archive:
                archive.extractall(tmp)
            os.rename(tmp, d)
        except (OSError, zipfile.BadZipFile):
            shutil.rmtree(tmp, ignore_errors=True)
    return d if os.path.isfile(os.path.join(d, "runner", "agent", "dispatch.py")) else pyz
for base in bases:
    if os.path.isfile(os.path.join(base, "runner-%s.pyz" % h)):
        sys.path.insert(0, unpacked(base, os.path.join(base, "runner-%s.pyz" % h)))
        break
    try:
        with open(os.path.join(base, "runner.hash")) as found:
            if found.read().strip() == h:
                sys.path.insert(0, base)
                break
    except OSError:
        pass
else:
    sys.exit(97)
from runner.agent.dispatch import main
sys.exit(main([mode, root]))
""".replace("PYTHON_MIN", repr(runner_package.PYTHON_MIN))


# A round trip longer than a day is a mistake (a misplaced unit), not a plan: and ssh needs an integer.
MAX_TIMEOUT_S = 86400.0


def check_timeout(value: float, what: str = "timeout") -> float:
    """VALUE if it is a usable number of seconds (finite, above 0, at most a day); else a PlanError (exit 2)."""
    if not isinstance(value, (int, float)) or not (0 < value <= MAX_TIMEOUT_S):  # nan fails every comparison
        raise PlanError(f"{what} {value!r}: give seconds above 0 and at most {MAX_TIMEOUT_S:g} (a day)")
    return float(value)


def limit_for(timeout: float | None, endpoint: Endpoint) -> float:
    """The round trip's limit: TIMEOUT as given (0 and negatives are refused, not taken for the default)."""
    if timeout is None:
        return check_timeout(endpoint.timeout, f"{endpoint.label}: timeout")
    return check_timeout(timeout)


@dataclass(frozen=True)
class Endpoint:
    """Where a queue root is and how to reach it; `label` names it in messages."""

    label: str
    root: str
    ssh: str | None = None
    ssh_options: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    timeout: float = 60.0
    python: str = "python3"


def runner_sources() -> dict[str, str]:
    """The runner package, file by file (its sub-packages too): it is standard library only, so a copy is all a
    host needs. The commit it was built from goes with it (runner/COMMIT), so the box says which code it runs."""
    from runner import COMMIT_FILE, commit

    base = Path(runner_package.__file__).resolve().parent
    files = {f"runner/{p.relative_to(base).as_posix()}": p.read_text() for p in sorted(base.rglob("*.py"))}
    if commit():
        files[f"runner/{COMMIT_FILE}"] = commit() + "\n"
    return files


@functools.lru_cache(maxsize=1)
def runner_zip() -> tuple[str, bytes]:
    """(content hash, zipapp bytes) of the runner package; byte-identical for identical sources."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        files = {**runner_sources(), "__main__.py": "import sys\nfrom runner.__main__ import main\nsys.exit(main())\n"}
        for name, text in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, text)
    data = buffer.getvalue()
    return hashlib.sha256(data).hexdigest()[:32], data


def _ssh(endpoint: Endpoint, *remote: str) -> list[str]:
    assert endpoint.ssh is not None
    connect = max(1, round(check_timeout(endpoint.connect_timeout, f"{endpoint.label}: connect_timeout")))
    return [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect}",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=2",
        *endpoint.ssh_options,
        endpoint.ssh,
        " ".join(shlex.quote(a) for a in remote),
    ]


def agent_argv(endpoint: Endpoint, mode: str, limit: float | None = None) -> list[str]:
    """The command that runs the agent in MODE on ENDPOINT's root over ssh (a local root's agent runs in-process,
    plancompiler/localagent.py); with LIMIT, the agent ends itself a little after it."""
    digest, _ = runner_zip()
    bound = [f"{limit:g}"] if limit is not None else []
    return _ssh(endpoint, endpoint.python, "-c", LOADER, digest, mode, endpoint.root, *bound)


def upload(endpoint: Endpoint, timeout: float | None = None) -> None:
    """Store this runner package on the host (once per content hash)."""
    digest, data = runner_zip()
    argv = _ssh(endpoint, endpoint.python, "-c", LOADER, digest, "--upload", endpoint.root)
    check_exit(endpoint, *_timed(argv, limit_for(timeout, endpoint), data))


def _timed(argv: list[str], limit: float, stdin: str | bytes | None) -> tuple[int, str, str, float, float]:
    started = time.monotonic()
    rc, out, err = run_command(argv, timeout=limit, stdin=stdin)
    return rc, out, err, time.monotonic() - started, limit


def check_exit(endpoint: Endpoint, rc: int, out: str, err: str, took: float, limit: float) -> None:
    if rc == PYTHON_TOO_OLD:
        raise RemoteFailed(python_too_old(endpoint, err))
    if rc == 124 and took >= limit - 0.5:
        raise Unreachable(f"{endpoint.label}: no answer within {limit:g}s")
    if endpoint.ssh is not None and rc == SSH_UNREACHABLE:
        last = err.strip().splitlines()[-1] if err.strip() else "exit 255"
        raise Unreachable(f"{endpoint.label}: ssh could not connect: {last}")
    if rc != 0:
        raise RemoteFailed(f"{endpoint.label}: the command on the host failed (exit {rc}): {err.strip()[-400:]}")


def python_too_old(endpoint: Endpoint, err: str) -> str:
    """What to say when the host's interpreter is older than the runner's floor (the loader's exit 96)."""
    found = (err.strip().splitlines() or [""])[-1].split(" ", 1)
    version, where = found[0] or "?", found[1] if len(found) > 1 else endpoint.python
    floor = ".".join(str(n) for n in runner_package.PYTHON_MIN)
    return (
        f"{endpoint.label}: `{endpoint.python}` there is Python {version} ({where}); the runner needs Python "
        f"{floor} or newer: name a newer interpreter on that host with `python:` in its hosts-file entry "
        f"(python: /usr/bin/python3.11, or a module's or conda's python3)"
    )


def decode(endpoint: Endpoint, out: str) -> dict[str, Any]:
    try:
        result = json.loads(out)
    except ValueError as exc:
        raise RemoteFailed(f"{endpoint.label}: the host's answer is not JSON: {out[:200]!r}") from exc
    return classify(endpoint, result, out)


def classify(endpoint: Endpoint, result: Any, out: str = "") -> dict[str, Any]:
    if not isinstance(result, dict):
        raise RemoteFailed(f"{endpoint.label}: the host's answer is not a JSON object: {out[:200]!r}")
    if "controller_down" in result:
        raise ControllerDown(f"{endpoint.label}: the Slurm controller did not answer: {result['controller_down']}")
    return result


def call(endpoint: Endpoint, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """One round trip over ssh: the agent answers REQUEST in MODE (two more, once, if the host lacks this runner)."""
    limit = limit_for(timeout, endpoint)
    payload = json.dumps(request)
    argv = agent_argv(endpoint, mode, limit)
    rc, out, err, took, _ = _timed(argv, limit, payload)
    # Twice at most: a push beside this one may create the root between the upload (to the user's cache,
    # while there is no root) and the retry (which then looks under the root).
    for _ in range(2):
        if rc != RUNNER_MISSING:
            break
        upload(endpoint, limit)
        rc, out, err, took, _ = _timed(argv, limit, payload)
    check_exit(endpoint, rc, out, err, took, limit)
    return decode(endpoint, out)

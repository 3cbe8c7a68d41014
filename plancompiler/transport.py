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
from plancompiler.tools import TOO_LARGE, run_command

SSH_UNREACHABLE = 255
RUNNER_MISSING = 97  # the loader's exit when this runner's hash is not cached on the host
PYTHON_TOO_OLD = 96  # the loader's exit on an interpreter older than runner.PYTHON_MIN (stderr: VERSION EXECUTABLE)

# Run on the host as `python3 -S -c LOADER HASH TREE MODE ROOT [SECONDS]` (or HASH TREE --upload ROOT with the zip
# on stdin). -S: the runner is standard library only, and the host's site-packages (.pth files that import at
# every start: an editable install, conda's, certifi) cost most of an agent's start-up, ~45 of ~55 ms here.
# SECONDS (one call, never a session): the call's own limit; the agent ends itself (SIGALRM) a little after it,
# so a call whose client gave up never leaves an agent process behind on the host.
# It only finds, checks or stores the runner package; everything else is the package's own `runner.agent.dispatch`.
# It is plain enough for any Python 3 to run, so that an older one is named, not a SyntaxError's traceback.
# Nothing is imported that was not checked: a cached zip by HASH (sha256 of its bytes), an unpacked copy and
# a `plan bootstrap` copy by TREE (sha256 of every .py file's name and bytes), each in directories that only
# this user or root can write (their bytecode is trusted as those directories are); a copy that does not
# match is ignored, and the workstation uploads the package again. Loads at once never disturb each other: bytecode
# that vanished while one checked a copy is no mismatch, and one load at a time (a lock beside the copy) unpacks.
LOADER = r"""
import hashlib, os, stat, sys
if sys.version_info < PYTHON_MIN:
    sys.stderr.write("%d.%d.%d %s\n" % (tuple(sys.version_info[:3]) + (sys.executable,)))
    sys.exit(96)
h, tree, mode, root = sys.argv[1:5]
if len(sys.argv) > 5:
    import signal
    signal.alarm(max(1, int(float(sys.argv[5])) + 2))
os.umask(0o077)  # what it unpacks and the bytecode Python caches are this user's alone, whatever ssh's umask
root = os.path.expanduser(root)
cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "plan-runner")
# Stored under the root once it exists; found under the root or in the user's cache (where a push to a
# root that did not exist yet left it), so no call uploads the same package twice.
bases = [os.path.join(root, ".plan-runner"), cache] if os.path.isdir(root) else [cache]
me = os.geteuid()
def trusted(path, kind=stat.S_ISDIR):
    # Ours or root's, a real directory (or file), writable by nobody else (a setgid group share excepted).
    try:
        st = os.lstat(path)
    except OSError:
        return False
    shared = st.st_mode & 0o2000 and st.st_mode & 0o020
    return kind(st.st_mode) and st.st_uid in (me, 0) and not st.st_mode & 0o002 and (shared or not st.st_mode & 0o020)
def read(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        return f.read()
def tree_of(top):
    # TREE of the runner/ package under TOP; None if anything in it (bytecode included) is not trusted.
    found = []
    for at, dirs, files in os.walk(os.path.join(top, "runner")):
        if not trusted(at):
            return None
        dirs.sort()
        for name in files:
            path = os.path.join(at, name)
            if not trusted(path, stat.S_ISREG):
                if not name.endswith(".py") and not os.path.lexists(path):
                    continue  # bytecode another load wrote as a temporary file and renamed meanwhile
                return None
            if name.endswith(".py"):
                found.append((os.path.relpath(path, top).replace(os.sep, "/"), path))
    digest = hashlib.sha256()
    try:
        for rel, path in sorted(found):
            digest.update(rel.encode() + b"\0" + read(path) + b"\0")
    except OSError:
        return None
    return digest.hexdigest()[:32] if found else None
if mode == "--upload":
    data = sys.stdin.buffer.read()
    if hashlib.sha256(data).hexdigest()[:32] != h:
        sys.exit("plan: the runner package arrived damaged")
    error = "no directory of ours to store it in"
    for base in bases:
        try:
            if not os.path.isdir(base):
                os.makedirs(base, 0o700)
                os.chmod(base, 0o700)
            if not trusted(base):
                error = "%s is not ours alone" % base
                continue
            tmp = os.path.join(base, ".runner-%s.%d.tmp" % (h, os.getpid()))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                os.fchmod(fd, 0o600)
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, os.path.join(base, "runner-%s.pyz" % h))
            sys.exit(0)
        except OSError as exc:
            error = exc
    sys.exit("plan: cannot store the runner package: %s" % error)
def unpacked(base):
    # A zip import compiles every module on every call; unpacked beside the zip (from its checked bytes,
    # renamed into place whole, so never seen half-written), the runner's bytecode is cached there.
    d = os.path.join(base, "runner-%s.d" % h)
    if tree_of(d) == tree:
        return d
    pyz = os.path.join(base, "runner-%s.pyz" % h)
    try:
        data = read(pyz) if trusted(pyz, stat.S_ISREG) else b""
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest()[:32] != h:
        return None  # missing, or not what the workstation sent: uploaded again
    import fcntl, io, shutil, zipfile
    tmp = os.path.join(base, ".runner-%s.%d.d" % (h, os.getpid()))
    old = os.path.join(base, ".runner-%s.%d.old" % (h, os.getpid()))
    lock = None
    try:
        # One load unpacks at a time; the others wait, then find its copy: a copy another load just put in
        # place (and may be importing from) is never set aside for a second one.
        lock = os.open(os.path.join(base, "runner-%s.lock" % h), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tree_of(d) == tree:
            return d
        os.mkdir(tmp, 0o700)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            archive.extractall(tmp)
        if tree_of(tmp) != tree:
            raise OSError("the unpacked package does not match")
        if os.path.lexists(d):
            os.rename(d, old)  # a copy that does not match (or a stray file): set aside, then removed
        os.rename(tmp, d)
    except (OSError, zipfile.BadZipFile):
        shutil.rmtree(tmp, ignore_errors=True)
        return pyz  # checked above; imported as it is (its directory is ours alone)
    finally:
        if lock is not None:
            os.close(lock)
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        elif os.path.lexists(old):
            os.unlink(old)
    return d
for base in bases:
    if not trusted(base):
        continue
    found = unpacked(base)
    if found:
        sys.path.insert(0, found)
        break
    try:
        if read(os.path.join(base, "runner.hash")).decode().strip() == h and tree_of(base) == tree:
            sys.path.insert(0, base)
            break
    except (OSError, ValueError):
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
    max_answer_bytes: int = 16 << 20  # stdout and stderr of one call together; past it, cut off (RemoteFailed)


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
def runner_tree() -> str:
    """The loader's TREE: sha256 of each runner/ .py file's name and bytes, in name order (an unpacked or
    bootstrapped copy on a host must hash to it before it is imported)."""
    digest = hashlib.sha256()
    for name, text in sorted(runner_sources().items()):
        if name.startswith("runner/") and name.endswith(".py"):
            digest.update(name.encode() + b"\0" + text.encode("utf-8") + b"\0")
    return digest.hexdigest()[:32]


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
    return _ssh(endpoint, endpoint.python, "-S", "-c", LOADER, digest, runner_tree(), mode, endpoint.root, *bound)


def upload(endpoint: Endpoint, timeout: float | None = None) -> None:
    """Store this runner package on the host (once per content hash)."""
    digest, data = runner_zip()
    argv = _ssh(endpoint, endpoint.python, "-S", "-c", LOADER, digest, runner_tree(), "--upload", endpoint.root)
    check_exit(endpoint, *_timed(argv, limit_for(timeout, endpoint), data, endpoint.max_answer_bytes))


def _timed(
    argv: list[str], limit: float, stdin: str | bytes | None, max_bytes: int
) -> tuple[int, str, str, float, float]:
    """One ssh call: its deadline holds however fast the host sends, and at most MAX_BYTES of it are read."""
    started = time.monotonic()
    rc, out, err = run_command(argv, timeout=limit, stdin=stdin, max_bytes=max_bytes)
    return rc, out, err, time.monotonic() - started, limit


def check_exit(endpoint: Endpoint, rc: int, out: str, err: str, took: float, limit: float) -> None:
    if rc == PYTHON_TOO_OLD:
        raise RemoteFailed(python_too_old(endpoint, err))
    if rc == TOO_LARGE:
        raise RemoteFailed(
            f"{endpoint.label}: the host's answer passed {endpoint.max_answer_bytes} bytes and was cut off "
            "(a host that answers without end, or a queue larger than max_answer_mb in the hosts file allows)"
        )
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
    rc, out, err, took, _ = _timed(argv, limit, payload, endpoint.max_answer_bytes)
    # Twice at most: a push beside this one may create the root between the upload (to the user's cache,
    # while there is no root) and the retry (which then looks under the root).
    for _ in range(2):
        if rc != RUNNER_MISSING:
            break
        upload(endpoint, limit)
        rc, out, err, took, _ = _timed(argv, limit, payload, endpoint.max_answer_bytes)
    check_exit(endpoint, rc, out, err, took, limit)
    return decode(endpoint, out)

"""The host side of push/status/watch: one stdlib script run as `python3 -c AGENT MODE ROOT`, JSON in and out.

It is sent whole over ssh (or run locally), so it imports nothing from this project. It exits 0
whenever it ran, and reports a queue it cannot read as {"error": ...}: "could not reach", "the
remote command failed" and "the queue says X" never mix.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time

STATES = ("queue", "running", "done", "failed")
STAGE_PREFIX = ".plan-stage-"


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _atomic(path, data):
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _plan_header(data):
    for line in data.split(b"\n")[:40]:
        if line.startswith(b"# PLAN="):
            return line[7:].decode("utf-8", "replace").strip()
        if line and not line.startswith(b"#"):
            break
    return None


def probe(root, request):
    files = {}
    for state in STATES:
        entries = {}
        try:
            names = os.listdir(os.path.join(root, state))
        except FileNotFoundError:
            names = []
        for name in names:
            if name.startswith(".") or not name.endswith(".job"):
                continue
            try:
                with open(os.path.join(root, state, name), "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            entries[name] = {"sha": hashlib.sha256(data).hexdigest(), "plan": _plan_header(data)}
        files[state] = entries
    missing = [p for p in request.get("external", []) if not os.path.exists(p.rstrip("/") or "/")]
    stages = [n for n in _listdir(root) if n.startswith(STAGE_PREFIX)]
    try:
        with open(os.path.join(root, "manifest.json"), "rb") as handle:
            manifest_sha = hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        manifest_sha = None
    return {"files": files, "external_missing": missing, "status": _read_json(os.path.join(root, "status.json")),
            "stages": stages, "manifest_sha": manifest_sha, "now": time.time()}


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def install(root, request):
    for state in (*STATES, "logs", "control"):
        os.makedirs(os.path.join(root, state), exist_ok=True)
    for name in _listdir(root):
        if name.startswith(STAGE_PREFIX):
            _rmtree(os.path.join(root, name))
    stage = tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=root)
    result = {"installed": [], "removed": [], "gone": []}
    try:
        for name, text in sorted(request.get("files", {}).items()):
            with open(os.path.join(stage, name), "wb") as handle:
                handle.write(text.encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())
        _fsync_dir(stage)
        for name in request.get("resets", []):
            _atomic(os.path.join(root, "control", "reset-" + name), b"{}\n")
        for state, name in request.get("remove", []):
            try:
                os.unlink(os.path.join(root, state, name))
                result["removed"].append([state, name])
            except FileNotFoundError:
                result["gone"].append([state, name])
        replacing = set(request.get("replace", []))
        for name in sorted(request.get("files", {})):
            target = os.path.join(root, "queue", name)
            if name in replacing and not os.path.exists(target):
                # The runner started the old version after the diff was made: do not queue it a second time.
                result["gone"].append(["queue", name])
                continue
            os.replace(os.path.join(stage, name), target)
            result["installed"].append(name)
        _fsync_dir(os.path.join(root, "queue"))
        if request.get("manifest") is not None:
            _atomic(os.path.join(root, "manifest.json"),
                    (json.dumps(request["manifest"], indent=1, sort_keys=True) + "\n").encode())
    finally:
        _rmtree(stage)
    return result


def _rmtree(path):
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            try:
                os.unlink(os.path.join(dirpath, name))
            except OSError:
                pass
        for name in dirnames:
            try:
                os.rmdir(os.path.join(dirpath, name))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def _tail(path, limit):
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace"), size
    except OSError:
        return "", 0


def _runner_alive(status):
    pid = (status or {}).get("runner", {}).get("pid")
    if not isinstance(pid, int):
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return b"runner" in handle.read()
    except OSError:
        return False


def status(root, request):
    st = _read_json(os.path.join(root, "status.json"))
    events_path = os.path.join(root, "events.jsonl")
    offset = int(request.get("offset", -1))
    try:
        size = os.path.getsize(events_path)
    except OSError:
        size = 0
    events, new_offset, rotated = [], size, False
    head = ""
    if size:
        with open(events_path, "rb") as handle:
            head = hashlib.sha256(handle.read(256)).hexdigest()[:16]
    if offset >= 0:
        # A file truncated or replaced since the last probe starts with other bytes: read it all.
        if offset > size or (request.get("head") and request["head"] != head and offset > 0):
            offset, rotated = 0, True
        limit = int(request.get("max_bytes", 1 << 20))
        with open(events_path, "rb") if size else open(os.devnull, "rb") as handle:
            handle.seek(offset)
            data = handle.read(limit)
        cut = data.rfind(b"\n") + 1
        new_offset = offset + cut
        for line in data[:cut].splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    else:
        text, _ = _tail(events_path, int(request.get("tail_bytes", 16384)))
        for line in text.splitlines()[1:] if len(text) >= int(request.get("tail_bytes", 16384)) else text.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    logs = {}
    for run in (st or {}).get("running", []):
        text, log_size = _tail(os.path.join(root, "logs", run.get("job", "") + ".log"), 8192)
        logs[run.get("job")] = {"tail": text, "size": log_size}
    counts = {s: len([n for n in _listdir(os.path.join(root, s)) if n.endswith(".job") and not n.startswith(".")])
              for s in STATES}
    return {"status": st, "events": events, "offset": new_offset, "rotated": rotated, "head": head, "logs": logs,
            "counts": counts, "runner_alive": _runner_alive(st), "now": time.time(),
            "parked": _read_json(os.path.join(root, "parked.json"))}


def park(root, request):
    path = os.path.join(root, "parked.json")
    if request.get("parked") is None:
        existed = os.path.exists(path)
        if existed:
            os.unlink(path)
        return {"unparked": existed}
    _atomic(path, (json.dumps(request["parked"]) + "\n").encode())
    if request.get("requeue_running"):
        os.makedirs(os.path.join(root, "control"), exist_ok=True)
        _atomic(os.path.join(root, "control", "requeue-running"), json.dumps({"by": request["parked"]["by"]}).encode())
    return {"parked": request["parked"]}


def _where(root, job):
    for state in STATES:
        if os.path.exists(os.path.join(root, state, job)):
            return state
    return None


def control(root, request):
    """Drop a request for the runner and wait (bounded) until it has been taken."""
    job, action = request["job"], request["action"]
    if "/" in job or job.startswith("."):
        return {"error": "bad job name %r" % job}
    before = _where(root, job)
    os.makedirs(os.path.join(root, "control"), exist_ok=True)
    path = os.path.join(root, "control", "%s-%s" % (action, job))
    _atomic(path, json.dumps({"by": request.get("by", "?")}).encode())
    deadline = time.time() + float(request.get("wait_s", 30))
    while time.time() < deadline and os.path.exists(path):
        time.sleep(0.05)
    taken = not os.path.exists(path)
    return {"taken": taken, "before": before, "after": _where(root, job)}


def logs(root, request):
    job = request["job"]
    if "/" in job or job.startswith("."):
        return {"error": "bad job name %r" % job}
    path = os.path.join(root, "logs", job + ".log")
    state = _where(root, job)
    offset = int(request.get("offset", -1))
    try:
        size = os.path.getsize(path)
    except OSError:
        return {"state": state, "text": "", "offset": 0, "exists": False}
    if offset < 0:
        text, size = _tail(path, int(request.get("max_bytes", 65536)))
        lines = text.splitlines()[-int(request.get("lines", 40)):]
        return {"state": state, "text": "\n".join(lines) + ("\n" if lines else ""), "offset": size, "exists": True}
    if offset > size:
        offset = 0
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(int(request.get("max_bytes", 1 << 20)))
    return {"state": state, "text": data.decode("utf-8", "replace"), "offset": offset + len(data), "exists": True}


def bootstrap(root, request):
    import shutil
    import subprocess

    done = {"written": [], "unchanged": [], "commands": [], "systemd": False, "heartbeat": False}
    lib = os.path.join(root, ".plan-runner")
    for rel, text in sorted(request["files"].items()):
        path = os.path.join(lib, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = text.encode("utf-8")
        try:
            with open(path, "rb") as handle:
                same = handle.read() == data
        except OSError:
            same = False
        if same:
            done["unchanged"].append(rel)
        else:
            _atomic(path, data)
            done["written"].append(rel)
    for state in (*STATES, "logs", "control"):
        os.makedirs(os.path.join(root, state), exist_ok=True)
    user_unit = bool(request.get("user_unit"))
    unit_dir = os.path.expanduser("~/.config/systemd/user") if user_unit else "/etc/systemd/system"
    unit_path = os.path.join(unit_dir, request["unit_name"])
    done["unit_path"] = unit_path
    ctl = ["systemctl", "--user"] if user_unit else ["systemctl"]
    run = "PYTHONPATH=%s %s -u -m runner run --root %s" % (lib, request.get("python", "python3"), root)
    has_systemd = shutil.which("systemctl") is not None and os.path.isdir("/run/systemd/system")
    try:
        os.makedirs(unit_dir, exist_ok=True)
        _atomic(unit_path, request["unit"].encode())
        done["written"].append(unit_path)
    except OSError as exc:
        done["unit_error"] = str(exc)
    if not has_systemd:
        done["commands"] = ["# systemd is not running here; start the runner yourself, e.g. under tmux:", run]
        return done
    done["systemd"] = True
    started = time.time()
    for args in (["daemon-reload"], ["enable", "--now", request["unit_name"]], ["restart", request["unit_name"]]):
        proc = subprocess.run(ctl + args, capture_output=True, text=True)
        done["commands"].append(" ".join(ctl + args) + " -> exit %d %s" % (proc.returncode, proc.stderr.strip()))
        if proc.returncode != 0:
            return done
    deadline = time.time() + float(request.get("wait_s", 30))
    while time.time() < deadline:
        st = _read_json(os.path.join(root, "status.json")) or {}
        if float(st.get("runner", {}).get("heartbeat", 0)) >= started:
            done["heartbeat"] = True
            break
        time.sleep(0.5)
    if user_unit:
        done["commands"].append("# a --user unit stops at logout unless lingering is on: loginctl enable-linger $USER")
    return done


def main(argv):
    mode, root = argv[1], os.path.expanduser(argv[2])
    raw = sys.stdin.read()
    request = json.loads(raw) if raw.strip() else {}
    if not os.path.isdir(root) and not request.get("create") and not request.get("allow_missing"):
        out = {"error": "no queue at %s (the directory does not exist)" % root}
    else:
        try:
            handlers = {"probe": probe, "install": install, "status": status, "park": park, "control": control,
                        "logs": logs, "bootstrap": bootstrap}
            handlers.update(globals().get("EXTRA_HANDLERS", {}))  # slurm_agent.py, when sent ahead of this
            handler = handlers[mode]
            out = handler(root, request)
        except Exception as exc:  # reported as a value: the probe reached the host
            out = {"error": "%s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

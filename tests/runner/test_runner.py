"""The real runner as a subprocess on a tmp queue, with real bash jobs (issue: the bundled runner)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runner import FORMAT_VERSION, procs
from runner.queue import fresh_status
from tests.conftest import REPO, RunnerProcess, kill_quietly, pid_alive, wait_for, write_job
from tests.ticking import Ticking

T0 = 1_000_000.0


def test_seed_92c_text_runs_with_local_paths(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    bench = tmp_path / "bench"
    (bench / "a9-results/matrix").mkdir(parents=True)
    (bench / "a9-results/matrix/.done-s2-fnmtpcx-flashnext-iq4xs").touch()
    (bench / "fetch-azureml.sh").write_text('mkdir -p "$2" && echo "fetch $1" && touch "$2/.ok"\n')
    models = tmp_path / "models"
    write_job(
        queue_root,
        "92c-net-mai-code.job",
        f"""# LANE=net
# REQUIRES=test -f {bench}/a9-results/matrix/.done-s2-fnmtpcx-flashnext-iq4xs
# DONE_IF=test -f {models}/MAI-Code-1.1-Flash-On-Device/.ok
# RETRIES=3
bash {bench}/fetch-azureml.sh azureml://registries/azureml/models/MAI-Code-1.1-Flash-On-Device/versions/1 {models}/MAI-Code-1.1-Flash-On-Device
""",
    )
    runner.start()
    done = runner.wait_event("done", job="92c-net-mai-code.job")
    assert done["rc"] == 0 and done["verified"] is True
    assert (queue_root / "done/92c-net-mai-code.job").exists()
    assert "fetch azureml://" in (queue_root / "logs/92c-net-mai-code.job.log").read_text()


def test_unparseable_jobs_are_never_executed(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    side = tmp_path / "side-effect"
    write_job(queue_root, "20-gpu-typo.job", "")
    write_job(queue_root, "21-typo.job", f"# REQUIRE=test -f /nonexistent\ntouch {side}\n")
    write_job(queue_root, "22-lane.job", f"# LANE=tpu\ntouch {side}\n")
    (queue_root / "queue/23-crlf.job").write_bytes(f"# LANE=cpu\r\ntouch {side}\r\n".encode())
    write_job(queue_root, ".staging.job", f"touch {side}\n")
    write_job(queue_root, "notes.txt", f"touch {side}\n")
    runner.start()
    wait_for(lambda: len(runner.events("invalid")) == 4)
    runner.wait_ticks(3)  # none of them started, nor will
    assert not side.exists()
    reasons = {e["job"]: e["reason"] for e in runner.events("invalid")}
    assert reasons["20-gpu-typo.job"] == "empty file"
    assert "did you mean REQUIRES" in reasons["21-typo.job"]
    assert "unknown LANE 'tpu'" in reasons["22-lane.job"]
    assert "carriage return" in reasons["23-crlf.job"]
    assert sorted(os.listdir(queue_root / "failed")) == ["20-gpu-typo.job", "21-typo.job", "22-lane.job", "23-crlf.job"]
    assert (queue_root / "queue/.staging.job").exists() and (queue_root / "queue/notes.txt").exists()
    assert not runner.events("start")


def test_net_and_gpu_never_overlap(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    for i in range(3):
        for lane in ("net", "gpu"):
            write_job(queue_root, f"{i}-{lane}.job", f"# LANE={lane}\nwork\n")
    write_job(queue_root, "0-cpu.job", "# LANE=cpu\nwork\n")
    q = ticking(T0)
    beside_cpu = False
    for t in range(12):
        q.tick(T0 + t)
        running = {job.split("-")[1].removesuffix(".job") for job in q.procs.running()}
        assert not {"net", "gpu"} <= running, "net and gpu ran at the same time"
        beside_cpu |= "cpu" in running and bool(running & {"net", "gpu"})
        for job in q.procs.running():
            if not job.endswith("cpu.job") or t >= 4:  # the cpu job runs through several exclusive jobs
                q.procs.exit(job)
    assert len(q.events("done")) == 7 and beside_cpu, "the cpu lane should run beside an exclusive lane"
    assert [e for e in q.events("lane") if e.get("reason") == "exclusive"], "a waiting exclusive lane says so"


@pytest.mark.parametrize(
    "leave_behind",
    [
        "sleep 300 &",
        "nohup sleep 300 >/dev/null 2>&1 &",
        "setsid sleep 300 >/dev/null 2>&1 < /dev/null &",
        "( ( exec sleep 300 ) & ) ; sleep 0.1",
    ],
    ids=["ampersand", "nohup", "setsid", "double-fork"],
)
def test_server_left_behind_is_ended_and_named(queue_root: Path, runner: RunnerProcess, leave_behind: str) -> None:
    # The job ends once what it left runs its command: a `&` child not yet past its exec still shows the job's
    # own command line when the runner looks, a moment after the job's end.
    started = 'p=$!; while [ -n "$p" ] && [ -e /proc/$p ] && ! grep -qa sleep /proc/$p/cmdline; do sleep 0.01; done'
    write_job(queue_root, "65-gpu-intake.job", f"# LANE=gpu\n{leave_behind}\necho $! > pidfile\n{started}\nexit 0\n")
    runner.start()
    killed = runner.wait_event("orphans-killed", job="65-gpu-intake.job")
    assert any("sleep 300" in cmd for cmd in killed["cmds"])
    for pid in killed["pids"]:
        wait_for(lambda pid=pid: not pid_alive(pid), 15)
    runner.wait_event("done", job="65-gpu-intake.job")
    # What this test's runner started carries its root's tag; other queues on the machine are not looked at.
    survivors = [pid for pid in _pids() if _tagged(pid, queue_root) and pid_alive(pid)]
    assert not survivors, f"processes of this test's runner survived: {survivors}"


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _fake_gpu_user(tmp_path: Path) -> Path:
    """A GPU user known by its name only, a name of this test's own: another runner on the machine (another
    test, another session) does not take it for one of its GPU users."""
    exe = tmp_path / "bin" / f"gpuuser-{os.getpid() % 100000}"
    exe.parent.mkdir(exist_ok=True)
    shutil.copy("/bin/sleep", exe)
    return exe


def test_foreign_gpu_process_blocks_gpu_lane_with_repeated_gpu_wait(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    exe = _fake_gpu_user(tmp_path)
    server = subprocess.Popen([str(exe), "300"])
    try:
        write_job(queue_root, "70-gpu-bench.job", "# LANE=gpu\necho bench\n")
        write_job(queue_root, "71-cpu.job", "# LANE=cpu\necho cpu\n")
        runner.start("--gpu-names", exe.name)  # the repeat is tick-driven in test_waiting; here: found by name
        runner.wait_event("done", job="71-cpu.job")
        runner.wait_event("gpu-wait", job="70-gpu-bench.job")
        waits = runner.events("gpu-wait")
        assert all(w["pid"] == server.pid and exe.name in w["cmd"] for w in waits)
        status = runner.status()
        reason = next(q for q in status["queued"] if q["job"] == "70-gpu-bench.job")
        assert reason["reason"] == "gpu-foreign" and str(server.pid) in reason["detail"]
        assert not runner.events("start") or all(e["job"] != "70-gpu-bench.job" for e in runner.events("start"))
    finally:
        server.kill()
        server.wait()
    runner.wait_event("done", job="70-gpu-bench.job")


def test_process_holding_a_gpu_device_node_blocks_gpu_lane(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    device = tmp_path / "renderD128"
    device.write_text("")
    holder = subprocess.Popen(["bash", "-c", f"exec 3<{device}; sleep 300"])
    try:
        write_job(queue_root, "70-gpu-bench.job", "# LANE=gpu\necho bench\n")
        runner.start("--gpu-device", str(device))
        wait_event = runner.wait_event("gpu-wait")
        assert wait_event["pid"] == holder.pid and str(device) in wait_event["why"]
    finally:
        holder.kill()
        holder.wait()
    runner.wait_event("done", job="70-gpu-bench.job")


def test_kill_9_mid_job_then_restart_loses_nothing(tmp_path: Path, queue_root: Path) -> None:
    marker = tmp_path / "second-run"
    write_job(
        queue_root,
        "10-gpu-long.job",
        f"# LANE=gpu\nif [ -e {marker} ]; then echo finished; exit 0; fi\ntouch {marker}\nsleep 300 &\nwait\n",
    )
    first = RunnerProcess(queue_root).start()
    start = first.wait_event("start")
    wait_for(lambda: marker.exists())
    tree = [pid for pid in _pids() if _tagged(pid, queue_root)]  # this root's only: other tests run beside it
    assert tree
    first.stop(signal.SIGKILL)
    assert (queue_root / "running/10-gpu-long.job").exists()
    second = RunnerProcess(queue_root).start()
    try:
        second.wait_event("recovered", job="10-gpu-long.job")
        second.wait_event("done", job="10-gpu-long.job")
        for pid in tree:
            wait_for(lambda pid=pid: not pid_alive(int(pid)), 15)
        state = json.loads((queue_root / "state.json").read_text())
        assert state["attempts"]["10-gpu-long.job"] == 1
        assert start["pid"] not in [int(p) for p in os.listdir("/proc") if p.isdigit() and pid_alive(int(p))]
    finally:
        second.stop()
        for pid in tree:
            kill_quietly(int(pid))


def _tagged(pid: int, root: Path) -> bool:
    """PID was started by a runner on ROOT (its tag begins with the root's id)."""
    return _root_tag(root) in _environ(pid)


def _root_tag(root: Path) -> bytes:
    return f"{procs.TAG_VAR}={hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]}:".encode()


def test_successor_starts_on_the_exit_not_the_tick(tmp_path: Path, queue_root: Path) -> None:
    """With an hour's tick, the second job can only start because the first one's exit woke the runner."""
    stamps = tmp_path / "stamps"
    write_job(queue_root, "1-gpu-a.job", f"# LANE=gpu\nsleep 0.2\ndate +%s.%N >> {stamps}\n")
    write_job(queue_root, "2-gpu-b.job", f"# LANE=gpu\ndate +%s.%N >> {stamps}\n")
    proc = RunnerProcess(queue_root).start("--tick", "3600")
    try:
        proc.wait_event("done", job="2-gpu-b.job", timeout=60)
    finally:
        proc.stop()


def test_timeout_kills_the_whole_tree(queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "5-cpu-slow.job", "# TIMEOUT=1\nsleep 300 &\necho $! > child.pid\nsleep 300\n")
    runner.start()
    timeout = runner.wait_event("timeout", job="5-cpu-slow.job")
    assert timeout["limit_s"] == 1
    failed = runner.wait_event("failed", job="5-cpu-slow.job")
    assert failed["why"] == "timeout"
    child = int((queue_root / "child.pid").read_text())
    wait_for(lambda: not pid_alive(child), 5)


def test_retries_with_backoff_then_done(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "6-cpu-flaky.job", "# RETRIES=3\nflaky\n")
    q = ticking(T0, backoff_base_s=30.0, backoff_max_s=45.0)
    q.tick(T0)
    q.say("6-cpu-flaky.job", "flaky failure")
    q.procs.exit("6-cpu-flaky.job", 1)
    q.tick(T0 + 1)
    retry = q.events("retry")
    assert [(r["rc"], r["attempt"], r["backoff_s"], r["next_attempt"]) for r in retry] == [(1, 1, 30.0, 2)]
    assert retry[0]["tail"][-1] == "flaky failure"
    assert q.reason("6-cpu-flaky.job")["reason"] == "backoff"  # type: ignore[index]
    q.tick(T0 + 30)
    assert not q.procs.running()
    q.tick(T0 + 31)
    q.procs.exit("6-cpu-flaky.job", 1)
    q.tick(T0 + 32)
    assert q.events("retry")[1]["backoff_s"] == 45.0  # 60 capped at backoff-max
    q.tick(T0 + 32 + 45)
    q.procs.exit("6-cpu-flaky.job", 0)
    q.tick(T0 + 80)
    done = q.events("done")
    assert len(done) == 1 and done[0]["verified"] is None
    assert [s["attempt"] for s in q.events("start")] == [1, 2, 3]
    assert json.loads((queue_root / "state.json").read_text())["attempts"] == {"6-cpu-flaky.job": 3}


def test_done_if_already_true_is_skipped(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    (tmp_path / "ok").touch()
    write_job(queue_root, "1-net-dl.job", f"# LANE=net\n# DONE_IF=test -f {tmp_path}/ok\ntouch {tmp_path}/ran\n")
    runner.start()
    skipped = runner.wait_event("skipped", job="1-net-dl.job")
    assert skipped["note"] == "DONE_IF already true"
    assert not (tmp_path / "ran").exists() and (queue_root / "done/1-net-dl.job").exists()


def test_exit_0_without_outputs_names_missing_and_closest(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    st = tmp_path / "strata"
    st.mkdir()
    write_job(
        queue_root,
        "84b-cpu-strata-setup.job",
        f"# DONE_IF=test -s {st}/strata-qwen-q2_0.json\n# OUTPUTS={st}/strata-qwen-q2_0.json\n"
        f"echo '{{}}' > {st}/strata-q2_0.json\n",
    )
    runner.start()
    failed = runner.wait_event("failed", job="84b-cpu-strata-setup.job")
    assert failed["rc"] == 0 and failed["verified"] is False
    assert failed["missing"] == [{"path": f"{st}/strata-qwen-q2_0.json", "closest": [f"{st}/strata-q2_0.json"]}]


def test_sigterm_requeues_without_using_an_attempt(queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "1-gpu-long.job", "# LANE=gpu\n# RETRIES=1\nsleep 300\n")
    runner.start()
    runner.wait_event("start")
    assert runner.stop() == 0
    assert (queue_root / "queue/1-gpu-long.job").exists()
    assert runner.events("runner-stop")
    state = json.loads((queue_root / "state.json").read_text())
    assert state["attempts"]["1-gpu-long.job"] == 0


def test_new_job_file_starts_without_waiting_for_the_tick(queue_root: Path, runner: RunnerProcess) -> None:
    """With an hour's tick, a job file that lands after the first tick starts by the runner's watch on queue/."""
    runner.start("--tick", "3600")
    wait_for(lambda: runner.status()["runner"]["tick"] >= 1)
    write_job(queue_root, "9-cpu-new.job", "echo new\n")
    runner.wait_event("done", job="9-cpu-new.job", timeout=60)


def test_status_command_and_unit(queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "1-gpu-wait.job", "# LANE=gpu\n# REQUIRES=test -f /nonexistent/x\necho\n")
    runner.start()
    wait_for(lambda: runner.status()["queued"])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "status", "--root", str(queue_root)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "requires" in out and "1-gpu-wait.job" in out and "test -f /nonexistent/x" in out
    raw = json.loads(
        subprocess.run(
            [sys.executable, "-S", "-m", "runner", "status", "--root", str(queue_root), "--json"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    )
    assert raw["runner"]["format_version"] == FORMAT_VERSION
    unit = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "unit", "--root", str(queue_root)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    for line in ("Restart=always", "KillMode=control-group", "LimitMEMLOCK=infinity", f'--root "{queue_root}"'):
        assert line in unit


def test_help_explains_every_flag() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for args in ([], ["run"], ["status"], ["unit"], ["gpus"]):
        out = subprocess.run(
            [sys.executable, "-S", "-m", "runner", *args, "--help"], capture_output=True, text=True, env=env, check=True
        ).stdout
        assert "usage:" in out
    run_help = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "run", "--help"], capture_output=True, text=True, env=env, check=True
    ).stdout
    for flag in (
        "--tick",
        "--requires-warn",
        "--idle",
        "--stall",
        "--kill-grace",
        "--backoff-base",
        "--gpu-device",
        "--gpus",
        "--gpu-window",
        "--gpu-memory",
        "--gpu-stall",
        "--gpu-ignore",
        "--gpu-proc",
        "--settle",
        "--keep-leaks",
        "--heartbeat-event-every",
    ):
        assert flag in run_help
    assert "default 6h00m" in run_help


def _cgroup_base() -> Path | None:
    from runner import procs

    for mount in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if procs.cgroup_usable(mount):
            return Path(mount)
    return None


def test_cgroup_catches_what_escapes_tag_and_session(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    base = _cgroup_base()
    if base is None:
        pytest.skip("no writable cgroup v2 hierarchy with cgroup.kill on this machine")
    cgroup = base / f"plantest-{os.getpid()}-{time.monotonic_ns()}"
    cgroup.mkdir()
    try:
        # env -i drops the tag and setsid leaves the session: only the cgroup still knows this process.
        write_job(
            queue_root,
            "65-gpu-intake.job",
            f"# LANE=gpu\nenv -i setsid sleep 301 >/dev/null 2>&1 < /dev/null &\necho $! > {tmp_path}/pid\nsleep 0.2\n",
        )
        runner.start("--cgroup", str(cgroup))
        killed = runner.wait_event("orphans-killed", job="65-gpu-intake.job")
        pid = int((tmp_path / "pid").read_text())
        assert killed["cgroup"] is True and any("sleep 301" in c for c in killed["cmds"])
        wait_for(lambda: not pid_alive(pid), 5)
        runner.wait_event("done", job="65-gpu-intake.job")
        wait_for(lambda: not (cgroup / "job-65-gpu-intake.job").exists(), 5)
    finally:
        runner.stop()
        for child in cgroup.glob("job-*"):
            (child / "cgroup.kill").write_text("1")
            time.sleep(0.1)
            child.rmdir()
        cgroup.rmdir()


def test_unreadable_processes_are_unknown_gpu_users_never_skipped(tmp_path: Path) -> None:
    """A runner that is not root cannot read root's open files: those processes are listed as unknown GPU
    users, and with --unreadable-gpu block they hold the gpu lane."""
    import shutil as sh
    import tempfile

    if os.geteuid() != 0 or sh.which("setpriv") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root and setpriv to run the runner as another user")
    secret = subprocess.Popen(["sleep", "300"])  # root's, so its fds are unreadable to nobody
    root = Path(tempfile.mkdtemp(prefix="plan-nobody-"))
    try:
        (root / "queue").mkdir()
        (root / "queue/1-gpu-a.job").write_text("# LANE=gpu\necho a\n")
        subprocess.run(["chown", "-R", "nobody:nogroup", str(root)], check=True)
        proc = subprocess.Popen(
            [
                "setpriv",
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "/usr/bin/python3",
                "-m",
                "runner",
                "run",
                "--root",
                str(root),
                "--tick",
                "0.2",
                "--unreadable-gpu",
                "block",
                "--gpu-names",
                f"plan-test-{os.getpid()}",
            ],
            cwd=REPO,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)},
        )
        try:
            wait_for(lambda: (root / "status.json").exists(), 10)
            wait_for(lambda: '"event": "gpu-wait"' in (root / "events.jsonl").read_text(), 10)
            # status.json is written at the end of the tick that wrote the event: until then it is an earlier one's
            status = wait_for(
                lambda: (s := json.loads((root / "status.json").read_text()))["gpu_unknown"]["count"] and s, 10
            )
            status = fresh_status(root, status, every=True)  # each waiting job, from waiting.json
            unknown = status["gpu_unknown"]
            assert unknown["policy"] == "block" and unknown["count"] >= 1
            assert secret.pid in [p["pid"] for p in unknown["processes"]] or unknown["count"] > 20
            reason = status["queued"][0]
            assert reason["reason"] == "gpu-foreign" and "unknown" in reason["detail"]
            assert not (root / "done/1-gpu-a.job").exists()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    finally:
        secret.kill()
        secret.wait()
        sh.rmtree(root, ignore_errors=True)


def test_rotated_events_file_gets_a_new_one(queue_root: Path, runner: RunnerProcess) -> None:
    runner.start()
    os.rename(queue_root / "events.jsonl", queue_root / "events.jsonl.1")
    write_job(queue_root, "1-cpu-after.job", "echo after\n")
    wait_for(
        lambda: (
            (queue_root / "events.jsonl").exists() and '"event": "done"' in (queue_root / "events.jsonl").read_text()
        ),
        10,
    )
    assert '"event": "done"' not in (queue_root / "events.jsonl.1").read_text()


def test_a_second_runner_on_the_same_root_refuses(queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "1-gpu-long.job", "# LANE=gpu\nsleep 300\n")
    runner.start()
    runner.wait_event("start")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    second = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "run", "--root", str(queue_root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 3 and f"pid {runner.proc.pid}" in second.stderr  # type: ignore[union-attr]
    assert not runner.events("orphans-killed") and not runner.events("recovered")


def test_two_slot_lane_runs_two_real_jobs_at_once(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    """Each job waits for the other to have started: they finish only if they ran at the same time."""
    for me, other in (("a", "b"), ("b", "a")):
        write_job(
            queue_root,
            f"1-cpu-{me}.job",
            f"touch {tmp_path}/{me}\n"
            f"for i in $(seq 200); do [ -e {tmp_path}/{other} ] && exit 0; sleep 0.05; done\nexit 1\n",
        )
    runner.start("--slots", "cpu=2")
    runner.wait_event("done", job="1-cpu-a.job", timeout=20)
    runner.wait_event("done", job="1-cpu-b.job", timeout=20)
    lanes = runner.status()["lanes"]
    assert lanes["cpu"]["slots"] == 2 and lanes["net"]["slots"] == 1


def test_bad_slots_are_refused_with_a_clear_message(queue_root: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for flag, says in (
        ("cpu=0", "want LANE=N with N a whole number >= 1"),
        ("cpu", "want LANE=N"),
        ("tpu=2", "--slots names a lane not in --lanes: tpu"),
    ):
        out = subprocess.run(
            [sys.executable, "-S", "-m", "runner", "run", "--root", str(queue_root), "--slots", flag],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, (flag, out.stderr)
    assert not (queue_root / "events.jsonl").exists()


def test_unit_keeps_an_odd_root_one_literal_word() -> None:
    """systemd splits ExecStart= at spaces and expands %specifiers and $VARS: a root with them stays one word."""
    import shlex

    root = '/tmp/my jobs%h$HOME"q\\z'
    env = dict(os.environ, PYTHONPATH=str(REPO))
    unit = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "unit", "--root", root, "--python", "/usr/bin/python3"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    exec_line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    words = [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(exec_line.removeprefix("ExecStart="))]
    assert words[words.index("--root") + 1] == root and words[0] == "/usr/bin/python3"
    assert 'Description=plancompiler queue runner (/tmp/my jobs%%h$HOME"q\\z)' in unit
    bad = subprocess.run(
        [sys.executable, "-S", "-m", "runner", "unit", "--root", "/tmp/a\nb"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and "cannot hold a newline" in bad.stderr and "Traceback" not in bad.stderr

"""Every kind of waiting gets a reason, an event and a repeat: the seed's silences, reproduced small."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import RunnerProcess, wait_for, write_job


def _reason(runner: RunnerProcess, job: str) -> dict | None:
    try:
        status = runner.status()
    except (OSError, ValueError):
        return None
    return next((q for q in status["queued"] if q["job"] == job), None)


def test_slow_download_holds_gpu_job_with_exclusive_reason(queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "92c-net-mai-code.job", "# LANE=net\nfor i in $(seq 40); do echo \"$i% 52.44G\"; sleep 0.1; done\n")
    write_job(queue_root, "88b-gpu-build-vulkan-new.job", "# LANE=gpu\necho build\n")
    runner.start("--warn-after-net", "0.5", "--long-running-repeat", "1")
    runner.wait_event("start", job="92c-net-mai-code.job")
    reason = wait_for(lambda: _reason(runner, "88b-gpu-build-vulkan-new.job"))
    assert reason["reason"] == "exclusive" and reason["blocker"] == "92c-net-mai-code.job"
    long = runner.wait_event("long-running", job="92c-net-mai-code.job")
    assert long["warn_after_s"] == 0.5 and "52.44G" in long["last_line"]
    wait_for(lambda: len(runner.events("long-running")) >= 2, 5)
    gpu_lane = [e for e in runner.events("lane") if e["lane"] == "gpu"]
    assert any(e["state"] == "waiting" and e.get("reason") == "exclusive" and e["blocker"] == "92c-net-mai-code.job"
               for e in gpu_lane)
    runner.wait_event("done", job="88b-gpu-build-vulkan-new.job", timeout=15)


def _manifest(root: Path, jobs: dict, external: list[str] | None = None) -> None:
    producers: dict[str, list[str]] = {}
    for name, entry in jobs.items():
        for path in entry.get("outputs", []):
            producers.setdefault(path, []).append(name)
    (root / "manifest.json").write_text(json.dumps({"plan": "t", "jobs": jobs, "producers": producers,
                                                    "external": external or []}))


def test_requires_no_job_produces_is_blocked_from_manifest(tmp_path: Path, queue_root: Path,
                                                           runner: RunnerProcess) -> None:
    want = str(tmp_path / "strata-qwen-q2_0.json")
    write_job(queue_root, "84c-gpu-strata-check.job", f"# LANE=gpu\n# REQUIRES=test -f {want}\necho run\n")
    _manifest(queue_root, {"84c-gpu-strata-check.job": {"requires": [want], "outputs": []},
                           "84b-cpu-strata-setup.job": {"requires": [], "outputs": [str(tmp_path / "strata-q2_0.json")]}})
    runner.start("--blocked-repeat", "0.5")
    blocked = runner.wait_event("blocked", job="84c-gpu-strata-check.job")
    assert blocked["path"] == want and "no job produces" in blocked["why"]
    wait_for(lambda: len(runner.events("blocked")) >= 2, 5)
    assert _reason(runner, "84c-gpu-strata-check.job")["reason"] == "blocked"


def test_requires_wait_without_manifest_survives_restart(tmp_path: Path, queue_root: Path) -> None:
    write_job(queue_root, "84c-gpu-strata-check.job",
              f"# LANE=gpu\n# REQUIRES=test -f {tmp_path}/strata-qwen-q2_0.json\necho run\n")
    first = RunnerProcess(queue_root).start("--requires-warn", "2")
    wait_for(lambda: _reason(first, "84c-gpu-strata-check.job"))
    since = _reason(first, "84c-gpu-strata-check.job")["since"]
    first.wait_event("requires-wait", timeout=6)
    first.stop()
    second = RunnerProcess(queue_root).start("--requires-warn", "2", "--requires-repeat", "60")
    try:
        wait_for(lambda: len(second.events("requires-wait")) >= 2, 3)
        again = second.events("requires-wait")[-1]
        assert again["requires"] == f"test -f {tmp_path}/strata-qwen-q2_0.json"
        assert again["waited_s"] >= 2
        assert _reason(second, "84c-gpu-strata-check.job")["since"] == since
    finally:
        second.stop()


def test_failed_producer_blocks_its_consumer(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    out = str(tmp_path / "model.gguf")
    write_job(queue_root, "10-net-fetch.job", f"# LANE=net\n# DONE_IF=test -s {out}\necho 'HTTP 404'; exit 22\n")
    write_job(queue_root, "20-gpu-intake.job", f"# LANE=gpu\n# REQUIRES=test -s {out}\necho intake\n")
    _manifest(queue_root, {"10-net-fetch.job": {"requires": [], "outputs": [out]},
                           "20-gpu-intake.job": {"requires": [out], "outputs": []}})
    runner.start()
    runner.wait_event("failed", job="10-net-fetch.job")
    blocked = runner.wait_event("blocked", job="20-gpu-intake.job")
    assert blocked["producer"] == "10-net-fetch.job"
    assert "exited 22: HTTP 404" in blocked["why"]


def test_correlated_failure_names_jobs_and_shared_line(queue_root: Path, runner: RunnerProcess) -> None:
    for i, model in enumerate(["ling-3.0-q4", "ling-3.0-q8", "kimi-linear-q8"]):
        write_job(queue_root, f"65-cpu-intake-{model}.job",
                  f"echo '== smoke / opencode / {model}'\necho 'loaded in {i + 3}.{i}s'\n"
                  f"echo 'unsupported sampler flag: -b (arg {i * 7 + 2})'\nexit 1\n")
    runner.start()
    wait_for(lambda: len(runner.events("failed")) == 3)
    # The third failure's correlated-failure is written just after its `failed` event: wait for it too.
    last = runner.wait_event("correlated-failure", jobs=sorted(f"65-cpu-intake-{m}.job"
                                                              for m in ["ling-3.0-q4", "ling-3.0-q8", "kimi-linear-q8"]))
    assert len(last["jobs"]) == 3
    assert last["message"].startswith("3 jobs failed with: unsupported sampler flag: -b")


def test_stalled_job_names_last_line(queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "30-net-dl.job", "# LANE=net\necho ' 12 52.44G 12 6.1G 0 0 2.72M'\nsleep 300\n")
    runner.start("--stall", "0.5")
    stalled = runner.wait_event("stalled", job="30-net-dl.job")
    assert "52.44G" in stalled["last_line"] and stalled["silent_s"] >= 0


def test_idle_names_each_waiting_reason(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "1-gpu-a.job", f"# LANE=gpu\n# REQUIRES=test -f {tmp_path}/never\necho a\n")
    write_job(queue_root, "2-cpu-b.job", f"# REQUIRES=test -d {tmp_path}/nodir\necho b\n")
    runner.start("--idle", "0.5", "--idle-repeat", "1")
    idle = runner.wait_event("idle", queued=2)
    assert set(idle["waiting"]) == {"1-gpu-a.job", "2-cpu-b.job"}
    assert idle["waiting"]["1-gpu-a.job"].startswith("requires: test -f")
    wait_for(lambda: len([e for e in runner.events("idle") if "lane" not in e]) >= 2, 5)


def test_lane_events_cover_the_run_without_gaps(tmp_path: Path, queue_root: Path, runner: RunnerProcess) -> None:
    write_job(queue_root, "1-net-a.job", "# LANE=net\nsleep 0.4\n")
    write_job(queue_root, "2-gpu-b.job", "# LANE=gpu\nsleep 0.4\n")
    write_job(queue_root, "3-cpu-c.job", f"# REQUIRES=test -f {tmp_path}/gate\necho c\n")
    runner.start()
    runner.wait_event("done", job="2-gpu-b.job")
    (tmp_path / "gate").touch()
    runner.wait_event("done", job="3-cpu-c.job")
    runner.stop()
    events = runner.events()
    stop = next(i for i, e in enumerate(events) if e["event"] == "runner-stop")
    for lane in ("net", "gpu", "cpu"):
        states = [e for e in events[:stop] if e["event"] == "lane" and e["lane"] == lane]
        assert states, lane
        assert states[-1]["state"] == "stopped"
        pairs = list(zip(states, states[1:], strict=False))
        assert all((a["state"], a["job"], a.get("reason")) != (b["state"], b["job"], b.get("reason"))
                   for a, b in pairs), "a lane event must be a change"
    gpu = [(e["state"], e.get("reason")) for e in events if e["event"] == "lane" and e["lane"] == "gpu"]
    assert gpu[:3] == [("waiting", "exclusive"), ("busy", None), ("idle", None)]


def test_seed_requires_warn_s_environment_variable_is_honoured(tmp_path: Path, queue_root: Path,
                                                               runner: RunnerProcess,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUIRES_WARN_S", "1")
    write_job(queue_root, "84c-gpu-demo.job", "# LANE=gpu\n# REQUIRES=test -f /nonexistent/strata-qwen-q2_0.json\n"
              "echo never\n")
    runner.start()
    event = runner.wait_event("requires-wait", timeout=5)
    assert event["requires"] == "test -f /nonexistent/strata-qwen-q2_0.json" and event["waited_s"] >= 1

"""Every kind of waiting gets a reason, an event and a repeat: the seed's silences, reproduced small.

Driven in-process by `tick(now)` over fake processes (tests/ticking.py): a 6-hour threshold is two ticks,
and each test shows both sides of its threshold (not said just before it, said at it, repeated only after
its repeat). Conditions run in real bash; events.jsonl, status.json and state.json are the real files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.procs import GpuUser
from tests.conftest import write_job
from tests.ticking import Ticking

T0 = 1_000_000.0
H = 3600.0


def test_slow_download_holds_gpu_job_with_exclusive_reason(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "92c-net-mai-code.job", "# LANE=net\ncurl -O big\n")
    write_job(queue_root, "88b-gpu-build-vulkan-new.job", "# LANE=gpu\necho build\n")
    q = ticking(T0, warn_after={"net": 60.0}, long_running_repeat_s=600.0)
    q.tick(T0)
    assert q.procs.running() == ["92c-net-mai-code.job"]
    reason = q.reason("88b-gpu-build-vulkan-new.job")
    assert reason and reason["reason"] == "exclusive" and reason["blocker"] == "92c-net-mai-code.job"
    q.say("92c-net-mai-code.job", " 12 52.44G 12 6.1G 0 0 2.72M")
    q.tick(T0 + 59)
    assert not q.events("long-running")
    q.tick(T0 + 60)
    long = q.events("long-running")
    assert len(long) == 1 and long[0]["warn_after_s"] == 60.0 and long[0]["elapsed_s"] == 60
    assert "52.44G" in long[0]["last_line"]
    q.tick(T0 + 659)
    assert len(q.events("long-running")) == 1
    q.tick(T0 + 660)
    assert len(q.events("long-running")) == 2
    gpu_lane = [e for e in q.events("lane") if e["lane"] == "gpu"]
    assert [(e["state"], e.get("reason"), e.get("blocker")) for e in gpu_lane] == [
        ("waiting", "exclusive", "92c-net-mai-code.job")
    ]
    q.procs.exit("92c-net-mai-code.job", 0)
    q.tick(T0 + 700)
    assert q.procs.running() == ["88b-gpu-build-vulkan-new.job"]
    q.procs.exit("88b-gpu-build-vulkan-new.job", 0)
    q.tick(T0 + 701)
    assert [e["job"] for e in q.events("done")] == ["92c-net-mai-code.job", "88b-gpu-build-vulkan-new.job"]


def _manifest(root: Path, jobs: dict, external: list[str] | None = None) -> None:
    producers: dict[str, list[str]] = {}
    for name, entry in jobs.items():
        for path in entry.get("outputs", []):
            producers.setdefault(path, []).append(name)
    (root / "manifest.json").write_text(
        json.dumps({"plan": "t", "jobs": jobs, "producers": producers, "external": external or []})
    )


def test_requires_no_job_produces_is_blocked_from_manifest(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    want = str(tmp_path / "strata-qwen-q2_0.json")
    write_job(queue_root, "84c-gpu-strata-check.job", f"# LANE=gpu\n# REQUIRES=test -f {want}\necho run\n")
    _manifest(
        queue_root,
        {
            "84c-gpu-strata-check.job": {"requires": [want], "outputs": []},
            "84b-cpu-strata-setup.job": {"requires": [], "outputs": [str(tmp_path / "strata-q2_0.json")]},
        },
    )
    q = ticking(T0, blocked_repeat_s=H)
    q.tick(T0)
    blocked = q.events("blocked")
    assert len(blocked) == 1 and blocked[0]["path"] == want and "no job produces" in blocked[0]["why"]
    q.tick(T0 + H - 1)
    assert len(q.events("blocked")) == 1
    q.tick(T0 + H)
    assert len(q.events("blocked")) == 2 and q.events("blocked")[1]["waited_s"] == H
    assert q.reason("84c-gpu-strata-check.job")["reason"] == "blocked"  # type: ignore[index]
    assert not q.procs.jobs


def test_requires_wait_after_six_hours_survives_restart(tmp_path: Path, queue_root: Path) -> None:
    write_job(
        queue_root,
        "84c-gpu-strata-check.job",
        f"# LANE=gpu\n# REQUIRES=test -f {tmp_path}/strata-qwen-q2_0.json\necho run\n",
    )
    first = Ticking(queue_root, requires_warn_s=6 * H, requires_repeat_s=H).start(T0)
    first.tick(T0)
    since = first.reason("84c-gpu-strata-check.job")["since"]  # type: ignore[index]
    assert since == T0
    first.tick(T0 + 6 * H - 1)
    assert not first.events("requires-wait")
    first.tick(T0 + 6 * H)
    said = first.events("requires-wait")
    assert len(said) == 1 and said[0]["waited_s"] == 6 * H
    assert said[0]["requires"] == f"test -f {tmp_path}/strata-qwen-q2_0.json"
    first.close()
    # A new life: the wait is timed from when it began (state.json), and said again at once.
    second = Ticking(queue_root, requires_warn_s=6 * H, requires_repeat_s=H).start(T0 + 7 * H)
    try:
        second.tick(T0 + 7 * H)
        again = second.events("requires-wait")
        assert len(again) == 2 and again[1]["waited_s"] == 7 * H
        assert second.reason("84c-gpu-strata-check.job")["since"] == since  # type: ignore[index]
        second.tick(T0 + 7 * H + H - 1)
        assert len(second.events("requires-wait")) == 2
        second.tick(T0 + 8 * H)
        assert len(second.events("requires-wait")) == 3
    finally:
        second.close()


def test_failed_producer_blocks_its_consumer(tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    out = str(tmp_path / "model.gguf")
    write_job(queue_root, "10-net-fetch.job", f"# LANE=net\n# DONE_IF=test -s {out}\nfetch\n")
    write_job(queue_root, "20-gpu-intake.job", f"# LANE=gpu\n# REQUIRES=test -s {out}\necho intake\n")
    _manifest(
        queue_root,
        {
            "10-net-fetch.job": {"requires": [], "outputs": [out]},
            "20-gpu-intake.job": {"requires": [out], "outputs": []},
        },
    )
    q = ticking(T0)
    q.tick(T0)
    assert q.reason("20-gpu-intake.job")["reason"] == "requires"  # type: ignore[index]  # its producer runs
    q.say("10-net-fetch.job", "HTTP 404")
    q.procs.exit("10-net-fetch.job", 22)
    q.tick(T0 + 1)
    blocked = q.events("blocked")
    assert [(e["job"], e["producer"]) for e in blocked] == [("20-gpu-intake.job", "10-net-fetch.job")]
    assert "exited 22: HTTP 404" in blocked[0]["why"]


def test_correlated_failure_names_jobs_and_shared_line(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    models = ["ling-3.0-q4", "ling-3.0-q8", "kimi-linear-q8"]
    for model in models:
        write_job(queue_root, f"65-cpu-intake-{model}.job", "intake\n")
    q = ticking(T0)
    for i, model in enumerate(sorted(models, key=lambda m: f"65-cpu-intake-{m}.job")):
        q.tick(T0 + 10 * i)
        job = f"65-cpu-intake-{model}.job"
        assert q.procs.running() == [job]
        q.say(job, f"== smoke / opencode / {model}")
        q.say(job, f"loaded in {i + 3}.{i}s")
        q.say(job, f"unsupported sampler flag: -b (arg {i * 7 + 2})")
        q.procs.exit(job, 1)
    q.tick(T0 + 30)
    assert len(q.events("failed")) == 3
    said = q.events("correlated-failure")
    assert [len(e["jobs"]) for e in said] == [2, 3]  # said again as the cluster grows, never repeated as it is
    assert said[-1]["jobs"] == sorted(f"65-cpu-intake-{m}.job" for m in models)
    assert said[-1]["message"].startswith("3 jobs failed with: unsupported sampler flag: -b")


def test_stalled_job_names_last_line(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "30-net-dl.job", "# LANE=net\ncurl -O big\n")
    q = ticking(T0, stall_s=1800.0, stall_repeat_s=1800.0)
    q.tick(T0)
    q.say("30-net-dl.job", " 12 52.44G 12 6.1G 0 0 2.72M")
    q.tick(T0 + 10)  # the log grew: silent from here
    q.tick(T0 + 1809)
    assert not q.events("stalled")
    q.tick(T0 + 1810)
    stalled = q.events("stalled")
    assert len(stalled) == 1 and stalled[0]["silent_s"] == 1800 and "52.44G" in stalled[0]["last_line"]
    q.tick(T0 + 3609)
    assert len(q.events("stalled")) == 1
    q.tick(T0 + 3610)
    assert len(q.events("stalled")) == 2
    q.say("30-net-dl.job", " 13 52.44G 13 6.8G 0 0 2.72M")  # it moves again: a new stall is said at once
    q.tick(T0 + 3620)
    q.tick(T0 + 3620 + 1800)
    assert [e["silent_s"] for e in q.events("stalled")] == [1800, 3600, 1800]


def test_idle_names_each_waiting_reason(tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "1-gpu-a.job", f"# LANE=gpu\n# REQUIRES=test -f {tmp_path}/never\necho a\n")
    write_job(queue_root, "2-cpu-b.job", f"# REQUIRES=test -d {tmp_path}/nodir\necho b\n")
    q = ticking(T0, idle_s=600.0, idle_repeat_s=H)
    q.tick(T0)
    q.tick(T0 + 599)
    assert not q.events("idle")
    q.tick(T0 + 600)
    idle = [e for e in q.events("idle") if "lane" not in e]
    assert len(idle) == 1 and idle[0]["queued"] == 2 and idle[0]["idle_s"] == 600
    assert set(idle[0]["waiting"]) == {"1-gpu-a.job", "2-cpu-b.job"}
    assert idle[0]["waiting"]["1-gpu-a.job"].startswith("requires: test -f")
    q.tick(T0 + 600 + H - 1)
    assert len([e for e in q.events("idle") if "lane" not in e]) == 1
    q.tick(T0 + 600 + H)
    assert len([e for e in q.events("idle") if "lane" not in e]) == 2


def test_lane_events_cover_the_run_without_gaps(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    write_job(queue_root, "1-net-a.job", "# LANE=net\nsleep 1\n")
    write_job(queue_root, "2-gpu-b.job", "# LANE=gpu\nsleep 1\n")
    write_job(queue_root, "3-cpu-c.job", f"# REQUIRES=test -f {tmp_path}/gate\necho c\n")
    q = ticking(T0)
    q.tick(T0)
    q.procs.exit("1-net-a.job")
    q.tick(T0 + 1)
    q.procs.exit("2-gpu-b.job")
    q.tick(T0 + 2)
    (tmp_path / "gate").touch()
    q.tick(T0 + 3)
    q.procs.exit("3-cpu-c.job")
    q.tick(T0 + 4)
    q.runner.stop(T0 + 5)
    events = q.events()
    for lane in ("net", "gpu", "cpu"):
        states = [e for e in events if e["event"] == "lane" and e["lane"] == lane]
        assert states[-1]["state"] == "stopped"
        pairs = list(zip(states, states[1:], strict=False))
        assert all(
            (a["state"], a["job"], a.get("reason")) != (b["state"], b["job"], b.get("reason")) for a, b in pairs
        ), "a lane event must be a change"
    gpu = [(e["state"], e.get("reason")) for e in events if e["event"] == "lane" and e["lane"] == "gpu"]
    assert gpu == [("waiting", "exclusive"), ("busy", None), ("idle", None), ("stopped", None)]
    cpu = [(e["state"], e.get("reason")) for e in events if e["event"] == "lane" and e["lane"] == "cpu"]
    assert cpu == [("waiting", "requires"), ("busy", None), ("idle", None), ("stopped", None)]


def test_gpu_wait_is_repeated_per_foreign_process_and_ends_with_it(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    write_job(queue_root, "70-gpu-bench.job", "# LANE=gpu\nbench\n")
    q = ticking(T0, gpu_wait_repeat_s=600.0)
    q.procs.gpu = [GpuUser(4242, 1, "llama-server -m x.gguf", "name")]
    q.tick(T0)
    q.tick(T0 + 599)
    waits = q.events("gpu-wait")
    assert [(e["pid"], e["waited_s"]) for e in waits] == [(4242, 0)]
    assert q.reason("70-gpu-bench.job")["reason"] == "gpu-foreign"  # type: ignore[index]
    q.tick(T0 + 600)
    assert [e["waited_s"] for e in q.events("gpu-wait")] == [0, 600]
    q.procs.gpu = [GpuUser(4343, 1, "llama-bench", "device /dev/dri/renderD128")]
    q.tick(T0 + 601)  # another process: said at once
    assert [e["pid"] for e in q.events("gpu-wait")] == [4242, 4242, 4343]
    q.procs.gpu = []
    q.tick(T0 + 602)
    assert q.procs.running() == ["70-gpu-bench.job"]


def test_seed_requires_warn_s_environment_variable_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.__main__ import build_parser, config_from

    monkeypatch.setenv("REQUIRES_WARN_S", "1")
    assert config_from(build_parser().parse_args(["run", "--root", "/tmp/x"])).requires_warn_s == 1.0
    monkeypatch.delenv("REQUIRES_WARN_S")
    assert config_from(build_parser().parse_args(["run", "--root", "/tmp/x"])).requires_warn_s == 6 * H


def test_two_jobs_overlap_in_a_two_slot_lane_and_exclusivity_holds_by_lane(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    for name in ("1-cpu-a.job", "2-cpu-b.job", "3-cpu-c.job"):
        write_job(queue_root, name, "work\n")
    for name in ("4-net-a.job", "5-net-b.job"):
        write_job(queue_root, name, "# LANE=net\nfetch\n")
    write_job(queue_root, "6-gpu-a.job", "# LANE=gpu\nbench\n")
    q = ticking(T0, slots={"cpu": 2, "net": 2})
    q.tick(T0)
    assert q.procs.running() == ["1-cpu-a.job", "2-cpu-b.job", "4-net-a.job", "5-net-b.job"]
    assert q.reason("3-cpu-c.job")["reason"] == "order"  # type: ignore[index]
    assert q.reason("6-gpu-a.job")["reason"] == "exclusive"  # type: ignore[index]
    lanes = q.status()["lanes"]
    assert (lanes["cpu"]["slots"], lanes["cpu"]["busy"], lanes["gpu"]["slots"], lanes["gpu"]["busy"]) == (2, 2, 1, 0)
    q.tick(T0 + 1)
    assert q.reason("3-cpu-c.job")["detail"] == "1-cpu-a.job, 2-cpu-b.job fill the 2 slots of cpu"  # type: ignore[index]
    q.procs.exit("1-cpu-a.job")
    q.procs.exit("4-net-a.job")
    q.tick(T0 + 2)  # a cpu slot is free again; one net slot still busy holds the gpu lane out
    assert q.procs.running() == ["2-cpu-b.job", "3-cpu-c.job", "5-net-b.job"]
    assert q.reason("6-gpu-a.job")["blocker"] == "5-net-b.job"  # type: ignore[index]
    q.procs.exit("5-net-b.job")
    q.tick(T0 + 3)
    assert "6-gpu-a.job" in q.procs.running()
    cpu = [(e["state"], e["job"], e.get("busy"), e.get("slots")) for e in q.events("lane") if e["lane"] == "cpu"]
    assert cpu == [("busy", "1-cpu-a.job", 2, 2), ("busy", "2-cpu-b.job", 2, 2)]  # the job named is the eldest
    gpu = [(e["state"], e.get("reason"), e.get("blocker")) for e in q.events("lane") if e["lane"] == "gpu"]
    assert gpu == [
        ("waiting", "exclusive", "4-net-a.job"),
        ("waiting", "exclusive", "5-net-b.job"),
        ("busy", None, None),
    ]

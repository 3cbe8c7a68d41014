"""The runner's parts on their own: the pure scheduler, the repeat throttle, and state.json across versions."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from runner.procs import GpuUser
from runner.queue import Queue, timestamp
from runner.runstate import STATE_VERSION, RunnerState
from runner.service.schedule import (
    ForgetGpuWaits,
    GpuWait,
    JobFacts,
    Launch,
    Ready,
    RequiresFalse,
    Skip,
    Snapshot,
    Wait,
    decide,
)
from runner.throttle import Throttle
from tests.conftest import write_job
from tests.ticking import Ticking

NOW = 1_000_000.0
LANES = ("net", "gpu", "cpu")


def _snap(
    *jobs: JobFacts,
    running: dict[str, tuple[str, ...]] | None = None,
    parked: str = "",
    gpu: tuple[GpuUser, ...] | None = None,
    slots: dict[str, int] | None = None,
) -> Snapshot:
    return Snapshot(tuple(jobs), running or {}, LANES, ("net", "gpu"), "gpu", parked, gpu, slots or {})


def _job(name: str, lane: str, done: bool = False, requires: bool | None = True) -> JobFacts:
    return JobFacts(name, lane, done, requires)


def test_first_ready_job_of_each_lane_launches_and_the_rest_queue_behind_it() -> None:
    actions = decide(
        RunnerState(),
        _snap(_job("1-net.job", "net"), _job("2-cpu.job", "cpu"), _job("3-cpu.job", "cpu"), _job("4-gpu.job", "gpu")),
        NOW,
    )
    assert [a for a in actions if isinstance(a, Launch)] == [
        Launch("net", ("1-net.job",)),
        Launch("cpu", ("2-cpu.job", "3-cpu.job")),
    ]
    assert Wait("4-gpu.job", "exclusive", "1-net.job holds exclusive lane net", "1-net.job") in actions


def test_each_check_in_its_order() -> None:
    state = RunnerState(backoff_until={"b.job": NOW + 5})
    actions = decide(
        state,
        _snap(
            _job("a.job", "cpu", done=True),
            _job("b.job", "cpu", requires=None),
            _job("c.job", "cpu", requires=False),
            _job("d.job", "cpu"),
            running={"cpu": ("x.job",)},
        ),
        NOW,
    )
    assert actions == [
        Skip("a.job"),
        Wait("b.job", "backoff", "retry at " + timestamp(NOW + 5)),
        RequiresFalse("c.job"),
        Ready("d.job"),
        Wait("d.job", "lane-busy", "x.job is running in cpu", "x.job"),
    ]


def test_backoff_that_has_passed_does_not_hold() -> None:
    state = RunnerState(backoff_until={"b.job": NOW})
    assert decide(state, _snap(_job("b.job", "cpu")), NOW) == [Ready("b.job"), Launch("cpu", ("b.job",))]


def test_parked_and_gpu_foreign_hold_a_free_lane() -> None:
    assert decide(RunnerState(), _snap(_job("a.job", "cpu"), parked="parked since x: y"), NOW) == [
        Ready("a.job"),
        Wait("a.job", "parked", "parked since x: y"),
    ]
    user = GpuUser(7, 1, "llama-server", "name")
    assert decide(RunnerState(), _snap(_job("g.job", "gpu"), gpu=(user,)), NOW) == [
        Ready("g.job"),
        GpuWait("g.job", (user,)),
    ]
    assert decide(RunnerState(), _snap(_job("g.job", "gpu"), gpu=()), NOW) == [
        Ready("g.job"),
        Launch("gpu", ("g.job",)),
        ForgetGpuWaits(),
    ]


def test_a_running_exclusive_lane_holds_the_other_and_the_shared_lane_runs() -> None:
    actions = decide(RunnerState(), _snap(_job("g.job", "gpu"), _job("c.job", "cpu"), running={"net": ("n.job",)}), NOW)
    assert Wait("g.job", "exclusive", "n.job holds exclusive lane net", "n.job") in actions
    assert Launch("cpu", ("c.job",)) in actions


def test_a_lane_of_slots_launches_into_its_free_slots_and_is_busy_when_they_are_full() -> None:
    jobs = (_job("a.job", "cpu"), _job("b.job", "cpu"), _job("c.job", "cpu"))
    assert decide(RunnerState(), _snap(*jobs, slots={"cpu": 2}), NOW)[-1] == Launch(
        "cpu", ("a.job", "b.job", "c.job"), 2
    )
    one_free = decide(RunnerState(), _snap(*jobs, running={"cpu": ("x.job",)}, slots={"cpu": 2}), NOW)
    assert one_free[-1] == Launch("cpu", ("a.job", "b.job", "c.job"), 1)
    full = decide(RunnerState(), _snap(jobs[0], running={"cpu": ("x.job", "y.job")}, slots={"cpu": 2}), NOW)
    assert full == [Ready("a.job"), Wait("a.job", "lane-busy", "x.job, y.job fill the 2 slots of cpu", "x.job")]


def test_an_exclusive_lane_with_a_free_slot_still_excludes_the_other() -> None:
    actions = decide(
        RunnerState(),
        _snap(_job("n2.job", "net"), _job("g.job", "gpu"), running={"net": ("n1.job",)}, slots={"net": 2}),
        NOW,
    )
    assert Launch("net", ("n2.job",), 1) in actions
    assert Wait("g.job", "exclusive", "n1.job holds exclusive lane net", "n1.job") in actions


def test_throttle_says_once_per_repeat_and_again_once_forgotten() -> None:
    throttle = Throttle()
    assert throttle.due("k", 0, 10) and not throttle.due("k", 9.9, 10) and throttle.due("k", 10, 10)
    throttle.forget("k")
    assert throttle.due("k", 11, 10)
    throttle.forget_where(lambda key: key == "k")
    assert throttle.due("k", 12, 10)


def test_state_json_of_the_runner_before_parts_still_loads(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    """state.json as the mixin runner wrote it (no version field) is read whole, and written back versioned."""
    before = {
        "attempts": {"a.job": 2},
        "waiting_since": {"b.job": NOW - 60},
        "backoff_until": {"a.job": NOW + 30},
        "last_failure": {"c.job": {"ts": "2026-01-01T00:00:00Z", "rc": 1, "summary": "exited 1"}},
    }
    (queue_root / "state.json").write_text(json.dumps(before))
    write_job(queue_root, "a.job", "work\n")
    q = ticking(NOW)
    assert q.runner.state == RunnerState(**before)  # type: ignore[arg-type]
    assert not q.events("state-corrupt")
    q.tick(NOW)
    assert q.reason("a.job")["reason"] == "backoff"  # type: ignore[index]
    after = json.loads((queue_root / "state.json").read_text())
    assert after == {"version": STATE_VERSION, **before, "held": {}, "priority": {}}


def test_state_json_of_the_seed_and_a_bad_version(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    (queue_root / "state.json").write_text(json.dumps({"a.job": 1}))  # the seed's flat {job: attempts}
    assert ticking(NOW).runner.state.attempts == {"a.job": 1}
    (queue_root / "state.json").write_text(json.dumps({"version": "two", "attempts": {"a.job": 1}}))
    state, problems = RunnerState.load(Queue(queue_root))
    assert state.attempts == {"a.job": 1}
    assert problems == [("version", "expected a whole number, got str: read as version 1")]


def _gpus(*jobs: JobFacts, taken: dict[int, str] | None = None, gpu: tuple[GpuUser, ...] | None = ()) -> Snapshot:
    running: dict[str, tuple[str, ...]] = {"gpu": tuple(sorted(set((taken or {}).values())))} if taken else {}
    return Snapshot(tuple(jobs), running, LANES, (), "gpu", "", gpu, {}, (0, 1), taken or {})


def test_each_gpu_job_gets_its_own_gpu_and_a_foreign_user_holds_only_its_gpu() -> None:
    both = decide(RunnerState(), _gpus(_job("a.job", "gpu"), _job("b.job", "gpu"), _job("c.job", "gpu")), NOW)
    assert Launch("gpu", ("a.job", "b.job"), 2, {"a.job": (0,), "b.job": (1,)}) in both
    assert Wait("c.job", "lane-busy", "needs 1 GPU; GPU 0: x", "x") not in both  # nothing ran before this tick
    on_one = GpuUser(7, 1, "llama-server", "engine time rising on GPU 1", (1,))
    actions = decide(RunnerState(), _gpus(_job("a.job", "gpu"), _job("b.job", "gpu"), gpu=(on_one,)), NOW)
    assert Launch("gpu", ("a.job",), 1, {"a.job": (0,)}) in actions
    assert GpuWait("b.job", (on_one,), 1) in actions
    everywhere = GpuUser(8, 1, "gpuuser", "device /dev/kfd (its use cannot be read)")  # which GPU: not known
    held = decide(RunnerState(), _gpus(_job("a.job", "gpu"), gpu=(everywhere,)), NOW)
    assert held == [Ready("a.job"), GpuWait("a.job", (everywhere,), 0)]


def test_a_job_asking_for_two_gpus_keeps_the_one_that_frees_up() -> None:
    two = JobFacts("a.job", "gpu", requires=True, gpus=2)
    actions = decide(RunnerState(), _gpus(two, _job("b.job", "gpu"), taken={0: "x.job"}), NOW)
    assert not [a for a in actions if isinstance(a, Launch)]
    assert Wait("a.job", "lane-busy", "needs 2 GPUs; GPU 0: x.job runs", "x.job") in actions
    assert Wait("b.job", "lane-busy", "needs 1 GPU; GPU 0: x.job runs, GPU 1 kept for a.job", "x.job") in actions
    free = decide(RunnerState(), _gpus(two, _job("b.job", "gpu")), NOW)
    assert Launch("gpu", ("a.job",), 1, {"a.job": (0, 1)}) in free
    too_many = decide(RunnerState(), _gpus(JobFacts("c.job", "gpu", requires=True, gpus=3)), NOW)
    assert too_many[:2] == [Ready("c.job"), Wait("c.job", "blocked", "asks for 3 GPUs; this runner has 2 (0,1)")]

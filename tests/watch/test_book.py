"""The runner's incident book, driven by tick(now): one incident per cause, opened once, repeated at --realert,
recovered when the cause ends, silenced by an ack request; the queue's own order never opens one.

In-process over fake processes (tests/ticking.py); the queue root, job files, conditions, events.jsonl,
status.json and incidents.json are real.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.alerts.book import BOOK_FILE
from runner.procs import GpuUser
from tests.conftest import RunnerProcess, wait_for, write_job
from tests.inprocess import plan_main
from tests.ticking import Ticking

T0 = 1_000_000.0
H = 3600.0


def book(root: Path) -> dict[str, Any]:
    return json.loads((root / BOOK_FILE).read_text())


def notices(q: Ticking) -> list[tuple[str, str]]:
    return [(e["what"], e["id"]) for e in q.events("incident")]


@pytest.mark.long  # computes for ~2 s in-process: started first, not last on its worker
def test_one_foreign_gpu_holder_behind_60_jobs_is_one_incident_until_it_ends(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    for n in range(60):
        write_job(queue_root, f"84c-gpu-bench-{n:02d}.job", "# LANE=gpu\necho bench\n")
    q = ticking(T0)
    q.procs.gpu = [GpuUser(1234, 1, "/opt/llama/llama-server --port 45541", "name")]
    for t in range(0, 3000, 10):  # fifty minutes of ticks
        q.tick(T0 + t)
    assert notices(q) == [("open", "gpu-held:pid 1234")]
    [incident] = book(queue_root)["open"]
    assert incident["count"] == 60 and incident["kind"] == "gpu-held"
    assert incident["text"].startswith("gpu lane held by pid 1234 (llama-server), not started by this runner: 60 jobs")
    assert "84c-gpu-bench-00.job, 84c-gpu-bench-01.job, 84c-gpu-bench-02.job +57" in incident["text"]
    q.tick(T0 + H)  # --realert (1h) after it opened: said again, once
    q.tick(T0 + H + 10)
    assert notices(q) == [("open", "gpu-held:pid 1234"), ("repeat", "gpu-held:pid 1234")]
    q.procs.gpu = []
    q.tick(T0 + H + 20)
    assert q.procs.running() == ["84c-gpu-bench-00.job"]
    assert notices(q)[-1] == ("recovered", "gpu-held:pid 1234")
    assert book(queue_root)["open"] == [] and book(queue_root)["closed"][0]["id"] == "gpu-held:pid 1234"


def test_thirty_failures_of_one_cause_are_one_incident(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    for n in range(30):
        write_job(queue_root, f"65-cpu-gate-{n:02d}.job", f"# LANE=cpu\necho boom-{n}; exit 3\n")
    q = ticking(T0, slots={"cpu": 30})
    q.tick(T0)
    assert len(q.procs.running()) == 30
    for n, job in enumerate(q.procs.running()):
        q.say(job, f"boom-{n}")
        q.procs.exit(job, 3)
        q.tick(T0 + 1 + n)  # one after another, each tick sees one more failure
    q.tick(T0 + 60)
    assert notices(q) == [("open", "failed:exited <n>: boom-<n>")]
    [incident] = book(queue_root)["open"]
    assert incident["count"] == 30
    assert incident["text"].startswith("30 jobs failed with `exited <n>: boom-<n>` (65-cpu-gate-00.job")
    assert incident["look"] == "plan logs HOST 65-cpu-gate-00.job"
    # every one fixed and retried (the runner moves them back): recovered, said once
    for n in range(30):
        write_job(queue_root, f"retry-65-cpu-gate-{n:02d}.job", "{}", state="control")
    q.tick(T0 + 120)
    assert notices(q)[-1] == ("recovered", "failed:exited <n>: boom-<n>") and len(notices(q)) == 2


def test_queue_order_never_alerts_but_a_wait_nothing_here_ends_does(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    made, outside = str(tmp_path / "made.json"), str(tmp_path / "outside.ok")
    write_job(queue_root, "10-net-fetch.job", f"# LANE=net\n# OUTPUTS={made}\ncurl -O big\n")
    write_job(queue_root, "20-gpu-uses.job", f"# LANE=gpu\n# REQUIRES=test -f {made}\necho use\n")
    write_job(queue_root, "30-cpu-outside.job", f"# LANE=cpu\n# REQUIRES=test -f {outside}\necho wait\n")
    jobs = {
        "10-net-fetch.job": {"requires": [], "outputs": [made]},
        "20-gpu-uses.job": {"requires": [made], "outputs": []},
        "30-cpu-outside.job": {"requires": [outside], "outputs": []},
    }
    (queue_root / "manifest.json").write_text(
        json.dumps({"plan": "t", "jobs": jobs, "producers": {made: ["10-net-fetch.job"]}, "external": [outside]})
    )
    q = ticking(T0, warn_after={"net": 9 * H})
    for t in range(0, int(7 * H), 600):
        q.say("10-net-fetch.job", f"progress {t}")
        q.tick(T0 + t)
    # 20 waits on its producer, which runs: the queue's order; 30 waits on a file nothing here makes: after
    # --requires-warn (6h) one incident
    assert notices(q) == [("open", "requires:test -f " + outside)]
    assert book(queue_root)["open"][0]["jobs"] == ["30-cpu-outside.job"]


def test_a_long_download_is_one_incident_naming_what_waits_behind_it(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    write_job(queue_root, "92c-net-mai-code.job", "# LANE=net\ncurl -O big\n")
    for n in range(5):
        write_job(queue_root, f"88b-gpu-build-{n}.job", "# LANE=gpu\necho build\n")
    q = ticking(T0)
    for t in range(0, int(3 * H), 60):
        q.say("92c-net-mai-code.job", " 64 52.44G  64 33.95G   0      0  2.72M      0 5:27:57 3:32:21 1:55:36  2.92M")
        q.tick(T0 + t)
    assert notices(q) == [
        ("open", "long-running:92c-net-mai-code.job"),  # at its lane's WARN_AFTER (net: 1h)
        ("repeat", "long-running:92c-net-mai-code.job"),  # and each --realert (1h) while it lasts
    ]
    [incident] = book(queue_root)["open"]
    assert incident["count"] == 6  # the holder and the five gpu jobs behind its exclusive lane
    assert "5 jobs wait behind it" in incident["text"] and "52.44G" in incident["text"]


def test_an_ack_request_silences_the_incident_until_it_recovers(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    for n in range(3):
        write_job(queue_root, f"84c-gpu-{n}.job", "# LANE=gpu\necho bench\n")
    q = ticking(T0, realert_s=600.0)
    q.procs.gpu = [GpuUser(77, 1, "llama-server", "name")]
    q.tick(T0)
    write_job(queue_root, "ack-1", json.dumps({"by": "me", "target": "gpu-held", "until": None}), state="control")
    q.tick(T0 + 10)
    assert book(queue_root)["open"][0]["acked"] == {"by": "me", "at": T0 + 10, "until": None}
    for t in range(20, 3000, 60):
        q.tick(T0 + t)
    assert notices(q) == [("open", "gpu-held:pid 77")]  # no repeat after the ack
    q.procs.gpu = []
    q.tick(T0 + 3000)
    assert notices(q) == [("open", "gpu-held:pid 77")]  # nor its recovery
    assert not (queue_root / "control" / "ack-1").exists()


def test_an_ack_for_a_time_then_the_incident_repeats(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "84c-gpu-0.job", "# LANE=gpu\necho bench\n")
    q = ticking(T0, realert_s=600.0)
    q.procs.gpu = [GpuUser(77, 1, "llama-server", "name")]
    q.tick(T0)
    ack = {"by": "me", "target": "WAITING:84c-gpu-*", "until": T0 + 1800}  # a watch kind and a job pattern
    write_job(queue_root, "ack-2", json.dumps(ack), state="control")
    for t in range(10, 1800, 60):
        q.tick(T0 + t)
    assert notices(q) == [("open", "gpu-held:pid 77")]
    q.tick(T0 + 1800)
    assert notices(q) == [("open", "gpu-held:pid 77"), ("repeat", "gpu-held:pid 77")]


def test_a_fresh_push_and_a_settling_file_are_never_idle(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    q = ticking(T0, idle_s=600.0)
    for t in range(0, 1200, 60):
        q.tick(T0 + t)
    write_job(queue_root, "40-cpu-later.job", "# LANE=cpu\n# REQUIRES=false\necho later\n")
    q.tick(T0 + 1200)
    q.tick(T0 + 1500)
    assert notices(q) == []  # pushed 5 minutes ago: not idle yet, whatever the runner did before
    q.tick(T0 + 1800)
    assert notices(q) == [("open", "idle:queue")]
    assert "nothing running for 10m00s while 1 job wait" in book(queue_root)["open"][0]["text"]


def test_the_book_survives_a_restart_without_saying_again(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "84c-gpu-0.job", "# LANE=gpu\necho bench\n")
    q = ticking(T0)
    q.procs.gpu = [GpuUser(77, 1, "llama-server", "name")]
    q.tick(T0)
    q.close()
    q.runner._lock_fd = None  # released: a second life of the runner takes the root
    again = ticking(T0 + 60)
    again.procs.gpu = [GpuUser(77, 1, "llama-server", "name")]
    again.tick(T0 + 60)
    assert notices(again) == [("open", "gpu-held:pid 77")]
    assert book(queue_root)["open"][0]["opened"] == T0


def test_plan_ack_writes_to_the_box_and_names_what_it_silenced(
    tmp_path: Path, queue_root: Path, runner: RunnerProcess
) -> None:
    write_job(queue_root, "65-gate-a.job", "# LANE=cpu\necho 'boom-1'; exit 3\n")
    write_job(queue_root, "65-gate-b.job", "# LANE=cpu\necho 'boom-2'; exit 3\n")
    runner.start()
    wait_for(lambda: (queue_root / BOOK_FILE).exists() and book(queue_root)["open"], 15)
    wait_for(lambda: book(queue_root)["open"][0]["count"] == 2, 15)
    shown = plan_main("status", str(queue_root), cwd=tmp_path, cache=tmp_path / "c")
    assert "\n\nopen incidents (the box's book):\n  EVENT    " in shown.stdout
    assert "2 jobs failed with `exited <n>: boom-<n>` (65-gate-a.job, 65-gate-b.job)" in shown.stdout
    missing = plan_main("ack", str(queue_root), "gpu-held", cwd=tmp_path, cache=tmp_path / "c")
    assert missing.returncode == 1 and "open: failed:exited <n>: boom-<n>" in missing.stderr
    unknown = plan_main("ack", str(queue_root), "boom", cwd=tmp_path, cache=tmp_path / "c")
    assert unknown.returncode == 2 and "unknown incident kind" in unknown.stderr
    done = plan_main("ack", str(queue_root), "failed:65-gate-*", "--for", "8h", cwd=tmp_path, cache=tmp_path / "c")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.startswith("acked failed:exited <n>: boom-<n> on ")
        and "for 8h or a job joins it: 2 jobs failed" in done.stdout
    )
    acked = book(queue_root)["open"][0]["acked"]
    assert acked["until"] > acked["at"] + 8 * H - 60 and "@" in acked["by"]


def _fails(q: Ticking, root: Path, job: str, rc: int, now: float) -> None:
    """JOB pushed (unless queued or running), started and failed with RC: two ticks, at NOW and NOW + 1."""
    if not any((root / state / job).exists() for state in ("queue", "running")):
        write_job(root, job, f"# LANE=cpu\nexit {rc}\n")
    q.tick(now)
    q.procs.exit(job, rc)
    q.tick(now + 1)


def _ack(root: Path, name: str, target: str, until: float | None) -> None:
    write_job(root, name, json.dumps({"by": "me", "target": target, "until": until}), state="control")


def test_a_job_that_joins_an_acked_failure_ends_the_ack_and_is_said_once(
    queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    q = ticking(T0, realert_s=H)
    _fails(q, queue_root, "j1.job", 1, T0)
    _ack(queue_root, "ack-1", "failed:j1", None)
    q.tick(T0 + 10)
    assert notices(q) == [("open", "failed:exited <n>")]
    _fails(q, queue_root, "j2.job", 7, T0 + 20)  # the same cause (`exited <n>`): it joins the acked incident
    [changed] = q.runner.alerts.notices
    assert (changed.what, changed.title) == ("changed", "changed: failed on " + q.runner.alerts.host)
    assert "2 jobs failed with `exited <n>` (j1.job, j2.job); new since the ack: j2.job (open 20s;" in changed.message
    for t in range(30, 1800, 60):
        q.tick(T0 + t)
    assert notices(q) == [("open", "failed:exited <n>"), ("changed", "failed:exited <n>")]  # once, not a flood
    [incident] = book(queue_root)["open"]
    assert incident["acked"] is None and incident["joined"] == {"at": T0 + 21, "jobs": ["j2.job"]}
    assert incident["sends"] == 2 and incident["count"] == 2
    # acked again, for a time: quiet while a job leaves (retried), news again when it fails anew, for all --for said
    _ack(queue_root, "ack-2", "EVENT", T0 + 8 * H)
    write_job(queue_root, "retry-j1.job", "{}", state="control")
    q.tick(T0 + 1800)
    assert book(queue_root)["open"][0]["jobs"] == ["j2.job"] and len(notices(q)) == 2
    _fails(q, queue_root, "j1.job", 1, T0 + 1810)
    assert notices(q)[2:] == [("changed", "failed:exited <n>")]
    assert book(queue_root)["open"][0]["joined"] == {"at": T0 + 1811, "jobs": ["j1.job"]}
    q.tick(T0 + 1811 + H)  # unacked since: repeated each --realert, as any open incident
    assert notices(q)[3:] == [("repeat", "failed:exited <n>")]


def test_more_jobs_waiting_on_an_acked_cause_are_not_news(queue_root: Path, ticking: Callable[..., Ticking]) -> None:
    write_job(queue_root, "84c-gpu-0.job", "# LANE=gpu\necho bench\n")
    q = ticking(T0, realert_s=600.0)
    q.procs.gpu = [GpuUser(77, 1, "llama-server", "name")]
    q.tick(T0)
    _ack(queue_root, "ack-1", "gpu-held", None)
    q.tick(T0 + 10)
    write_job(queue_root, "84c-gpu-1.job", "# LANE=gpu\necho bench\n")  # pushed: it waits on the same holder
    for t in range(20, 3000, 60):
        q.tick(T0 + t)
    assert notices(q) == [("open", "gpu-held:pid 77")]
    [incident] = book(queue_root)["open"]
    assert incident["count"] == 2 and incident["acked"] is not None and incident["joined"] is None


def test_plan_watch_hears_a_failure_that_joins_an_acked_one(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking], stand_in: int
) -> None:
    """The new user's trial, end to end: `plan ack` to the box, `plan watch --once` from a workstation."""
    now = time.time()  # the watcher judges the box's heartbeat on the box's clock, the real one
    q = ticking(now, pid=stand_in)
    state = str(tmp_path / "w.json")

    def plan(*args: str) -> tuple[int, str]:
        ran = plan_main(*args, cwd=tmp_path, cache=tmp_path / "c")
        return ran.returncode, ran.stdout + ran.stderr

    def watch() -> tuple[int, str]:
        return plan("watch", str(queue_root), "--once", "--state", state, "--dead", "1e9")

    _fails(q, queue_root, "j1.job", 1, now)
    code, out = watch()
    assert code == 10 and out.startswith(f"EVENT: {queue_root}: j1.job failed: exited 1 (open "), out
    code, out = plan("ack", str(queue_root), "failed:j1", "--wait", "0")
    assert code == 0 and out.startswith("acked failed:exited <n> on "), out
    q.tick(now + 2)  # the runner takes the ack
    assert watch() == (0, "")
    _fails(q, queue_root, "j2.job", 7, now + 3)
    code, out = watch()
    assert code == 10, out
    assert out.startswith(f"EVENT: {queue_root}: 2 jobs failed with `exited <n>` (j1.job, j2.job); new since the ack: ")
    assert watch() == (0, "")  # said once
    code, out = plan("ack", str(queue_root), "failed:j1", "--wait", "0")
    assert code == 0, out
    q.tick(now + 5)
    assert watch() == (0, "")
    code, out = plan("top", "--once", str(queue_root))
    assert "(acked): 2 jobs failed with `exited <n>` (j1.job, j2.job)" in out, out

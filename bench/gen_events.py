"""A generated week of runner events (current vocabulary): for `plan report` benchmarks and tests."""

from __future__ import annotations

import json
import random
import time
from typing import Any


def week_of_events(jobs: int = 200, events: int = 50000, seed: int = 7) -> list[dict[str, Any]]:
    """About EVENTS events over 7 days: jobs in three lanes, retries, waits, lane records, power cuts."""
    rng = random.Random(seed)
    start = time.mktime(time.strptime("2026-10-10 00:00:00", "%Y-%m-%d %H:%M:%S"))
    end = start + 7 * 86400
    names = [f"{i:03d}-{lane}-job-{i}.job" for i, lane in ((i, ("net", "gpu", "cpu")[i % 3]) for i in range(jobs))]
    out: list[dict[str, Any]] = []

    def emit(t: float, job: str, event: str, **kw: Any) -> None:
        out.append({"ts": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)), "job": job, "event": event, **kw})

    t = start
    emit(t, "-", "runner-start")
    for lane in ("net", "gpu", "cpu"):
        emit(t, "-", "lane", lane=lane, state="idle")
    # Each job's attempts; filler events (requires-wait, idle, ...) bring the count up.
    per_job = max(1, (end - start) / jobs)
    filler = max(0, events // jobs - 8)
    for i, name in enumerate(names):
        lane = name.split("-")[1]
        t = max(t, start + i * per_job + 1)
        emit(
            t,
            name,
            "lane",
            lane=lane,
            state="waiting",
            reason=rng.choice(["requires", "exclusive", "backoff"]),
            blocker="x",
        )
        for k in range(filler):
            emit(t + (k + 1) * (per_job * 0.3 / (filler + 1)), name, "requires-wait", requires="test -f /x", waited_s=k)
        t += per_job * 0.3
        attempts = rng.choice([1, 1, 1, 2, 3])
        for attempt in range(1, attempts + 1):
            emit(t, name, "start", lane=lane, pid=1000 + i, attempt=attempt)
            emit(t, name, "lane", lane=lane, state="busy")
            t += per_job * 0.15
            last = attempt == attempts
            ok = last and rng.random() < 0.9
            emit(
                t,
                name,
                "done" if ok else ("failed" if last else "retry"),
                rc=0 if ok else 1,
                attempt=attempt,
                tail=[] if ok else [f"error {rng.randint(1, 99)}: flag -b"],
            )
            emit(t, "-", "lane", lane=lane, state="idle")
        if rng.random() < 0.02:
            t += 600
            emit(t, "-", "runner-start")
            for other in ("net", "gpu", "cpu"):
                emit(t, "-", "lane", lane=other, state="idle")
    emit(max(t, end), "-", "runner-stop")
    return out


if __name__ == "__main__":
    for event in week_of_events():
        print(json.dumps(event))

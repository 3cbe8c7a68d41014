"""The A9 day replayed: a 300-job backlog at default thresholds, with the seed's silences in it, and the number of
notifications the box sends counted. Each silence opens exactly one incident and recovers once; repeats come
only every --realert (1 h) while one lasts. The seed's watcher sent either nothing or hundreds.

Driven by tick(now) over fake processes (tests/ticking.py): fake time, real files (job files, events.jsonl,
status.json, state.json, incidents.json), conditions in real bash.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.procs import GpuUser
from tests.conftest import write_job
from tests.ticking import Ticking

T0 = 1_000_000.0
M, H = 60.0, 3600.0
TICK = 10 * M  # the longest step of the fake clock; it steps to the next job's end sooner


@pytest.fixture
def day_root(tmp_path: Path) -> Iterator[Path]:
    """A queue root in memory where there is a tmpfs: some 300 ticks each sync their files, and on a busy disk
    the syncs, not the runner, were the test's time (25 s against 4)."""
    base = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.path.isdir("/dev/shm") else tmp_path
    root = base / "q"
    for state in ("queue", "running", "done", "failed", "logs"):
        (root / state).mkdir(parents=True)
    yield root
    if base != tmp_path:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.long  # computes for ~2 s in-process: started first, not last on its worker
def test_the_a9_day_sends_each_silence_once_and_its_recovery(tmp_path: Path, day_root: Path) -> None:
    queue_root = day_root
    strata = str(tmp_path / "strata-qwen-q2_0.json")  # 84c's REQUIRES: a typo, nothing writes it
    runs: dict[str, tuple[float, int, str]] = {}  # job -> (how long it runs, rc, its last line)
    jobs: dict[str, dict] = {}

    def job(name: str, lane: str, minutes: float, rc: int = 0, line: str = "ok", header: str = "") -> None:
        write_job(queue_root, name, f"# LANE={lane}\n{header}echo run\n")
        runs[name] = (minutes * M, rc, line)
        jobs[name] = {"requires": [], "outputs": []}

    for n in range(40):
        job(f"10-net-fetch-{n:02d}.job", "net", 2)
    job("92c-net-mai-code.job", "net", 212, line=" 64 52.44G  64 33.95G   0      0  2.72M      0 5:27:57 3:32:21")
    for n in range(3):  # one model's launch flags break every model's smoke test
        job(f"65-gpu-intake-{n}.job", "gpu", 3, rc=1, line=f"smoke test {n} failed: unknown flag --ctx-draft")
    for n in range(200):
        job(f"70-gpu-bench-{n:03d}.job", "gpu", 1)
    for n in range(54):
        job(f"30-cpu-publish-{n:02d}.job", "cpu", 1)
    job("84c-gpu-strata-check.job", "gpu", 2, header=f"# REQUIRES=test -f {strata}\n")
    jobs["84c-gpu-strata-check.job"]["requires"] = [strata]
    write_job(queue_root, "99-gpu-seeded.job", "")  # the seed script's 0-byte job
    assert len(runs) + 1 == 300
    (queue_root / "manifest.json").write_text(json.dumps({"plan": "a9", "jobs": jobs, "producers": {}, "external": []}))

    q = Ticking(queue_root).start(T0)
    started: dict[str, float] = {}
    holder_from: float | None = None
    seen: list[dict] = []  # events.jsonl, read on as it grows (not again from its start every tick)
    events = (queue_root / "events.jsonl").open()

    def new_events() -> list[dict]:
        fresh = [json.loads(line) for line in events.readlines()]
        seen.extend(fresh)
        return fresh

    failed: list[str] = []
    fixed = retried = False
    now = T0
    while now < T0 + 16 * H and (q.procs.running() or any((queue_root / "queue").iterdir())):
        for name in q.procs.running():  # jobs end when their time is up, saying their last line
            length, rc, line = runs[name]
            if name == "92c-net-mai-code.job":
                q.say(name, line)  # a download that keeps going
            if now - started[name] >= length:
                q.say(name, line)
                q.procs.exit(name, rc)
        fresh = new_events()
        if holder_from is None and any(e["event"] == "done" and e["job"] == "70-gpu-bench-010.job" for e in fresh):
            holder_from = now  # bench 010 left its llama-server behind: it holds the gpu lane 3 h 44 min
            q.procs.gpu = [GpuUser(46458, 1, "/home/user/tools/llama-server --port 45541", "name")]
        if holder_from is not None and now - holder_from >= 3 * H + 44 * M:
            q.procs.gpu = []
        if T0 + 67 * M <= now and not fixed:  # the 84c typo found after 1 h 07 min: pushed again without it
            fixed = True
            (queue_root / "queue" / "84c-gpu-strata-check.job").unlink()
            write_job(queue_root, "84c-gpu-strata-check.job", "# LANE=gpu\necho run\n")
        if T0 + 30 * M <= now and (queue_root / "failed" / "99-gpu-seeded.job").exists():  # the next push prunes it
            (queue_root / "failed" / "99-gpu-seeded.job").unlink()
        failed += [e["job"] for e in fresh if e["event"] == "failed"]
        if len(failed) == 3 and not retried:  # the flag fixed, the intakes retried
            retried = True
            for name in failed:
                runs[name] = (3 * M, 0, "ok")
                write_job(queue_root, f"retry-{name}", "{}", state="control")
        q.tick(now)
        for name in q.procs.running():
            started.setdefault(name, now)  # it started in this tick
        ends = [started.get(n, now) + runs[n][0] for n in q.procs.running()]
        now = min([now + TICK, T0 + 30 * M, T0 + 67 * M, *(e for e in ends if e > now)], key=lambda t: (t <= now, t))

    new_events()
    events.close()
    q.close()
    said = [(e["what"], e["kind"]) for e in seen if e["event"] == "incident"]
    opened = Counter(kind for what, kind in said if what == "open")
    recovered = Counter(kind for what, kind in said if what == "recovered")
    repeats = Counter(kind for what, kind in said if what == "repeat")
    silences = {"long-running": 1, "gpu-held": 1, "blocked": 1, "failed": 2}  # failed: the gate, and the 0-byte job
    assert opened == silences and recovered == silences, said
    # while they lasted: the download 3 h 32 min (opened at its 1 h WARN_AFTER), the holder 3 h 44 min, 84c 1 h 07 min
    assert repeats == {"long-running": 2, "gpu-held": 3, "blocked": 1}, said
    assert len(said) == 16
    assert len([e for e in seen if e["event"] == "done"]) == 299  # everything but the 0-byte job ran in the end
    assert now < T0 + 16 * H
    assert json.loads((queue_root / "incidents.json").read_text())["open"] == []

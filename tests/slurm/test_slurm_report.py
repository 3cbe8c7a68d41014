"""`plan report` on a Slurm host speaks Slurm's truth, from a real cluster run: per lane busy + idle + waiting is
the window, its jobs' waits are split by Slurm's reasons, and a failure cluster is labelled with the jobs' own
last lines, never the wrapper's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import plan_cli, wait_for
from tests.slurm.cluster import Slurm
from tests.slurm.jobs import cancel_root, ended, held_until, write_plan

pytestmark = pytest.mark.usefixtures("plan_env")
LANES = (("g1", "gpu"), ("g2", "gpu"), ("n1", "net"), ("n2", "net"))
plan = plan_cli


def test_the_report_splits_each_lanes_window_and_its_jobs_waits_by_slurms_reasons(tmp_path: Path, slurm: Slurm) -> None:
    root, gate = tmp_path / "submit", tmp_path / "gate"
    fail = 'echo \\"fatal: disk quota exceeded on /data/{0}\\"; exit 3'
    held = held_until(gate)
    jobs = (
        # two jobs on the one GPU and two on the one net licence, each held until the test opens GATE: the second
        # of each waits on Resources and on Licenses; d waits on g1 (Dependency); f1 and f2 fail alike
        "".join(
            f"  - name: {n}\n    lane: {lane}\n    run: '{held}; touch {tmp_path}/{n}'\n"
            f"    outputs: ['{tmp_path}/{n}']\n"
            for n, lane in LANES
        )
        + "  - name: d\n    run: 'true'\n    requires: [{after: g1}]\n"
        + "".join(f'  - name: {n}\n    run: "{fail.format(n)}"\n' for n in ("f1", "f2"))
    )
    p = write_plan(tmp_path / "rw.yaml", "rw", jobs)
    hosts = slurm.hosts_file(root, extra="    exclusive: []\n")  # gpu and net apart: each job waits on its own
    code, out = plan("push", "cluster", str(p), "--hosts", str(hosts))
    assert code == 0, out
    try:

        def waiting() -> dict | None:  # each status contact records the reasons squeue gives the pending jobs
            code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
            said = {q["lane"]: q["detail"].split(":")[0] for q in json.loads(out)["status"]["queued"]}
            # a job the scheduler has not looked at yet pends for reason None (seen at load 7): waited past
            return (
                said
                if said.get("gpu") == "Resources"
                and said.get("cpu") == "Dependency"
                and said.get("net", "None") != "None"
                else None
            )

        said = wait_for(waiting, 60, 0.3)
        # the second net job waits on Licenses, or on Priority behind the gpu job waiting on Resources
        assert said["net"] in ("Licenses", "Priority"), said
        wait_for(lambda: ended(root, "rw", "f2") and ended(root, "rw", "f1"), 60, 0.2)
        gate.touch()
        wait_for(lambda: all(ended(root, "rw", n) == "COMPLETED" for n in ("g1", "g2", "n1", "n2", "d")), 60, 0.2)
    finally:
        cancel_root(slurm, root)
    code, out = plan("report", "cluster", "--hosts", str(hosts), "--plan", "rw", "--json")
    assert code == 0, out
    report = json.loads(out[out.index("{") :])
    lanes = report["lanes"]
    window = max(s["end"] for s in report["spans"]) - min(s["start"] for s in report["spans"])
    assert window > 0
    for lane in ("gpu", "net", "cpu"):
        row = lanes[lane]
        total = row["busy_s"] + row["idle_s"] + row["waiting_s"] + row["down_s"]
        assert abs(total - window) < 0.01, (lane, row, window)  # each lane's time is the window, no more
    assert lanes["gpu"]["waited"]["Resources"] > 0 and lanes["net"]["waited"][said["net"]] > 0, lanes
    assert lanes["cpu"]["waited"]["Dependency"] > 0, lanes["cpu"]
    second = max(("rw/g1.job", "rw/g2.job"), key=lambda j: report["jobs"][j].get("waited", {}).get("Resources", 0))
    assert report["jobs"][second]["waited"]["Resources"] > 0, report["jobs"]
    for row in lanes.values():  # a lane idle with work waiting says why in Slurm's words
        assert abs(sum(row["causes"].values()) - row["waiting_s"]) < 0.01, row
        assert set(row["causes"]) <= set(row["waited"]), row
    [cluster] = report["failure_clusters"]
    assert sorted(cluster["jobs"]) == ["rw/f1.job", "rw/f2.job"]
    assert cluster["line"].startswith("fatal: disk quota exceeded on /data/f"), cluster
    code, text = plan("report", "cluster", "--hosts", str(hosts), "--plan", "rw")
    lines = text.splitlines()
    block = lines[lines.index(next(ln for ln in lines if ln.startswith("gpu "))) + 1 :]
    said = [ln for ln in block[: next(i for i, ln in enumerate(block) if not ln.startswith(" " * 9))]]
    assert code == 0 and any(
        ln.startswith("         its jobs waited (Slurm's reasons, summed): ") and "Resources" in ln for ln in said
    ), text

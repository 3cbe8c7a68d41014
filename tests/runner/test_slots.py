"""Lane slots from the plan (`lanes: {cpu: {slots: 2}}`) and the hosts file, through manifest.json to the runner;
`--slots` wins; status, watch and report count them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from plancompiler.cli import app
from plancompiler.report import build_report
from runner.views.status import render_status
from tests.ticking import Ticking

cli = CliRunner()
T0 = 1_000_000.0


def _plan(tmp_path: Path, lanes: str, jobs: int = 3) -> Path:
    path = tmp_path / "slots.yaml"
    rows = ", ".join(str(i) for i in range(jobs))
    path.write_text(
        f"plan: slots\nlanes: {lanes}\njobs:\n"
        f'  - name: "work-{{{{ i }}}}"\n    foreach: {{i: [{rows}]}}\n    lane: cpu\n    run: "sleep 1"\n'
    )
    return path


def _invoke(*args: str) -> tuple[int, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.output


def test_plan_slots_reach_the_runner_and_two_jobs_overlap(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    plan = _plan(tmp_path, "{cpu: {slots: 2}, net: {slots: 1}}")
    code, out = _invoke("push", str(queue_root), str(plan))
    assert code == 0, out
    manifest = json.loads((queue_root / "manifest.json").read_text())
    assert manifest["slots"] == {"cpu": 2, "net": 1} and manifest["plans"]["slots"]["slots"] == {"cpu": 2, "net": 1}
    q = ticking(T0)
    q.tick(T0)
    assert q.procs.running() == ["work-0.job", "work-1.job"]  # side by side in the 2 slots of cpu
    assert q.reason("work-2.job")["reason"] == "order"  # type: ignore[index]
    lanes = q.status()["lanes"]
    assert (lanes["cpu"]["slots"], lanes["cpu"]["busy"]) == (2, 2)
    assert "cpu   2/2 slots busy" in render_status(q.status(), T0)


def test_the_slots_flag_wins_over_the_manifest(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    assert _invoke("push", str(queue_root), str(_plan(tmp_path, "{cpu: {slots: 3}}")))[0] == 0
    q = ticking(T0, slots={"cpu": 1})
    q.tick(T0)
    assert q.procs.running() == ["work-0.job"]
    assert q.status()["lanes"]["cpu"]["slots"] == 1


def test_the_list_form_keeps_one_slot_and_a_bad_count_is_located(tmp_path: Path, queue_root: Path) -> None:
    assert _invoke("push", str(queue_root), str(_plan(tmp_path, "[net, gpu, cpu]")))[0] == 0
    assert "slots" not in json.loads((queue_root / "manifest.json").read_text())
    code, out = _invoke("check", str(_plan(tmp_path, "{cpu: {slots: 0}}")))
    assert (
        code == 1 and "slots.yaml:2:" in out and "lanes: cpu.slots: a whole number >= 1 (at most 1024), got 0" in out
    ), out
    assert "valid list" not in out and "Traceback" not in out
    code, out = _invoke("check", str(_plan(tmp_path, "{cpu: {slot: 2}}")))
    assert code == 1 and "lanes: cpu: unknown key 'slot'; did you mean 'slots'?" in out and "Traceback" not in out, out


def test_a_hosts_file_lane_slots_win_and_a_change_of_them_is_pushed(tmp_path: Path) -> None:
    root = tmp_path / "box"
    hosts = tmp_path / "hosts.yaml"
    plan = _plan(tmp_path, "{cpu: {slots: 2}}")
    hosts.write_text(f"hosts:\n  box:\n    root: {root}\n    lanes: {{cpu: {{slots: 4}}}}\n")
    code, out = _invoke("push", "box", str(plan), "--hosts", str(hosts))
    assert code == 0, out
    assert json.loads((root / "manifest.json").read_text())["slots"] == {"cpu": 4}
    hosts.write_text(f"hosts:\n  box:\n    root: {root}\n    lanes: {{cpu: {{slots: 3}}}}\n")
    code, out = _invoke("push", "box", str(plan), "--hosts", str(hosts))
    assert code == 0, out
    assert json.loads((root / "manifest.json").read_text())["slots"] == {"cpu": 3}
    hosts.write_text(f"hosts:\n  box:\n    root: {root}\n    lanes: {{cpu: {{slotz: 3}}}}\n")
    code, out = _invoke("push", "box", str(plan), "--hosts", str(hosts))
    assert code == 2 and "hosts.yaml:4:" in out and "did you mean 'slots'?" in out, out


def test_watch_line_and_report_count_slots(tmp_path: Path) -> None:
    from plancompiler.watch.judge import lanes_line as _lanes_line

    status = {
        "lane_order": ["cpu"],
        "lanes": {"cpu": {"state": "busy", "slots": 4, "busy": 2}},
        "running": [{"lane": "cpu", "job": "a.job"}, {"lane": "cpu", "job": "b.job"}],
    }
    assert _lanes_line(status) == "cpu 2/4 slots busy (a.job + b.job)"
    status["lanes"] = {"cpu": {"state": "busy", "busy": 2}}  # Slurm: a lane without licences has no slot count
    assert _lanes_line(status) == "cpu 2 running (a.job + b.job)"
    events = [
        {"ts": "2026-01-01 00:00:00", "job": "-", "event": "runner-start"},
        {"ts": "2026-01-01 00:00:00", "job": "a.job", "event": "lane", "lane": "cpu", "state": "busy", "busy": 1},
        {
            "ts": "2026-01-01 00:00:10",
            "job": "a.job",
            "event": "lane",
            "lane": "cpu",
            "state": "busy",
            "busy": 2,
            "slots": 2,
        },
        {"ts": "2026-01-01 00:00:30", "job": "-", "event": "lane", "lane": "cpu", "state": "idle"},
        {"ts": "2026-01-01 00:01:00", "job": "-", "event": "runner-stop"},
    ]
    report = build_report(events)
    cpu = report.totals()["cpu"]
    assert cpu["busy_s"] == 30 and cpu["slot_s"] == 10 + 2 * 20
    assert "slot-time busy" in report.text()

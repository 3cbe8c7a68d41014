"""`plan report`: the seed's two worst evenings attributed to their causes, seed-format events, the HTML."""
from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from typer.testing import CliRunner

from plancompiler.cli import app
from plancompiler.report import build_report
from plancompiler.report_html import render_html
from tests.conftest import RunnerProcess, write_job

cli = CliRunner()


def ev(ts: str, job: str, event: str, **details: object) -> dict:
    return {"ts": ts, "job": job, "event": event, **details}


def evening_of_15_october() -> list[dict]:
    d = "2026-10-15 "
    return [
        ev(d + "20:00:00", "-", "runner-start", pid=1),
        ev(d + "20:00:00", "-", "lane", lane="net", state="idle"),
        ev(d + "20:00:00", "-", "lane", lane="gpu", state="idle"),
        ev(d + "20:00:00", "-", "lane", lane="cpu", state="idle"),
        ev(d + "20:09:33", "92b-net-glm53-reap-q4km.job", "start", lane="net", pid=99494, attempt=1),
        ev(d + "20:09:33", "92b-net-glm53-reap-q4km.job", "lane", lane="net", state="busy"),
        ev(d + "20:25:23", "92b-net-glm53-reap-q4km.job", "done", rc=0, verified=True),
        ev(d + "20:25:23", "92c-net-mai-code.job", "start", lane="net", pid=99681, attempt=1),
        ev(d + "20:25:23", "92c-net-mai-code.job", "lane", lane="net", state="busy"),
        ev(d + "20:25:23", "88b-gpu-build-vulkan-new.job", "lane", lane="gpu", state="waiting",
           reason="exclusive", blocker="92c-net-mai-code.job"),
        ev(d + "21:25:23", "92c-net-mai-code.job", "long-running", lane="net", elapsed_s=3600),
        ev(d + "23:57:56", "92c-net-mai-code.job", "failed", rc=143, attempt=1, verified=False),
        ev(d + "23:57:56", "-", "lane", lane="net", state="idle"),
        ev(d + "23:57:56", "88b-gpu-build-vulkan-new.job", "start", lane="gpu", pid=100894, attempt=1),
        ev(d + "23:57:56", "88b-gpu-build-vulkan-new.job", "lane", lane="gpu", state="busy"),
        ev(d + "23:59:27", "88b-gpu-build-vulkan-new.job", "done", rc=0, verified=True),
        ev(d + "23:59:27", "-", "lane", lane="gpu", state="idle"),
    ]


def test_gpu_idle_behind_the_slow_download_is_attributed_to_92c() -> None:
    report = build_report(evening_of_15_october())
    gpu = report.totals()["gpu"]
    assert gpu["causes"] == {"exclusive: held by 92c-net-mai-code.job": 3 * 3600 + 32 * 60 + 33}
    assert "idle with work waiting   3h32m: exclusive: held by 92c-net-mai-code.job" in report.text()
    assert report.jobs["92c-net-mai-code.job"].outcome == "failed"


def test_orphan_of_11_october_is_attributed_to_pid_46458() -> None:
    d = "2026-10-11 "
    events = [
        ev(d + "05:00:00", "-", "runner-start"),
        ev(d + "05:00:00", "65-gpu-intake-z-qwen36-35b-q8kxl.job", "start", lane="gpu", attempt=1),
        ev(d + "05:00:00", "65-gpu-intake-z-qwen36-35b-q8kxl.job", "lane", lane="gpu", state="busy"),
        ev(d + "06:06:26", "65-gpu-intake-z-qwen36-35b-q8kxl.job", "done", rc=0, verified=True),
        ev(d + "06:06:26", "65-gpu-intake-z-step37-flash-iq3xxs.job", "gpu-wait", pid=46458, ppid="1",
           cmd="/home/user/tools/llamacpp-vulkan-master/llama-server --port 45541"),
        ev(d + "06:06:26", "65-gpu-intake-z-step37-flash-iq3xxs.job", "lane", lane="gpu", state="waiting",
           reason="gpu-foreign", blocker="pid 46458"),
        ev(d + "09:50:20", "65-gpu-intake-z-step37-flash-iq3xxs.job", "start", lane="gpu", attempt=1),
        ev(d + "09:50:20", "65-gpu-intake-z-step37-flash-iq3xxs.job", "lane", lane="gpu", state="busy"),
        ev(d + "10:00:00", "65-gpu-intake-z-step37-flash-iq3xxs.job", "done", rc=0, verified=True),
    ]
    report = build_report(events)
    waiting = [s for s in report.spans if s.state == "waiting"]
    assert len(waiting) == 1
    span = waiting[0]
    assert span.cause == "foreign GPU process pid 46458"
    assert (span.start, span.end) == (report.start + 3986, report.start + 3986 + 13434)
    assert report.to_json()["spans"][1]["seconds"] == 13434


def test_runner_down_is_its_own_cause() -> None:
    d = "2026-10-12 "
    events = [
        ev(d + "01:00:00", "-", "runner-start"),
        ev(d + "01:00:00", "-", "lane", lane="gpu", state="idle"),
        ev(d + "01:30:00", "x.job", "start", lane="cpu"),
        ev(d + "03:00:00", "-", "runner-start"),  # a power cut: nothing between 01:30 and 03:00
        ev(d + "03:00:00", "-", "lane", lane="gpu", state="idle"),
        ev(d + "03:10:00", "-", "runner-stop"),
    ]
    totals = build_report(events).totals()
    assert totals["gpu"]["down_s"] == 5400 and totals["gpu"]["idle_s"] == 1800 + 600


SEED_EVENTS = """\
{"ts": "2026-10-15 20:00:00", "job": "-", "event": "runner-start"}
{"ts": "2026-10-15 20:09:33", "job": "92b-net-glm53-reap-q4km.job", "event": "start", "lane": "net", "pid": 99494, "attempt": 1}
{"ts": "2026-10-15 20:25:23", "job": "92b-net-glm53-reap-q4km.job", "event": "done", "rc": 0, "verified": true}
{"ts": "2026-10-15 20:25:23", "job": "92c-net-mai-code.job", "event": "start", "lane": "net", "pid": 99681, "attempt": 1}
{"ts": "2026-10-15 23:57:56", "job": "92c-net-mai-code.job", "event": "failed", "rc": 143, "attempt": 1, "verified": false}
{"ts": "2026-10-15 23:57:56", "job": "88b-gpu-build-vulkan-new.job", "event": "start", "lane": "gpu", "pid": 100894, "attempt": 1}
{"ts": "2026-10-15 23:59:27", "job": "88b-gpu-build-vulkan-new.job", "event": "done", "rc": 0, "verified": true}
"""


def test_seed_format_events_give_per_lane_busy_and_idle(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(SEED_EVENTS)
    result = cli.invoke(app, ["report", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["inferred"] is True
    assert data["lanes"]["net"]["busy_s"] == 950 + 12753
    assert data["lanes"]["net"]["idle_s"] == 573 + 91
    assert data["lanes"]["gpu"]["busy_s"] == 91 and data["lanes"]["gpu"]["idle_s"] == 14276
    text = cli.invoke(app, ["report", str(path)]).stdout
    assert "inferred" in text


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.lanes: list[str] = []
        self.bars: list[dict[str, str]] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "lane" in a.get("class", "").split() and tag == "div":
            self.lanes.append(a["data-lane"])
        if "bar" in a.get("class", "").split():
            self.bars.append(a)
        for key in ("src", "href"):
            if a.get(key):
                self.external.append(a[key])


def test_html_structure_matches_text_report(tmp_path: Path) -> None:
    report = build_report(evening_of_15_october())
    page = _Collect()
    page.feed(render_html(report))
    assert page.lanes == ["net", "gpu", "cpu"]
    busy = [b for b in page.bars if b["data-state"] == "busy"]
    assert sorted(b["data-job"] for b in busy) == ["88b-gpu-build-vulkan-new.job", "92b-net-glm53-reap-q4km.job",
                                                   "92c-net-mai-code.job"]
    waiting = [b for b in page.bars if b["data-state"] == "waiting"]
    assert [int(b["data-seconds"]) for b in waiting] == [12753]
    assert "exclusive: held by 92c-net-mai-code.job" in waiting[0]["title"]
    assert page.external == []  # opens offline: no scripts, styles or images from anywhere


def test_report_of_a_real_runner_run_covers_its_lanes(queue_root: Path, runner: RunnerProcess,
                                                      tmp_path: Path) -> None:
    write_job(queue_root, "1-net-a.job", "# LANE=net\nsleep 1.2\n")
    write_job(queue_root, "2-gpu-b.job", "# LANE=gpu\nsleep 0.2\n")
    runner.start()
    runner.wait_event("done", job="2-gpu-b.job")
    runner.stop()
    out = tmp_path / "r.html"
    result = cli.invoke(app, ["report", str(queue_root), "--json", "--html", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["inferred"] is False
    assert data["jobs"]["1-net-a.job"]["outcome"] == "done"
    assert any(c.startswith("exclusive: held by 1-net-a.job") for c in data["lanes"]["gpu"]["causes"])
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_generated_week_reports_every_job() -> None:
    from bench.gen_events import week_of_events

    events = week_of_events(jobs=200, events=5000)
    report = build_report(events)
    assert len(report.jobs) == 200
    totals = report.totals()
    span = report.end - report.start
    for lane, row in totals.items():
        covered = row["busy_s"] + row["idle_s"] + row["waiting_s"] + row["down_s"]
        assert abs(covered - span) < 2, lane


def test_since_and_until_clip_the_window(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in evening_of_15_october()) + "\n")
    result = cli.invoke(app, ["report", str(path), "--json", "--since", "2026-10-15 21:25:23",
                              "--until", "2026-10-15 22:25:23"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["lanes"]["gpu"]["causes"] == {"exclusive: held by 92c-net-mai-code.job": 3600}
    assert data["lanes"]["net"]["busy_s"] == 3600
    bad = cli.invoke(app, ["report", str(path), "--since", "yesterday"])
    assert bad.exit_code == 2 and "not a time" in bad.output

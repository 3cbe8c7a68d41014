"""`plan report`: the seed's two worst evenings attributed to their causes, seed-format events, the HTML."""

from __future__ import annotations

import json
import time
from html.parser import HTMLParser
from pathlib import Path

from typer.testing import CliRunner

from plancompiler.cli import app
from plancompiler.report import build_report
from plancompiler.report.html import render_html
from runner.queue import timestamp
from tests.conftest import RunnerProcess, read_events, write_job
from tests.ticking import Ticking
from tests.watch.page import Page

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
        ev(
            d + "20:25:23",
            "88b-gpu-build-vulkan-new.job",
            "lane",
            lane="gpu",
            state="waiting",
            reason="exclusive",
            blocker="92c-net-mai-code.job",
        ),
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
        ev(
            d + "06:06:26",
            "65-gpu-intake-z-step37-flash-iq3xxs.job",
            "gpu-wait",
            pid=46458,
            ppid="1",
            cmd="/home/user/tools/llamacpp-vulkan-master/llama-server --port 45541",
        ),
        ev(
            d + "06:06:26",
            "65-gpu-intake-z-step37-flash-iq3xxs.job",
            "lane",
            lane="gpu",
            state="waiting",
            reason="gpu-foreign",
            blocker="pid 46458",
        ),
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
    assert sorted(b["data-job"] for b in busy) == [
        "88b-gpu-build-vulkan-new.job",
        "92b-net-glm53-reap-q4km.job",
        "92c-net-mai-code.job",
    ]
    waiting = [b for b in page.bars if b["data-state"] == "waiting"]
    assert [int(b["data-seconds"]) for b in waiting] == [12753]
    assert "exclusive: held by 92c-net-mai-code.job" in waiting[0]["title"]
    assert page.external == []  # opens offline: no scripts, styles or images from anywhere


def test_report_of_a_real_runner_run_covers_its_lanes(queue_root: Path, runner: RunnerProcess, tmp_path: Path) -> None:
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
    result = cli.invoke(
        app, ["report", str(path), "--json", "--since", "2026-10-15 21:25:23", "--until", "2026-10-15 22:25:23"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["lanes"]["gpu"]["causes"] == {"exclusive: held by 92c-net-mai-code.job": 3600}
    assert data["lanes"]["net"]["busy_s"] == 3600
    bad = cli.invoke(app, ["report", str(path), "--since", "yesterday"])
    assert bad.exit_code == 2 and "not a time" in bad.output


def _report_file(tmp_path: Path, events: list[dict], *flags: str) -> dict:
    """`plan report FILE --json` on a real events.jsonl written in the runner's format."""
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    result = cli.invoke(app, ["report", str(path), "--json", *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _outage(restart: dict, heartbeats: bool) -> list[dict]:
    """Idle from 01:00, killed at 01:25 (nothing changed, so no event since 01:00), back at 01:26."""
    d = "2026-10-12 "
    events = [
        ev(d + "01:00:00", "-", "runner-start", pid=1, last_alive=None),
        ev(d + "01:00:00", "-", "lane", lane="gpu", state="idle"),
    ]
    if heartbeats:
        events += [ev(d + "01:10:00", "-", "heartbeat"), ev(d + "01:20:00", "-", "heartbeat")]
    return events + [
        restart,
        ev(d + "01:26:00", "-", "lane", lane="gpu", state="idle"),
        ev(d + "01:30:00", "-", "runner-stop", why="SIGTERM"),
    ]


def test_downtime_is_counted_from_the_last_sign_of_life(tmp_path: Path) -> None:
    d = "2026-10-12 "
    with_alive = ev(d + "01:26:00", "-", "runner-start", pid=2, last_alive=d + "01:25:00")
    gpu = _report_file(tmp_path, _outage(with_alive, heartbeats=True))["lanes"]["gpu"]
    assert (gpu["down_s"], gpu["idle_s"]) == (60, 25 * 60 + 4 * 60)
    # no last_alive (an older runner): its last heartbeat event is the last sign of life
    unknown = ev(d + "01:26:00", "-", "runner-start", pid=2, last_alive=None)
    assert _report_file(tmp_path, _outage(unknown, heartbeats=True))["lanes"]["gpu"]["down_s"] == 6 * 60
    # neither (a seed runner): from its last event, as before
    seed = ev(d + "01:26:00", "-", "runner-start", pid=2)
    assert _report_file(tmp_path, _outage(seed, heartbeats=False))["lanes"]["gpu"]["down_s"] == 26 * 60


def test_downtime_from_last_alive_in_seed_format_events(tmp_path: Path) -> None:
    d = "2026-10-12 "
    events = [
        ev(d + "01:00:00", "-", "runner-start"),
        ev(d + "01:00:00", "1-gpu-long.job", "start", lane="gpu", attempt=1),
        ev(d + "01:40:00", "-", "runner-start", last_alive=d + "01:30:00"),
        ev(d + "01:40:00", "1-gpu-long.job", "start", lane="gpu", attempt=2),
        ev(d + "01:50:00", "1-gpu-long.job", "done", rc=0),
    ]
    data = _report_file(tmp_path, events)
    assert data["inferred"] is True
    assert data["lanes"]["gpu"]["busy_s"] == 30 * 60 + 10 * 60 and data["lanes"]["gpu"]["down_s"] == 10 * 60


def test_each_outcome_is_named_and_refused_requests_are_not_jobs(tmp_path: Path) -> None:
    d = "2026-10-13 "
    events = [
        ev(d + "10:00:00", "-", "runner-start", pid=1),
        ev(d + "10:00:00", "a.job", "start", lane="cpu", attempt=1),
        ev(d + "10:01:00", "a.job", "cancelled", by="me@lap", was="running", pids=[5]),
        ev(d + "10:01:00", "b.job", "cancelled", by="me@lap", was="queued"),
        ev(d + "10:01:00", "c.job", "start", lane="gpu", attempt=1),
        ev(d + "10:03:00", "c.job", "timeout", limit_s=120, elapsed_s=120, attempt=1),
        ev(d + "10:03:01", "c.job", "failed", rc=143, attempt=1, why="timeout"),
        ev(d + "10:04:00", "d.job", "invalid", reason="unknown header key LANEE"),
        ev(d + "10:04:00", "e.job", "blocked", path="/x", producer="", why="no job produces /x"),
        ev(d + "10:05:00", "f.job", "retry", by="me@lap", note="not in failed/: nothing to retry"),
        ev(d + "10:05:00", "g.job", "cancelled", by="me@lap", was="neither queued nor running: nothing done"),
        ev(d + "10:05:00", "h.job", "start", lane="net", attempt=1),
        ev(d + "10:06:00", "i.job", "start", lane="cpu", attempt=1),
        ev(d + "10:07:00", "i.job", "failed", rc=1, attempt=1),
        ev(d + "10:08:00", "i.job", "retry", by="me@lap", note="re-queued from failed/, attempts reset"),
    ]
    jobs = _report_file(tmp_path, events)["jobs"]
    assert {name: (j["attempts"], j["outcome"]) for name, j in jobs.items()} == {
        "a.job": (1, "cancelled"),
        "b.job": (0, "cancelled"),
        "c.job": (1, "timeout"),
        "d.job": (0, "invalid"),
        "e.job": (0, "blocked"),
        "h.job": (1, ""),
        "i.job": (1, "retrying"),
    }
    assert jobs["a.job"]["durations"] == [60] and jobs["c.job"]["durations"] == [120]
    text = cli.invoke(app, ["report", str(tmp_path / "events.jsonl")]).stdout
    assert "c.job  gpu  1 attempt  timeout" in text and "h.job  net  1 attempt  unfinished" in text
    assert "f.job" not in text and "g.job" not in text


def test_heartbeat_events_do_not_break_a_silence(tmp_path: Path) -> None:
    d = "2026-10-12 "
    events = [
        ev(d + "01:00:00", "-", "runner-start"),
        ev(d + "01:00:00", "x.job", "start", lane="net"),
        *(ev(f"{d}01:{m}:00", "-", "heartbeat") for m in (10, 20, 30, 40, 50)),
        ev(d + "01:55:00", "x.job", "done", rc=0),
    ]
    silences = _report_file(tmp_path, events)["silences"]
    assert silences[0]["seconds"] == 55 * 60


def test_html_has_everything_the_text_report_has_and_names_the_job_on_each_bar() -> None:
    events = evening_of_15_october() + [
        ev(
            "2026-10-15 23:59:30",
            "-",
            "correlated-failure",
            jobs=["65-a.job", "65-b.job"],
            line="unsupported sampler flag: -b",
        )
    ]
    report = build_report(events)
    page = Page()
    page.feed(render_html(report))
    assert page.external == []
    jobs = {row[0]: row[1:4] for row in page.tables["jobs"][1:]}
    assert jobs == {
        "88b-gpu-build-vulkan-new.job": ["gpu", "1", "done"],
        "92b-net-glm53-reap-q4km.job": ["net", "1", "done"],
        "92c-net-mai-code.job": ["net", "1", "failed"],
    }
    assert page.tables["clusters"][1] == ["2", "unsupported sampler flag: -b", "65-a.job, 65-b.job"]
    silences = page.tables["silences"][1:]
    assert silences[0] == ["2026-10-15 21:25:23", "2026-10-15 23:57:56", "2h32m"]
    assert len(silences) == len(report.silences)
    assert page.tables["causes"][0][0] == "gpu: exclusive: held by 92c-net-mai-code.job"
    by_job = {(b["data-state"], b["data-job"]): b for b in page.bars}
    wide = by_job[("busy", "92c-net-mai-code.job")]
    assert wide["label"] == "92c-net-mai-code.job" and wide["title"].startswith("busy: 92c-net-mai-code.job (3h32m")
    narrow = by_job[("busy", "88b-gpu-build-vulkan-new.job")]  # 91 s of four hours: no room for a label
    assert narrow["label"] == "" and "88b-gpu-build-vulkan-new.job" in narrow["title"]
    waiting = by_job[("waiting", "88b-gpu-build-vulkan-new.job")]
    assert waiting["label"] == "92c-net-mai-code.job" == waiting["data-holder"]  # what held the lane
    assert "exclusive: held by 92c-net-mai-code.job; 88b-gpu-build-vulkan-new.job waits" in waiting["title"]


def test_report_downtime_is_the_outage_not_the_quiet_before_it(queue_root: Path) -> None:
    """A runner alive and idle for 4 s (a heartbeat each tick, no event), killed -9 (no runner-stop: its
    status.json and heartbeat.json left as they were), a new one started 3 s later: down 3 s, not 7. Time is
    passed in (a real runner's ticks are late on a loaded machine, and the outage then is not the test's)."""
    t0 = float(int(time.time()) - 60)  # whole seconds: events are stamped to the second
    first = Ticking(queue_root).start(t0)
    for step in range(1, 21):
        first.tick(t0 + step * 0.2)  # idle: nothing changes, so the runner writes no event, but it is alive
    first.close()  # killed -9: the locks go with the process, nothing else is written
    second = Ticking(queue_root).start(t0 + 7)
    second.tick(t0 + 7.2)
    second.runner.stop(t0 + 8)
    second.close()
    [restart] = [e for e in read_events(queue_root) if e["event"] == "runner-start"][1:]
    assert restart["last_alive"] == timestamp(t0 + 4)  # the killed runner's last heartbeat
    result = cli.invoke(app, ["report", str(queue_root), "--json", "--until", timestamp(t0 + 8)])
    assert result.exit_code == 0, result.output
    lanes = json.loads(result.stdout)["lanes"]
    # Counting the idle 4 s as down would make it 7.
    assert {lane: row["down_s"] for lane, row in lanes.items()} == {"net": 3.0, "gpu": 3.0, "cpu": 3.0}


def test_a_requires_wait_says_whether_it_came_true_and_an_untouched_queue_has_no_events_yet(
    tmp_path: Path, queue_root: Path
) -> None:
    d = "2026-10-15 "
    events = [
        ev(d + "20:00:00", "-", "runner-start"),
        ev(d + "20:00:00", "a.job", "lane", lane="cpu", state="waiting", reason="requires", blocker="test -f /x/a"),
        ev(d + "20:10:00", "a.job", "start", lane="cpu", attempt=1),
        ev(d + "20:10:00", "a.job", "lane", lane="cpu", state="busy"),
        ev(d + "20:11:00", "a.job", "done", rc=0),
        ev(d + "20:11:00", "b.job", "lane", lane="cpu", state="waiting", reason="requires", blocker="test -f /x/b"),
        ev(d + "20:20:00", "-", "runner-stop", why="SIGTERM"),
    ]
    text = build_report(events).text()
    assert "10m00s: requires: test -f /x/a (true later: the job started)" in text
    assert "9m00s: requires: test -f /x/b (the job never started)" in text and "held" not in text
    result = cli.invoke(app, ["report", str(queue_root)])  # a queue no runner has run: no events.jsonl
    assert result.exit_code == 0 and result.output == f"{queue_root}: no events yet: no runner has run this queue\n"

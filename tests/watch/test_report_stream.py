"""`plan report` streams events.jsonl: a file is read line by line, --since skips what lies long before the
window without parsing it, and the report is the one the whole file gives (bench/report_bench.py: 1M lines)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gen_events import week_of_events
from plancompiler.report import EventLines, build_report, parse_ts
from tests.conftest import plan_cli


def _week(tmp_path: Path) -> tuple[Path, list[dict]]:
    events = week_of_events(jobs=60, events=6000)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path, events


def test_a_streamed_report_is_the_report_of_the_whole_list(tmp_path: Path) -> None:
    path, events = _week(tmp_path)
    whole = build_report(list(events)).to_json()
    with open(path) as lines:
        streamed = build_report(EventLines(lines)).to_json()
    assert streamed == whole


def test_since_skips_old_lines_unparsed_and_reports_the_same_window(tmp_path: Path) -> None:
    path, events = _week(tmp_path)
    since = parse_ts(events[len(events) // 2]["ts"])
    # A line long before the window that is not even JSON: skipped unread with --since, said without it.
    # (An `invalid` event: one the report reads, so without --since the line is parsed and found broken.)
    old = '{"ts": "2020-01-01 00:00:00", "job": "x.job", "event": "invalid", BROKEN\n'
    path.write_text(old + path.read_text())
    with open(path) as lines:
        reader = EventLines(lines, since)
        skipping = build_report(reader, since).to_json()
    assert not any("not JSON" in note for note in reader.skipped())
    with open(path) as lines:
        reader = EventLines(lines)
        reading = build_report(reader, since).to_json()
    assert any(note == "line 1: not JSON" for note in reader.skipped())
    assert skipping["lanes"] == reading["lanes"] and skipping["jobs"] == reading["jobs"]
    assert skipping["silences"] == reading["silences"]


def test_report_of_a_file_says_which_lines_it_left_out(tmp_path: Path) -> None:
    path, _ = _week(tmp_path)
    path.write_text(path.read_text() + "not json\n" + json.dumps({"ts": "x", "event": "done"}) + "\n")
    code, out = plan_cli("report", str(path), "--json")
    assert code == 0, out
    skipped = json.loads(out[out.index("{") :])["skipped"]
    assert any("not JSON" in s for s in skipped) and any("is not a time" in s for s in skipped)


def test_an_empty_or_foreign_file_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    code, out = plan_cli("report", str(empty))
    assert code == 2 and "no events (it is empty)" in out
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text("hello\nworld\n")
    code, out = plan_cli("report", str(foreign))
    assert code == 2 and "not an events.jsonl: none of its 2 lines" in out

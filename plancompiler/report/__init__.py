"""`plan report`: from events.jsonl, where each lane's time went, and why the work that waited waited.

events (reading and time parsing), model (the report and its text/JSON), analysis (spans, causes, silences),
html (the report as one HTML page). This is the door: the rest of plancompiler imports the names below."""

from __future__ import annotations

from plancompiler.report.analysis import build_report
from plancompiler.report.events import EventLines, parse_events, parse_ts, read_events
from plancompiler.report.html import render_html
from plancompiler.report.model import Liveness, Report, Span, file_liveness, liveness

__all__ = [
    "EventLines",
    "Liveness",
    "Report",
    "Span",
    "build_report",
    "file_liveness",
    "liveness",
    "parse_events",
    "parse_ts",
    "read_events",
    "render_html",
]

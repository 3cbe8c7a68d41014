"""`plan report --html`: one self-contained file (no network), a timeline row per lane and the totals."""
from __future__ import annotations

import html
import time

from plancompiler.report import Report
from runner.durations import format_duration

_CSS = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:16px}.timeline{position:relative;margin:8px 0 24px}
.lane{position:relative;height:26px;margin:3px 0 3px 60px;background:#f3f3f3;border-radius:3px}
.lane .name{position:absolute;left:-60px;width:55px;text-align:right;line-height:26px;font-weight:600}
.bar{position:absolute;top:2px;height:22px;min-width:1px;border-radius:2px}
.busy{background:#3b7dd8}
.waiting{background:repeating-linear-gradient(45deg,#e8a33d,#e8a33d 4px,#f3c47a 4px,#f3c47a 8px)}
.down{background:#9a9a9a}.bar:hover{outline:2px solid #000;z-index:2}
.axis{display:flex;justify-content:space-between;margin-left:60px;color:#666;font-size:11px}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
"""


def _t(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def render_html(report: Report) -> str:
    total = max(report.end - report.start, 1.0)
    rows = []
    for lane in report.lanes:
        bars = []
        for span in report.spans:
            if span.lane != lane or span.state == "idle":
                continue
            left = 100 * (span.start - report.start) / total
            width = 100 * span.seconds / total
            what = span.job if span.state == "busy" else span.cause
            title = f"{span.state}: {what} ({format_duration(span.seconds)}, {_t(span.start)} .. {_t(span.end)})"
            bars.append(f'<div class="bar {span.state}" data-state="{span.state}" data-job="{html.escape(span.job)}" '
                        f'data-seconds="{span.seconds:.0f}" style="left:{left:.4f}%;width:{width:.4f}%" '
                        f'title="{html.escape(title)}"></div>')
        rows.append(f'<div class="lane" data-lane="{html.escape(lane)}"><div class="name">{html.escape(lane)}</div>'
                    + "".join(bars) + "</div>")
    table = ['<table id="totals"><tr><th>lane</th><th>busy</th><th>idle</th><th>idle with work waiting</th>'
             "<th>runner down</th></tr>"]
    causes = []
    for lane, row in report.totals().items():
        table.append(f'<tr data-lane="{html.escape(lane)}"><td>{html.escape(lane)}</td>'
                     + "".join(f'<td data-seconds="{row[k]:.0f}">{format_duration(row[k])}</td>'
                               for k in ("busy_s", "idle_s", "waiting_s", "down_s")) + "</tr>")
        for cause, seconds in sorted(row["causes"].items(), key=lambda kv: -kv[1]):
            causes.append(f'<tr class="cause" data-lane="{html.escape(lane)}"><td>{html.escape(lane)}: '
                          f'{html.escape(cause)}</td><td data-seconds="{seconds:.0f}">'
                          f"{format_duration(seconds)}</td></tr>")
    table.append("</table>")
    note = "<p>Seed-format events: lane states are inferred.</p>" if report.inferred else ""
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>plan report</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>plan report: {_t(report.start)} .. {_t(report.end)} ({format_duration(total)})</h1>{note}"
        '<div class="legend"><span class="busy"></span>busy<span class="waiting"></span>idle with work waiting'
        '<span class="down"></span>runner down</div>'
        f'<div class="timeline">{"".join(rows)}</div>'
        f'<div class="axis"><span>{_t(report.start)}</span><span>{_t(report.start + total / 2)}</span>'
        f"<span>{_t(report.end)}</span></div>"
        "<h2>Totals</h2>" + "".join(table)
        + ("<h2>Idle with work waiting, by cause</h2><table>" + "".join(causes) + "</table>" if causes else "")
        + "</body></html>\n"
    )

"""`plan report --html`: one self-contained file (no network) with everything the text report says, and a timeline."""

from __future__ import annotations

import html
import time
from dataclasses import replace

from plancompiler.report.model import Report, Span
from runner.durations import format_duration

_CSS = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:16px}h2{font-size:14px;margin-top:24px}.timeline{position:relative;margin:8px 0 24px}
.lane{position:relative;height:26px;margin:3px 0 3px 60px;background:#f3f3f3;border-radius:3px}
.lane .name{position:absolute;left:-60px;width:55px;text-align:right;line-height:26px;font-weight:600}
.bar{position:absolute;top:2px;height:22px;min-width:1px;border-radius:2px;overflow:hidden;white-space:nowrap}
.bar .label{display:block;padding:0 4px;line-height:22px;font-size:11px;text-overflow:ellipsis;overflow:hidden}
.busy{background:#3b7dd8;color:#fff}
.waiting{background:repeating-linear-gradient(45deg,#e8a33d,#e8a33d 4px,#f3c47a 4px,#f3c47a 8px);color:#222}
.down{background:#9a9a9a;color:#fff}.bar:hover{outline:2px solid #000;z-index:2}
.axis{display:flex;justify-content:space-between;margin-left:60px;color:#666;font-size:11px}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}
td:first-child,th:first-child{text-align:left}td.text{text-align:left}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
"""
# A bar this wide (percent of the timeline) shows its label; narrower ones keep it in their tooltip.
_LABEL_MIN_PERCENT = 4.0


def _t(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _e(text: object) -> str:
    """Escaped for text and for a quoted attribute alike (quotes too): every value from the events goes here."""
    return html.escape(str(text), quote=True)


def _bar(span: Span, report: Report, total: float, waiters: list[str] | None = None) -> str:
    left = 100 * (span.start - report.start) / total
    width = 100 * span.seconds / total
    holder = ""
    if span.state == "busy":
        what, label = span.job, span.job
    elif span.state == "waiting":
        waiting = waiters or ([span.job] if span.job else [])
        verb = "waits" if len(waiting) == 1 else "wait"
        what = f"{span.cause}" + (f"; {', '.join(waiting)} {verb}" if waiting else "")
        label = holder = span.holder or span.cause  # what held the lane; the jobs that waited are in the tooltip
    else:
        what, label = span.cause, span.cause
    title = f"{span.state}: {what} ({format_duration(span.seconds)}, {_t(span.start)} .. {_t(span.end)})"
    inner = f'<span class="label">{_e(label)}</span>' if label and width >= _LABEL_MIN_PERCENT else ""
    return (
        f'<div class="bar {_e(span.state)}" data-state="{_e(span.state)}" data-job="{_e(span.job)}" '
        + (f'data-holder="{_e(holder)}" ' if holder else "")
        + f'data-seconds="{span.seconds:.0f}" style="left:{left:.4f}%;width:{width:.4f}%" '
        f'title="{_e(title)}">{inner}</div>'
    )


def _merged(spans: list[Span]) -> list[tuple[Span, list[str]]]:
    """Back-to-back waiting spans held by one holder as one bar, with every job that waited behind it."""
    out: list[tuple[Span, list[str]]] = []
    for span in sorted(spans, key=lambda s: s.start):
        last, waiters = out[-1] if out else (None, [])
        if last is not None and _same_wait(last, span):
            out[-1] = (replace(last, end=span.end), waiters + [j for j in [span.job] if j and j not in waiters])
        else:
            out.append((span, [span.job] if span.job else []))
    return out


def _same_wait(last: Span, span: Span) -> bool:
    return (
        last.state == span.state == "waiting"
        and bool(span.holder)
        and last.holder == span.holder
        and abs(last.end - span.start) < 1e-6
    )


def _totals(report: Report) -> list[str]:
    table = [
        '<table id="totals"><tr><th>lane</th><th>busy</th><th>idle</th><th>idle with work waiting</th>'
        "<th>runner down</th></tr>"
    ]
    causes = []
    for lane, row in report.totals().items():
        table.append(
            f'<tr data-lane="{_e(lane)}"><td>{_e(lane)}</td>'
            + "".join(
                f'<td data-seconds="{row[k]:.0f}">{format_duration(row[k])}</td>'
                for k in ("busy_s", "idle_s", "waiting_s", "down_s")
            )
            + "</tr>"
        )
        tag = " (inferred)" if report.inferred else ""
        for cause, seconds in sorted(row["causes"].items(), key=lambda kv: -kv[1]):
            causes.append(
                f'<tr class="cause" data-lane="{_e(lane)}"><td>{_e(lane)}: {_e(cause)}{tag}</td>'
                f'<td data-seconds="{seconds:.0f}">{format_duration(seconds)}</td></tr>'
            )
    table.append("</table>")
    if causes:
        table.append('<h2>Idle with work waiting, by cause</h2><table id="causes">' + "".join(causes) + "</table>")
    return table


def _jobs(report: Report) -> str:
    rows = [
        '<h2>Jobs</h2><table id="jobs"><tr><th>job</th><th>lane</th><th>attempts</th><th>outcome</th>'
        "<th>busy</th><th>each attempt</th><th>retries</th><th>reruns</th></tr>"
    ]
    for name, stats in sorted(report.jobs.items()):
        took = ", ".join(format_duration(d) for d in stats.durations)
        rows.append(
            f'<tr data-job="{_e(name)}" data-outcome="{_e(stats.outcome or "unfinished")}">'
            f'<td>{_e(name)}</td><td class="text">{_e(stats.lane)}</td><td>{stats.attempts}</td>'
            f'<td class="text">{_e(stats.outcome or "unfinished")}</td>'
            f'<td data-seconds="{stats.busy_s:.0f}">{format_duration(stats.busy_s)}</td>'
            f'<td class="text">{_e(took)}</td><td>{stats.retries}</td><td>{stats.reruns}</td></tr>'
        )
    rows.append("</table>")
    return "".join(rows)


def _clusters_and_silences(report: Report) -> str:
    out = []
    if report.clusters:
        out.append(
            '<h2>Failure clusters</h2><table id="clusters"><tr><th>jobs</th><th>failed with</th><th>which</th></tr>'
        )
        for cluster in report.clusters:
            out.append(
                f'<tr><td>{len(cluster["jobs"])}</td><td class="text">{_e(cluster["line"])}</td>'
                f'<td class="text">{_e(", ".join(cluster["jobs"]))}</td></tr>'
            )
        out.append("</table>")
    if report.silences:
        out.append(
            "<h2>Longest silences (no event but the runner's heartbeat)</h2>"
            '<table id="silences"><tr><th>from</th><th>to</th><th>length</th></tr>'
        )
        for a, b in report.silences:
            out.append(
                f'<tr><td>{_t(a)}</td><td>{_t(b)}</td><td data-seconds="{b - a:.0f}">{format_duration(b - a)}</td></tr>'
            )
        out.append("</table>")
    return "".join(out)


def render_html(report: Report) -> str:
    total = max(report.end - report.start, 1.0)
    rows = []
    for lane in report.lanes:
        bars = [
            _bar(span, report, total, waiters)
            for span, waiters in _merged([s for s in report.spans if s.lane == lane and s.state != "idle"])
        ]
        rows.append(
            f'<div class="lane" data-lane="{_e(lane)}"><div class="name">{_e(lane)}</div>' + "".join(bars) + "</div>"
        )
    note = "<p>Seed-format events: lane states are inferred.</p>" if report.inferred else ""
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>plan report</title>'
        f"<style>{_CSS}</style></head><body>"
        f"<h1>plan report: {_t(report.start)} .. {_t(report.end)} ({format_duration(total)})</h1>{note}"
        '<div class="legend"><span class="busy"></span>busy<span class="waiting"></span>idle with work waiting'
        '<span class="down"></span>runner down</div>'
        f'<div class="timeline">{"".join(rows)}</div>'
        f'<div class="axis"><span>{_t(report.start)}</span><span>{_t(report.start + total / 2)}</span>'
        f"<span>{_t(report.end)}</span></div>"
        "<h2>Totals</h2>"
        + "".join(_totals(report))
        + _jobs(report)
        + _clusters_and_silences(report)
        + "</body></html>\n"
    )

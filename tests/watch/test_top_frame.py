"""`plan top`'s frame and keys, as pure functions of the hosts' views: what an 80x24 screen shows, what each key does."""

from __future__ import annotations

import time
from typing import Any

from plancompiler.top.frame import HostView, Item, Ui, build
from plancompiler.top.keys import Actions, handle, split_keys
from plancompiler.watch import Incident

NOW = 1_800_000_000.0


def _answer(queued: int = 3, running: int = 1, estimates: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {
        "runner": {"pid": 4242, "heartbeat": NOW - 3},
        "counts": {"queue": queued, "running": running, "done": 7, "failed": 1},
        "lane_order": ["net", "gpu", "cpu"],
        "lanes": {
            "net": {"state": "idle", "slots": 1},
            "gpu": {"state": "busy", "slots": 1},
            "cpu": {"state": "idle", "reason": "exclusive", "blocker": "84c-gpu-strata.job", "slots": 1},
        },
        "running": [
            {
                "job": f"84c-gpu-strata{'-' + str(n) if n else ''}.job",
                "lane": "gpu",
                "started": NOW - 700,
                "progress": "64% of 52.44G (33.5G) at 10.2M/s, ETA 0:55:12",
                "last_line": "downloading shard 3/5",
            }
            for n in range(running)
        ],
        "queued": [
            {
                "job": f"9{n}-gpu-bench-{n}.job",
                "lane": "gpu",
                "reason": "lane-busy",
                "blocker": "84c-gpu-strata.job",
                "detail": "84c-gpu-strata.job is running in gpu",
                "since": NOW - 300 - n,
            }
            for n in range(queued)
        ]
        + [
            {
                "job": "99-cpu-report.job",
                "lane": "cpu",
                "reason": "blocked",
                "blocker": "10-cpu-intake.job",
                "detail": "its producer 10-cpu-intake.job failed",
                "since": NOW - 100,
            }
        ],
    }
    return {"status": status, "now": NOW, "runner_alive": True, "estimates": estimates or {}}


def _view(name: str = "a9", **fields: Any) -> HostView:
    fields.setdefault("answer", _answer())
    fields.setdefault("answered", NOW - 1)
    return HostView(name, f"ssh {name}:/srv/jobs", 10.0, **fields)


def test_a_frame_shows_running_jobs_their_estimate_with_its_basis_and_waiting_groups() -> None:
    estimates = {
        "running": {"84c-gpu-strata.job": {"ends": NOW + 3312, "basis": "its progress line's ETA"}},
        "queued": {"90-gpu-bench-0.job": {"starts": NOW + 3312, "basis": "when 84c-gpu-strata.job ends"}},
    }
    frame = build([_view(answer=_answer(estimates=estimates))], Ui(), NOW, 80, None)
    text = frame.plain()
    ends = time.strftime("%H:%M", time.localtime(NOW + 3312))
    assert f"gpu  84c-gpu-strata.job  11m41s  64%  ends ~{ends} (est.)" in text
    assert "est.: its progress line's ETA  | downloading shard 3/5" in text
    assert (
        "runner 4242  beat 4s ago  q3 r1 d7 f1" in text
    )  # the heartbeat's age as the box said it, plus since the answer came
    # waiting jobs grouped by reason and blocker, worst first: blocked before lane-busy, with counts
    blocked = text.index("blocked      1  99-cpu-report.job")
    busy = text.index("lane-busy    3  90-gpu-bench-0.job +2")
    assert blocked < busy
    assert (
        f"starts ~{ends} (est.)"
        in text.splitlines()[next(i for i, ln in enumerate(text.splitlines()) if "lane-busy" in ln)]
    )
    assert "est.: when 84c-gpu-strata.job ends" in text
    assert "cpu  idle (exclusive: 84c-gpu-strata.job)" in text


def test_a_lane_of_several_slots_with_none_in_use_says_what_holds_it() -> None:
    answer = _answer(running=0)
    error = "IsADirectoryError: Is a directory: /srv/jobs/queue/b.job"
    answer["status"]["lanes"]["cpu"] = {"state": "waiting", "reason": "install-pending", "blocker": error, "slots": 4}
    text = build([_view(answer=answer)], Ui(), NOW, 120, None).plain()
    assert f"cpu  0/4 slots busy (install-pending: {error})" in text


def test_two_busy_hosts_fit_80x24_dropping_details_first_and_keeping_the_selection_in_view() -> None:
    views = [_view("a9", answer=_answer(queued=30, running=3)), _view("lab", answer=_answer(queued=30, running=3))]
    ui = Ui()
    frame = build(views, ui, NOW, 80, 24)
    assert len(frame.lines) <= 24
    assert all(len(line.text) <= 80 for line in frame.lines)
    text = frame.plain()
    assert "a9  runner 4242" in text and "lab  runner 4242" in text
    assert text.count("downloading shard") == 1  # the details went first, but for the selected job
    ui.selected = len(frame.items) - 1  # the last row of the second host
    frame = build(views, ui, NOW, 80, 24)
    assert len(frame.lines) <= 24
    assert any(line.style == "reverse" for line in frame.lines)


def test_a_host_that_does_not_answer_is_marked_after_one_interval_with_what_it_said_last() -> None:
    answered = NOW - 25
    quiet = _view("a9", answered=answered, probing_since=NOW - 11)  # interval 10 s: one interval passed
    text = build([quiet], Ui(), NOW, 100, None).plain()
    assert "a9  NO ANSWER for 25s (probe running 11s); as it was then:  [ssh a9:/srv/jobs]" in text
    assert "84c-gpu-strata.job" in text  # what it showed last stays, under the mark
    fresh = _view("a9", answered=NOW - 1, probing_since=NOW - 4)  # within its interval: no mark yet
    assert "NO ANSWER" not in build([fresh], Ui(), NOW, 100, None).plain()
    failed = _view(
        "lab", answer=None, answered=None, failure="UNREACHABLE: ssh: connect to host lab port 22: Connection refused"
    )
    assert "lab  UNREACHABLE: ssh: connect to host lab port 22" in build([failed], Ui(), NOW).plain()


def test_incidents_come_first_and_an_acked_one_says_so() -> None:
    incident = Incident("BLOCKED", "99-cpu-report.job", "99-cpu-report.job can never run", "x", NOW - 60, NOW)
    frame = build([_view(incidents=(incident,))], Ui(), NOW, 80, None)
    assert frame.lines[2].text.startswith("  ! BLOCKED 99-cpu-report.job 1m00s: 99-cpu-report.job can never run")
    assert frame.items[0] == Item("incident", 0, "BLOCKED:99-cpu-report.job")
    incident.acked = True
    assert "(acked)" in build([_view(incidents=(incident,))], Ui(), NOW, 80, None).lines[2].text
    # the box's failed incident is keyed by a signature with its numbers masked: the line says `failed`, never `<n>`
    failed = Incident("EVENT", "failed:exited <n>: boom", "9-cpu-a.job failed: exited 3: boom", "y", NOW - 5, NOW)
    line = build([_view(incidents=(failed,))], Ui(), NOW, 80, None).lines[2].text
    assert line.startswith("  ! EVENT failed 5s: 9-cpu-a.job failed: exited 3: boom") and "<n>" not in line


def test_the_filter_keeps_the_jobs_whose_names_hold_it() -> None:
    frame = build([_view()], Ui(filter="bench-1"), NOW, 80, None)
    text = frame.plain()
    assert "lane-busy    1  91-gpu-bench-1.job" in text
    assert "84c-gpu-strata.job  11m" not in text  # the running job's name does not hold it
    assert "filter: bench-1" in frame.lines[0].text


def test_a_job_line_cannot_write_escape_sequences_to_the_terminal() -> None:
    answer = _answer()
    answer["status"]["running"][0]["last_line"] = "\x1b]0;owned\x07\x1b[2Jcleared"
    text = build([_view(answer=answer)], Ui(), NOW, 120, None).plain()
    assert "\x1b" not in text and "cleared" in text


def test_keys_move_the_selection_ask_before_retry_and_cancel_and_filter() -> None:
    done: list[tuple[str, str]] = []
    actions = Actions(
        ack=lambda i: done.append(("ack", i.key)),
        log=lambda i: done.append(("log", i.key)),
        retry=lambda i: done.append(("retry", i.key)),
        cancel=lambda i: done.append(("cancel", i.key)),
    )
    incident = Incident("STALL", "84c-gpu-strata.job", "no log growth for 40m", "x", NOW - 60, NOW)
    ended = ({"ts": "2026-12-03 17:01:02", "job": "10-cpu-intake.job", "event": "failed", "rc": 3},)
    ui = Ui()
    frame = build([_view(incidents=(incident,), ends=ended)], ui, NOW, 80, None)
    kinds = [item.kind for item in frame.items]
    assert kinds[0] == "incident" and "running" in kinds and "waiting" in kinds and kinds[-1] == "ended"
    assert not handle("a", ui, frame, actions) and done == [("ack", "STALL:84c-gpu-strata.job")]
    for key in split_keys(b"j\x1b[B"):  # j, then the down arrow
        handle(key, ui, frame, actions)
    assert frame.items[ui.selected].kind == "waiting"
    handle("c", ui, frame, actions)
    assert ui.confirm == f"cancel {frame.items[ui.selected].key}" and done[-1][0] == "ack"
    handle("n", ui, frame, actions)  # anything but y keeps it
    assert ui.confirm == "" and done[-1][0] == "ack" and ui.message.startswith("not done")
    ui.selected = len(frame.items) - 1
    handle("r", ui, frame, actions)
    handle("y", ui, frame, actions)
    assert done[-1] == ("retry", "10-cpu-intake.job")
    handle("l", ui, frame, actions)
    assert done[-1] == ("log", "10-cpu-intake.job")
    for key in "/gpu":
        handle(key, ui, frame, actions)
    handle("backspace", ui, frame, actions)
    handle("enter", ui, frame, actions)
    assert ui.filter == "gp" and not ui.typing
    assert handle("q", ui, frame, actions) is True


def test_split_keys_reads_arrows_and_skips_keys_it_does_not_use() -> None:
    assert split_keys(b"\x1b[Ak\x1bOB\x1b[15~q\r") == ["up", "k", "down", "q", "enter"]
    assert split_keys(b"\x1b") == ["esc"]

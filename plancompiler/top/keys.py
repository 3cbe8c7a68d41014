"""`plan top`'s keys: raw bytes from the terminal read as key names, and what each key does to the screen's state."""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from dataclasses import dataclass

from plancompiler.top.frame import Frame, Item, Ui

_SEQUENCES = {
    b"\x1b[A": "up",
    b"\x1bOA": "up",
    b"\x1b[B": "down",
    b"\x1bOB": "down",
    b"\r": "enter",
    b"\n": "enter",
    b"\x7f": "backspace",
    b"\x08": "backspace",
    b"\x1b": "esc",
    b"\x03": "q",  # Ctrl-C in cbreak mode arrives as a signal; in raw mode as this byte
}


def split_keys(data: bytes) -> list[str]:
    """DATA (what one read returned) as key names: 'up', 'down', 'enter', 'esc', 'backspace' or the character."""
    keys: list[str] = []
    i = 0
    while i < len(data):
        if data[i] == 0x1B and data[i + 1 : i + 2] in (b"[", b"O"):
            end = i + 2
            while end < len(data) and not 0x40 <= data[end] <= 0x7E:
                end += 1
            known = _SEQUENCES.get(data[i : end + 1])
            if known:  # a key not used here (F1, Home...) is skipped whole
                keys.append(known)
            i = end + 1
            continue
        one = data[i : i + 1]
        if one in _SEQUENCES:
            keys.append(_SEQUENCES[one])
        elif data[i] < 0x80:
            keys.append(chr(data[i]))
        i += 1
    return keys


def read_keys(fd: int, timeout: float) -> list[str]:
    """The keys typed within TIMEOUT (none: an empty list); end of input reads as 'q'."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return []
    data = os.read(fd, 64)
    return split_keys(data) if data else ["q"]


@dataclass
class Actions:
    """What a key asks of the hosts; each runs in the background and says how it went in the message line."""

    ack: Callable[[Item], None]
    log: Callable[[Item], None]
    retry: Callable[[Item], None]
    cancel: Callable[[Item], None]


def handle(key: str, ui: Ui, frame: Frame, actions: Actions) -> bool:
    """Apply KEY to UI (FRAME is what is on screen); True when it asks to quit."""
    if ui.typing:
        if key == "enter":
            ui.typing = False
        elif key == "esc":
            ui.typing, ui.filter = False, ""
        elif key == "backspace":
            ui.filter = ui.filter[:-1]
        elif len(key) == 1 and key.isprintable():
            ui.filter += key
        return False
    if ui.log is not None:
        if key in ("q", "esc", "l"):
            ui.log, ui.message = None, ""
        return False
    ui.selected = max(0, min(ui.selected, len(frame.items) - 1))
    selected = frame.items[ui.selected] if frame.items else None
    if ui.confirm:
        action, ui.confirm = ui.confirm, ""
        if key == "y" and selected is not None:
            (actions.retry if action.startswith("retry") else actions.cancel)(selected)
        else:
            ui.message = f"not done: {action}"
        return False
    if key == "q":
        return True
    if key in ("j", "down"):
        ui.selected = min(ui.selected + 1, max(0, len(frame.items) - 1))
    elif key in ("k", "up"):
        ui.selected = max(ui.selected - 1, 0)
    elif key == "/":
        ui.typing = True
    elif key == "esc":
        ui.filter, ui.message = "", ""
    elif selected is None:
        if key in ("l", "a", "r", "c"):
            ui.message = "nothing selected"
    elif key == "l":
        if selected.kind == "incident":
            ui.message = "an incident has no log: select a job"
        else:
            actions.log(selected)
    elif key == "a":
        if selected.kind == "incident":
            actions.ack(selected)
        else:
            ui.message = "a acks an incident: select one (the ! lines)"
    elif key == "r":
        if selected.kind != "ended" or selected.state != "failed":
            ui.message = "r retries a failed job: select one (ended failed)"
        else:
            ui.confirm = f"retry {selected.key}"
    elif key == "c":
        if selected.kind not in ("running", "waiting"):
            ui.message = "c cancels a running or waiting job: select one"
        else:
            ui.confirm = f"cancel {selected.key}"
    return False

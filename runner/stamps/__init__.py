"""Rerun on change: the stamps a done job ran with (store), the runner's judgement of them (judge), a push's
effect on them (push). Others import `runner.stamps` (the store's names, below), `runner.stamps.judge` (the
runner) and `runner.stamps.push` (a push's diff); what a rerun would redo is measured by `cost` (exported here)."""

from __future__ import annotations

from runner.stamps.cost import format_size, measure, stands_for
from runner.stamps.store import (
    STAMPS_DIR,
    VERSION,
    check,
    content_hash,
    current_ids,
    file_hash,
    mark_stale,
    new_stamp,
    producers_of,
    queued_path,
    ran_again,
    read,
    read_all,
    record_done,
    rerun_never,
    stamp_name,
    stamped,
    try_write,
)

__all__ = [
    "STAMPS_DIR",
    "VERSION",
    "check",
    "content_hash",
    "current_ids",
    "file_hash",
    "format_size",
    "mark_stale",
    "measure",
    "new_stamp",
    "producers_of",
    "queued_path",
    "ran_again",
    "read",
    "read_all",
    "record_done",
    "rerun_never",
    "stamp_name",
    "stamped",
    "stands_for",
    "try_write",
]

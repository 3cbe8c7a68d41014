"""Time values as users write them: `90`, `90s`, `10m`, `6h`, `2d`."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, at_most: float | None = None) -> float:
    """Seconds in TEXT; ValueError with the accepted forms if it is not a duration (or is more than AT_MOST)."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use 90, 90s, 10m, 6h or 2d)")
    seconds = float(match.group(1)) * _UNIT[match.group(2)]
    if at_most is not None and seconds > at_most:
        raise ValueError(f"{text!r} is more than {format_duration(at_most)}")
    return seconds


def format_duration(seconds: float) -> str:
    """Short human form: 0.4s, 45s, 12m05s, 3h32m, 2d04h."""
    if 0 < seconds < 9.95 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


# What a limit of 0 would do, and what giving none means.
_AT_ZERO = {
    "TIMEOUT": "would end every attempt at once: give more than 0, or none for no limit",
    "WARN_AFTER": "would call every run long-running as it starts: give more than 0, or none for its lane's default",
}


def parse_limit(key: str, text: str) -> float:
    """A job header's KEY (TIMEOUT or WARN_AFTER) in seconds, more than 0: a TIMEOUT of 0 would end every attempt
    as it starts, a WARN_AFTER of 0 raise long-running for every job as it starts."""
    if (seconds := parse_duration(text)) > 0:
        return seconds
    raise ValueError(f"{text.strip()!r} {_AT_ZERO[key]}")

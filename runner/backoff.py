"""A failed job's wait before its next try, the runner's and a Slurm attempt's alike: base * 2**(n-1), capped.

Here, not in runner.config: an attempt inside its Slurm allocation (runner.slurm.attempt) imports this module,
and making the runner's Config (a dataclass of 47 fields) at import was ~8 % of an attempt's instructions."""

from __future__ import annotations

BASE_S = 30.0  # retry n waits base * 2**(n-1) ...
MAX_S = 600.0  # ... capped here


def backoff_s(attempt: int, base_s: float = BASE_S, max_s: float = MAX_S) -> float:
    """The wait before the next try after attempt ATTEMPT (1-based) failed: BASE_S * 2**(n-1), capped at MAX_S."""
    return min(base_s * 2 ** (attempt - 1), max_s)

"""Outputs two plans on one root both write: at push, an error naming both jobs (G003 catches it within one plan).

One plan's job that writes a file another plan's job also writes (an output, a DONE_IF path, a marker) makes the
second look done without running (`skipped: DONE_IF already true`) the moment the first writes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def written_paths(spec: Mapping[str, Any]) -> list[str]:
    """The paths a manifest job entry writes or is judged done by: its outputs and DONE_IF paths."""
    found = []
    for key in ("outputs", "done_if"):
        values = spec.get(key)
        if isinstance(values, list):
            found += [p for p in values if isinstance(p, str) and p and p not in found]
    return found


def shared_outputs(
    plan: str, jobs: Mapping[str, Mapping[str, Any]], others: Mapping[str, Any], allowed: Iterable[str], host: str
) -> list[str]:
    """An error for each path a job of PLAN writes that a job of another plan in OTHERS (plan -> its manifest
    record, with `jobs`) writes too, unless the path is ALLOWED (`--allow-shared-output PATH`)."""
    theirs: dict[str, tuple[str, str]] = {}
    for other, record in sorted(others.items()):
        if other == plan or not isinstance(record, dict) or not isinstance(record.get("jobs"), dict):
            continue
        for name, spec in sorted(record["jobs"].items()):
            if isinstance(spec, dict):
                for path in written_paths(spec):
                    theirs.setdefault(path, (other, name))
    if not theirs:
        return []  # no other plan on the root writes anything: nothing to compare (10,000 jobs, ~10 ms)
    allow = set(allowed)
    errors = []
    for name, spec in sorted(jobs.items()):
        for path in written_paths(spec):
            if path in theirs and path not in allow:
                other, job = theirs[path]
                if job == name:
                    continue  # the same job name: the ownership rules (--take-over) say what happens to it
                errors.append(
                    f"{path} is written by {plan}/{name} and by {other}/{job}, both on {host}: whichever writes it "
                    f"first makes the other skipped as done without running; give one of them another path, or "
                    f"push with --allow-shared-output {path} if they are meant to share it"
                )
    return errors

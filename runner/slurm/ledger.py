"""ROOT/slurm.json, the Slurm backend's durable ledger: per plan and job every Slurm id, its script hash and final
state, so a re-push knows what ran long after squeue has forgotten it.

Shape (version 2): {"version": 2, "generation": N, "plans": {PLAN: {"by", "pushed_at", "jobs": {NAME: {"hash",
"lane", "deps", "attempts": [{"id", "hash", "attempt", "submitted", "state", "start", "end", "rc", "kind",
"tail"}]}}}}, "seen": {ID: state recorded as an event}}. The last attempt is the job's current Slurm job. It is
written atomically, by whoever holds ROOT/.push.lock (runner.delivery's push lock), the previous generation
kept beside it (slurm.json.1). It is a cache of Slurm's truth, never its only copy: one lost or damaged is
rebuilt (runner.slurm.rebuild). Each attempt's own wrapper (runner.slurm.attempt) never writes it: it leaves
ROOT/results/PLAN/NAME/ID.json when it ends, and those are folded in here under the lock.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from runner.files import atomic_write, read_json

LEDGER = "slurm.json"
VERSION = 2
FINISHED_OK = ("COMPLETED",)
FINISHED_BAD = ("FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")
FINAL = FINISHED_OK + FINISHED_BAD
ACTIVE = ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED")
RUNNING = ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING")


BACKUP = "slurm.json.1"  # the generation before the last save


def empty() -> dict[str, Any]:
    return {"version": VERSION, "generation": 0, "plans": {}, "seen": {}}


def _parse(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the ledger at PATH, "") or (None, why it cannot be used)."""
    try:
        raw = read_json(path)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except ValueError as exc:
        return None, f"not JSON, or cut short ({exc})"
    if raw is None:
        return None, "missing"
    if not isinstance(raw, dict) or raw.get("version") != VERSION or not isinstance(raw.get("plans"), dict):
        return None, f"not a version-{VERSION} ledger"
    raw.setdefault("seen", {})
    raw.setdefault("generation", 0)
    return raw, ""


def read(root: str) -> tuple[dict[str, Any], str]:
    """(the ledger, why it is not to be trusted as it is: "" when it is). A missing, unreadable or cut-short
    slurm.json is never read as empty: the previous generation is taken if it can be, and the caller rebuilds
    from Slurm's truth (runner.slurm.rebuild) either way. A root no push ever wrote to has nothing to distrust."""
    ledger, why = _parse(Path(root) / LEDGER)
    if ledger is not None:
        return ledger, ""
    if why == "missing" and not (Path(root) / "scripts").is_dir():
        return empty(), ""
    older, _ = _parse(Path(root) / BACKUP)
    if older is not None:
        return older, f"{LEDGER} is {why}; its previous generation ({BACKUP}) was read"
    return empty(), f"{LEDGER} is {why}"


def load(root: str) -> dict[str, Any]:
    """The ledger as it is on disk (for readers that write nothing back: logs)."""
    return read(root)[0]


def save(root: str, ledger: dict[str, Any]) -> None:
    """Written whole and atomically, the generation it replaces kept as slurm.json.1 (a hard link, so there is
    never a moment without a ledger)."""
    path, backup = Path(root) / LEDGER, Path(root) / BACKUP
    ledger["generation"] = int(ledger.get("generation") or 0) + 1
    if _parse(path)[0] is not None:  # a damaged file is not kept over a good backup
        link = backup.with_name(f".{BACKUP}.{os.getpid()}.tmp")
        try:
            os.link(path, link)
            os.replace(link, backup)
        except OSError:
            try:
                os.unlink(link)
            except OSError:
                pass
    atomic_write(path, (json.dumps(ledger, indent=1, sort_keys=True) + "\n").encode())


def plan_jobs(ledger: dict[str, Any], plan: str) -> dict[str, Any]:
    entry = ledger["plans"].setdefault(plan, {"jobs": {}})
    jobs: dict[str, Any] = entry.setdefault("jobs", {})
    return jobs


def current(record: dict[str, Any]) -> dict[str, Any] | None:
    attempts = record.get("attempts") or []
    return attempts[-1] if attempts else None


def results_dir(root: str, plan: str, name: str) -> Path:
    return Path(root) / "results" / plan / name


def read_result(root: str, plan: str, name: str, slurm_id: int | str) -> dict[str, Any] | None:
    try:
        found = read_json(results_dir(root, plan, name) / f"{slurm_id}.json")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def fold_results(root: str, ledger: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Fold every attempt's result file into the ledger, following each to the next attempt it submitted.

    Returns the (plan, name, result) newly folded, oldest first, for the caller to record as events."""
    folded: list[tuple[str, str, dict[str, Any]]] = []
    for plan, entry in ledger["plans"].items():
        for name, record in (entry.get("jobs") or {}).items():
            while True:
                last = current(record)
                if last is None or last.get("result"):
                    break
                result = read_result(root, plan, name, last["id"])
                if result is None:
                    break
                last["result"] = True
                last.update(
                    {k: result.get(k) for k in ("start", "end", "rc", "kind", "tail", "attempt", "wait_s", "moved")}
                )
                if result.get("retry_due") is not None:  # its wrapper could not submit the next try
                    last.update(retry_due=result["retry_due"], next_attempt=result.get("next_attempt"))
                if result.get("state") in FINAL:
                    last["state"] = result["state"]
                folded.append((plan, name, result))
                if not result.get("next_id"):
                    break
                nxt: dict[str, Any] = {
                    "id": int(result["next_id"]),  # a retry is a job of its own, never an array's
                    "hash": last.get("hash"),
                    "attempt": int(result.get("next_attempt") or 1),
                    "submitted": result.get("end"),
                    "state": None,
                    "after": result.get("kind"),
                }
                nxt.update({k: last[k] for k in ("bundle", "entry") if k in last})  # the same spec, a later attempt
                record["attempts"].append(nxt)
    return folded


def record_state(record: dict[str, Any], live: dict[str, Any]) -> None:
    """What squeue or sacct says of the current attempt, kept once final (and its clocks as they become known)."""
    last = current(record)
    if last is None or last.get("id") != live["id"]:
        return
    for key in ("start", "end", "eligible"):
        if live.get(key) and not last.get(key):
            last[key] = live[key]
    if live["state"] in FINAL and last.get("state") not in FINAL:
        last["state"] = live["state"]
        last["reason"] = live.get("reason", "")


def remove_results(root: str, plan: str, name: str) -> None:
    """A job dropped from the ledger takes its result files with it."""
    directory = results_dir(root, plan, name)
    try:
        for entry in os.listdir(directory):
            os.unlink(directory / entry)
        os.rmdir(directory)
    except OSError:
        pass

"""Retries the attempt's own wrapper could not submit, made at the next push, status or watch contact under the
push lock: an attempt Slurm ended itself (memory, its time limit, a node failure, preemption: the wrapper is
killed with it) is retried like one whose body failed, and a next try the wrapper could not submit (the
controller did not answer) is submitted now, never dropped. The dependents Slurm cancelled meanwhile (their
producer had failed, as far as Slurm knew) are submitted again after it, so the plan goes on as if the wrapper
had re-pointed them itself."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from runner.config import Config
from runner.files import read_json_or_none
from runner.slurm import ledger as ledger_mod
from runner.slurm.ledger import ACTIVE, RUNNING
from runner.slurm.query import Live, live_of, slurm, state_of
from runner.slurm.submit import hand_over
from runner.slurm.wrapper import submit_env, wrapper_text

# What Slurm ends an attempt with that the attempt's own wrapper cannot see to (it is killed with it)
SLURM_ENDED = ("OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL")


def spec_of(root: str, plan: str, name: str, record: dict[str, Any]) -> tuple[str, int, dict[str, Any]] | None:
    """(bundle, entry, element) of NAME's current content: where its attempts were, or the newest bundle of
    the plan holding it (a ledger rebuilt, or written before attempts named their bundle)."""
    for attempt in reversed(record.get("attempts") or []):
        if attempt.get("bundle") is not None and attempt.get("entry") is not None:
            found = read_json_or_none(attempt["bundle"])
            elements = found.get("elements") if isinstance(found, dict) else None
            if isinstance(elements, list) and int(attempt["entry"]) < len(elements):
                return str(attempt["bundle"]), int(attempt["entry"]), elements[int(attempt["entry"])]
    bundles = sorted(Path(root, "scripts", plan).glob("bundle.*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in bundles:
        found = read_json_or_none(path)
        for entry, element in enumerate(found.get("elements", []) if isinstance(found, dict) else []):
            if element.get("name") == name and element.get("hash") == record.get("hash"):
                return str(path), entry, element
    return None


def _due(root: str, plan: str, name: str, record: dict[str, Any], live: Live, now: float) -> dict[str, Any] | None:
    """The next try NAME needs now, if any: {attempt, wait_s, cause}."""
    state, last = state_of(record, live)
    if last is None or last.get("next_id"):
        return None
    if last.get("retry_due") is not None:  # its wrapper could not submit it
        return {
            "attempt": int(last.get("next_attempt") or int(last.get("attempt") or 1) + 1),
            "wait_s": max(1.0, float(last["retry_due"]) - now),
            "cause": str(last.get("kind") or "failed").upper(),
        }
    if state not in SLURM_ENDED or last.get("result"):
        return None
    found = spec_of(root, plan, name, record)
    attempt = int(last.get("attempt") or 1)
    if found is None or attempt >= int(found[2].get("retries") or 1):
        return None
    element = found[2]
    config = Config(
        root=Path(root),
        backoff_base_s=float(element.get("backoff_base_s", Config.backoff_base_s)),
        backoff_max_s=float(element.get("backoff_max_s", Config.backoff_max_s)),
    )
    ended = float(last.get("end") or now)
    return {"attempt": attempt + 1, "wait_s": max(1.0, ended + config.backoff_s(attempt) - now), "cause": state}


def _submit(
    root: str, plan: str, name: str, record: dict[str, Any], attempt: int, extra: list[str], env: dict[str, str]
) -> tuple[int | None, str]:
    """ATTEMPT of NAME as a new Slurm job with EXTRA options (--begin, --dependency); (its id, or None and why)."""
    found = spec_of(root, plan, name, record)
    if found is None:
        return None, f"{plan}/{name}: no bundle holds its script any more"
    bundle, entry, element = found
    script = wrapper_text(
        root,
        plan,
        f"job {name}",
        element.get("env") or {},
        (Path(bundle), [entry], attempt),
        element.get("slurm_conf"),
        (list(element["sbatch"]), [(name, element.get("text") or "")]),
    )
    rc, out, err = slurm(
        ["sbatch", "--parsable", *element["sbatch"], *extra], submit_env(env.get("SLURM_CONF")), 60, script
    )
    if rc != 0:
        return None, err.strip()
    new = int(out.strip().split(";")[0])
    record["attempts"].append(
        {"id": new, "hash": element.get("hash"), "attempt": attempt, "submitted": time.time(), "state": None}
    )
    record["attempts"][-1].update(bundle=bundle, entry=entry)
    return new, ""


def _order(job_id: Any) -> int:
    return int(str(job_id).partition("_")[0] or 0)


def _cancelled_for_a_producer(record: dict[str, Any], live: Live) -> dict[str, Any] | None:
    """The current attempt, if Slurm cancelled it because a producer failed (not a user's scancel)."""
    state, last = state_of(record, live)
    if last is None or state != "CANCELLED" or last.get("result"):
        return None
    reason = (live_of(record, last["id"], live) or {}).get("reason") or last.get("reason") or ""
    return last if reason.startswith("Dependency") else None


def requeue_dependents(root: str, plan: str, jobs: dict[str, Any], live: Live, env: dict[str, str]) -> list[str]:
    """Submit again each job Slurm cancelled for a producer that has had a next try since (its current attempt
    newer than the cancelled job), after that try; a chain of them in one sweep, producers first."""
    done: list[str] = []
    changed = True
    while changed:
        changed = False
        for name in sorted(jobs):
            record = jobs[name]
            cancelled = _cancelled_for_a_producer(record, live)
            if cancelled is None:
                continue
            waits, retried, lost = [], False, False
            for dep in record.get("deps") or []:
                state, last = state_of(jobs.get(dep), live)
                if last is None:
                    continue
                newer = _order(last["id"]) > _order(cancelled["id"])
                if state in ACTIVE or state in RUNNING or state == "COMPLETED" and newer:
                    retried = retried or newer
                    if state != "COMPLETED":
                        waits.append(str(last["id"]))
                elif state != "COMPLETED":
                    lost = True  # a producer failed for good: the job stays blocked
            if not retried or lost:
                continue
            extra = [f"--dependency=afterok:{':'.join(waits)}"] if waits else []
            again, why = _submit(root, plan, name, record, int(cancelled.get("attempt") or 1), extra, env)
            if again is None:
                done.append(f"{plan}/{name}: could not be submitted again: {why}")
                continue
            done.append(f"{plan}/{name}: submitted again as {again}{', after ' + ', '.join(waits) if waits else ''}")
            changed = True
    return done


def retry_due(
    root: str, ledger: dict[str, Any], live: Live, env: dict[str, str], now: float | None = None
) -> list[str]:
    """Submit every next try that is due and the dependents Slurm cancelled for want of it; what was done, a
    line each (for the caller's answer)."""
    now = time.time() if now is None else now
    done: list[str] = []
    for plan, entry in ledger["plans"].items():
        jobs = entry.get("jobs") or {}
        for name in sorted(jobs):
            record = jobs[name]
            due = _due(root, plan, name, record, live, now)
            if due is None:
                continue
            last = ledger_mod.current(record)
            assert last is not None
            new, why = _submit(root, plan, name, record, due["attempt"], [f"--begin=now+{int(due['wait_s'])}"], env)
            if new is None:
                done.append(f"{plan}/{name}: the next try could not be submitted: {why}")
                continue
            last.update(next_id=new, wait_s=due["wait_s"], cause=due["cause"], retried_by="agent")
            last.pop("retry_due", None)
            record["attempts"][-1]["after"] = due["cause"].lower()
            done.append(f"{plan}/{name}: attempt {due['attempt']} is Slurm job {new} (after {due['cause']})")
            done += [f"{plan}/{name}: re-pointed {moved}" for moved in hand_over(last["id"], new, live, env)]
        done += requeue_dependents(root, plan, jobs, live, env)
    return done

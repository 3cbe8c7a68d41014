"""The host side of a `backend: slurm` host, run on its submit node by `python3 -m runner agent`.

A push diffs the plan against the ledger (runner.slurm_ledger) joined with squeue and, where accounting is on,
sacct, under the push lock; each job is a wrapper (runner.slurm_wrapper) submitted with afterok dependencies on
its producers. Each job's script is per plan and per content hash, so a pending job runs exactly the text it
was submitted with; a changed pending job is a new Slurm job and its pending dependents are re-pointed to it
before the old one is cancelled. The Slurm commands are runner.slurm_query's; status and history live in
runner.slurm_view.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runner import delivery
from runner import slurm_ledger as ledger_mod
from runner.conditions import compile_condition, evaluate
from runner.queue import timestamp
from runner.slurm_attempt import repoint
from runner.slurm_ledger import ACTIVE, FINISHED_BAD, RUNNING
from runner.slurm_query import ControllerDown, env_for, live_of, slurm, squeue, state_of, sync
from runner.slurm_wrapper import job_paths, sbatch_options, wrapper_text, write_job

SUBMIT_THREADS = 8  # sbatch calls in flight at once: each is mostly a round trip to slurmctld


def adopt(plan: str, request: dict[str, Any], jobs: dict[str, Any], live: dict[int, dict[str, Any]]) -> None:
    """Jobs an earlier version of this backend submitted (a bare job name, no ledger entry) that squeue still
    has: taken into the ledger as they are, so an upgrade neither runs them twice nor cancels them."""
    for job in request["jobs"]:
        if job["name"] in jobs:
            continue
        found = [j for j in live.values() if j["plan"] == plan and j["name"] == job["name"]]
        if found:
            newest = max(found, key=lambda j: j["id"])
            jobs[job["name"]] = {
                "hash": newest["hash"],
                "lane": job.get("lane", ""),
                "deps": job.get("deps", []),
                "slurm_name": newest["name"],
                "attempts": [{"id": newest["id"], "hash": newest["hash"], "attempt": 1, "state": None}],
            }


def _holds(condition: str | None, root: str) -> bool:
    return bool(condition) and evaluate(compile_condition(str(condition)), root, 30).holds


def diff(
    root: str, request: dict[str, Any], jobs: dict[str, Any], live: dict[int, dict[str, Any]]
) -> tuple[list[list[str]], list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """(changes as [mark, name, note], jobs to submit, retired (name, record) pairs) for one plan."""
    changes: list[list[str]] = []
    submit: list[dict[str, Any]] = []
    names = {job["name"] for job in request["jobs"]}
    resubmitted: set[str] = set()
    for job in request["jobs"]:
        name = job["name"]
        state, last = state_of(jobs.get(name), live)
        same = last is not None and last.get("hash") == job["hash"]
        ident = f"{state} as {last['id']}" if last else state
        if last is None:
            if _holds(job.get("done_if"), root):
                changes.append(["d", name, "DONE_IF already holds: not submitted"])
            else:
                changes.append(["+", name, ""])
                submit.append(job)
        elif state in ACTIVE or state == "GATED":
            if same:
                changes.append(["=", name, f"pending as {last['id']}"])
            else:
                changes.append(["~", name, f"pending {last['id']} has other content: a new job replaces it"])
                submit.append(dict(job, replaces=last["id"]))
        elif state in RUNNING:
            changes.append([">" if same else ">~", name, f"running as {last['id']}"])
        elif state == "COMPLETED":
            if same or _holds(job.get("done_if"), root):
                changes.append(["d", name, f"completed as {last['id']}"])
            else:
                changes.append(["~", name, "completed before; content changed, submitted again"])
                submit.append(job)
        elif request.get("retry_failed"):
            changes.append(["r", name, f"{ident}; resubmitted"])
            submit.append(job)
        else:
            why = "Slurm no longer knows it and left no final state" if state == "UNKNOWN" else ""
            changes.append(["!", name, f"{ident}{'; ' + why if why else ''}; not resubmitted without --retry-failed"])
    submit = _hold_orphans(submit, jobs, live, changes)
    for job in submit:
        resubmitted.add(job["name"])
    _note_dependents(request, jobs, live, changes, resubmitted)
    retired = []
    prune = request.get("prune", True)
    for name in sorted(set(jobs) - names):
        state, last = state_of(jobs[name], live)
        if state in ACTIVE or state in RUNNING or state == "GATED":
            where = f"{state} as {last['id']}" if last else state
            changes.append(
                [
                    "-" if prune else "=",
                    name,
                    f"no longer in the plan ({where})" + ("" if prune else "; kept (--no-prune)"),
                ]
            )
        if prune:
            retired.append((name, jobs[name]))
    return changes, submit, retired


def _failed_and_forgotten(record: dict[str, Any], live: dict[int, dict[str, Any]]) -> bool:
    state, last = state_of(record, live)
    return (state in FINISHED_BAD or state == "UNKNOWN") and (last is None or live_of(record, last["id"], live) is None)


def _hold_orphans(
    submit: list[dict[str, Any]], jobs: dict[str, Any], live: dict[int, dict[str, Any]], changes: list[list[str]]
) -> list[dict[str, Any]]:
    """Jobs whose producer failed (or is unknown) and is not resubmitted now, where squeue no longer has that
    producer to block them on: held, since submitted they would run without its outputs."""
    going = {job["name"] for job in submit}
    held: set[str] = set()
    kept = []
    for job in submit:  # graph order: a producer is decided before its consumers
        bad = [
            d
            for d in job.get("deps", [])
            if d in held or (d not in going and d in jobs and _failed_and_forgotten(jobs[d], live))
        ]
        if not bad:
            kept.append(job)
            continue
        held.add(job["name"])
        for change in changes:
            if change[1] == job["name"]:
                change[0] = "!"
                change[2] = f"its producer {', '.join(bad)} failed: not submitted (--retry-failed resubmits both)"
    return kept


def _note_dependents(
    request: dict[str, Any],
    jobs: dict[str, Any],
    live: dict[int, dict[str, Any]],
    changes: list[list[str]],
    resubmitted: set[str],
) -> None:
    """Say, on each replaced pending job's line, which pending dependents will be re-pointed to its new job."""
    consumers: dict[str, list[str]] = {}
    for job in request["jobs"]:
        for dep in job.get("deps", []):
            consumers.setdefault(dep, []).append(job["name"])
    for change in changes:
        if change[0] != "~" or "pending" not in change[2]:
            continue
        kept = [
            c for c in consumers.get(change[1], []) if c not in resubmitted and state_of(jobs.get(c), live)[0] in ACTIVE
        ]
        again = [c for c in consumers.get(change[1], []) if c in resubmitted]
        if kept:
            change[2] += "; its pending dependents re-pointed to it: " + ", ".join(kept)
        if again:
            change[2] += "; resubmitted with it: " + ", ".join(again)


def _levels(submit: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Jobs to submit, grouped so each group's producers are all submitted by earlier groups."""
    level: dict[str, int] = {}
    names = {job["name"] for job in submit}
    for job in submit:  # in graph order: producers first
        level[job["name"]] = 1 + max((level[d] for d in job.get("deps", []) if d in names), default=-1)
    groups: list[list[dict[str, Any]]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for job in submit:
        groups[level[job["name"]]].append(job)
    return groups


def push(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Diff the plan against the ledger and Slurm; unless `dry_run`, submit, re-point and cancel, then record."""
    env = env_for(request)
    plan = request["plan"]
    missing = [p for p in request.get("external", []) if not os.path.exists(p.rstrip("/") or "/")]
    dry = bool(request.get("dry_run"))
    if not dry:
        got = delivery.lock(root, {"wait_s": request.get("lock_wait_s", 60), "by": request.get("by")})
        if got.get("busy"):
            return {"busy": True, "holder": got.get("holder", {})}
    try:
        try:
            live = squeue(env)
        except ControllerDown as exc:
            return {"controller_down": str(exc)}
        ledger = ledger_mod.load(root)
        why = sync(root, ledger, live, env)
        jobs = ledger_mod.plan_jobs(ledger, plan)
        adopt(plan, request, jobs, live)
        changes, submit, retired = diff(root, request, jobs, live)
        result: dict[str, Any] = {
            "changes": changes,
            "external_missing": missing,
            "submitted": {},
            "repointed": {},
            "cancelled": [],
            "accounting": why or "on",
        }
        if dry or (missing and request.get("verify_external", True)):
            return result
        try:
            _apply(root, request, ledger, live, submit, retired, result, env)
        except ControllerDown as exc:  # what was submitted before is recorded all the same
            result["error"] = f"the Slurm controller stopped answering during the push: {exc}"
        entry = ledger["plans"][plan]
        entry.update(by=request.get("by") or "?", pushed_at=timestamp(time.time()))
        ledger_mod.save(root, ledger)
        return result
    finally:
        if not dry:
            delivery.release_lock()


def _apply(
    root: str,
    request: dict[str, Any],
    ledger: dict[str, Any],
    live: dict[int, dict[str, Any]],
    submit: list[dict[str, Any]],
    retired: list[tuple[str, dict[str, Any]]],
    result: dict[str, Any],
    env: dict[str, str],
) -> None:
    plan = request["plan"]
    jobs = ledger_mod.plan_jobs(ledger, plan)
    ids: dict[str, int] = {}
    for name, record in jobs.items():
        state, last = state_of(record, live)
        if last is not None and (state in ACTIVE or state in RUNNING or state == "GATED"):
            ids[name] = last["id"]
    failed = {
        name: last["id"]
        for name, (state, last) in ((n, state_of(r, live)) for n, r in jobs.items())
        if last is not None and state in FINISHED_BAD and last["id"] in live
    }
    cancel: list[int] = []
    for job in submit:
        write_job(root, plan, job, request, job_paths(root, plan, job["name"], job["hash"]))
    os.sync()  # once for all the scripts written above: a job must never start on a script not yet on disk
    for group in _levels(submit):
        argvs = []
        for job in group:
            paths = job_paths(root, plan, job["name"], job["hash"])
            deps = [str(ids[d]) for d in job.get("deps", []) if d in ids]
            # A producer that failed and that squeue still knows: the job is blocked at once, as it would be
            deps += [str(failed[d]) for d in job.get("deps", []) if d not in ids and d in failed]
            argv = ["sbatch", "--parsable", *sbatch_options(root, plan, job, request)]
            if deps:
                argv.append("--dependency=afterok:" + ":".join(deps))
            argvs.append([*argv, str(paths["sbatch"]), "1"])
        with ThreadPoolExecutor(max_workers=SUBMIT_THREADS) as pool:
            answers = list(pool.map(lambda argv: slurm(argv, env), argvs))
        for job, (rc, out, err) in zip(group, answers, strict=True):
            if rc != 0:
                result["error"] = f"sbatch for {plan}/{job['name']} failed: {err.strip()}"
                continue
            new = int(out.strip().split(";")[0])
            ids[job["name"]] = new
            result["submitted"][job["name"]] = new
            record = jobs.setdefault(job["name"], {"attempts": []})
            record.update(
                hash=job["hash"], lane=job.get("lane", ""), deps=job.get("deps", []), slurm_name=f"{plan}/{job['name']}"
            )
            record.setdefault("attempts", []).append(
                {"id": new, "hash": job["hash"], "attempt": 1, "submitted": time.time(), "state": None}
            )
            if job.get("replaces"):
                result["repointed"][job["name"]] = _hand_over(int(job["replaces"]), new, live, env)
                cancel.append(int(job["replaces"]))
        if result.get("error"):
            break
    for name, record in retired:
        state, last = state_of(record, live)
        if last is not None and (state in ACTIVE or state in RUNNING or state == "GATED"):
            cancel.append(last["id"])
        del jobs[name]
        ledger_mod.remove_results(root, plan, name)
    if cancel:
        slurm(["scancel", *(str(i) for i in cancel)], env)  # one call for all of them
        result["cancelled"] = cancel
        for record in jobs.values():
            for attempt in record.get("attempts", []):
                if attempt["id"] in cancel and attempt.get("state") not in ledger_mod.FINAL:
                    attempt.update(state="CANCELLED", reason="replaced by a push")


def _hand_over(old: int, new: int, live: dict[int, dict[str, Any]], env: dict[str, str]) -> list[int]:
    """Re-point the pending jobs that wait on OLD to NEW (before OLD is cancelled, so none is killed)."""
    moved = []
    for job in live.values():
        if job["state"] not in ACTIVE:
            continue
        dep = repoint(job["dependency"], old, new)
        if dep is not None and slurm(["scontrol", "update", f"JobId={job['id']}", f"Dependency={dep}"], env)[0] == 0:
            job["dependency"] = dep
            moved.append(job["id"])
    return moved


def wrapper(root: str, job: dict[str, Any], plan: str, slurm_conf: str | None = None) -> str:
    """The sbatch script of JOB as a push writes it (for lint tests and docs)."""
    return wrapper_text(root, plan, job, job_paths(root, plan, job["name"], job["hash"]), slurm_conf)


def status(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """squeue and the ledger as a status answer (runner.slurm_view)."""
    from runner.slurm_view import status as view_status

    return view_status(root, request)


def history(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """The ledger's attempts as report events (runner.slurm_view)."""
    from runner.slurm_view import history as view_history

    return view_history(root, request)


def logs(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """A Slurm job's log (ROOT/logs/PLAN/NAME.job.log): JOB is PLAN/NAME.job, or NAME.job where one plan has it."""
    job = str(request["job"]).removesuffix(".job")
    plan, _, name = job.rpartition("/")
    ledger = ledger_mod.load(root)
    plans = [plan] if plan else [p for p, e in ledger["plans"].items() if name in (e.get("jobs") or {})]
    if len(plans) != 1 or ".." in job or name.startswith("."):
        return {
            "error": f"no job {job}.job pushed here"
            if not plans
            else f"{name}.job is in plans {', '.join(sorted(plans))}: name one, as PLAN/{name}.job"
        }
    record = (ledger["plans"].get(plans[0], {}).get("jobs") or {}).get(name)
    last = ledger_mod.current(record) if isinstance(record, dict) else None
    state = {"RUNNING": "running", "COMPLETED": "done"}.get(str((last or {}).get("state")), "queue" if last else None)
    path = str(job_paths(root, plans[0], name, "")["log"])
    from runner.agent import tail

    offset = int(request.get("offset", -1))
    if not os.path.exists(path):
        return {"state": state, "text": "", "offset": 0, "exists": False}
    if offset < 0:
        text, size = tail(path, int(request.get("max_bytes", 65536)))
        lines = text.splitlines()[-int(request.get("lines", 40)) :]
        return {"state": state, "text": "\n".join(lines) + ("\n" if lines else ""), "offset": size, "exists": True}
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(int(request.get("max_bytes", 1 << 20)))
    return {"state": state, "text": data.decode("utf-8", "replace"), "offset": offset + len(data), "exists": True}

"""The host side of a `backend: slurm` host, run on its submit node by `python3 -m runner agent`.

A push diffs the plan against the ledger (runner.slurm.ledger) joined with squeue and, where accounting is on,
sacct, under the push lock; each job is a wrapper (runner.slurm.wrapper) submitted with afterok dependencies on
its producers. Each job's script is per plan and per content hash, so a pending job runs exactly the text it
was submitted with; a changed pending job is a new Slurm job and its pending dependents are re-pointed to it
before the old one is cancelled. The Slurm commands are runner.slurm.query's, the sbatch calls (job arrays
among them) runner.slurm.submit's; status and logs live in runner.slurm.view, history in runner.slurm.events.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner import pushlock
from runner.conditions import compile_condition, evaluate
from runner.errors import AgentError
from runner.queue import timestamp
from runner.records import replaced
from runner.slurm import ledger as ledger_mod
from runner.slurm import submit as slurm_submit
from runner.slurm.bundle import PushJob
from runner.slurm.events import history
from runner.slurm.gates import check_gates
from runner.slurm.jsonfields import RecordError
from runner.slurm.ledger import ACTIVE, FINISHED_BAD, RUNNING
from runner.slurm.limits import read_limits
from runner.slurm.query import ControllerDown, env_for, live_of, slurm, squeue, state_of, sync
from runner.slurm.rebuild import LOST, lost_job, open_ledger
from runner.slurm.records import Attempt, JobRecord, Ledger
from runner.slurm.request import PushRequest, PushResult, parse_push_request
from runner.slurm.retry import retry_due
from runner.slurm.submit import Submitted
from runner.slurm.view import logs, status
from runner.slurm.wrapper import wrapper_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.jsonfields import SlurmId
    from runner.slurm.query import Live

__all__ = ["history", "logs", "push", "status", "wrapper"]  # status, history and logs: the agent's other modes


def adopt(plan: str, wanted: tuple[PushJob, ...], jobs: dict[str, JobRecord], live: Live) -> None:
    """Jobs an earlier version of this backend submitted (a bare job name, no ledger entry) that squeue still
    has: taken into the ledger as they are, so an upgrade neither runs them twice nor cancels them."""
    for job in wanted:
        if job.name in jobs:
            continue
        found = [j for j in live.values() if j.plan == plan and j.name == job.name]
        if found:
            newest = max(found, key=lambda j: int(str(j.id).partition("_")[0]))
            jobs[job.name] = JobRecord(
                hash=newest.hash,
                lane=job.lane,
                deps=tuple(job.deps),
                slurm_name=newest.name,
                attempts=(Attempt(id=newest.id, hash=newest.hash),),
            )


def lane_licences(wanted: tuple[PushJob, ...]) -> dict[str, list[str]]:
    """Lane -> the licences (NAME:COUNT) each of its jobs asks for: on Slurm a lane's slots are their counts."""
    lanes: dict[str, list[str]] = {}
    for job in wanted:
        for option in job.sbatch:
            if option.startswith("--licenses="):
                lanes[job.lane] = option.split("=", 1)[1].split(",")
    return lanes


def _holds(condition: str | None, root: str) -> bool:
    return bool(condition) and evaluate(compile_condition(str(condition)), root, 30).holds


def _decide(
    root: str, request: PushRequest, job: PushJob, record: JobRecord | None, live: Live
) -> tuple[list[str], bool]:
    """([mark, name, note], whether to submit it) for one job of the plan, against the ledger and Slurm."""
    name = job.name
    state, last = state_of(record, live)
    if last is None:
        if _holds(job.done_if, root):
            return ["d", name, "DONE_IF already holds: not submitted"], False
        return ["+", name, ""], True
    same = last.hash == job.hash
    if state in ACTIVE or state == "GATED":
        if same:
            return ["=", name, f"pending as {last.id}"], False
        return ["~", name, f"pending {last.id} has other content: a new job replaces it"], True
    if state in RUNNING:
        return [">" if same else ">~", name, f"running as {last.id}"], False
    if state == "COMPLETED":
        if same or _holds(job.done_if, root):
            return ["d", name, f"completed as {last.id}"], False
        return ["~", name, "completed before; content changed, submitted again"], True
    if state == LOST:
        lost = "lost with the ledger: a push submitted it, and neither squeue, sacct nor a result file knows it now"
        if request.retry_failed:
            return ["r", name, f"{lost}; resubmitted"], True
        return ["!", name, f"{lost}; not resubmitted without --retry-failed"], False
    ident = f"{state} as {last.id}"
    if request.retry_failed:
        return ["r", name, f"{ident}; resubmitted"], True
    why = "; Slurm no longer knows it and left no final state" if state == "UNKNOWN" else ""
    return ["!", name, f"{ident}{why}; not resubmitted without --retry-failed"], False


def diff(
    root: str, request: PushRequest, jobs: dict[str, JobRecord], live: Live
) -> tuple[list[list[str]], list[PushJob], list[tuple[str, JobRecord]]]:
    """(changes as [mark, name, note], jobs to submit, retired (name, record) pairs) for the request's plan."""
    wanted = request.jobs
    changes: list[list[str]] = []
    submit: list[PushJob] = []
    for job in wanted:
        change, go = _decide(root, request, job, jobs.get(job.name), live)
        changes.append(change)
        if go:
            last = jobs[job.name].current if job.name in jobs else None
            replaces = change[0] == "~" and change[2].startswith("pending") and last is not None
            submit.append(replaced(job, replaces=last.id) if replaces and last else job)
    submit = _hold_orphans(submit, jobs, live, changes)
    _note_dependents(wanted, jobs, live, changes, {job.name for job in submit})
    return changes, submit, _retire(request, wanted, jobs, live, changes)


def _retire(
    request: PushRequest,
    wanted: tuple[PushJob, ...],
    jobs: dict[str, JobRecord],
    live: Live,
    changes: list[list[str]],
) -> list[tuple[str, JobRecord]]:
    """Jobs of the ledger no longer in the plan: said, and (unless --no-prune) retired."""
    names = {job.name for job in wanted}
    prune = request.prune
    retired = []
    for name in sorted(set(jobs) - names):
        state, last = state_of(jobs[name], live)
        if state in ACTIVE or state in RUNNING or state == "GATED":
            where = f"{state} as {last.id}" if last else state
            kept = "" if prune else "; kept (--no-prune)"
            changes.append(["-" if prune else "=", name, f"no longer in the plan ({where}){kept}"])
        if prune:
            retired.append((name, jobs[name]))
    return retired


def _failed_and_forgotten(record: JobRecord, live: Live) -> bool:
    state, last = state_of(record, live)
    return (state in FINISHED_BAD or state in ("UNKNOWN", LOST)) and (
        last is None or live_of(record, last.id, live) is None
    )


def _hold_orphans(
    submit: list[PushJob], jobs: dict[str, JobRecord], live: Live, changes: list[list[str]]
) -> list[PushJob]:
    """Jobs whose producer failed (or is unknown) and is not resubmitted now, where squeue no longer has that
    producer to block them on: held, since submitted they would run without its outputs."""
    going = {job.name for job in submit}
    held: set[str] = set()
    kept = []
    for job in submit:  # graph order: a producer is decided before its consumers
        bad = [
            d for d in job.deps if d in held or (d not in going and d in jobs and _failed_and_forgotten(jobs[d], live))
        ]
        if not bad:
            kept.append(job)
            continue
        held.add(job.name)
        for change in changes:
            if change[1] == job.name:
                change[0] = "!"
                change[2] = f"its producer {', '.join(bad)} failed: not submitted (--retry-failed resubmits both)"
    return kept


def _note_dependents(
    wanted: tuple[PushJob, ...],
    jobs: dict[str, JobRecord],
    live: Live,
    changes: list[list[str]],
    resubmitted: set[str],
) -> None:
    """Say, on each replaced pending job's line, which pending dependents will be re-pointed to its new job."""
    consumers: dict[str, list[str]] = {}
    for job in wanted:
        for dep in job.deps:
            consumers.setdefault(dep, []).append(job.name)
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


def _levels(submit: list[PushJob]) -> list[list[PushJob]]:
    """Jobs to submit, grouped so each group's producers are all submitted by earlier groups."""
    level: dict[str, int] = {}
    names = {job.name for job in submit}
    for job in submit:  # in graph order: producers first
        level[job.name] = 1 + max((level[d] for d in job.deps if d in names), default=-1)
    groups: list[list[PushJob]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for job in submit:
        groups[level[job.name]].append(job)
    return groups


@dataclass
class Decided:
    """One plan's push as diffed under the push lock: what the user is shown, and what applying it does."""

    ledger: Ledger
    live: Live
    wanted: tuple[PushJob, ...]
    submit: list[PushJob]
    retired: list[tuple[str, JobRecord]]
    result: PushResult  # replaced as the push goes on: applied, what it did


_KEPT: dict[str, Decided] = {}  # token -> a push diffed by this agent, applied by a later request of its session


def push(root: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Diff the plan against the ledger and Slurm; unless `dry_run`, submit, re-point and cancel, then record.
    With `keep` the diff is held here (a token in the answer) and a later request of this session with that
    `token` applies exactly it, the push lock held in between: the diff the user saw is the one applied.
    RAW is read first (runner.slurm.request): a request that is not one is answered as a located error before
    any lock, squeue or ledger is touched. The answer is a PushResult's JSON, or says the lock is busy."""
    request = parse_push_request(raw)
    if isinstance(request, RecordError):
        said = f"the push request's {request}" if request.where else f"the push request: {request.message}"
        raise AgentError(said)
    if request.token:
        return _apply_kept(root, request)
    dry, keep = request.dry_run, request.keep
    took = False
    if (keep or not dry) and not pushlock.held(root):
        got = pushlock.lock(root, {"wait_s": request.lock_wait_s, "by": request.by})
        if got.get("busy"):
            return {"busy": True, "holder": got.get("holder", {})}
        took = not keep  # a kept diff's lock is the session's, released when it ends
    try:
        env = env_for(request.slurm_conf)
        decided = decide(root, request, env)  # ControllerDown: answered by runner.agent.dispatch
        result = decided.result
        if dry and not keep or result.error or (result.external_missing and request.verify_external):
            return result.to_json()
        if keep:
            token = os.urandom(8).hex()
            _KEPT[token] = decided
            return replace(result, token=token).to_json()
        return _commit(root, request, decided, env).to_json()
    finally:
        if took:
            pushlock.release_lock()


def decide(root: str, request: PushRequest, env: dict[str, str]) -> Decided:
    """The diff of one plan against the ledger (rebuilt first where it cannot be trusted) and Slurm."""
    plan, wanted = request.plan, request.jobs
    missing = [p for p in request.external if not os.path.exists(p.rstrip("/") or "/")]
    live = squeue(env)
    ledger, rebuilt = open_ledger(root, live, env)
    why = sync(root, ledger, live, env)
    retried = retry_due(root, ledger, live, env) if pushlock.held(root) else []
    if pushlock.held(root):
        retried += check_gates(root, ledger, live, env, request.slurm_conf)
    jobs = ledger_mod.plan_jobs(ledger, plan)
    adopt(plan, wanted, jobs, live)
    changes, submit, retired = diff(root, request, jobs, live)
    result = PushResult(
        changes=tuple(tuple(change) for change in changes),
        external_missing=tuple(missing),
        accounting=why or "on",
        retried=tuple(retried),
        rebuilt=rebuilt.note if rebuilt else None,
    )
    if rebuilt:
        lost = sorted(n for n in jobs if lost_job(jobs[n]))
        unplaced = [u for u in rebuilt.unplaced if u.startswith(f"{plan} (")]
        if unplaced:  # before the lost jobs: they are likely among them
            error = (
                f"squeue has {len(unplaced)} pending or running jobs of plan {plan} under this root that the "
                f"ledger cannot be rebuilt with: which plan job each is cannot be told (an array's members file "
                f"under scripts/{plan} is gone): {', '.join(unplaced)}. Nothing was submitted; cancel them "
                "(scancel) or let them end, then push again"
            )
        elif lost and not request.retry_failed:
            one = len(lost) == 1
            them, jobs_of = ("it", "1 job") if one else ("them", f"{len(lost)} jobs")
            error = (
                f"{jobs_of} of plan {plan} cannot be accounted for: a push submitted {them}, and neither "
                f"squeue, sacct nor a result file knows {them} now: {', '.join(lost)}. Nothing was submitted; "
                f"once you know {'it does not run' if one else 'none of them runs'}, push again with "
                f"--retry-failed to submit {them} again"
            )
        else:
            error = ""
        result = replace(result, error=error)
    return Decided(ledger, live, wanted, submit, retired, result)


def _apply_kept(root: str, request: PushRequest) -> dict[str, Any]:
    decided = _KEPT.pop(request.token, None)
    if decided is None or not pushlock.held(root):
        raise AgentError("this push's diff is no longer held by the agent; run the push again")
    env = env_for(request.slurm_conf)
    live = squeue(env)
    started = [
        job.name
        for job in decided.submit
        if job.replaces and getattr(live.get(job.replaces), "state", None) not in ACTIVE
    ]
    if started:  # the pending job it was to replace has started (or ended) since: the diff no longer holds
        return {"changed": f"{', '.join(started)} no longer pending as when this push looked"}
    decided.live.update(live)
    return _commit(root, request, decided, env).to_json()


def _commit(root: str, request: PushRequest, decided: Decided, env: dict[str, str]) -> PushResult:
    """Apply a decided push all or nothing: the limits first, then submit; a submission that fails part-way
    cancels what this push submitted and leaves the ledger as it was."""
    result, plan = decided.result, request.plan
    try:
        limits = read_limits(env)
    except ControllerDown as exc:
        said = f"the cluster's limits could not be read: {exc}; nothing was submitted"
        raise AgentError(said, **result.to_json()) from None
    new = len(decided.submit)
    problems = limits.problems(new)
    if problems:
        return replace(
            result,
            error=f"this push would submit {new} job{'' if new == 1 else 's'}, more than the cluster takes now: "
            f"{'; '.join(problems)}. Nothing was submitted",
        )
    done = _apply(root, request, decided, limits.array_chunk, env)
    result = decided.result  # what it submitted, re-pointed and cancelled
    if done.error:
        cancelled = done.slurm_jobs()
        if cancelled:
            slurm(["scancel", *cancelled], env)
        error = (
            f"{done.error}; all or nothing: the {len(done.new)} jobs this push had submitted were cancelled "
            f"({' '.join(cancelled) or 'none'}) and the ledger is as it was"
        )
        result = replace(result, error=error, submitted={}, withdrawn=tuple(cancelled))
        # saved as it was before this push (with what this contact folded in, retries it submitted among them):
        # a ledger left missing would be rebuilt next time from squeue, where the withdrawn jobs still show
        if plan in decided.ledger.plans and not decided.ledger.plans[plan].jobs:
            del decided.ledger.plans[plan]
        ledger_mod.save(root, decided.ledger)
        return result
    entry = decided.ledger.plan(plan)
    entry.by, entry.pushed_at = request.by or "?", timestamp(time.time())
    entry.lanes = {lane: tuple(licences) for lane, licences in lane_licences(decided.wanted).items()}
    ledger_mod.save(root, decided.ledger)
    if any(job.gate for job in decided.submit):  # held: released now if open, else watched
        try:
            released = check_gates(root, decided.ledger, squeue(env), env, request.slurm_conf)
            result = replace(result, released=tuple(released))
        except ControllerDown:
            pass
    return result


def _apply(root: str, request: PushRequest, decided: Decided, chunk: int, env: dict[str, str]) -> Submitted:
    plan, live, submit = request.plan, decided.live, decided.submit
    jobs = ledger_mod.plan_jobs(decided.ledger, plan)
    current = {name: state_of(record, live) for name, record in jobs.items()}
    ids = {n: last.id for n, (state, last) in current.items() if last and last.id is not None and _holds_slot(state)}
    failed = {
        n: last.id
        for n, (state, last) in current.items()
        if last is not None and last.id is not None and state in FINISHED_BAD and last.id in live
    }
    done = Submitted(ids, chunk=chunk)
    if submit:
        slurm_submit.submit(root, request, _levels(submit), done, failed, env)
    if done.error:
        return done
    cancel: list[SlurmId] = []
    submitted = [job for job in submit if job.name in done.new]
    repointed: dict[str, tuple[str, ...]] = {}
    for job in submitted:  # all recorded before any hand-over: a controller lost meanwhile loses none of them
        slurm_submit.record_new(plan, jobs, job, done.new[job.name], (done.bundle, done.entries[job.name]))
    for job in submitted:
        if job.replaces:
            new = done.new[job.name][0]
            repointed[job.name] = tuple(slurm_submit.hand_over(job.replaces, new, live, env))
            cancel.append(job.replaces)
    for name, record in decided.retired:
        state, last = state_of(record, live)
        if last is not None and last.id is not None and _holds_slot(state):
            cancel.append(last.id)
        del jobs[name]
        ledger_mod.remove_results(root, plan, name)
    if cancel:
        _cancel(jobs, cancel, env)
    decided.result = replace(
        decided.result,
        submitted={job.name: done.new[job.name][0] for job in submitted},
        repointed=repointed,
        cancelled=tuple(cancel),
    )
    return done


def _holds_slot(state: str) -> bool:
    """Whether a job in STATE is still Slurm's to run (pending, held for its gate or running)."""
    return state in ACTIVE or state in RUNNING or state == "GATED"


def _cancel(jobs: dict[str, JobRecord], cancel: list[SlurmId], env: dict[str, str]) -> None:
    slurm(["scancel", *(str(i) for i in cancel)], env)  # one call for all of them
    for name, record in jobs.items():
        if any(a.id in cancel and a.state not in ledger_mod.FINAL for a in record.attempts):
            attempts = tuple(
                replace(a, state="CANCELLED", reason="replaced by a push")
                if a.id in cancel and a.state not in ledger_mod.FINAL
                else a
                for a in record.attempts
            )
            jobs[name] = replace(record, attempts=attempts)


def wrapper(root: str, job: PushJob, plan: str, slurm_conf: str | None = None) -> str:
    """The sbatch script of JOB on its own as a push submits it (for lint tests and docs)."""
    bundle = Path(root) / "scripts" / plan / "bundle.0.json"
    return wrapper_text(root, plan, f"job {job.name}", job.env, (bundle, [0], 1), slurm_conf)

"""A push to a queue host, decided: what installing a plan changes in the queue the probe saw, and what refuses it.

The diff rules (which job is new, replaced, re-run, taken over, pruned or refused) and the plan's manifest
record; the backend (backends/queue.py) sends the resulting request to the host's agent.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from plancompiler.backends.protocol import Change, PushOptions, PushPlan, who
from plancompiler.backends.queuehealth import health
from plancompiler.backends.shared_outputs import shared_outputs
from plancompiler.hosts import Host
from runner import identity, jobfile, refusal, stamps
from runner.durations import format_duration
from runner.stamps import push as stamp_push

if TYPE_CHECKING:  # status, watch and the operate commands never compile: no pydantic, no jinja2
    from plancompiler.compile import Compiled


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def plan_record(
    compiled: Compiled, host_slots: dict[str, int] | None = None, host_gpus: tuple[int, ...] = ()
) -> dict[str, Any]:
    """This plan's entry in manifest.json: its graph, each job's content hash, the plan's hash, who pushed; the
    lanes' slots and the gpu lane's GPUs (the hosts file's HOST_SLOTS and HOST_GPUS win over the plan's: it knows
    the machine)."""
    from plancompiler.compile import manifest

    graph = manifest(compiled)
    slots = {**graph.get("slots", {}), **(host_slots or {})}
    gpus = {**graph.get("gpus", {}), **({"gpu": list(host_gpus)} if host_gpus else {})}
    texts = {job.filename: job.text for job in compiled.jobs}
    jobs = graph["jobs"]  # made for this record: each entry gets its job's hash in place
    for name, spec in jobs.items():
        spec["sha"] = _sha(texts[name])
    never = sorted(n for n, spec in jobs.items() if spec.get("rerun") == "never")
    # `rerun: never` lives only in the manifest: changing it must change the plan's hash, so it is recorded.
    counted = [f"{lane}={n}" for lane, n in sorted(slots.items())]  # a change of slots is pushed too
    digest = _sha(
        "\0".join(
            [
                *(texts[n] for n in sorted(texts)),
                *(["rerun: never", *never] if never else []),
                *(["slots", *counted] if counted else []),
                *(["gpus", *(f"{lane}={d}" for lane, d in sorted(gpus.items()))] if gpus else []),
            ]
        )
    )[:12]
    try:
        plan_sha = hashlib.sha256(compiled.path.read_bytes()).hexdigest()[:12]
    except OSError:
        plan_sha = ""
    record = {
        "plan": compiled.name,
        "hash": digest,
        "by": who(),
        # who pushed it from where: a push of this plan from another clone or user says it replaces this one's jobs
        "source": {"by": who(), "path": os.path.realpath(compiled.path), "sha": plan_sha},
        "jobs": jobs,
        "producers": graph["producers"],
        "external": graph["external"],
    }
    if slots:
        record["slots"] = slots
    if gpus:
        record["gpus"] = gpus
    return record


def outputs_of(compiled: Compiled) -> dict[str, list[str]]:
    return {job.filename: [o.value for o in job.job.outputs] for job in compiled.jobs}


def rerun_paths(result: PushPlan, compiled: Compiled) -> list[str]:
    """What to measure for the cost of RESULT's reruns: each output of a job that runs again, or the directory
    its marker stands for."""
    again = set(result.reruns or ()) | set(result.maybe)
    if not again:  # a push of new or queued jobs only: nothing to measure (stands_for reads every output)
        return []
    outputs = outputs_of(compiled)
    stand = stamps.stands_for(outputs)
    return sorted({stand[o] for job, paths in outputs.items() if job in again for o in paths})


def diff(compiled: Compiled, host: Host, probe: dict[str, Any], options: PushOptions) -> PushPlan:
    """What installing COMPILED would do to the queue PROBE describes, and what refuses it."""
    work = _Diff(compiled, host, probe, options)
    for job in compiled.jobs:
        work.job(job.filename, job.text)
    work.prune()
    result = work.result(host)
    # judged here from what the box holds (named as the user names the host), else the box's own verdict
    refused = refusal(probe.get("holds") or {}, identity(), host.name) or probe.get("refused")
    if refused:
        result.errors.append(refused)
    others: dict[str, Any] = probe["plans"] if isinstance(probe.get("plans"), dict) else {}
    result.errors += shared_outputs(compiled.name, work.record["jobs"], others, options.allow_shared_output, host.name)
    for name, wrong in sorted((probe.get("stamp_problems") or {}).items()):
        result.warnings.append(f"{name} on {host.name}: {'; '.join(str(w[-1]) for w in wrong)}")
    if options.verify_external and probe.get("external_missing"):
        for path in probe["external_missing"]:
            result.errors.append(
                f"external path {path} does not exist on {host.name} "
                "(jobs that require it would wait forever; --no-verify-external to push anyway)"
            )
    health(result, host, probe, options)
    return result


def _joined(*notes: str) -> str:
    return "; ".join(filter(None, notes))


class _Diff:
    """The changes and the install request of one push, built job by job against the probed queue."""

    def __init__(self, compiled: Compiled, host: Host, probe: dict[str, Any], options: PushOptions) -> None:
        self.probe, self.options, self.plan_name = probe, options, compiled.name
        self.files: dict[str, dict[str, dict[str, Any]]] = probe.get("files", {})
        self.where: dict[str, tuple[str, dict[str, Any]]] = {}
        for state_dir in ("failed", "done", "queue", "running"):  # later states win: running is what matters
            for name, info in self.files.get(state_dir, {}).items():
                self.where[name] = (state_dir, info)
        self.recorded: dict[str, str] = probe.get("owners", {})
        self.changes: list[Change] = []
        self.foreign: dict[tuple[str, str | None], list[str]] = {}  # (state, owning plan or None) -> jobs refused
        self.again: dict[str, bool] = {}  # ran before, queued again by a retry or a take-over -> whether it surely runs
        self.request: dict[str, Any] = {"files": {}, "remove": [], "resets": [], "replace": [], "take_over": []}
        self.ours = {job.filename for job in compiled.jobs}
        self.record = plan_record(compiled, dict(host.slots), host.gpus)
        # Rerun on change (runner/stamps/store.py): which done jobs run again, and which follow them downstream.
        mine = {
            n: (self.where[n][0], self.where[n][1].get("sha"))
            for n in self.ours
            if n in self.where and self.owner(n) == self.plan_name
        }
        # what each job runs, hashed: read only for a done job of ours (whether a changed one must run again)
        texts = {job.filename: job.text for job in compiled.jobs if mine.get(job.filename, ("",))[0] == "done"}
        graph = {
            n: {**spec, "run_sha": stamps.content_hash(texts[n].encode())} if n in texts else spec
            for n, spec in self.record["jobs"].items()
        }
        self.effects, self.marks = stamp_push.push_effects(graph, mine, probe.get("stamps") or {})

    def owner(self, name: str) -> str | None:
        """The plan that owns NAME: manifest.json's record, else the PLAN= header the runner reads."""
        if name in self.recorded:
            return self.recorded[name]
        header = self.where[name][1].get("plan") if name in self.where else None
        return header.split("@", 1)[0] if header else None

    def job(self, name: str, text: str) -> None:
        """The change one job of the plan makes to the queue."""
        state, info = self.where.get(name, (None, {}))
        held_by = self.owner(name) if (state or name in self.recorded) else None
        taken = ""
        if held_by != self.plan_name and (state is not None or held_by is not None):
            if state is not None and not self.options.take_over:
                self.foreign.setdefault((state, held_by), []).append(name)
                return
            taken = f"taken over from {'plan ' + held_by if held_by else 'a hand-written job'}; attempts reset"
            self.request["take_over"].append(name)
            self.request["resets"].append(name)
        same = state is not None and info.get("sha") == self.record["jobs"][name]["sha"]  # the record hashed it
        if state is None:
            self.changes.append(Change("+", name, None, taken))
            self.request["files"][name] = text
        elif state == "running":
            older = "" if same else "running an older version; the new one is not sent"
            self.changes.append(Change(">" if same else ">~", name, state, _joined(taken, older)))
        elif state == "queue":
            self._queued(name, text, same, taken)
        elif state == "done":
            self._done(name, text, same, taken)
        else:
            self._failed(name, text, taken)

    def _queued(self, name: str, text: str, same: bool, taken: str) -> None:
        effect = self.effects.get(name)
        if effect is not None and effect.kind == "stale":
            self.changes.append(Change("^", name, "queue", _joined(taken, "" if same else "changed", effect.note)))
        else:
            self.changes.append(Change("=" if same else "~", name, "queue", taken))
        if not same:
            self.request["files"][name] = text
            self.request["replace"].append(name)

    def _done(self, name: str, text: str, same: bool, taken: str) -> None:
        if same and not taken and name not in self.effects:
            self.changes.append(Change("d", name, "done"))
            return
        effect = self.effects.get(name)
        mark = "^" if effect is not None and effect.kind == "stale" else "~"
        why = effect.note if effect else f"done before; {'' if same else 'content changed, '}queued again"
        if effect is None:  # taken over: the stamps' rules never saw it (not this plan's), yet it is sent back
            self._ran_before(name, text)
        self.changes.append(Change(mark, name, "done", _joined(taken, why)))
        self.request["remove"].append(["done", name])
        self.request["files"][name] = text
        if effect is not None and effect.kind in ("run", "stale") and name not in self.request["resets"]:
            self.request["resets"].append(name)  # a rerun starts at attempt 1, with all its retries

    def _failed(self, name: str, text: str, taken: str) -> None:
        if not (self.options.retry_failed or taken):
            same = self.where[name][1].get("sha") == _sha(text)
            todo = (
                "unchanged: --retry-failed runs it again"
                if same
                else "changed since: --retry-failed runs the new version"
            )
            self.changes.append(Change("!", name, "failed", f"{self._failure(name)}; {todo}"))
            return
        self.changes.append(Change("r", name, "failed", taken or "attempts reset"))
        self._ran_before(name, text)
        self.request["remove"].append(["failed", name])
        if name not in self.request["resets"]:
            self.request["resets"].append(name)
        self.request["files"][name] = text

    def _ran_before(self, name: str, text: str) -> None:
        """NAME ran before (it failed, or it is done under another owner) and is queued again: it surely runs
        unless a DONE_IF may hold, as the runner judges it (runner/stamps/judge.py): a job without a DONE_IF always
        runs, and a stamped one whose stamp is of other content runs even when it holds."""
        spec = self.record["jobs"][name]
        judged = jobfile.parse(name, text.encode(), (spec["lane"],))
        if not isinstance(judged, jobfile.JobFile) or judged.done_if is None:
            self.again[name] = True
            return
        stamp = (self.probe.get("stamps") or {}).get(name)
        if not isinstance(stamp, dict) or not stamps.stamped(judged) or stamps.rerun_never(self.record, name):
            self.again[name] = False  # no stamp to judge it by: its DONE_IF decides
            return
        self.again[name] = stamp.get("sha") != stamps.content_hash(text.encode())

    def _failure(self, name: str) -> str:
        """`failed 3/3: unsupported sampler flag: -b`: its attempts and its last failure, from the probe."""
        known = (self.probe.get("failures") or {}).get(name)
        known = known if isinstance(known, dict) else {}
        used, allowed = known.get("attempts"), known.get("retries")
        counted = f" {used}/{allowed}" if isinstance(used, int) and isinstance(allowed, int) and used else ""
        why = known.get("summary") if isinstance(known.get("summary"), str) else ""
        return f"failed{counted}" + (f": {why[:160]}" if why else "")

    def prune(self) -> None:
        """This plan's jobs that it no longer has, by state: queued ones removed (kept with --no-prune); running
        ones keep running unless --stop-retired ends them; done and failed ones stay where they are."""
        for name in sorted(self.where):
            state = self.where[name][0]
            if name in self.ours or self.owner(name) != self.plan_name:
                continue  # hand-written jobs and other plans' jobs are never pruned
            if state == "queue":
                if self.options.prune:
                    self.changes.append(Change("-", name, "queue", "no longer in the plan"))
                    self.request["remove"].append(["queue", name])
                else:
                    self.changes.append(Change("=", name, "queue", "no longer in the plan; kept (--no-prune)"))
            elif state == "running":
                self._retired_running(name)
            elif name in self.recorded:  # said once: by the push that retires it
                where = "stays in failed/" if state == "failed" else "its outputs stay"
                self.changes.append(Change("-", name, state, f"{state}; no longer in the plan: {where}"))

    def _retired_running(self, name: str) -> None:
        runs = (self.probe.get("status") or {}).get("running") or []
        run = next((r for r in runs if isinstance(r, dict) and r.get("job") == name), {})
        started = run.get("started")
        now = float(self.probe.get("now") or 0)
        took = f" {format_duration(now - started)}" if isinstance(started, (int, float)) and now else ""
        if self.options.stop_retired:
            self.changes.append(Change("-", name, "running", f"running{took}: ended by --stop-retired, as plan cancel"))
            self.request.setdefault("stop", []).append(name)
        else:
            self.changes.append(Change("-", name, "running", f"running{took}: keeps running; --stop-retired ends it"))

    def result(self, host: Host) -> PushPlan:
        request, where = self.request, self.where
        request["stale"] = [m for m in self.marks if m[0] in request["files"] or where.get(m[0], ("",))[0] == "queue"]
        before = self.probe.get("plans", {}).get(self.plan_name) or {}
        owned_before = {n for n, p in self.recorded.items() if p == self.plan_name}
        changed_record = before.get("hash") != self.record["hash"] or owned_before != self.ours or request["take_over"]
        request["record"] = self.record if changed_record else None
        request["generation"] = self.probe.get("generation", 0)
        request["client"] = identity()
        # Done jobs sent back without a stamp: a DONE_IF decides whether they run; without one they surely do.
        unstamped = {n for n, e in self.effects.items() if e.kind == "unstamped" and n in request["files"]}
        judged = {n for n in unstamped if {"outputs", "done_if"} & {k for k, v in self.record["jobs"][n].items() if v}}
        surely = {n for n, sure in self.again.items() if sure}
        reruns = [name for name, _ in request["stale"]] + sorted((unstamped - judged) | surely)
        maybe = sorted(judged | (set(self.again) - surely))
        result = PushPlan(
            host.describe(),
            self.plan_name,
            self.changes,
            errors=[_foreign(sorted(jobs), *cause, self.plan_name, self.probe) for cause, jobs in self.foreign.items()],
            request=request,
            reruns=reruns,
            maybe=maybe,
            refused=[
                {"job": n, "state": s, "plan": p} for (s, p), names in self.foreign.items() for n in sorted(names)
            ],
        )
        self._previous(result, before)
        return result

    def _previous(self, result: PushPlan, before: dict[str, Any]) -> None:
        """Whether this plan was last pushed from another source (a clone, another user), and how many of the
        jobs it left this push replaces or removes."""
        theirs, ours = before.get("source"), self.record["source"]
        if not isinstance(theirs, dict) or (theirs.get("by"), theirs.get("path")) == (ours["by"], ours["path"]):
            return
        existing = [n for n in self.request["files"] if n in self.where]
        replaced = len(set(existing) | {n for _, n in self.request["remove"]} | set(self.request.get("stop", [])))
        at, now = theirs.get("at"), float(self.probe.get("now") or 0)
        ago = f" {format_duration(max(0.0, now - at))} ago" if isinstance(at, (int, float)) and now else ""
        result.previous = {**theirs, "pushed_at": before.get("pushed_at"), "replaces": replaced}
        if replaced:
            result.warnings.append(
                f"plan {self.plan_name} was last pushed by {theirs.get('by', '?')} from {theirs.get('path', '?')}"
                f"{ago}; this push replaces {replaced} of its job{'s' * (replaced != 1)}"
            )


def add_costs(result: PushPlan, compiled: Compiled, sizes: Any) -> None:
    """Each rerun's cost, from the SIZES the box measured (a job none of whose outputs exist costs nothing known)."""
    if not isinstance(sizes, dict):
        return
    outputs = outputs_of(compiled)
    again = set(result.reruns or ()) | set(result.maybe)
    stand = stamps.stands_for(outputs)
    for i, change in enumerate(result.changes):
        if change.job not in again:
            continue
        measured = [sizes[p] for p in {stand[o] for o in outputs.get(change.job, [])} if isinstance(sizes.get(p), list)]
        if measured:
            floor = any(not m[1] for m in measured)
            result.changes[i] = replace(change, cost=sum(int(m[0]) for m in measured), cost_floor=floor)


# A refusal of many jobs for one cause names this many of them; --json's `refused` lists every one.
NAMED = 5


def _foreign(names: list[str], state: str, held_by: str | None, plan_name: str, probe: dict[str, Any]) -> str:
    """One line for all of NAMES, which STATE/ holds for another plan (HELD_BY) or as hand-written jobs (None):
    3 000 colliding names are one refusal, with the count and the first few, not 3 000 lines."""
    one = len(names) == 1
    more = f", and {len(names) - NAMED} more" if len(names) > NAMED else ""
    jobs = names[0] if one else f"{len(names)} jobs ({', '.join(names[:NAMED])}{more})"
    them = "it" if one else "them"
    if held_by is None:
        what = "is a hand-written job" if one else "are hand-written jobs"
        fix = "rename the job, remove the file" if one else "rename the jobs, remove the files"
        return (
            f"{jobs} in {state}/ {what} (no PLAN= header): plan {plan_name} will not replace {them}; "
            f"{fix}, or push with --take-over"
        )
    pushed = probe.get("plans", {}).get(held_by) or {}
    by = f", pushed by {pushed['by']} at {pushed['pushed_at']}" if pushed.get("by") and pushed.get("pushed_at") else ""
    return (
        f"{jobs} in {state}/ {'belongs' if one else 'belong'} to plan {held_by}{by}: plan {plan_name} will not "
        f"replace {them}; push with --take-over to move {them} to {plan_name}"
    )

"""`plan push` to a host with `backend: slurm`: each job becomes a batch script submitted with afterok
dependencies on its producers; lanes map to GRES and licenses (see README, "The Slurm backend")."""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from plancompiler.compile import Compiled
from plancompiler.hosts import Host
from plancompiler.push import MARKS, Change, PushOptions, PushOutcome, PushPlan
from runner.durations import parse_duration

# gpu -> a GPU by GRES; net -> a license; lanes exclusive with each other share one more license.
DEFAULT_LANES: dict[str, dict[str, Any]] = {"gpu": {"gres": "gpu:1"}, "net": {"licenses": ["net:1"]}, "cpu": {}}
DEFAULT_EXCLUSIVE = ("net", "gpu")
DEFAULT_SHARED_LICENSE = "netgpu:1"


def sbatch_args(host: Host, lane: str) -> list[str]:
    """#SBATCH options for a job in LANE on HOST, from its `lanes:` mapping and defaults."""
    lanes = {**DEFAULT_LANES, **(host.extra.get("lanes") or {})}
    spec = dict(lanes.get(lane) or {})
    args: list[str] = []
    partition = spec.get("partition", host.extra.get("partition"))
    account = spec.get("account", host.extra.get("account"))
    if partition:
        args.append(f"--partition={partition}")
    if account:
        args.append(f"--account={account}")
    if spec.get("gres"):
        args.append(f"--gres={spec['gres']}")
    licenses = list(spec.get("licenses") or [])
    exclusive = host.extra.get("exclusive", list(DEFAULT_EXCLUSIVE))
    shared = host.extra.get("exclusive_license", DEFAULT_SHARED_LICENSE)
    if lane in exclusive and shared:
        licenses.append(shared)
    if licenses:
        args.append("--licenses=" + ",".join(licenses))
    args += [str(a) for a in spec.get("extra", [])]
    return args


def push_request(compiled: Compiled, host: Host, *, retry_failed: bool, prune: bool, verify_external: bool,
                 dry_run: bool) -> dict[str, Any]:
    assert compiled.graph is not None
    graph = compiled.graph
    by_name = {job.name: job for job in compiled.jobs}
    jobs = []
    for name in graph.order():
        job = by_name[name]
        parsed_done = next((ln[len("# DONE_IF="):] for ln in job.text.splitlines()[:job.header_lines]
                            if ln.startswith("# DONE_IF=")), None)
        spec = job.job.job
        jobs.append({
            "name": name, "text": job.text, "hash": hashlib.sha256(job.text.encode()).hexdigest()[:12],
            "deps": list(graph.deps.get(name, [])), "lane": spec.lane, "done_if": parsed_done,
            "retries": spec.retries, "timeout_s": parse_duration(spec.timeout) if spec.timeout else None,
            "sbatch": sbatch_args(host, spec.lane),
        })
    return {"plan": compiled.name, "jobs": jobs, "external": list(graph.external) if verify_external else [],
            "retry_failed": retry_failed, "prune": prune, "dry_run": dry_run, "verify_external": verify_external,
            "create": True}


def as_push_plan(compiled: Compiled, host: Host, answer: dict[str, Any]) -> PushPlan:
    changes = [Change(mark, f"{name}.job", None, note) for mark, name, note in answer.get("changes", [])
               if mark in MARKS]
    result = PushPlan(host.describe(), compiled.name, changes)
    for path in answer.get("external_missing", []):
        result.errors.append(f"external path {path} does not exist on the submit host of {host.name}")
    if answer.get("error"):
        result.errors.append(answer["error"])
    return result


def push_slurm(compiled: Compiled, host: Host, options: PushOptions, show: Callable[[PushPlan], None]) -> PushOutcome:
    """The diff is computed on the submit host and shown; then the same request, not dry, submits."""
    request = push_request(compiled, host, retry_failed=options.retry_failed, prune=options.prune,
                           verify_external=options.verify_external, dry_run=True)
    diff = as_push_plan(compiled, host, host.call("push", request, 300))
    show(diff)
    if diff.errors:
        return PushOutcome(diff, notes=["plan: push refused; nothing was submitted"])
    if options.dry_run:
        return PushOutcome(diff, notes=["dry run: nothing was submitted"])
    answer = host.call("push", {**request, "dry_run": False}, 600)
    submitted = answer.get("submitted", {})
    notes = [f"  submitted {name}.job as {slurm_id}" for name, slurm_id in submitted.items()]
    if answer.get("error"):
        diff.errors.append(answer["error"])
        notes.append(f"plan: {answer['error']}")
    notes.append(f"pushed: {len(submitted)} submitted")
    return PushOutcome(diff, not answer.get("error"), notes)


_SACCT_EVENT = {"COMPLETED": "done", "FAILED": "failed", "TIMEOUT": "timeout", "OUT_OF_MEMORY": "failed",
                "NODE_FAIL": "failed", "CANCELLED": "cancelled"}
_LANE_BY_OPTION = {"gpu": "gpu", "net": "net"}


def sacct_events(lines: list[str], lanes: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`sacct -P -n -X --format=JobID,JobName,State,Start,End,Comment,ExitCode,Reason` lines of plan jobs as
    runner-vocabulary events (start, done, failed, timeout, cancelled), for `plan report`."""
    events: list[dict[str, Any]] = []
    for line in lines:
        parts = line.split("|")
        if len(parts) < 8 or not parts[5].startswith("plan="):
            continue
        job_id, name, state, start, end, _comment, exit_code, reason = parts[:8]
        state = state.split()[0]
        job = f"{name}.job"
        lane = (lanes or {}).get(name, "cpu")
        if start and start not in ("Unknown", "None"):
            events.append({"ts": start.replace("T", " "), "job": job, "event": "start", "lane": lane,
                           "slurm_id": int(job_id.split("_")[0].split(".")[0])})
        kind = _SACCT_EVENT.get(state)
        if kind and end and end not in ("Unknown", "None"):
            if state == "CANCELLED" and reason == "DependencyNeverSatisfied":
                kind = "blocked"
            rc = int(exit_code.split(":")[0]) if exit_code.split(":")[0].isdigit() else None
            events.append({"ts": end.replace("T", " "), "job": job, "event": kind, "rc": rc, "state": state})
    events.sort(key=lambda e: e["ts"])
    return events

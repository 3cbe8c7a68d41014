"""A `backend: slurm` host: each job a batch script with afterok dependencies on its producers; lanes map to
GRES and licenses (see README, "The Slurm backend"). The diff is made on the submit host by runner.slurm_agent."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from plancompiler.backends.protocol import MARKS, Change, PushOptions, PushOutcome, PushPlan, Refused, ReportSource
from plancompiler.compile import Compiled
from plancompiler.hosts import Host
from plancompiler.hostsfile import DEFAULT_SLURM_LANES, SlurmHostEntry
from runner import jobfile
from runner.durations import parse_duration
from runner.vocab import Event


def sbatch_args(settings: SlurmHostEntry, lane: str) -> list[str]:
    """#SBATCH options for a job in LANE, from the host's `lanes:` mapping and the defaults."""
    spec = {**DEFAULT_SLURM_LANES, **settings.lanes}.get(lane)
    args: list[str] = []
    partition = (spec.partition if spec else None) or settings.partition
    account = (spec.account if spec else None) or settings.account
    if partition:
        args.append(f"--partition={partition}")
    if account:
        args.append(f"--account={account}")
    if spec and spec.gres:
        args.append(f"--gres={spec.gres}")
    licenses = list(spec.licenses) if spec else []
    if lane in settings.exclusive and settings.exclusive_license:
        licenses.append(settings.exclusive_license)
    if licenses:
        args.append("--licenses=" + ",".join(licenses))
    return args + list(spec.extra if spec else [])


def push_request(compiled: Compiled, host: Host, options: PushOptions) -> dict[str, Any]:
    assert compiled.graph is not None and host.slurm is not None
    graph = compiled.graph
    by_name = {job.name: job for job in compiled.jobs}
    jobs = []
    for name in graph.order():
        job = by_name[name]
        parsed = jobfile.parse(job.filename, job.text.encode())  # DONE_IF as the runner reads it
        spec = job.job.job
        jobs.append({
            "name": name, "text": job.text, "hash": hashlib.sha256(job.text.encode()).hexdigest()[:12],
            "deps": list(graph.deps.get(name, [])), "lane": spec.lane,
            "done_if": parsed.done_if if isinstance(parsed, jobfile.JobFile) else None,
            "retries": spec.retries, "timeout_s": parse_duration(spec.timeout) if spec.timeout else None,
            "sbatch": sbatch_args(host.slurm, spec.lane),
        })
    return {"plan": compiled.name, "jobs": jobs, "external": list(graph.external) if options.verify_external else [],
            "retry_failed": options.retry_failed, "prune": options.prune, "dry_run": True,
            "verify_external": options.verify_external, "create": True}


class SlurmPushSession:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.request: dict[str, Any] = {}

    def diff(self, compiled: Compiled, options: PushOptions) -> PushPlan:
        self.request = push_request(compiled, self.host, options)
        answer = self.host.call("push", self.request, 300)
        changes = [Change(mark, f"{name}.job", None, note) for mark, name, note in answer.get("changes", [])
                   if mark in MARKS]
        result = PushPlan(self.host.describe(), compiled.name, changes, request={"submit": True},
                          host_state={"runner": "slurm"})
        for path in answer.get("external_missing", []):
            result.errors.append(f"external path {path} does not exist on the submit host of {self.host.name}")
        if answer.get("error"):
            result.errors.append(answer["error"])
        return result

    def apply(self, diff: PushPlan) -> PushOutcome:
        answer = self.host.call("push", {**self.request, "dry_run": False}, 600)
        submitted = answer.get("submitted", {})
        results = [f"  submitted {name}.job as {slurm_id}" for name, slurm_id in submitted.items()]
        notes = []
        if answer.get("error"):
            diff.errors.append(answer["error"])
            notes.append(f"plan: {answer['error']}")
        notes.append(f"pushed: {len(submitted)} submitted")
        return PushOutcome(diff, not answer.get("error"), notes, results)


class SlurmBackend:
    def __init__(self, host: Host) -> None:
        self.host = host

    @contextmanager
    def push_session(self, options: PushOptions) -> Iterator[SlurmPushSession]:
        yield SlurmPushSession(self.host)

    def status(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.host.call("status", request, timeout)

    def report_source(self, since: str | None) -> ReportSource:
        history = self.host.call("history", {"since": since}, 300)
        if history.get("accounting"):
            return ReportSource("\n".join(json.dumps(e) for e in sacct_events(history.get("lines", []))),
                                ("note: read from Slurm accounting (sacct)",))
        answer = self.host.call("status", {"offset": 0, "max_bytes": 1 << 30}, 300)
        if "error" in answer:
            raise Refused(f"{self.host.describe()}: {answer['error']}")
        return ReportSource("\n".join(json.dumps(e) for e in answer.get("events", [])), (
            f"note: Slurm accounting is off here ({history.get('why', 'sacct failed')}); this report is built from "
            "the state changes `plan status`/`plan watch` recorded on the submit host, so it is as complete as "
            "their probes were frequent",))

    def operate(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.host.call(mode, request, timeout)


_SACCT_EVENT = {"COMPLETED": Event.DONE, "FAILED": Event.FAILED, "TIMEOUT": Event.TIMEOUT,
                "OUT_OF_MEMORY": Event.FAILED, "NODE_FAIL": Event.FAILED, "CANCELLED": Event.CANCELLED}


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
            events.append({"ts": start.replace("T", " "), "job": job, "event": Event.START.value, "lane": lane,
                           "slurm_id": int(job_id.split("_")[0].split(".")[0])})
        kind = _SACCT_EVENT.get(state)
        if kind and end and end not in ("Unknown", "None"):
            if state == "CANCELLED" and reason == "DependencyNeverSatisfied":
                kind = Event.BLOCKED
            rc = int(exit_code.split(":")[0]) if exit_code.split(":")[0].isdigit() else None
            events.append({"ts": end.replace("T", " "), "job": job, "event": kind.value, "rc": rc, "state": state})
    events.sort(key=lambda e: e["ts"])
    return events

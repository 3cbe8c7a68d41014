"""A `backend: slurm` host: each job a batch script with afterok dependencies on its producers; lanes map to
GRES and licenses (see docs/slurm.md). The diff is made on the submit host by runner.slurm.agent."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from plancompiler.backends.protocol import MARKS, Change, PushOptions, PushOutcome, PushPlan, Refused, ReportSource, who
from plancompiler.backends.queue import CHANGED, busy_message, take_push_lock
from plancompiler.backends.slurmanswer import PushAnswer, history_answer, push_answer
from plancompiler.backends.slurmstatus import read_status
from plancompiler.compile import Compiled
from plancompiler.hosts import AgentSession, Host
from plancompiler.hostsfile import DEFAULT_SLURM_LANES, SlurmHostEntry, SlurmLane
from runner import jobfile
from runner.durations import parse_duration
from runner.slurm.request import PushJob, PushRequest


def lane_spec(settings: SlurmHostEntry, lane: str) -> SlurmLane | None:
    return {**DEFAULT_SLURM_LANES, **settings.lanes}.get(lane)


def with_gpus(gres: str | None, gpus: int | None) -> str | None:
    """The lane's GRES with a job's `gpus: N` as the count of its gpu (its type kept: gpu:a100:1 -> gpu:a100:N),
    or gpu:N added where the lane asks for none."""
    if not gpus:
        return gres
    items = [item for item in (gres or "").split(",") if item]
    for i, item in enumerate(items):
        parts = item.split(":")
        if parts[0] == "gpu":
            items[i] = ":".join((parts[:-1] if len(parts) > 1 and parts[-1].isdigit() else parts) + [str(gpus)])
            return ",".join(items)
    return ",".join([*items, f"gpu:{gpus}"])


def sbatch_args(settings: SlurmHostEntry, lane: str, gpus: int | None = None) -> list[str]:
    """sbatch options for a job in LANE (taking GPUS, its `gpus:`), from the host's `lanes:` and the defaults."""
    spec = lane_spec(settings, lane)
    args: list[str] = []
    for option, value in (
        ("partition", (spec.partition if spec else None) or settings.partition),
        ("account", (spec.account if spec else None) or settings.account),
        ("qos", (spec.qos if spec else None) or settings.qos),
        ("mem", spec.mem if spec else None),
        ("cpus-per-task", spec.cpus if spec else None),
        ("gres", with_gpus(spec.gres if spec else None, gpus)),
    ):
        if value:
            args.append(f"--{option}={value}")
    licenses = list(spec.licenses) if spec else []
    if lane in settings.exclusive and settings.exclusive_license:
        licenses.append(settings.exclusive_license)
    if licenses:
        args.append("--licenses=" + ",".join(licenses))
    return args + list(spec.extra if spec else [])


def group_label(template: str) -> str:
    """A foreach job's name template as its group reads in squeue: each `{{ ... }}` a `*` (shard-{{ i }} -> shard-*)."""
    return re.sub(r"\{\{.*?\}\}|\{%.*?%\}", "*", template)


def _gated(spec: Any) -> bool:
    """Whether a job has a gate only the wrapper can check: an `sh:` requirement or one marked external."""
    return any(req.kind == "sh" or req.external for req in spec.requires)


def push_request(compiled: Compiled, host: Host, options: PushOptions) -> PushRequest:
    """The push of COMPILED to HOST as its agent reads it (runner.slurm.request), its jobs in graph order."""
    assert compiled.graph is not None and host.slurm is not None
    graph = compiled.graph
    by_name = {job.name: job for job in compiled.jobs}
    jobs = []
    for name in graph.order():
        job = by_name[name]
        parsed = jobfile.parse(job.filename, job.text.encode())  # DONE_IF and REQUIRES as the runner reads them
        spec = job.job.job
        lane = lane_spec(host.slurm, spec.lane)
        read = parsed if isinstance(parsed, jobfile.JobFile) else None
        grouped = spec.foreach is not None
        jobs.append(
            PushJob(
                name=name,
                hash=hashlib.sha256(job.text.encode()).hexdigest()[:12],
                text=job.text,
                deps=tuple(graph.deps.get(name, [])),
                lane=spec.lane,
                # a foreach group: one job array where its dependencies allow (runner.slurm.submit)
                group=job.job.index if grouped else None,
                family=group_label(spec.name) if grouped else None,  # the array's name
                done_if=read.done_if if read else None,
                gate=read.requires if read and _gated(spec) else None,
                retries=spec.retries,
                timeout_s=parse_duration(spec.timeout) if spec.timeout else None,
                default_time=lane.time if lane else None,
                env=dict(lane.env) if lane else {},
                sbatch=tuple(sbatch_args(host.slurm, spec.lane, spec.gpus)),
            )
        )
    return PushRequest(
        plan=compiled.name,
        jobs=tuple(jobs),
        external=tuple(graph.external) if options.verify_external else (),
        retry_failed=options.retry_failed,
        prune=options.prune,
        dry_run=True,
        verify_external=options.verify_external,
        by=who(),
        lock_wait_s=options.lock_wait_s,
        gate_interval_s=host.slurm.gate_interval,
        backoff_base_s=host.slurm.backoff_base,
        backoff_max_s=host.slurm.backoff_max,
        slurm_conf=host.slurm.slurm_conf,
    )


class SlurmPushSession:
    """Diff and apply through one agent process on the submit host, which holds ROOT/.push.lock from the diff to
    the apply and keeps the diff it made: the jobs submitted are the ones the user was shown."""

    def __init__(self, host: Host, session: AgentSession, options: PushOptions) -> None:
        self.host = host
        self.session = session
        self.options = options
        self.request: PushRequest | None = None
        self.token = ""

    def diff(self, compiled: Compiled, options: PushOptions) -> PushPlan:
        self.request = push_request(compiled, self.host, options)
        asked = self.session.ask("push", replace(self.request, keep=not options.dry_run).to_json(), 300)
        answer = push_answer(asked, self.host.describe())
        if answer.busy:
            raise Refused(busy_message(self.host, answer.holder))
        if answer.error and answer.changes is None:
            raise Refused(f"{self.host.describe()}: {answer.error}")
        self.token = answer.token
        changes = [
            Change(mark, f"{name}.job", None, note) for mark, name, note in answer.changes or () if mark in MARKS
        ]
        result = PushPlan(
            self.host.describe(), compiled.name, changes, request={"submit": True}, host_state={"runner": "slurm"}
        )
        if answer.rebuilt:
            result.warnings.append(answer.rebuilt)
        for path in answer.external_missing:
            result.errors.append(f"external path {path} does not exist on the submit host of {self.host.name}")
        if answer.error:
            result.errors.append(answer.error)
        return result

    def apply(self, diff: PushPlan) -> PushOutcome:
        assert self.request is not None, "a diff comes first"
        asked = self.session.ask("push", replace(self.request, token=self.token).to_json(), 600)
        answer = push_answer(asked, self.host.describe())
        if answer.busy:
            raise Refused(busy_message(self.host, answer.holder))
        if answer.changed:
            raise Refused(f"{CHANGED} ({answer.changed})")
        if answer.error and answer.changes is None:
            raise Refused(f"{self.host.describe()}: {answer.error}")
        if answer.error:  # all or nothing: nothing of this push is left in Slurm
            diff.errors.append(answer.error)
        return PushOutcome(diff, not answer.error, *outcome_lines(answer))

    def landed(self, diff: PushPlan) -> bool | None:
        return None  # the ledger says what was submitted, not which push submitted it


def outcome_lines(answer: PushAnswer) -> tuple[list[str], list[str]]:
    """(notes for stderr, results for stdout) of an applied Slurm push: what was submitted, re-pointed, cancelled."""
    submitted = answer.submitted
    results = [f"  submitted {name}.job as {slurm_id}" for name, slurm_id in submitted.items()]
    for name, moved in answer.repointed.items():
        if moved:
            results.append(
                f"  re-pointed {len(moved)} pending dependents of {name}.job to {submitted.get(name)}: "
                + ", ".join(str(i) for i in moved)
            )
    if answer.cancelled:
        results.append("  cancelled " + " ".join(str(i) for i in answer.cancelled))
    notes = [f"plan: {answer.error}"] if answer.error else []
    notes.append(f"pushed: {len(submitted)} submitted")
    return notes, results


class SlurmBackend:
    def __init__(self, host: Host) -> None:
        self.host = host

    @contextmanager
    def push_session(self, options: PushOptions) -> Iterator[SlurmPushSession]:
        session = self.host.session()
        try:
            if not options.dry_run:
                take_push_lock(self.host, session, options)
            yield SlurmPushSession(self.host, session, options)
        finally:
            session.close()

    def status(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """The agent's status answer, its status read (runner.slurm.statusitems) and passed on as it was read: a
        malformed one is an AgentError naming the host and where it is wrong, never a traceback further on."""
        return read_status(self.host.call("status", request, timeout), self.host.describe())

    def report_source(self, since: str | None, plan: str | None = None) -> ReportSource:
        """The ledger's attempts with Slurm's clocks (sacct completing what squeue forgot, where it is on)."""
        history = history_answer(self.host.call("history", {"since": since, "plan": plan}, 300), self.host.describe())
        if history.error:
            raise Refused(f"{self.host.describe()}: {history.error}")
        if plan is not None and plan not in history.plans:
            raise Refused(
                f"{self.host.describe()}: no plan {plan!r} was pushed here "
                f"(plans: {', '.join(history.plans) or 'none'})"
            )
        notes = ["note: read from the submit host's ledger with Slurm's job times"]
        if not history.accounting:
            notes.append(
                f"note: accounting off ({history.why or 'sacct failed'}): jobs that squeue forgot "
                "before the ledger saw them end are missing"
            )
        return ReportSource("\n".join(json.dumps(e) for e in history.events), tuple(notes))

    def operate(self, mode: str, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.host.call(mode, request, timeout)

"""Stage 6, push: diff a checked plan against a host's queue, show it, then install it atomically."""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from plancompiler.compile import Compiled, manifest
from plancompiler.hosts import Host
from runner import FORMAT_VERSION
from runner.durations import format_duration

# What a push does to each job: new, changed, unchanged, retired, held (failed), retried,
# running (left alone), running but changed (reported, left alone), done (left alone).
MARKS = {"+": "new", "~": "changed", "=": "unchanged", "-": "retired", "!": "held", "r": "retried",
         ">": "running", ">~": "running, changed", "d": "done"}
STALE_HEARTBEAT_S = 600.0


@dataclass(frozen=True)
class Change:
    mark: str
    job: str
    state: str | None
    note: str = ""


@dataclass
class PushPlan:
    host: str
    plan: str
    changes: list[Change]
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> Counter[str]:
        return Counter(c.mark for c in self.changes)

    def has_work(self) -> bool:
        return bool(self.request.get("files") or self.request.get("remove") or self.request.get("resets")
                    or self.request.get("manifest") is not None)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "plan": self.plan, "changes": [asdict(c) for c in self.changes],
                "counts": dict(self.counts()), "warnings": self.warnings, "errors": self.errors}

    def text(self) -> str:
        lines = [f"push {self.plan} -> {self.host}"]
        order = ["+", "~", "r", "-", "!", ">~", ">", "=", "d"]
        for mark in order:
            for change in (c for c in self.changes if c.mark == mark):
                if mark in ("=", "d") and not change.note:
                    continue
                note = f"  ({change.note})" if change.note else ""
                lines.append(f"  {mark:<2} {change.job}{note}")
        counts = self.counts()
        lines.append("  " + ", ".join(f"{counts[m]} {MARKS[m]}" for m in order if counts[m]))
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def plan_push(compiled: Compiled, host: Host, probe: dict[str, Any], *, retry_failed: bool = False,
              prune: bool = True, verify_external: bool = True) -> PushPlan:
    files: dict[str, dict[str, dict[str, Any]]] = probe.get("files", {})
    where: dict[str, tuple[str, str]] = {}
    for state_dir in ("failed", "done", "queue", "running"):  # later states win: running is what matters
        for name, info in files.get(state_dir, {}).items():
            where[name] = (state_dir, info["sha"])
    changes: list[Change] = []
    request: dict[str, Any] = {"files": {}, "remove": [], "resets": [], "replace": []}
    ours = {job.filename for job in compiled.jobs}
    for job in compiled.jobs:
        name, sha = job.filename, _sha(job.text)
        found = where.get(name)
        state, host_sha = (found[0], found[1]) if found else (None, None)
        same = host_sha == sha
        if state is None:
            changes.append(Change("+", name, None))
            request["files"][name] = job.text
        elif state == "running":
            changes.append(Change(">" if same else ">~", name, state,
                                  "" if same else "running an older version; the new one is not sent"))
        elif state == "queue":
            if same:
                changes.append(Change("=", name, state))
            else:
                changes.append(Change("~", name, state))
                request["files"][name] = job.text
                request["replace"].append(name)
        elif state == "done":
            if same:
                changes.append(Change("d", name, state))
            else:
                changes.append(Change("~", name, state, "done before; content changed, queued again"))
                request["remove"].append(["done", name])
                request["files"][name] = job.text
        else:  # failed
            if retry_failed:
                changes.append(Change("r", name, state, "attempts reset"))
                request["remove"].append(["failed", name])
                request["resets"].append(name)
                request["files"][name] = job.text
            else:
                changes.append(Change("!", name, state, "failed; not re-queued without --retry-failed"))
    plan_name = compiled.name
    for name, info in sorted(files.get("queue", {}).items()):
        header = info.get("plan") or ""
        if name in ours or header.split("@", 1)[0] != plan_name:
            continue
        if prune:
            changes.append(Change("-", name, "queue", "no longer in the plan"))
            request["remove"].append(["queue", name])
        else:
            changes.append(Change("=", name, "queue", "no longer in the plan; kept (--no-prune)"))
    new_manifest = manifest(compiled)
    manifest_bytes = (json.dumps(new_manifest, indent=1, sort_keys=True) + "\n").encode()
    if hashlib.sha256(manifest_bytes).hexdigest() != probe.get("manifest_sha"):
        request["manifest"] = new_manifest
    else:
        request["manifest"] = None
    result = PushPlan(host.describe(), plan_name, changes, request=request)
    if verify_external and probe.get("external_missing"):
        for path in probe["external_missing"]:
            result.errors.append(f"external path {path} does not exist on {host.name} "
                                 "(jobs that require it would wait forever; --no-verify-external to push anyway)")
    _check_runner(result, host, probe)
    return result


def _check_runner(result: PushPlan, host: Host, probe: dict[str, Any]) -> None:
    status = probe.get("status") or {}
    runner = status.get("runner") or {}
    version = runner.get("format_version")
    if isinstance(version, int) and version < FORMAT_VERSION:
        result.errors.append(f"the runner on {host.name} reads job-file format {version}, this plan needs "
                             f"{FORMAT_VERSION}: update it with `plan bootstrap {host.name}`")
    queued = len(probe.get("files", {}).get("queue", {})) + len(result.request.get("files", {}))
    beat = runner.get("heartbeat")
    if not isinstance(beat, (int, float)):
        result.warnings.append(f"{queued} jobs queued on {host.name}, but no runner has ever ticked there "
                               f"(no status.json under {host.root}): start one with `python3 -m runner run "
                               f"--root {host.root}` or `plan bootstrap {host.name}`")
    elif probe.get("now", beat) - beat > STALE_HEARTBEAT_S:
        age = format_duration(probe["now"] - beat)
        result.warnings.append(f"{queued} jobs queued on {host.name}, but no runner has ticked there for {age}")


def apply(push_plan: PushPlan, host: Host) -> dict[str, Any]:
    """Install: files staged under a dot-directory of the root, then renamed into queue/ one by one."""
    return host.call("install", {**push_plan.request, "create": True})


@dataclass(frozen=True)
class PushOptions:
    dry_run: bool = False
    retry_failed: bool = False
    prune: bool = True
    verify_external: bool = True


@dataclass
class PushOutcome:
    diff: PushPlan
    applied: bool = False
    notes: list[str] = field(default_factory=list)  # what happened, a line each, for stderr


def push(compiled: Compiled, host: Host, options: PushOptions, show: Callable[[PushPlan], None]) -> PushOutcome:
    """Read the host's queue (one round trip), SHOW the diff, then install it (one more) unless refused or dry.

    Unreachable and RemoteFailed from the host propagate to the caller."""
    if host.backend == "slurm":
        from plancompiler.slurm import push_slurm

        return push_slurm(compiled, host, options, show)
    external = list(compiled.graph.external) if options.verify_external and compiled.graph else []
    probe = host.call("probe", {"external": external, "allow_missing": True})
    diff = plan_push(compiled, host, probe, retry_failed=options.retry_failed, prune=options.prune,
                     verify_external=options.verify_external)
    show(diff)
    if diff.errors:
        return PushOutcome(diff, notes=["plan: push refused; nothing was changed"])
    if options.dry_run:
        return PushOutcome(diff, notes=["dry run: nothing was changed"])
    if not diff.has_work():
        return PushOutcome(diff, notes=["nothing to push"])
    result = apply(diff, host)
    notes = [f"note: {state}/{name} had already moved (the runner took it) when the push came to change it"
             for state, name in result.get("gone", [])]
    notes.append(f"pushed: {len(result.get('installed', []))} installed, {len(result.get('removed', []))} removed")
    return PushOutcome(diff, True, notes)

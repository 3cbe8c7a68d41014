"""The host side of `plan add`: one checked job installed under the push lock, owned by the `adhoc` plan.

The `adhoc` plan's entry in manifest.json grows by the job (its graph and content hash), so every other
plan's push sees it as another plan's job: never replaced, never pruned. Entries of adhoc jobs that are in
none of the queue's states any more are dropped as a job is added, so the entry does not grow for ever.
"""

from __future__ import annotations

import json
import os

from runner import jobfile, pushlock
from runner.agent import delivery
from runner.digest import sha256_hex
from runner.errors import AgentError
from runner.files import read_json_or_none
from runner.queue import STATES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ADHOC_PLAN = delivery.ADHOC_PLAN
MAX_SUFFIX = 1000  # name-2 .. name-1000: an automatic name that is taken gets the first free suffix


def _lanes(root: str) -> list[str]:
    """The lanes this root's runner serves (status.json's order), else the defaults."""
    status = read_json_or_none(os.path.join(root, "status.json"))
    order = status.get("lane_order") if isinstance(status, dict) else None
    if isinstance(order, list) and order and all(isinstance(lane, str) for lane in order):
        return order
    return list(jobfile.DEFAULT_LANES)


def _where(root: str, filename: str) -> str | None:
    for state in STATES:
        if os.path.lexists(os.path.join(root, state, filename)):
            return state
    return None


def _free_name(root: str, name: str, owners: dict[str, str], unique: bool) -> str | None:
    """NAME, or with UNIQUE the first NAME-n that no state holds and no plan owns; None when it is taken."""
    candidates = [name] + ([f"{name}-{n}" for n in range(2, MAX_SUFFIX + 1)] if unique else [])
    for candidate in candidates:
        if _where(root, f"{candidate}.job") is None and f"{candidate}.job" not in owners:
            return candidate
    return None


def add(root: str, request: dict[str, Any]) -> dict[str, Any]:
    """Request: `name`, `unique` (an automatic name: take the next free one), `text` (the job file as `plan add`
    checked it), `entry` (its manifest graph: lane, requires, outputs, after, sha), `producers` ({path: [job]}
    for each --after), `external`, `by`, `lock_wait_s`. Answer: `added` (the job file's name); AgentError where
    the job would not run here or its name is taken."""
    if not pushlock.held(root):
        got = pushlock.lock(root, {"wait_s": request.get("lock_wait_s", 60), "by": request.get("by")})
        if got.get("busy"):
            return got
    name, text, entry = str(request["name"]), str(request["text"]), dict(request["entry"])
    lanes = _lanes(root)
    parsed = jobfile.parse(f"{name}.job", text.encode("utf-8"), lanes)
    if isinstance(parsed, jobfile.Invalid):
        raise AgentError(f"{name}.job would not run here: {parsed}")
    status = read_json_or_none(os.path.join(root, "status.json"))
    runner = status.get("runner") if isinstance(status, dict) else None
    version = runner.get("format_version") if isinstance(runner, dict) else None
    if isinstance(version, int) and version < jobfile.format_needed(text):
        raise AgentError(f"the runner here reads job-file format {version}: update it with `plan bootstrap`")
    for after in request.get("after", []):
        if _where(root, after) is None:
            raise AgentError(f"--after {jobfile.job_name(after)}: no job {after} in this queue")
    manifest = delivery.read_manifest(root)
    owners = delivery.owners(manifest)
    free = _free_name(root, name, owners, bool(request.get("unique")))
    if free is None:
        where = _where(root, f"{name}.job")
        held = f"in {where}/" if where else f"owned by plan {owners.get(f'{name}.job')}"
        raise AgentError(f"a job named {name} is already on this host ({held}): give another --name")
    filename = f"{free}.job"
    record = _adhoc_record(root, manifest, filename, entry, request)
    result = delivery.install(
        root,
        {"files": {filename: text}, "record": record, "generation": manifest["generation"], "by": request.get("by")},
    )
    if result.get("busy") or result.get("changed"):
        return result
    return {"added": filename, "lane": parsed.lane, "generation": result.get("generation")}


def _adhoc_record(
    root: str, manifest: dict[str, Any], filename: str, entry: dict[str, Any], request: dict[str, Any]
) -> dict[str, Any]:
    """The adhoc plan's next entry: its jobs still on the host, and FILENAME."""
    before = manifest["plans"].get(ADHOC_PLAN)
    before = before if isinstance(before, dict) else {}
    jobs = {
        job: spec
        for job, spec in (before.get("jobs") or {}).items()
        if isinstance(spec, dict) and _where(root, job) is not None
    }
    jobs[filename] = entry
    wanted = {path for spec in jobs.values() for path in spec.get("requires", [])}
    producers: dict[str, list[str]] = {}
    for given in (before.get("producers") or {}, request.get("producers", {})):
        for path, names in given.items():
            if path in wanted:
                producers[path] = producers.get(path, []) + [n for n in names if n not in producers.get(path, [])]
    external = sorted(p for p in {*(before.get("external") or []), *request.get("external", [])} if p in wanted)
    digest = sha256_hex(json.dumps(sorted((j, s.get("sha", "")) for j, s in jobs.items())).encode())
    return {
        "plan": ADHOC_PLAN,
        "hash": digest[:12],
        "by": request.get("by") or "?",
        "jobs": jobs,
        "producers": producers,
        "external": external,
    }

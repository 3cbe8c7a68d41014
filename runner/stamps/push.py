"""Rerun on change, the push's side: what a push of a plan does to the queue's done and queued jobs (their stamps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Tuple

from runner.stamps import ran_again

Spec = Mapping[str, Any]  # a manifest entry, with `run_sha`
Found = Tuple["Effect", str, str]  # an effect, the changed job it follows ("" when it marks nothing), the mark's why


@dataclass(frozen=True)
class Effect:
    """What a push does to one done or queued plan job, as `plan push` says it."""

    kind: str  # "run" (changed: runs again), "kept" (changed, rerun: never), "unstamped" (changed, no stamp:
    # DONE_IF alone decides), "same" (changed file, but its stamp has this content), "stale" (downstream)
    note: str
    root: str = ""  # for "stale": the changed job it follows


def _order(jobs: Mapping[str, Spec]) -> list[str]:
    """JOBS with each job's producers before it (the graph has no cycles: the compiler checked)."""
    seen: set[str] = set()
    order: list[str] = []

    def visit(name: str) -> None:
        stack = [(name, iter(sorted(jobs[name].get("after") or [])))]
        seen.add(name)
        while stack:
            current, deps = stack[-1]
            for dep in deps:
                if dep in jobs and dep not in seen:
                    seen.add(dep)
                    stack.append((dep, iter(sorted(jobs[dep].get("after") or []))))
                    break
            else:
                stack.pop()
                order.append(current)

    for name in sorted(jobs):
        if name not in seen:
            visit(name)
    return order


def push_effects(
    jobs: Mapping[str, Spec],
    states: Mapping[str, tuple[str, str | None]],
    stamps: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, Effect], list[list[str]]]:
    """What a push of JOBS (manifest entries with `sha`, `after`, `outputs`, `rerun`, plus `run_sha`: the
    new file's `content_hash`) does to the queue whose plan jobs are in STATES (file -> (state, file sha
    there)) with STAMPS: each done job that changed, each job downstream of one that will run again; and
    the stamps to mark stale, producers first."""
    effects: dict[str, Effect] = {}
    marks: list[list[str]] = []
    if not any(state == "done" for state, _ in states.values()):
        return effects, marks  # every effect starts at a done job (changed, or stale): a first push has none
    root_of: dict[str, str] = {}  # a job that will run again -> the changed job that makes it
    for name in _order(jobs):
        spec = jobs[name]
        state, sha_there = states.get(name, (None, None))
        stamp = stamps.get(name)
        if spec.get("rerun") == "never" or not spec.get("outputs"):
            found: Found | None = _unstamped(spec, state, sha_there)
        else:
            found = _changed(name, spec, state, sha_there, stamp) or _downstream(spec, state, stamp, stamps, root_of)
        if found is None:
            continue
        effects[name], root, why = found
        if root:
            root_of[name] = root
            marks.append([name, why])
    return effects, marks


def _unstamped(spec: Spec, state: str | None, sha_there: str | None) -> Found | None:
    """A changed done job that keeps no stamp: `rerun: never`, or no outputs."""
    if state != "done" or sha_there == spec.get("sha"):
        return None
    if spec.get("rerun") == "never":
        return Effect("kept", "changed, output kept: rerun: never"), "", ""
    return Effect("unstamped", "changed, queued again; no outputs, so no stamp: its DONE_IF alone decides"), "", ""


def _changed(
    name: str, spec: Spec, state: str | None, sha_there: str | None, stamp: Mapping[str, Any] | None
) -> Found | None:
    """A done job sent again: changed, or marked stale by a push whose install did not finish."""
    if state != "done":
        return None
    if stamp is not None and stamp.get("stale") and sha_there == spec.get("sha"):
        # Marked by a push whose install did not finish: sent again, so that it does run.
        why = str(stamp["stale"])
        return Effect("run", f"will run again: an earlier push marked it stale ({why})"), name, why
    if sha_there == spec.get("sha"):
        return None
    if stamp is None:
        note = "changed, queued again; output kept if its DONE_IF holds (no stamp: it last ran before stamps were kept)"
        return Effect("unstamped", note), "", ""
    if stamp.get("sha") == spec.get("run_sha"):
        return Effect("same", "changed header only, output kept: what it runs is the same"), "", ""
    return Effect("run", "changed, will run again: its output is stale"), name, f"{name} changed"


def _downstream(
    spec: Spec,
    state: str | None,
    stamp: Mapping[str, Any] | None,
    stamps: Mapping[str, Mapping[str, Any]],
    root_of: Mapping[str, str],
) -> Found | None:
    """A done or queued job stale because a producer will run again, or (done) because one ran after it."""
    if state not in ("done", "queue"):
        return None
    after = [p for p in spec.get("after") or [] if isinstance(p, str)]
    upstream = next((p for p in after if p in root_of), None)
    if upstream is not None:
        root = root_of[upstream]
        via = f", via {upstream}" if upstream != root else ""
        return Effect("stale", f"stale because {root} changed{via}", root), root, f"{root} changed{via}"
    if state != "done" or stamp is None or stamp.get("stale"):
        return None
    for producer in after:
        theirs = stamps.get(producer)
        if ran_again((stamp.get("producers") or {}).get(producer), theirs.get("id") if theirs else None):
            why = f"{producer} ran again after it"
            return Effect("stale", f"stale because {producer} ran again after it", producer), producer, why
    return None

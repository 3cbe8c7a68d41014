"""The pipeline: load -> expand -> graph -> render -> lint, all findings of all stages collected in one run."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancompiler.diagnostics import Diagnostic, display_path, has_errors
from plancompiler.expand import Expanded, expand
from plancompiler.graph import Graph, build_graph
from plancompiler.lint import lint_jobs
from plancompiler.load import Source, load_plan
from plancompiler.models import Plan
from plancompiler.render import RenderedJob, render_jobs
from plancompiler.sandbox import Limits


@dataclass
class Compiled:
    path: Path
    source: Source
    plan: Plan | None = None
    expanded: Expanded | None = None
    graph: Graph | None = None
    jobs: list[RenderedJob] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def job_count(self) -> int:
        """Every job the plan describes, rendered or not (what `plan check` counts)."""
        return self.expanded.attempted if self.expanded else len(self.jobs)

    def clean(self, strict: bool = False) -> bool:
        return self.plan is not None and not has_errors(self.diagnostics, strict)

    @property
    def name(self) -> str:
        return self.plan.plan if self.plan else self.path.stem


def template_dirs(plan_path: Path, extra: Sequence[Path] = ()) -> list[Path]:
    """--templates first, then templates/ beside the plan, above it, and in the working directory."""
    candidates = [
        *extra,
        plan_path.parent / "templates",
        plan_path.parent.parent / "templates",
        Path.cwd() / "templates",
    ]
    found: list[Path] = []
    for directory in candidates:
        resolved = Path(os.path.realpath(directory))
        if os.path.isdir(resolved) and resolved not in found:  # never raises: a name too long is no directory
            found.append(resolved)
    return found


# cycles_unsearched: the objects made (net, as the collector counts them) past which they are moved out of the
# young searches' way; a 300-job compile makes ~10 000, one of 10 000 jobs millions.
MOVED_FROM = 50_000


@contextmanager
def cycles_unsearched() -> Iterator[None]:
    """Python's search for garbage cycles held off while a plan is compiled or pushed, then let run again (the
    cycles left meanwhile are found by its next searches). Every job is hundreds of objects that live on to the end:
    at 10 000 jobs the searches, each walking more of them, took 0.33 s of a 2 s push, and they found a few hundred
    objects to free."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        # What was made meanwhile goes to the oldest generation unsearched (freeze, then unfreeze: two list
        # moves): not searched at once, all of it, by the next young search; full searches still find its cycles.
        # Unless the caller had frozen objects of its own (gc.freeze() before a fork, or to keep a long-lived heap
        # out of the full searches): unfreeze would hand those back to every full search, so what was made here
        # is left to the young searches. Asked only where much was made: gc.get_freeze_count() walks every
        # frozen object (~3 ms for 50 000), and a small compile's objects cost the young searches less than that.
        if gc.get_count()[0] >= MOVED_FROM and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.enable()


def compile_plan(
    path: Path,
    overrides: Mapping[str, str] | None = None,
    templates: Sequence[Path] = (),
    lint: bool = True,
    use_cache: bool = True,
    progress: Callable[[str], None] | None = None,
    limits: Limits | None = None,
) -> Compiled:
    with cycles_unsearched():
        loaded = load_plan(path, display_path(path), (limits or Limits()).max_size)
        if loaded.plan is None:
            return Compiled(path, loaded.source, loaded.plan, diagnostics=list(loaded.diagnostics))
        expanded = expand(loaded.plan, loaded.source, overrides, limits)
        dirs = template_dirs(path, templates)
        result = compile_expanded(path, loaded.source, loaded.plan, expanded, dirs, lint, use_cache, progress, limits)
    result.diagnostics[:0] = loaded.diagnostics
    return result


def compile_expanded(
    path: Path,
    source: Source,
    plan: Plan,
    expanded: Expanded,
    dirs: Sequence[Path] | None = None,
    lint: bool = True,
    use_cache: bool = True,
    progress: Callable[[str], None] | None = None,
    limits: Limits | None = None,
) -> Compiled:
    """The stages after expand (graph, render, lint) over EXPANDED: a plan file's, or `plan add`'s one job (no
    template DIRS: linted as written, not per template shape)."""
    result = Compiled(path, source, plan, expanded, diagnostics=list(expanded.diagnostics))
    result.graph, found = build_graph(expanded, source)
    result.diagnostics += found
    result.jobs, found = render_jobs(expanded.jobs, result.graph, source, plan.plan, dirs or (), limits)
    result.diagnostics += found
    if lint:
        result.diagnostics += lint_jobs(
            result.jobs, source, use_cache=use_cache, progress=progress, template_dirs=dirs, limits=limits
        )
    return result


def manifest(compiled: Compiled) -> dict[str, Any]:
    """The plan's job graph for the runner's `blocked` reason (contract 2, manifest.json)."""
    assert compiled.graph is not None and compiled.plan is not None
    graph = compiled.graph
    requires, deps, order_only = graph.requires, graph.deps, graph.order_only
    jobs = {}
    for rendered in compiled.jobs:
        job = rendered.job
        spec, name = job.job, job.name
        ordered = order_only.get(name)
        entry: dict[str, Any] = {
            "lane": spec.lane,
            "requires": requires.get(name, []),
            "outputs": [o.value for o in job.outputs],
            # what it reads: a rerun of one of these makes it stale (runner/stamps/store.py); `order` only gates it
            "after": [f"{d}.job" for d in deps.get(name, []) if not ordered or d not in ordered],
        }
        if ordered:
            entry["order"] = [f"{d}.job" for d in ordered]
        checks = [r.value for r in job.done_if or () if r.kind not in ("sh", "after")]
        if checks and checks != entry["outputs"]:
            entry["done_if"] = checks  # what judges it done, for the cross-plan output check
        if spec.rerun == "never":  # read by runner/stamps/store.py: its DONE_IF alone decides
            entry["rerun"] = "never"
        family = spec.name if spec.foreach is not None else spec.template
        if family:  # the jobs of one family are expected to take about as long (runner/estimates)
            entry["family"] = family
        jobs[f"{name}.job"] = entry
    producers = {path: [f"{n}.job" for n in names] for path, names in graph.producers.items()}
    found = {
        "plan": compiled.plan.plan,
        "version": 1,
        "jobs": jobs,
        "producers": producers,
        "external": list(graph.external),
    }
    if compiled.plan.slots:
        found["slots"] = compiled.plan.slots  # the runner counts these (its --slots flag overrides them)
    if compiled.plan.gpus:
        found["gpus"] = compiled.plan.gpus  # lane -> the GPUs it gives its jobs (the runner's --gpus overrides)
    return found

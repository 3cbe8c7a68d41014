"""Stage 3, graph: producers from outputs; every REQUIRES producible or external; no cycles; DONE_IF reachable."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from plancompiler.diagnostics import Diagnostic, error, warning
from plancompiler.expand import Expanded, ExpandedJob
from plancompiler.load import Source
from plancompiler.models import Requirement


@dataclass
class Graph:
    jobs: dict[str, ExpandedJob]
    producers: dict[str, list[str]] = field(default_factory=dict)  # path -> job names
    deps: dict[str, list[str]] = field(default_factory=dict)  # job -> jobs it waits for
    requires: dict[str, list[str]] = field(default_factory=dict)  # job -> paths it waits for
    # job -> jobs it waits for only by `{after: JOB}` (an ordering gate: their reruns never make it stale)
    order_only: dict[str, list[str]] = field(default_factory=dict)
    external: list[str] = field(default_factory=list)
    _dirs: list[tuple[str, str]] | None = None

    def producers_of(self, path: str) -> list[str]:
        found = list(self.producers.get(path, []))
        if self._dirs is None:
            self._dirs = [
                (out.value.rstrip("/") + "/", name)
                for name, job in self.jobs.items()
                for out in job.outputs
                if out.kind == "dir"
            ]
        for prefix, name in self._dirs:
            if path.startswith(prefix) and name not in found:
                found.append(name)
        return found

    def is_external(self, path: str) -> bool:
        return any(path == e or (e.endswith("/") and path.startswith(e)) for e in self.external)

    def order(self) -> list[str]:
        """Jobs in dependency order (producers first), ties by name."""
        done: list[str] = []
        seen: set[str] = set()

        def visit(name: str, stack: tuple[str, ...]) -> None:
            if name in seen or name in stack:
                return
            for dep in sorted(self.deps.get(name, [])):
                visit(dep, (*stack, name))
            seen.add(name)
            done.append(name)

        for name in sorted(self.jobs):
            visit(name, ())
        return done


def build_graph(expanded: Expanded, source: Source) -> tuple[Graph, list[Diagnostic]]:
    jobs = {j.name: j for j in expanded.jobs}
    graph = Graph(jobs, external=list(expanded.external))
    diagnostics = _producers(expanded, graph, source)
    produced = sorted(graph.producers)
    for job in expanded.jobs:
        deps: list[str] = []
        paths: list[str] = []
        gates: list[str] = []
        for i, req in enumerate(job.requires):
            line, col = source.where(("jobs", job.index, "requires", i))
            found = _requirement(job, req, graph, produced, gates if req.kind == "after" else deps, paths)
            diagnostics.extend(error(source.path, line, col, code, message) for code, message in found)
        graph.order_only[job.name] = [g for g in gates if g not in deps]
        graph.deps[job.name] = deps + graph.order_only[job.name]
        graph.requires[job.name] = paths
        diagnostics.extend(_check_done_if(job, source))
    diagnostics.extend(_cycles(graph, source))
    return graph, diagnostics


def _producers(expanded: Expanded, graph: Graph, source: Source) -> list[Diagnostic]:
    """Each output's producing jobs into GRAPH; an output two jobs produce is a warning."""
    diagnostics = []
    for job in expanded.jobs:
        for out in job.outputs:
            owners = graph.producers.setdefault(out.value, [])
            if owners and owners[-1] != job.name:
                line, col = source.where(("jobs", job.index, "outputs"))
                diagnostics.append(
                    warning(
                        source.path, line, col, "G003", f"{out.value} is produced by both {owners[0]} and {job.name}"
                    )
                )
            if job.name not in owners:
                owners.append(job.name)
    return diagnostics


def _requirement(
    job: ExpandedJob, req: Requirement, graph: Graph, produced: list[str], deps: list[str], paths: list[str]
) -> list[tuple[str, str]]:
    """REQ of JOB into its DEPS (the jobs it waits for) and PATHS (what it tests); what is wrong with it."""
    jobs = graph.jobs
    if req.kind == "after":
        if req.value not in jobs:
            hint = difflib.get_close_matches(req.value, list(jobs), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            return [("G005", f"job {job.name}: after: {req.value!r} is not a job of this plan{suggestion}")]
        found = []
        if not jobs[req.value].outputs:
            found.append(("G008", f"job {job.name}: after: {req.value} has no outputs to wait for"))
        deps.append(req.value)
        paths.extend(o.value for o in jobs[req.value].outputs)
        return found
    if req.kind == "sh":
        if req.external:
            return []
        return [
            (
                "G006",
                f"job {job.name}: a shell REQUIRES cannot be checked against the plan;"
                " mark it `external: true` if something outside the plan makes it true",
            )
        ]
    if req.external or graph.is_external(req.value):
        return []
    owners = graph.producers_of(req.value)
    if not owners:
        hint = difflib.get_close_matches(req.value, produced, n=3, cutoff=0.6)
        suggestion = "; did you mean " + " or ".join(hint) + "?" if hint else ""
        return [
            (
                "G001",
                f"job {job.name} requires {req.value}, which no job produces and which "
                f"is not listed in `external`{suggestion}",
            )
        ]
    deps.extend(o for o in owners if o not in deps)
    paths.append(req.value)
    return []


def _check_done_if(job: ExpandedJob, source: Source) -> list[Diagnostic]:
    if job.done_if is None:
        return []
    promised = {o.value for o in job.outputs}
    dirs = [o.value.rstrip("/") + "/" for o in job.outputs if o.kind == "dir"]
    found = []
    for req in job.done_if:
        if req.kind in ("sh", "after"):
            continue
        if req.value in promised or any(req.value.startswith(d) for d in dirs):
            continue
        line, col = source.where(("jobs", job.index, "done_if"))
        found.append(
            error(
                source.path,
                line,
                col,
                "G004",
                f"job {job.name}: DONE_IF tests {req.value}, which is not among its outputs, so this "
                "job can never make it true",
            )
        )
    return found


def _cycles(graph: Graph, source: Source) -> list[Diagnostic]:
    found = []
    color: dict[str, int] = {}
    reported: set[frozenset[str]] = set()

    def visit(name: str, stack: list[str]) -> None:
        color[name] = 1
        stack.append(name)
        for dep in graph.deps.get(name, []):
            if color.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                key = frozenset(cycle)
                if key not in reported:
                    reported.add(key)
                    job = graph.jobs[dep]
                    line, col = source.where(("jobs", job.index, "requires"))
                    found.append(
                        error(source.path, line, col, "G002", "dependency cycle: " + " -> ".join(reversed(cycle)))
                    )
            elif color.get(dep) is None:
                visit(dep, stack)
        stack.pop()
        color[name] = 2

    for name in sorted(graph.jobs):
        if color.get(name) is None:
            visit(name, [])
    return found


def to_dot(graph: Graph, plan_name: str) -> str:
    lines = [f'digraph "{plan_name}" {{', "  rankdir=LR;", "  node [shape=box, fontname=monospace];"]
    for name in sorted(graph.jobs):
        lines.append(f'  "{name}" [label="{name}\\n[{graph.jobs[name].job.lane}]"];')
    for name in sorted(graph.deps):
        for dep in graph.deps[name]:
            lines.append(f'  "{dep}" -> "{name}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(graph: Graph) -> str:
    ids = {name: f"j{i}" for i, name in enumerate(sorted(graph.jobs))}
    lines = ["flowchart LR"]
    for name, ident in ids.items():
        lines.append(f'  {ident}["{name} [{graph.jobs[name].job.lane}]"]')
    for name in sorted(graph.deps):
        for dep in graph.deps[name]:
            lines.append(f"  {ids[dep]} --> {ids[name]}")
    return "\n".join(lines) + "\n"

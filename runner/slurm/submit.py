"""Submitting what a Slurm push decided (runner.slurm.agent): one bundle for all its jobs, then per dependency
level every sbatch call at once, a `foreach` group as job arrays where its dependencies allow.

An array is sound where Slurm can say each element's dependency: when every element waits on the same jobs
(one `afterok` for the array), or when element i waits on element i of one array of this push and otherwise on
the same jobs (`aftercorr`, chunk by chunk, since both are cut the same way). A group whose elements wait on
different jobs any other way (a dependency per element that no array form says) is submitted job by job; so are
jobs outside a `foreach`, groups smaller than ARRAY_MIN, and elements whose lane shape (options, time,
environment) differs.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from runner.slurm.attempt import pending_updates
from runner.slurm.bundle import PushJob
from runner.slurm.ledger import ACTIVE
from runner.slurm.query import ControllerDown, slurm
from runner.slurm.records import Attempt, JobRecord
from runner.slurm.request import PushRequest
from runner.slurm.wrapper import (
    array_options,
    element,
    sbatch_options,
    shared_options,
    submit_env,
    wrapper_text,
    write_bundle,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.jsonfields import SlurmId
    from runner.slurm.query import Live

SUBMIT_THREADS = 8  # sbatch calls in flight at once: each is mostly a round trip to slurmctld
CHUNK = 1000  # elements per array at most where no limit was read: Slurm's default MaxArraySize (1001) allows 0-1000
# Smaller groups stay separate jobs: they would save a few sbatch calls and lose the per-job names (PLAN/NAME)
# that squeue and sacct show.
ARRAY_MIN = 4


@dataclass
class Unit:
    """One sbatch call: a job, or an array whose element i is jobs[i]."""

    jobs: list[PushJob]
    dependency: str = ""

    @property
    def array(self) -> bool:
        return len(self.jobs) > 1


@dataclass
class Submitted:
    """What the sbatch calls of one push gave: ledger ids per job name, array sizes, and the first error."""

    ids: dict[str, SlurmId]
    sizes: dict[str, int] = field(default_factory=dict)
    new: dict[str, tuple[SlurmId, str]] = field(default_factory=dict)  # name -> (id, the Slurm job name)
    error: str = ""
    chunk: int = CHUNK  # elements per array at most (the cluster's MaxArraySize, runner.slurm.limits)
    bundle: str = ""  # this push's bundle, and each job's entry in it: where a retry finds its spec
    entries: dict[str, int] = field(default_factory=dict)

    def slurm_jobs(self) -> list[str]:
        """Every Slurm job this push submitted, an array once (for scancel when the push fails part-way)."""
        return sorted({str(new).partition("_")[0] for new, _ in self.new.values()}, key=int)


def _deps(job: PushJob, done: Submitted, failed: dict[str, SlurmId]) -> list[str]:
    ids = [str(done.ids[d]) for d in job.deps if d in done.ids]
    # A producer that failed and that squeue still knows: the job is blocked at once, as it would be
    return ids + [str(failed[d]) for d in job.deps if d not in done.ids and d in failed]


def _afterok(ids: list[str]) -> str:
    return "afterok:" + ":".join(ids) if ids else ""


def _shape(root: str, job: PushJob) -> str:
    return json.dumps([job.group, shared_options(root, job), job.env])


def _corresponding(
    group: list[PushJob], rest: list[list[str]], done: Submitted
) -> list[tuple[str, list[PushJob]]] | None:
    """(producer array, group ordered by task) pairs where each element's one other dependency is the same task
    of an array of this push, and each such array's tasks are all named once; else None."""
    by_array: dict[str, dict[int, PushJob]] = {}
    for job, extra in zip(group, rest):
        if len(extra) != 1 or "_" not in extra[0]:
            return None
        array, _, task = extra[0].partition("_")
        if array not in done.sizes or int(task) in by_array.setdefault(array, {}):
            return None
        by_array[array][int(task)] = job
    if any(len(tasks) != done.sizes[array] for array, tasks in by_array.items()):
        return None
    return [(array, [tasks[i] for i in range(len(tasks))]) for array, tasks in by_array.items()]


def _group_units(group: list[PushJob], done: Submitted, failed: dict[str, SlurmId]) -> list[Unit]:
    deps = [_deps(job, done, failed) for job in group]
    common = sorted(set.intersection(*(set(d) for d in deps)))
    rest = [[d for d in each if d not in common] for each in deps]
    if not any(rest):
        size = -(-len(group) // -(-len(group) // done.chunk))  # even chunks: never a last array of one
        return [Unit(group[i : i + size], _afterok(common)) for i in range(0, len(group), size)]
    pairs = _corresponding(group, rest, done)
    if pairs is None:  # no array form says these dependencies: one job each
        return [Unit([job], _afterok(each)) for job, each in zip(group, deps)]
    return [Unit(jobs, ",".join(filter(None, [f"aftercorr:{array}", _afterok(common)]))) for array, jobs in pairs]


def plan_units(root: str, level: list[PushJob], done: Submitted, failed: dict[str, SlurmId]) -> list[Unit]:
    """The sbatch calls for one dependency level: foreach groups of one lane shape as arrays where sound."""
    groups: dict[str, list[PushJob]] = {}
    units: list[Unit] = []
    for job in level:
        if job.group is None or job.gate:  # a gated job is held on its own (runner.slurm.gates)
            units.append(Unit([job], _afterok(_deps(job, done, failed))))
        else:
            groups.setdefault(_shape(root, job), []).append(job)
    for group in groups.values():
        if len(group) < ARRAY_MIN:
            units += [Unit([job], _afterok(_deps(job, done, failed))) for job in group]
        else:
            units += _group_units(group, done, failed)
    return units


def _argv(root: str, plan: str, unit: Unit) -> list[str]:
    if unit.array:
        options = array_options(root, plan, unit.jobs, _array_name(unit))
    else:
        options = sbatch_options(root, plan, unit.jobs[0])
        if unit.jobs[0].gate:  # released by the submit host once its gate holds (runner.slurm.gates)
            options.append("--hold")
    return ["sbatch", "--parsable", *options, *([f"--dependency={unit.dependency}"] if unit.dependency else [])]


def _array_name(unit: Unit) -> str:
    """The plan group an array is (its foreach job's name, `shard-*`), so squeue's NAME shows it as PLAN/GROUP;
    FIRST..LAST where the push names no group."""
    return str(unit.jobs[0].family or f"{unit.jobs[0].name}..{unit.jobs[-1].name}")


def _script(root: str, plan: str, unit: Unit, bundle: Path, entries: dict[str, int], slurm_conf: str | None) -> str:
    label = f"array {_array_name(unit)}" if unit.array else f"job {unit.jobs[0].name}"
    where = (bundle, [entries[job.name] for job in unit.jobs], 1)
    shown = (_argv(root, plan, unit)[2:], [(job.name, job.text) for job in unit.jobs])
    return wrapper_text(root, plan, label, unit.jobs[0].env, where, slurm_conf, shown)


def submit(
    root: str,
    request: PushRequest,
    levels: list[list[PushJob]],
    done: Submitted,
    failed: dict[str, SlurmId],
    env: dict[str, str],
) -> None:
    """Submit LEVELS in order (each level's producers are in earlier ones), recording into DONE."""
    plan, conf = request.plan, request.slurm_conf
    jobs = [job for level in levels for job in level]
    bundle = write_bundle(root, plan, [element(root, plan, job, request) for job in jobs])
    os.sync()  # once: a job must never start on a bundle not yet on disk
    entries = {job.name: i for i, job in enumerate(jobs)}
    done.bundle, done.entries = str(bundle), entries
    bare = submit_env(conf)  # what the jobs get (--export=ALL)
    with ThreadPoolExecutor(max_workers=SUBMIT_THREADS) as pool:
        for level in levels:
            units = plan_units(root, level, done, failed)
            calls = [(_argv(root, plan, u), _script(root, plan, u, bundle, entries, conf)) for u in units]
            answers = list(pool.map(lambda call: _sbatch(call[0], call[1], bare), calls))
            for unit, (rc, out, err) in zip(units, answers):
                _record(plan, unit, rc, out, err, done)
            if done.error:
                return


def _sbatch(argv: list[str], script: str, env: dict[str, str]) -> tuple[int, str, str]:
    """One sbatch call; one that does not end is this call's error, in Slurm's own words where sbatch said any
    (a controller at MaxJobCount makes sbatch retry for ever: "temporarily unable to accept job")."""
    try:
        return slurm(argv, env, 60, script)
    except ControllerDown as exc:
        return -1, "", str(exc)


def _record(plan: str, unit: Unit, rc: int, out: str, err: str, done: Submitted) -> None:
    if rc != 0:
        names = ", ".join(f"{plan}/{job.name}" for job in unit.jobs[:3]) + (" ..." if len(unit.jobs) > 3 else "")
        done.error = f"sbatch for {names} failed: {err.strip()}"
        return
    new = int(out.strip().split(";")[0])
    if not unit.array:
        done.ids[unit.jobs[0].name] = new
        done.new[unit.jobs[0].name] = (new, f"{plan}/{unit.jobs[0].name}")
        return
    done.sizes[str(new)] = len(unit.jobs)
    for task, job in enumerate(unit.jobs):
        done.ids[job.name] = f"{new}_{task}"
        done.new[job.name] = (f"{new}_{task}", f"{plan}/{_array_name(unit)}")


def hand_over(old: SlurmId, new: SlurmId, live: Live, env: dict[str, str]) -> list[str]:
    """Re-point the pending jobs that wait on OLD to NEW (before OLD is cancelled, so none is killed)."""
    listing = "\n".join(f"{job.job_id}|{job.id}|{job.dependency}" for job in live.values() if job.state in ACTIVE)
    moved = []
    for job_id, dep in pending_updates(listing, old, new):
        if slurm(["scontrol", "update", f"JobId={job_id}", f"Dependency={dep}"], env)[0] == 0:
            moved.append(job_id)
            for key, job in list(live.items()):
                if job.job_id == job_id or str(job.id) == job_id:
                    live[key] = replace(job, dependency=dep)
    return moved


def record_new(
    plan: str,
    jobs: dict[str, JobRecord],
    job: PushJob,
    new: tuple[SlurmId, str],
    where: tuple[str, int] | None = None,
) -> None:
    """A submitted job's ledger entry gets its new attempt (an array element's keeps the array's name), with
    WHERE its spec is (bundle, entry), for a retry the agent submits (runner.slurm.retry)."""
    slurm_name = f"{plan}/{job.name}"
    record = replace(
        jobs.get(job.name) or JobRecord(),
        hash=job.hash,
        lane=job.lane,
        deps=tuple(job.deps),
        slurm_name=slurm_name,
    )
    attempt = Attempt(
        id=new[0],
        hash=job.hash,
        submitted=time.time(),
        bundle=where[0] if where else None,
        entry=where[1] if where else None,
        slurm_name=new[1] if new[1] != slurm_name else None,
    )
    jobs[job.name] = record.with_attempt(attempt)

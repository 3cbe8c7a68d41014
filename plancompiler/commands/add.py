"""`plan add`: one job from the command line (like `pueue add` or `tsp`), checked as a plan job is and installed
on the host in the `adhoc` plan of its own (runner/adhoc.py).

The command's words are data: they reach the job's body through the renderer as one quoted word each (the
escaper a plan's `{{ list }}` goes through), never read as shell or as a template; `--shell 'STRING'` is
shell code on purpose (`{{ script | sh }}`). The job then goes through the graph, render and lint stages
of every plan (bash -n, shellcheck, the escaping rules), so a one-off command is refused as a plan job is.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from plancompiler.diagnostics import error
from plancompiler.expand import Expanded, ExpandedJob
from plancompiler.hosts import Host
from plancompiler.load import Source, validation_diagnostics
from plancompiler.models import Job, Plan
from plancompiler.sandbox import Limits
from runner.agent.delivery import ADHOC_PLAN

SOURCE = "plan add"  # where an add's findings point: its command line has no file
OPTION_KEYS = ("name", "lane", "timeout", "retries", "priority")  # the job's keys its options of the same name set
# The body of a job whose command is words: each one quoted by the renderer; of one whose command is shell.
RUN_WORDS = "{{ argv | program }}\n"  # the user names the program: a trusted one
RUN_SHELL = "{{ script | sh }}\n"


@dataclass(frozen=True)
class AddSpec:
    lane: str = "cpu"
    argv: tuple[str, ...] = ()
    shell: str | None = None
    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    timeout: str | None = None
    retries: int = 1
    priority: int = 0
    name: str | None = None
    shellcheck_disable: tuple[str, ...] = field(default=())


def auto_name(spec: AddSpec, now: float | None = None) -> str:
    """add-YYYYmmdd-HHMMSS-PROGRAM: added jobs sort after the seed's numbered ones and in the order they were
    added (the host appends -2, -3 when the second is taken)."""
    word = os.path.basename(spec.argv[0]) if spec.argv else "sh"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", word).strip("-.")[:24] or "job"
    return f"add-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{slug}"


def after_path(job: str) -> str:
    """The path --after JOB waits for: the job file in done/ (paths in conditions are relative to the root)."""
    return f"done/{job if job.endswith('.job') else job + '.job'}"


def _job(spec: AddSpec, name: str) -> Job:
    words = spec.shell is None
    return Job.model_validate(
        {
            "name": name,
            "lane": spec.lane,
            "run": RUN_WORDS if words else RUN_SHELL,
            "with": {"argv": list(spec.argv)} if words else {"script": spec.shell},
            "requires": [{"kind": "path", "value": p} for p in (*spec.requires, *map(after_path, spec.after))],
            "outputs": [{"kind": "path", "value": p} for p in spec.outputs],
            "retries": spec.retries,
            "timeout": spec.timeout,
            "priority": spec.priority,
            "shellcheck_disable": list(spec.shellcheck_disable),
        }
    )


def _as_option(message: str) -> str:
    """A plan key's finding named as the option that set it: `retries: …` -> `--retries: …`."""
    key, said, rest = message.partition(": ")
    return f"--{key}: {rest}" if said and key in OPTION_KEYS else message


def compile_add(spec: AddSpec, name: str, limits: Limits | None = None, use_cache: bool = True) -> Any:
    """The add as a compiled one-job plan (plancompiler.compile.Compiled): findings located at `plan add`."""
    from plancompiler.compile import Compiled, compile_expanded

    source = Source(SOURCE)
    if spec.shell is None and not spec.argv:
        diagnostic = error(SOURCE, 1, 1, "P004", "no command: give it after `--` (or as --shell 'STRING')")
        return Compiled(Path(SOURCE), source, diagnostics=[diagnostic])
    try:
        job = _job(spec, name)
        plan = Plan(plan=ADHOC_PLAN, lanes=[spec.lane], jobs=[job])
    except ValidationError as exc:
        found = [replace(d, message=_as_option(d.message)) for d in validation_diagnostics(exc, source)]
        return Compiled(Path(SOURCE), source, diagnostics=found)
    outputs = tuple(job.outputs)
    context: dict[str, Any] = {
        **job.with_,
        "plan_name": ADHOC_PLAN,
        "name": name,
        "lane": spec.lane,
        "plan": ADHOC_PLAN,
        "job_outputs": [o.value for o in outputs],
    }
    item = ExpandedJob(name, 0, 1, job, context, tuple(job.requires), outputs, None)
    # What the job waits for is made outside this one-job plan: by hand, by other plans, or by the --after job.
    external = [r.value for r in job.requires]
    expanded = Expanded({}, [item], [], external, attempted=1)
    return compile_expanded(Path(SOURCE), source, plan, expanded, limits=limits, use_cache=use_cache)


def request(spec: AddSpec, compiled: Any, name: str, unique: bool, by: str) -> dict[str, Any]:
    """What the host's `add` takes: the job file, its manifest graph, what each --after waits for."""
    from plancompiler.backends import plan_record

    record = plan_record(compiled)
    (filename, entry), *_ = record["jobs"].items()
    (rendered,) = compiled.jobs
    after = [f"{a}.job" if not a.endswith(".job") else a for a in spec.after]
    # Every path it waits for, made outside this one-job plan: the runner reads them for `blocked`.
    entry = {**entry, "requires": [*spec.requires, *map(after_path, after)]}
    return {
        "name": name,
        "unique": unique,
        "text": rendered.text,
        "entry": entry,
        "after": after,
        # each --after's done/ file is produced by that job: `blocked` when it failed, as for a plan's jobs
        "producers": {after_path(a): [a] for a in after},
        "external": list(spec.requires),
        "by": by,
    }


def add(host: Host, spec: AddSpec, limits: Limits | None = None) -> Any:
    """Compile SPEC's job and install it on HOST: the job file's name, or the compiled job whose findings refuse
    it (a Compiled that is not clean). OperateError when the host refuses it (a taken --name, an unknown --after
    job, another push holding the lock)."""
    from plancompiler.backends.protocol import who
    from plancompiler.commands.operate import ask
    from plancompiler.errors import OperateError

    name = spec.name or auto_name(spec)
    compiled = compile_add(spec, name, limits)
    if not compiled.clean():
        return compiled
    answer = ask(host, "add", {**request(spec, compiled, name, spec.name is None, who()), "create": True})
    if answer.get("busy"):
        holder = answer.get("holder") or {}
        raise OperateError(
            f"another push to {host.name} is in progress (pid {holder.get('pid', '?')}, {holder.get('user', '?')}, "
            f"since {holder.get('since', '?')}); try again when it is done"
        )
    if answer.get("changed"):
        raise OperateError("the queue changed while the job was added; run it again")
    return str(answer["added"])

"""A Slurm push request (PushRequest) as plancompiler.backends.slurm writes it and runner.slurm.agent reads it:
the plan, its jobs (runner.slurm.bundle's PushJobs) and the push's options. Written with to_json, read once where
the agent takes it into a frozen value or a located error (`the push request's jobs[3].deps[1]: ...`). And what
the agent answers (PushResult, written with to_json; plancompiler.backends.slurmanswer reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runner import backoff
from runner.slurm.bundle import PushJob as PushJob  # the request's jobs: this door's too
from runner.slurm.bundle import parse_jobs
from runner.slurm.jsonfields import (
    OPT_STR,
    STRINGS,
    Bad,
    Field,
    RecordError,
    read_bool,
    read_fields,
    read_float,
    read_object,
    read_str,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.slurm.jsonfields import SlurmId


@dataclass(frozen=True)
class PushRequest:
    """One push of one plan. `keep` asks the agent to hold the diff it made for this session (a token in its
    answer); `token` applies the diff held so. `slurm_conf` is the host's (SLURM_CONF for the client commands)."""

    plan: str
    jobs: tuple[PushJob, ...] = ()
    external: tuple[str, ...] = ()  # paths outside the plan its jobs need: checked on the submit host
    retry_failed: bool = False
    prune: bool = True  # retire (cancel) jobs no longer in the plan
    dry_run: bool = False
    verify_external: bool = True
    by: str | None = None  # user@host of the workstation that pushes
    lock_wait_s: float = 60.0
    gate_interval_s: float = 60.0
    backoff_base_s: float = backoff.BASE_S
    backoff_max_s: float = backoff.MAX_S
    slurm_conf: str | None = None
    keep: bool = False
    token: str = ""

    def to_json(self) -> dict[str, Any]:
        """The request as it goes over the wire (`create`: the dispatcher may make the root)."""
        out: dict[str, Any] = {"backend": "slurm", "slurm_conf": self.slurm_conf, "plan": self.plan}
        out["jobs"] = [job.to_json() for job in self.jobs]
        out.update(
            external=list(self.external),
            retry_failed=self.retry_failed,
            prune=self.prune,
            dry_run=self.dry_run,
            verify_external=self.verify_external,
            create=True,
            by=self.by,
            lock_wait_s=self.lock_wait_s,
            gate_interval_s=self.gate_interval_s,
            backoff_base_s=self.backoff_base_s,
            backoff_max_s=self.backoff_max_s,
        )
        if self.keep:
            out["keep"] = True
        if self.token:
            out["token"] = self.token
        return out


@dataclass(frozen=True)
class PushResult:
    """A push's answer: its diff ([mark, name, note] each), and once applied what it did (submitted, re-pointed,
    cancelled) or why nothing was. The keys after `accounting` are written only where they say something."""

    changes: tuple[tuple[str, ...], ...] = ()
    external_missing: tuple[str, ...] = ()
    submitted: dict[str, SlurmId] = field(default_factory=dict)
    repointed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # replaced job -> dependents moved to it
    cancelled: tuple[SlurmId, ...] = ()
    accounting: str = "on"  # or why sacct cannot be read
    retried: tuple[str, ...] = ()  # next tries this contact submitted, a line each
    rebuilt: str | None = None  # what rebuilding an untrusted ledger did
    error: str = ""
    withdrawn: tuple[str, ...] | None = None  # what a push that failed part-way cancelled of its own
    released: tuple[str, ...] | None = None  # held gated jobs released once submitted
    token: str = ""  # the diff the agent keeps for this session to apply

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "changes": [list(change) for change in self.changes],
            "external_missing": list(self.external_missing),
            "submitted": dict(self.submitted),
            "repointed": {name: list(moved) for name, moved in self.repointed.items()},
            "cancelled": list(self.cancelled),
            "accounting": self.accounting,
        }
        if self.retried:
            out["retried"] = list(self.retried)
        if self.rebuilt is not None:
            out["rebuilt"] = self.rebuilt
        if self.error:
            out["error"] = self.error
        if self.withdrawn is not None:
            out["withdrawn"] = list(self.withdrawn)
        if self.released is not None:
            out["released"] = list(self.released)
        if self.token:
            out["token"] = self.token
        return out


_FLAG = Field((bool,), read_bool)
_NUMBER = Field((float, int), read_float)
_READ: dict[str, Field] = {
    "plan": Field((str,), read_str),
    "external": STRINGS,
    "retry_failed": _FLAG,
    "prune": _FLAG,
    "dry_run": _FLAG,
    "verify_external": _FLAG,
    "by": OPT_STR,
    "lock_wait_s": _NUMBER,
    "gate_interval_s": _NUMBER,
    "backoff_base_s": _NUMBER,
    "backoff_max_s": _NUMBER,
    "slurm_conf": OPT_STR,
    "keep": _FLAG,
    "token": Field((str,), read_str),
}
# read by runner.agent.dispatch before the push is (which backend answers; whether the root may be made)
_DISPATCH = frozenset({"backend", "create", "allow_missing"})
_KEYS = frozenset(_READ) | _DISPATCH | {"jobs"}


def parse_push_request(value: Any) -> PushRequest | RecordError:
    """The push request in VALUE (the JSON the agent was sent), or where in it and why it is not one. An older
    client's request, without the keys added since, reads with their defaults."""
    try:
        raw = read_object(value, _KEYS)
        if "plan" not in raw:
            raise Bad("", "no 'plan'")
        fields = read_fields({k: v for k, v in raw.items() if k not in _DISPATCH and k != "jobs"}, _READ)
        if not fields["plan"]:
            raise Bad("plan", "a plan name was expected, not an empty string")
    except Bad as bad:
        return bad.error
    jobs = parse_jobs(raw.get("jobs"))
    if isinstance(jobs, RecordError):
        return jobs
    return PushRequest(jobs=jobs, **fields)

"""The cluster's limits a Slurm push must fit in, read before it submits anything: MaxArraySize (arrays are cut to
fit), MaxJobCount (every job record slurmctld holds, ended ones until MinJobAge) and the user's MaxSubmitJobs
(sacctmgr, where accounting enforces limits). A push that cannot fit is refused with the numbers, whole."""

from __future__ import annotations

import getpass
from dataclasses import dataclass

from runner.slurm.query import ControllerDown, slurm


@dataclass(frozen=True)
class Limits:
    max_array_size: int = 1001  # an array's task indices must stay below it
    max_job_count: int | None = None
    max_submit: int | None = None  # the user's, pending and running jobs together
    submit_source: str = ""  # where max_submit came from, for the message
    records: int = 0  # job records slurmctld holds now (each array task one)
    user_jobs: int = 0  # this user's pending and running jobs now

    @property
    def array_chunk(self) -> int:
        """Elements per array at most (task indices 0 .. MaxArraySize-1)."""
        return max(1, self.max_array_size - 1)

    def problems(self, new: int) -> list[str]:
        """Why NEW more jobs (array tasks counted one by one) cannot be submitted now; [] when they fit."""
        found = []
        if self.max_job_count is not None and self.records + new > self.max_job_count:
            found.append(
                f"MaxJobCount={self.max_job_count}: slurmctld holds {self.records} job records (ended ones until "
                f"MinJobAge), so {max(0, self.max_job_count - self.records)} more fit"
            )
        if self.max_submit is not None and self.user_jobs + new > self.max_submit:
            found.append(
                f"MaxSubmitJobs={self.max_submit} ({self.submit_source}): {self.user_jobs} of your jobs are pending "
                f"or running, so {max(0, self.max_submit - self.user_jobs)} more fit"
            )
        return found


def _config(env: dict[str, str]) -> dict[str, str]:
    rc, out, err = slurm(["scontrol", "show", "config"], env, 60)
    if rc != 0:
        raise ControllerDown(err.strip() or f"scontrol show config exited {rc}")
    found = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip()] = value.strip()
    return found


def _number(text: str | None) -> int | None:
    word = (text or "").split()[0] if (text or "").split() else ""
    return int(word) if word.isdigit() else None


def _max_submit(env: dict[str, str], user: str) -> tuple[int | None, str]:
    """The user's MaxSubmitJobs from their associations (the smallest that is set), where sacctmgr answers."""
    try:
        rc, out, _ = slurm(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", "format=MaxSubmit"], env)
    except ControllerDown:
        return None, ""
    values = [int(v) for v in out.split() if v.strip().isdigit()] if rc == 0 else []
    return (min(values), f"sacctmgr, user {user}") if values else (None, "")


def read_limits(env: dict[str, str]) -> Limits:
    config = _config(env)
    user = getpass.getuser()
    rc, out, err = slurm(["squeue", "-h", "-a", "-r", "-t", "all", "-o", "%u|%T"], env)
    if rc != 0:
        raise ControllerDown(err.strip() or f"squeue exited {rc}")
    rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
    mine = sum(1 for who, state in rows if who == user and state.strip() in ("PENDING", "RUNNING", "SUSPENDED"))
    max_submit, source = None, ""
    enforce = config.get("AccountingStorageEnforce", "")
    if config.get("AccountingStorageType", "").endswith("slurmdbd") and ("limits" in enforce or "safe" in enforce):
        max_submit, source = _max_submit(env, user)
    return Limits(
        max_array_size=_number(config.get("MaxArraySize")) or 1001,
        max_job_count=_number(config.get("MaxJobCount")),
        max_submit=max_submit,
        submit_source=source,
        records=len(rows),
        user_jobs=mine,
    )

"""The tiny bash wrapper each job runs under: it records the job's exit status next to it in running/.

The job runs in its own session, so it outlives a runner killed with -9; the wrapper is its session leader
and parent, and writes `RC STARTED ENDED` and a newline to `running/.NAME.exit` when the job ends. A runner
that starts and finds that record knows the job finished while it was down, and how.

The record is one write(2) of a few dozen bytes by bash's printf, straight to its name: no temp file and
`mv`, whose fork and exec were about 1.5-4 ms of every job's end before its lane's next job could start. A
reader takes a record only whole, ending in its newline: an empty or cut file (a disk full, a machine
crash) counts as no record, as a temp file never renamed did. Only the runner reads it, and only once the
wrapper is gone (reaped, or ended with its job's leftovers), so it never reads one being written.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

# $1 the job file, $2 the exit record, $3 a cgroup.procs to join first ('' for none). A TERM to the wrapper
# means the runner is ending the job (timeout, cancel, stop, a new runner life ending leftovers): then it
# records nothing, so the job counts as interrupted, not as failed. The trap is ignored from the job's exit
# on, so a TERM that comes after the job finished cannot cut the record short. EPOCHREALTIME is bash 5's
# clock (no fork), `date` where it is missing; a locale's decimal comma is made a point. The record is 0600
# whatever the umask the runner was started with (the job's own umask is left as it was).
SCRIPT = r"""s=${EPOCHREALTIME:-$(date +%s)}
trap 'x=1' TERM
if [ -n "$3" ]; then echo $$ >"$3"; fi 2>/dev/null
bash "$1"
rc=$?
trap '' TERM
e=${EPOCHREALTIME:-$(date +%s)}
if [ -z "$x" ]; then
  umask 077
  printf '%d %s %s\n' "$rc" "${s/,/.}" "${e/,/.}" >"$2"
fi
exit "$rc"
"""


def argv(script: str, record: Path, cgroup_procs: str | None) -> list[str]:
    return ["bash", "-c", SCRIPT, "plan-job", script, str(record), cgroup_procs or ""]


def is_wrapper(cmdline: str) -> bool:
    """Whether CMDLINE (a /proc cmdline, its NULs read as spaces) is a wrapper's."""
    return cmdline.startswith(f"bash -c {SCRIPT} plan-job ")


class ExitRecord(NamedTuple):
    rc: int
    started: float
    ended: float


def read_record(path: Path) -> ExitRecord | None:
    """The recorded exit of a job, or None when there is none (the job never ended, or was ended by us) or it
    is not whole (no newline at its end)."""
    try:
        text = path.read_text()
        if not text.endswith("\n"):
            return None
        rc, started, ended = text.split()
        return ExitRecord(int(rc), float(started), float(ended))
    except (OSError, ValueError):
        return None


def clear_record(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass

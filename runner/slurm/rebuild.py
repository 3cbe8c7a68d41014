"""The Slurm ledger (runner.slurm.ledger) is a cache of Slurm's truth: what it lacks is taken from squeue (each
job's `plan=` comment, its name PLAN/NAME and its working directory, this root), the attempts' result files
and, where accounting is on, sacct; what none of them can account for is marked lost, never forgotten.

All of it is read only when the ledger cannot be trusted: missing under a root a push used, unreadable, cut
short, or only its previous generation (slurm.json.1) readable, which misses the last save's submissions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runner.files import read_json_or_none
from runner.slurm import ledger as ledger_mod
from runner.slurm.query import Live, sacct, slurm_id, slurm_time

LOST = "LOST"  # the state of a job a push prepared that nothing left a trace of (it may run, or have run)


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def _members(root: str, plan: str, tag: str) -> list[Any] | None:
    """The [name, hash] per element of the array whose comment names TAG (array.SHA); None if unknown."""
    if not tag.startswith("array.") or "/" in tag:
        return None
    found = read_json_or_none(Path(root) / "scripts" / plan / f"{tag}.json")
    return found if isinstance(found, list) else None


def _id_order(job_id: Any) -> tuple[int, int]:
    array, _, task = str(job_id).partition("_")
    return (int(array) if array.isdigit() else 0, int(task) if task.isdigit() else -1)


def _add(ledger: dict[str, Any], plan: str, name: str, attempt: dict[str, Any]) -> bool:
    """Add ATTEMPT to NAME's record unless its id is there already; attempts kept in submission order."""
    record = ledger_mod.plan_jobs(ledger, plan).setdefault(name, {"attempts": []})
    attempts = record.setdefault("attempts", [])
    if any(a.get("id") == attempt["id"] for a in attempts):
        return False
    attempts[:] = [a for a in attempts if a.get("state") != LOST]
    attempts.append(attempt)
    attempts.sort(key=lambda a: _id_order(a.get("id")))
    record.setdefault("slurm_name", f"{plan}/{name}")
    record.setdefault("lane", "")
    record.setdefault("deps", [])
    if attempt.get("hash"):
        record["hash"] = attempt["hash"]
    return True


def from_squeue(root: str, ledger: dict[str, Any], live: Live) -> list[str]:
    """Jobs squeue has under this root that the ledger lacks, added to it; what was added, as PLAN/NAME (ID)."""
    added = []
    for job_id, job in sorted(live.items(), key=lambda item: _id_order(item[0])):
        if not job.get("workdir") or not _same_dir(job["workdir"], root):
            continue
        plan, tag = job["plan"], job["hash"].partition(":")[0]  # an array's: array.SHA[:its element names]
        if tag.startswith("array"):
            members = _members(root, plan, tag)
            task = str(job_id).partition("_")[2]
            if members is None or not task.isdigit() or int(task) >= len(members):
                continue
            name, digest = members[int(task)]
            extra = {"slurm_name": job["name"]}
        else:
            prefix = f"{plan}/"
            if not job["name"].startswith(prefix):
                continue
            name, digest, extra = job["name"][len(prefix) :], tag, {}
        attempt = {"id": job_id, "hash": digest, "attempt": 1, "submitted": job.get("submitted"), "state": None}
        if _add(ledger, plan, name, {**attempt, **extra}):
            added.append(f"{plan}/{name} ({job_id})")
    return added


def from_results(root: str, ledger: dict[str, Any]) -> int:
    """Attempts whose wrapper left ROOT/results/PLAN/NAME/ID.json, with the next try each submitted."""
    base = Path(root) / "results"
    count = 0
    for plan in _listdir(base):
        for name in _listdir(base / plan):
            for entry in _listdir(base / plan / name):
                if not entry.endswith(".json") or entry.startswith("."):
                    continue
                found = read_json_or_none(base / plan / name / entry)
                if not isinstance(found, dict) or "id" not in found:
                    continue
                attempt = {"id": slurm_id(str(found["id"])), "hash": None, "result": True}
                attempt.update({k: found.get(k) for k in ("start", "end", "rc", "kind", "tail", "wait_s", "moved")})
                attempt.update(attempt=found.get("attempt") or 1, state=found.get("state"))
                count += _add(ledger, plan, name, attempt)
                if found.get("next_id"):
                    nxt = {"id": int(found["next_id"]), "attempt": found.get("next_attempt") or 1, "state": None}
                    count += _add(ledger, plan, name, {**nxt, "after": found.get("kind")})
    return count


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def from_sacct(root: str, ledger: dict[str, Any], env: dict[str, str]) -> tuple[bool, int]:
    """Single jobs (PLAN/NAME) that accounting knows under this root, with their final states; (asked, added)."""
    argv_fields = "JobID,JobName,State,Start,End,WorkDir,Comment"
    on, _, lines = sacct(env, [], None, argv_fields)
    count = 0
    for line in lines if on else []:
        parts = line.split("|")
        if len(parts) < 7 or not parts[0].isdigit() or "/" not in parts[1] or not _same_dir(parts[5], root):
            continue
        plan, _, name = parts[1].partition("/")
        digest = parts[6].partition("@")[2] if parts[6].startswith(f"plan={plan}@") else None
        state = parts[2].split()[0] if parts[2] else None
        attempt: dict[str, Any] = {"id": int(parts[0]), "hash": digest, "attempt": 1, "state": state}
        attempt.update(start=slurm_time(parts[3]), end=slurm_time(parts[4]))
        count += _add(ledger, plan, name, attempt)
    return on, count


def prepared(root: str) -> dict[str, dict[str, str]]:
    """Plan -> job -> content hash of every job a push prepared to submit (the bundles under scripts/PLAN)."""
    base = Path(root) / "scripts"
    found: dict[str, dict[str, str]] = {}
    for plan in _listdir(base):
        for entry in _listdir(base / plan):
            if not (entry.startswith("bundle.") and entry.endswith(".json")):
                continue
            bundle = read_json_or_none(base / plan / entry)
            for element in bundle.get("elements", []) if isinstance(bundle, dict) else []:
                if isinstance(element, dict) and isinstance(element.get("name"), str):
                    found.setdefault(plan, {})[element["name"]] = str(element.get("hash") or "")
    return found


def _fill_hashes(root: str, ledger: dict[str, Any]) -> None:
    """An attempt whose content hash no source said: the newest body its attempts wrote (scripts/PLAN/NAME.HASH.job)."""
    for plan, entry in ledger["plans"].items():
        for name, record in (entry.get("jobs") or {}).items():
            for attempt in record.get("attempts") or []:
                if attempt.get("hash"):
                    continue
                bodies = sorted(
                    Path(root, "scripts", plan).glob(f"{name}.*.job"), key=lambda p: p.stat().st_mtime, reverse=True
                )
                digest = bodies[0].name[len(name) + 1 : -len(".job")] if bodies else None
                attempt["hash"] = digest
                record["hash"] = record.get("hash") or digest


def rebuild(root: str, ledger: dict[str, Any], live: Live, env: dict[str, str], why: str) -> dict[str, Any]:
    """Complete an untrusted LEDGER from Slurm's truth; the jobs a push prepared that nothing accounts for are
    recorded as LOST (never submitted again without --retry-failed). Returns what was done, for the push to say."""
    added = from_squeue(root, ledger, live)
    results = from_results(root, ledger)
    asked, accounted = from_sacct(root, ledger, env)
    lost: list[str] = []
    for plan, jobs in prepared(root).items():
        known = ledger_mod.plan_jobs(ledger, plan)
        for name, digest in sorted(jobs.items()):
            if not (known.get(name) or {}).get("attempts"):
                known[name] = {
                    "hash": digest,
                    "lane": "",
                    "deps": [],
                    "slurm_name": f"{plan}/{name}",
                    "attempts": [{"id": None, "hash": digest, "attempt": 1, "state": LOST}],
                }
                lost.append(f"{plan}/{name}")
    _fill_hashes(root, ledger)
    sources = ["squeue", "the results directory"] + (["sacct"] if asked else [])
    note = (
        f"the ledger could not be trusted ({why}): rebuilt under the push lock from {', '.join(sources)} "
        f"({len(added)} jobs from squeue, {results} attempts from results, {accounted} from sacct)"
    )
    return {"note": note, "lost": lost}


def open_ledger(root: str, live: Live, env: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ledger joined with squeue; rebuilt first where it cannot be trusted. (ledger, what a rebuild did)."""
    ledger, why = ledger_mod.read(root)
    if why:
        ledger_mod.fold_results(root, ledger)  # an older generation's attempts first, with the retries they made
        return ledger, rebuild(root, ledger, live, env, why)
    return ledger, None


def lost_job(record: dict[str, Any] | None) -> bool:
    """Whether the job's current attempt is one a rebuild could not account for."""
    last = ledger_mod.current(record) if record else None
    return last is not None and last.get("state") == LOST

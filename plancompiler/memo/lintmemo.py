"""Stage 5's memo: each job's findings kept under its exact text, so that a re-check lints only changed jobs.

A job's findings depend on nothing but its file's text, the codes it disables and the tools and code that
lint it (the differential test shows that linting per shape finds what linting per job finds). So they are
kept per plan file, keyed by a digest of those, beside the compiler's, the tools' and the libraries' identity;
any change of those empties the memo. Findings are kept in the job's own lines and columns, as mapped back.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable

from plancompiler.memo.checkmemo import cache_dir, code_identity
from plancompiler.render import RenderedJob

_VERSION = "1"
Kept = list[tuple[int, int, str, str, str]]  # (line, col, severity, code, message) of one job


class JobMemo:
    """The findings of the jobs of one plan file, as its last check found them."""

    def __init__(self, plan_path: str) -> None:
        digest = hashlib.sha256(os.fsencode(os.path.abspath(plan_path))).hexdigest()[:32]
        self.path = cache_dir() / "lint-jobs" / digest[:2] / f"{digest}.json"
        self.salt = hashlib.sha256(f"{_VERSION}\0{code_identity()}".encode()).hexdigest()
        self.kept: dict[str, Kept] = {}
        self.changed = False
        try:
            data = json.loads(self.path.read_text())
            if data.get("salt") == self.salt:
                self.kept = {k: [tuple(f) for f in v] for k, v in data["jobs"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.kept = {}
        self.used: dict[str, Kept] = {}

    def key(self, job: RenderedJob) -> str:
        disabled = ",".join(sorted(job.job.job.shellcheck_disable))
        return hashlib.sha256(f"{job.header_lines}\0{disabled}\0{job.text}".encode()).hexdigest()

    def get(self, job: RenderedJob) -> Kept | None:
        key = self.key(job)
        found = self.kept.get(key)
        if found is not None:
            self.used[key] = found
        return found

    def put(self, job: RenderedJob, findings: Iterable[tuple[int, int, str, str, str]]) -> None:
        self.used[self.key(job)] = list(findings)
        self.changed = True

    def save(self) -> None:
        """Keep what this check used: the entries of jobs the plan no longer has are dropped."""
        if not self.changed and len(self.used) == len(self.kept):
            return
        from runner.files import atomic_write

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps({"salt": self.salt, "jobs": self.used}).encode(), durable=False)
        except OSError:
            pass  # a read-only cache costs time, never correctness

"""One implementation of each contract: what the plan side writes is what the host side reads (the import rules,
circles among them, are tests/test_architecture.py's)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from plancompiler.compile import compile_plan
from plancompiler.hosts import Host
from plancompiler.models import Job
from runner import jobfile
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("plan_env")

# Headers where a second parser would disagree with runner.jobfile.parse (the runner's reading wins).
TRICKY = {
    "blank-line.job": b"# LANE=cpu\n\n# PLAN=x@1\necho hi\n",  # the blank line ends the header: no PLAN
    "shebang.job": b"#!/bin/bash\n# PLAN=x@1\necho hi\n",
    "no-space.job": b"#PLAN=x@1\necho hi\n",
    "spaced.job": b"# PLAN = x@1\necho hi\n",  # malformed: never run, so never anyone's
    "crlf.job": b"# PLAN=x@1\r\necho hi\r\n",
    "unknown-lane.job": b"# LANE=tpu\n# PLAN=x@1\necho hi\n",
    "body-first.job": b"echo hi\n# PLAN=x@1\n",
    "header-only.job": b"# LANE=cpu\n# PLAN=x@1\n",
    "twice.job": b"# PLAN=x@1\n# PLAN=y@2\necho hi\n",
    "hand.job": b"# LANE=gpu\n# REQUIRES=test -f /x\necho hi\n",
}


def header_fixtures() -> dict[str, bytes]:
    """Every job text of the suite: the goldens, the example plans compiled, and the tricky headers above."""
    found = {f"{i:03d}-{p.name}": p.read_bytes() for i, p in enumerate(sorted((REPO / "tests/golden").rglob("*.job")))}
    for plan in ("demo.yaml", "a9.yaml", "a9_intakes.py"):
        compiled = compile_plan(REPO / "plans" / plan, lint=False)
        assert compiled.jobs, plan
        found.update({f"{plan[:2]}-{job.filename}": job.text.encode() for job in compiled.jobs})
    found.update(TRICKY)
    return found


def test_the_host_reads_every_header_fixture_as_the_runner_does(tmp_path: Path) -> None:
    root = tmp_path / "q"
    (root / "queue").mkdir(parents=True)
    fixtures = header_fixtures()
    assert len(fixtures) > 30
    for name, data in fixtures.items():
        (root / "queue" / name).write_bytes(data)
    probe = Host(name="q", root=str(root)).call("probe", {})  # the agent, as a real process
    seen = probe["files"]["queue"]
    assert set(seen) == set(fixtures)
    for name, data in fixtures.items():
        parsed = jobfile.parse(name, data)
        assert seen[name]["plan"] == (parsed.plan if isinstance(parsed, jobfile.JobFile) else None), name
    assert seen["blank-line.job"]["plan"] is None and seen["shebang.job"]["plan"] == "x@1"
    assert seen["no-space.job"]["plan"] == "x@1" and seen["spaced.job"]["plan"] is None


def test_what_the_compiler_writes_as_plan_is_what_the_host_reads(tmp_path: Path) -> None:
    root = tmp_path / "q"
    (root / "queue").mkdir(parents=True)
    compiled = compile_plan(REPO / "plans/a9.yaml", lint=False)
    for job in compiled.jobs:
        (root / "queue" / job.filename).write_text(job.text)
    seen = Host(name="q", root=str(root)).call("probe", {})["files"]["queue"]
    for job in compiled.jobs:
        written = next(ln for ln in job.text.splitlines() if ln.startswith("# PLAN="))[len("# PLAN=") :]
        assert seen[job.filename]["plan"] == written and written.startswith(f"{compiled.name}@")


def test_the_box_side_is_one_package_and_the_plan_side_keeps_no_copy_of_its_formats() -> None:
    for path in (REPO / "plancompiler").rglob("*.py"):
        text = path.read_text()
        for copy in ("EXTRA_HANDLERS", "noqa: F821", '"# PLAN="', 'b"# PLAN="', 'partition("-")', "parked.json"):
            assert copy not in text, f"{path.relative_to(REPO)} keeps {copy!r}"


def test_a_signed_header_is_the_header_with_its_plan_line_made_from_the_rest() -> None:
    """The compiler formats each job once: SIGN gets the file without its PLAN line and what it returns goes in
    PLAN's place (before GPUS and PRIORITY), byte for byte what formatting it again with that PLAN writes."""
    seen: list[str] = []

    def sign(unsigned: str) -> str:
        seen.append(unsigned)
        return f"p@{len(unsigned)}"

    fields: dict[str, Any]
    for fields in (
        {"lane": "cpu", "body": "\necho hi"},
        {"lane": "gpu", "body": "\necho hi\n", "done_if": "test -f /o", "outputs": ["/o"], "gpus": 2, "priority": 3},
        {"lane": "net", "body": "\ntrue\n", "requires": "test -d /i", "retries": 4, "comment": "generated"},
    ):
        seen.clear()
        signed = jobfile.format(**fields, sign=sign)
        assert seen == [jobfile.format(**fields)]
        assert signed == jobfile.format(**fields, plan=f"p@{len(seen[0])}")
        assert f"# PLAN=p@{len(seen[0])}\n" in signed
    with pytest.raises(ValueError, match="header value for PLAN must be one non-empty line"):
        jobfile.format(lane="cpu", body="\ntrue\n", sign=lambda _: "p@1\ntouch PWNED")


def test_a_timeout_of_0_is_refused_by_the_runner_as_by_the_compiler() -> None:
    """A hand-written `# TIMEOUT=0` ran and was ended as it started: now it is never run (failed/, `invalid`), with the
    compiler's reason (runner.jobfile.parse_timeout, which the model calls)."""
    for text in ("0", "0s", " 0.0m", "00"):
        parsed = jobfile.parse("a.job", f"# LANE=cpu\n# TIMEOUT={text}\necho hi\n".encode())
        reason = f"{text.strip()!r} would end every attempt at once: give more than 0, or none for no limit"
        assert isinstance(parsed, jobfile.Invalid) and str(parsed) == f"line 2: TIMEOUT: {reason}"
        with pytest.raises(ValidationError, match=re.escape(reason)):
            Job(name="a", run="true", timeout=text)
    parsed = jobfile.parse("a.job", b"# TIMEOUT=0.5\necho hi\n")
    assert isinstance(parsed, jobfile.JobFile) and parsed.timeout_s == 0.5
    assert Job(name="a", run="true", timeout="0.5").timeout == "0.5"


def test_a_warn_after_of_0_is_refused_by_the_runner_as_by_the_compiler() -> None:
    """`warn_after: 0` passed every check, and then every run of the job was long-running as it started: an alert
    for each job at once. Refused as TIMEOUT=0 is, with the same reason on both sides."""
    for text in ("0", "0s", " 0.0m", "00"):
        parsed = jobfile.parse("a.job", f"# LANE=cpu\n# WARN_AFTER={text}\necho hi\n".encode())
        reason = f"{text.strip()!r} would call every run long-running as it starts: give more than 0, or none for its"
        assert isinstance(parsed, jobfile.Invalid) and str(parsed).startswith(f"line 2: WARN_AFTER: {reason}")
        with pytest.raises(ValidationError, match=re.escape(reason)):
            Job(name="a", run="true", warn_after=text)
    parsed = jobfile.parse("a.job", b"# WARN_AFTER=90s\necho hi\n")
    assert isinstance(parsed, jobfile.JobFile) and parsed.warn_after_s == 90
    assert Job(name="a", run="true", warn_after="1h").warn_after == "1h"

"""`expect_wait:` in a plan, EXPECT_WAIT in a job header: a wait the plan says is normal alerts only after it."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from plancompiler.compile import compile_plan
from runner import jobfile
from tests.conftest import write_job
from tests.ticking import Ticking

T0 = 1_000_000.0
H = 3600.0


def test_the_header_reads_one_duration_or_one_per_reason() -> None:
    assert jobfile.parse_expect_wait("2d") == (("*", 172800.0),)
    assert jobfile.parse_expect_wait("requires=2d, gpu-foreign=1h") == (("requires", 172800.0), ("gpu-foreign", 3600.0))
    bad = jobfile.parse("j.job", b"# EXPECT_WAIT=requirez=2d\necho\n")
    assert isinstance(bad, jobfile.Invalid) and bad.line == 1
    assert str(bad).startswith("line 1: EXPECT_WAIT: 'requirez' is not a reason a job waits on")


def test_a_plan_says_it_and_the_job_carries_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAN_CACHE_DIR", str(tmp_path / "cache"))
    plan = tmp_path / "p.yaml"
    plan.write_text(
        textwrap.dedent(
            """\
            plan: t
            external: [/srv/.done-s2]
            jobs:
              - name: 92c-net-mai-code
                lane: net
                run: echo fetch
                requires: [/srv/.done-s2]
                expect_wait: {requires: 2d}
              - name: bad
                run: echo bad
                expect_wait: forever
            """
        )
    )
    compiled = compile_plan(plan)
    assert [(d.line, d.message) for d in compiled.diagnostics][0][0] == 11
    assert "not a duration: 'forever'" in compiled.diagnostics[0].message
    plan.write_text(plan.read_text().replace("expect_wait: forever", "expect_wait: 6h"))
    compiled = compile_plan(plan)
    assert not compiled.diagnostics
    texts = {job.filename: job.text for job in compiled.jobs}
    assert "# EXPECT_WAIT=requires=2d\n" in texts["92c-net-mai-code.job"]
    assert "# EXPECT_WAIT=6h\n" in texts["bad.job"]


def test_nothing_alerts_before_an_expected_wait_has_passed(
    tmp_path: Path, queue_root: Path, ticking: Callable[..., Ticking]
) -> None:
    marker = str(tmp_path / ".done-s2")
    write_job(
        queue_root,
        "92c-net-mai-code.job",
        f"# LANE=net\n# REQUIRES=test -f {marker}\n# EXPECT_WAIT=requires=2d\ncurl\n",
    )
    (queue_root / "manifest.json").write_text(
        json.dumps({"plan": "t", "jobs": {"92c-net-mai-code.job": {"requires": [marker]}}, "external": [marker]})
    )
    q = ticking(T0)
    for t in range(0, int(48 * H), 1800):
        q.tick(T0 + t)
    assert q.events("incident") == [] and q.events("requires-wait")  # the event log still says it waits
    q.tick(T0 + 48 * H)
    assert [(e["what"], e["kind"]) for e in q.events("incident")] == [("open", "requires")]

"""Contract 1: the job-file parser accepts seed jobs and refuses anything it cannot fully parse."""

from __future__ import annotations

import pytest

from runner import jobfile
from runner.conditions import compile_condition, evaluate
from tests.seed import SEED_92C


def test_seed_92c_parses_with_its_four_keys() -> None:
    job = jobfile.parse("92c-net-mai-code.job", SEED_92C.encode())
    assert isinstance(job, jobfile.JobFile)
    assert job.lane == "net"
    assert job.retries == 3
    assert job.requires and job.requires.endswith(".done-s2-fnmtpcx-flashnext-iq4xs")
    assert job.done_if == "test -f /home/user/models/MAI-Code-1.1-Flash-On-Device/.ok"
    assert job.body.startswith("bash /home/user/work/")
    assert compile_condition(job.done_if).fast


def test_job_without_header_runs_in_cpu_lane() -> None:
    job = jobfile.parse("x.job", b"echo hi\n")
    assert isinstance(job, jobfile.JobFile) and job.lane == "cpu" and job.retries == 1


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("a.job", b"", "empty file"),
        ("a.job", b"  \n\t\n", "file holds only whitespace"),
        ("a.job", b"echo \xff\xfe\n", "not valid UTF-8 at byte 5"),
        ("a.job", b"echo a\x00b\n", "file contains a NUL byte"),
        ("a.job", b"# LANE=gpu\r\necho hi\r\n", "carriage return"),
        ("a.job", b"# REQUIRE=test -f x\necho hi\n", "unknown header key REQUIRE (did you mean REQUIRES?)"),
        ("a.job", b"# LANE: gpu\necho hi\n", "malformed header line"),
        ("a.job", b"# LANE=tpu\necho hi\n", "unknown LANE 'tpu'"),
        ("a.job", b"# LANE=gpu\n# LANE=net\necho hi\n", "header key LANE given twice (first on line 1)"),
        ("a.job", b"# RETRIES=three\necho hi\n", "RETRIES must be a whole number"),
        ("a.job", b"# RETRIES=0\necho hi\n", "RETRIES must be at least 1"),
        ("a.job", b"# TIMEOUT=soon\necho hi\n", "TIMEOUT: not a duration"),
        ("a.job", b"# LANE=gpu\n# GPUS=0\necho hi\n", "GPUS must be a whole number from 1 to 64, not '0'"),
        ("a.job", b"# LANE=gpu\n# GPUS=\xc2\xb2\necho hi\n", "GPUS must be a whole number from 1 to 64"),
        ("a.job", b"# LANE=gpu\n# just a comment\n", "no command after the header"),
        ("..x.job", b"echo hi\n", "bad job name"),
        ("-x.job", b"echo hi\n", "bad job name"),
        ("a.sh", b"echo hi\n", "does not end in .job"),
    ],
)
def test_invalid_files_say_why(name: str, data: bytes, reason: str) -> None:
    result = jobfile.parse(name, data)
    assert isinstance(result, jobfile.Invalid)
    assert reason in str(result)


def test_invalid_names_the_line() -> None:
    result = jobfile.parse("a.job", b"# LANE=gpu\n# RETRIES=2\n# REQUIRE=test -f x\necho hi\n")
    assert isinstance(result, jobfile.Invalid) and result.line == 3


def test_format_round_trips_every_key() -> None:
    text = jobfile.format(
        lane="gpu",
        body="echo 'a b'\n",
        requires="test -f /x",
        done_if="test -s '/y z'",
        retries=2,
        timeout="10m",
        warn_after="1h",
        outputs=["/y z", "/w"],
        plan="a9@abc123",
        comment="generated from plans/a9.yaml by plan - do not edit",
        gpus=2,
    )
    assert text.splitlines()[:4] == ["# LANE=gpu", "# REQUIRES=test -f /x", "# DONE_IF=test -s '/y z'", "# RETRIES=2"]
    job = jobfile.parse("j.job", text.encode())
    assert isinstance(job, jobfile.JobFile)
    assert job.timeout_s == 600 and job.warn_after_s == 3600
    assert job.outputs == ("/y z", "/w") and job.plan == "a9@abc123" and job.gpus == 2
    assert job.body == "echo 'a b'\n"


def test_format_refuses_multiline_header_value() -> None:
    with pytest.raises(ValueError, match="one non-empty line"):
        jobfile.format(lane="cpu", body="true", requires="test -f a\nrm -rf /")


@pytest.mark.parametrize(
    ("text", "fast"),
    [
        ("test -f /a/b", True),
        ("test -s '/a b/c' && test -d /x", True),
        ('[ -e "/q r" ]', True),
        ("test -f $HOME/x", False),
        ("test -f /a || true", False),
        ("test -f ~/x", False),
        ("test -f /a/*.gguf", False),
        ("grep -q ok /x", False),
    ],
)
def test_fast_conditions_are_only_those_stat_can_decide(text: str, fast: bool) -> None:
    assert compile_condition(text).fast is fast


def test_fast_and_bash_answers_agree(tmp_path) -> None:
    (tmp_path / "full").write_text("x")
    (tmp_path / "empty").write_text("")
    (tmp_path / "d d").mkdir()
    cases = [
        "test -f full",
        "test -s empty",
        "test -s full",
        "test -d 'd d'",
        "test -e nope",
        "test -f full && test -d 'd d'",
        "test -f full && test -f nope",
        "[ -f full ]",
    ]
    for text in cases:
        cond = compile_condition(text)
        assert cond.fast
        fast = evaluate(cond, str(tmp_path), 5).holds
        slow = evaluate(compile_condition(text + " && true"), str(tmp_path), 5).holds
        assert fast == slow, text


def test_hanging_condition_is_bounded(tmp_path) -> None:
    outcome = evaluate(compile_condition("sleep 30"), str(tmp_path), 0.3)
    assert not outcome.holds and "timed out" in outcome.detail


def test_a_bom_before_the_header_is_stripped() -> None:
    """A Windows editor's UTF-8 BOM: the header is still read (REQUIRES and TIMEOUT kept, the gpu lane)."""
    data = "\ufeff# LANE=gpu\n# REQUIRES=false\n# TIMEOUT=1s\necho hi\n".encode()
    job = jobfile.parse("a.job", data)
    assert isinstance(job, jobfile.JobFile), job
    assert (job.lane, job.requires, job.timeout_s) == ("gpu", "false", 1.0)


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ("\n# LANE=gpu\n# REQUIRES=false\necho hi\n", 2),  # a leading blank line
        (" # LANE=gpu\n# REQUIRES=false\necho hi\n", 1),  # a leading space
        ("\u200b# LANE=gpu\necho hi\n", 1),  # a zero-width space
        ("\u2060# TIMEOUT=1s\necho hi\n", 1),  # a word joiner
        ("#!/bin/bash\n\n# LANE=gpu\necho hi\n", 3),
    ],
)
def test_a_header_not_at_the_top_is_invalid_never_ignored(data: str, line: int) -> None:
    found = jobfile.parse("a.job", data.encode())
    assert isinstance(found, jobfile.Invalid), found
    assert found.line == line and "is not at the top of the file" in found.reason


def test_header_words_below_a_header_are_the_body_own() -> None:
    """The compiler always writes a header (LANE at least) and a blank line: a body comment below it is the body's."""
    for text in (b"# LANE=gpu\n\necho hi\n# RETRIES=3 would be nice\n", b"# LANE=gpu\n\n# RETRIES=3\necho hi\n"):
        job = jobfile.parse("a.job", text)
        assert isinstance(job, jobfile.JobFile) and job.retries == 1

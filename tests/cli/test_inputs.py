"""Hostile inputs at the compiler's edges: odd file names, odd files, odd -o targets, oversized filters, --set typos."""

from __future__ import annotations

import os
import subprocess
import typing
from pathlib import Path

import pytest

from plancompiler import cli
from plancompiler.compile import compile_plan, template_dirs
from plancompiler.diagnostics import PlanError
from plancompiler.hostsfile import load_hosts
from runner import jobfile
from tests.conftest import REPO
from tests.inprocess import Ran, plan_limited, plan_main, unblocking

TRIVIAL = "plan: t\njobs:\n  - name: j\n    run: echo hi\n"
MEMORY_LIMIT = 1 << 30  # address space for a child: building a multi-gigabyte value fails there, not on the box


def plan(tmp_path: Path, *args: str, cwd: Path | None = None) -> Ran:
    """`plan ARGS...` in this process (tests/inprocess.py), in CWD (default TMP_PATH), with a cache of its own."""
    return plan_main(*args, cwd=cwd or tmp_path, cache=tmp_path / "cache")


def found(compiled: typing.Any) -> list[str]:
    return [f"{Path(d.path).name}:{d.line}:{d.col}: {d.severity}[{d.code}]: {d.message}" for d in compiled.diagnostics]


# 3. A newline in the plan's file name


def test_a_newline_in_the_plan_file_name_is_escaped_in_the_comment_and_never_runs(tmp_path: Path) -> None:
    name = "evil\ntouch PWNED; #.yaml"
    (tmp_path / name).write_text(TRIVIAL)
    result = plan(tmp_path, "render", name, "-o", "out")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "out" / "j.job").read_text()
    assert text.splitlines()[2] == "# generated from 'evil\\ntouch PWNED; #.yaml' by plan; do not edit"
    run = subprocess.run(["bash", "out/j.job"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stdout == "hi\n"
    assert not (tmp_path / "PWNED").exists()


def test_jobfile_format_refuses_a_comment_of_more_than_one_line() -> None:
    with pytest.raises(ValueError) as caught:
        jobfile.format(lane="cpu", body="echo hi\n", comment="from x\ntouch PWNED")
    assert str(caught.value) == "the header comment must be one line: 'from x\\ntouch PWNED'"
    with pytest.raises(ValueError, match="one line"):
        jobfile.format(lane="cpu", body="echo hi\n", comment="from x\rtouch PWNED")
    assert jobfile.format(lane="cpu", body="echo hi\n", comment="fine") == "# LANE=cpu\n# fine\necho hi\n"


# 4. `plan render -o` never replaces what is not a directory of job files


def _snapshot(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): ("dir" if p.is_dir() else p.read_text())
        for p in sorted(directory.rglob("*"))
        if "cache" not in p.parts
    }


def test_render_refuses_to_replace_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(TRIVIAL)
    (tmp_path / "notes.txt").write_text("my notes\n")
    before = _snapshot(tmp_path)
    result = plan(tmp_path, "render", "p.yaml", "-o", ".")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "plan: cannot write .: it is the working directory or holds it; "
        "nothing written (give -o a directory of its own, e.g. -o jobs)"
    )
    assert _snapshot(tmp_path) == before


def test_render_refuses_to_replace_a_file(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(TRIVIAL)
    (tmp_path / "notes.txt").write_text("my notes\n")
    before = _snapshot(tmp_path)
    result = plan(tmp_path, "render", "p.yaml", "-o", "notes.txt")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "plan: cannot write notes.txt: it exists and is not a directory; "
        "nothing written (-o names a directory that will hold only this "
        "plan's job files)"
    )
    assert _snapshot(tmp_path) == before  # notes.txt still the file it was; no .notes.txt.* left behind


def test_render_refuses_a_directory_holding_more_than_job_files(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(TRIVIAL)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.job").write_text("echo old\n")
    (out / "keep.txt").write_text("keep me\n")
    (out / "sub").mkdir()
    before = _snapshot(tmp_path)
    result = plan(tmp_path, "render", "p.yaml", "-o", "out")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "plan: cannot write out: it holds 2 entries that are not a job file ('keep.txt', 'sub'); it would be "
        "replaced as a whole, so nothing written (give -o a directory of its own)"
    )
    assert _snapshot(tmp_path) == before
    (out / "keep.txt").unlink()
    (out / "sub").rmdir()
    replaced = plan(tmp_path, "render", "p.yaml", "-o", "out")
    assert replaced.returncode == 0, replaced.stderr
    assert sorted(p.name for p in out.iterdir()) == ["j.job"]


# 5. Job names that end in a newline


def test_a_job_name_ending_in_a_newline_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        'plan: t\njobs:\n  - name: "x-{{ n }}"\n    foreach: {n: ["a\\n"]}\n    run: echo hi\n'
    )
    compiled = compile_plan(tmp_path / "p.yaml", lint=False)
    assert found(compiled) == [
        "p.yaml:3:11: error[P021]: job name 'x-a\\n': use letters, digits, '.', '_' "
        "and '-', starting with a letter or digit, at most 200 characters"
    ]
    assert compiled.jobs == []


def test_the_runner_refuses_a_job_file_whose_name_ends_in_a_newline() -> None:
    parsed = jobfile.parse("x\n.job", b"echo hi\n")
    assert isinstance(parsed, jobfile.Invalid)
    assert str(parsed) == ("bad job name 'x\\n': use letters, digits, '.', '_' and '-', not starting with '.' or '-'")
    assert not jobfile.NAME_RE.match("x\n")
    assert isinstance(jobfile.parse("x.job", b"echo hi\n"), jobfile.JobFile)


# 8. Filters whose result is bounded before it is built


OVERSIZED = [
    (
        "{{ ('x\\n' * 1000) | indent(1000000) }}",
        "| indent would make a value of 1,000,002,000 items or bytes, over the limit of 1,048,576",
    ),
    (
        "{{ ('x' * 1000000).replace('x', 'y' * 1000000) }}",
        "str.replace would make a value of 1,000,000,000,000 items or bytes, over the limit of 1,048,576",
    ),
    (
        "{{ ('x' * 1000000) | replace('x', 'y' * 1000) }}",
        "| replace would make a value of 1,000,000,000 items or bytes, over the limit of 1,048,576",
    ),
    ("{{ ['x' * 1000000] * 1000000 }}", "a value written out would be more than 1,048,576 bytes as text"),
    (
        "{{ (['x' * 1000000] * 1000000) | join }}",
        "| join would make a value of 2,000,000 items or bytes, over the limit of 1,048,576",
    ),
    (
        "{{ 'a' ~ (['x' * 1000000] * 1000000) }}",
        "a part of a joined value would be more than 1,048,576 bytes as text",
    ),
    (
        "{{ ('\\t' * 1000000).expandtabs(1000000) }}",
        "str.expandtabs would make a value of 1,000,001,000,000 items or bytes, over the limit of 1,048,576",
    ),
    (
        "{{ ([[1] * 100] * 100) | tojson(indent=1000000) }}",
        "| tojson would make a value of 2,000,000 items or bytes, over the limit of 1,048,576",
    ),
    (
        "{{ ('x ' * 100000) | wordwrap(10, wrapstring='y' * 100000) }}",
        "| wordwrap would make a value of 12,000,300,000 items or bytes, over the limit of 1,048,576",
    ),
]
R007_BODY = (
    "plan: t\njobs:\n  - name: a\n    run: |\n      echo hi\n      echo {{ ('x\\n' * 1000) | indent(1000000) }}\n"
)


@pytest.fixture(scope="module")
def limited_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """Every plan whose check would build a huge value if a bound were missing, checked in one child process
    under a 1 GiB address-space limit: building any of them first would be a MemoryError there (exit 2)."""
    runs: dict[str, tuple[Path, list[str]]] = {}
    for n, (value, _) in enumerate(OVERSIZED):
        where = tmp_path_factory.mktemp(f"oversized{n}")
        (where / "p.yaml").write_text(f'plan: t\nvars:\n  a: "{value}"\njobs: []\n')
        runs[value] = (where, ["check", "p.yaml"])
    where = tmp_path_factory.mktemp("r007")
    (where / "p.yaml").write_text(R007_BODY)
    runs["r007"] = (where, ["check", "p.yaml"])
    runs["/dev/zero"] = (tmp_path_factory.mktemp("device"), ["check", "/dev/zero"])
    return dict(zip(runs, plan_limited(list(runs.values()), MEMORY_LIMIT), strict=True))


# The tests that read limited_runs run on one worker (`--dist loadgroup`): its child process, ~0.45 s of CPU,
# is then started once, not once on each worker that a parametrized case lands on.
@pytest.mark.xdist_group("limited_runs")
@pytest.mark.parametrize(("value", "message"), OVERSIZED)
def test_an_oversized_filter_result_is_refused_before_it_is_built(
    limited_runs: dict[str, Ran], value: str, message: str
) -> None:
    result = limited_runs[value]
    assert result.returncode == 1, result.stderr
    assert result.stdout == f"p.yaml:3:6: error[P011]: var 'a': {message} (raise it with plan --max-size)\n".replace(
        " as text (raise it", " as text (raise the limit"
    )


@pytest.mark.xdist_group("limited_runs")
def test_an_oversized_filter_in_a_job_body_is_an_r007(limited_runs: dict[str, Ran]) -> None:
    result = limited_runs["r007"]
    assert result.returncode == 1, result.stderr
    assert result.stdout == (
        "p.yaml:6:7: error[R007]: job a: | indent would make a value of 1,000,002,000 "
        "items or bytes, over the limit of 1,048,576 (raise it with plan --max-size)\n"
    )


def test_ordinary_filters_still_render(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        "plan: t\nvars:\n"
        "  a: \"{{ ['a', 'b'] | join(', ') }}|{{ [{'n': 'a'}, {'n': 'b'}] | join('-', attribute='n') }}\"\n"
        "  b: \"{{ [[1], [2]] | sum(start=[]) }}|{{ 'x\\ny' | indent(2) }}|{{ 'abc'.replace('b', 'BB') }}\"\n"
        "  c: \"{{ {'k': [1, 2]} | tojson(indent=1) | length }}|{{ (['x' * 1000] * 1000) | length }}\"\n"
        "jobs:\n  - name: j\n    run: echo {{ a }} {{ b }} {{ c }}\n"
    )
    compiled = compile_plan(tmp_path / "p.yaml", lint=False)
    assert found(compiled) == []
    assert compiled.expanded is not None
    assert [compiled.expanded.vars[k] for k in "abc"] == ["a, b|a-b", "[1, 2]|x\n  y|aBBc", "23|1000"]


# 9. A duration with a newline; a header jobfile.format refuses


def test_a_timeout_with_a_newline_is_a_located_p004(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text('plan: t\njobs:\n  - name: a\n    run: echo hi\n    timeout: "10m\\n"\n')
    result = plan(tmp_path, "check", "p.yaml")
    assert result.returncode == 1, result.stderr
    assert result.stdout == (
        "p.yaml:5:14: error[P004]: jobs[0].timeout: not a duration: '10m\\n' (one line: 90, 90s, 10m, 6h or 2d)\n"
    )


def test_a_timeout_with_spaces_is_written_stripped(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text('plan: t\njobs:\n  - name: a\n    run: echo hi\n    timeout: " 10m "\n')
    compiled = compile_plan(tmp_path / "p.yaml", lint=False)
    assert found(compiled) == []
    assert "# TIMEOUT=10m\n" in compiled.jobs[0].text


def test_a_header_value_jobfile_refuses_is_a_located_r010_not_an_internal_error(tmp_path: Path) -> None:
    # model_construct skips validation, as a Python plan's own code may: the renderer still catches it.
    (tmp_path / "p.py").write_text(
        "from plancompiler.models import Job, Plan\n\n"
        "job = Job.model_construct(name='a', lane='cpu', run='echo hi', timeout='1\\n')\n"
        "plan = Plan(plan='t', jobs=[job])\n"
    )
    result = plan(tmp_path, "check", "p.py")
    assert result.returncode == 1, result.stderr
    assert result.stdout == (
        "p.py:3:1: error[R010]: job a: header value for TIMEOUT must be one non-empty line: '1\\n'\n"
    )


# 10. Plan and hosts files that are not regular files, or too large


@pytest.mark.parametrize("name", ["fifo.yaml", "fifo.py"])
def test_a_fifo_plan_is_a_p001_not_a_hang(tmp_path: Path, name: str) -> None:
    os.mkfifo(tmp_path / name)
    with unblocking(tmp_path / name):  # a hang would end, and fail, here
        result = plan(tmp_path, "check", name)
    assert result.returncode == 1, result.stderr
    assert result.stdout == f"{name}:1:1: error[P001]: a FIFO (named pipe), not a plan file\n"


@pytest.mark.xdist_group("limited_runs")
def test_a_device_plan_is_a_p001_not_read_until_memory_runs_out(limited_runs: dict[str, Ran]) -> None:
    result = limited_runs["/dev/zero"]
    assert result.returncode == 1, result.stderr
    assert result.stdout == "/dev/zero:1:1: error[P001]: a device, not a plan file\n"


def test_a_plan_larger_than_max_size_is_a_p001(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(TRIVIAL + "#" + "x" * 2000 + "\n")
    result = plan(tmp_path, "--max-size", "1K", "check", "p.yaml")
    assert result.returncode == 1, result.stderr
    assert result.stdout == (
        "p.yaml:1:1: error[P001]: the plan file is larger than 1,024 bytes (raise the limit with plan --max-size)\n"
    )
    assert plan(tmp_path, "--max-size", "4K", "check", "p.yaml").returncode == 0


def test_a_fifo_or_empty_hosts_file_is_a_located_h001(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.yaml")
    with unblocking(tmp_path / "fifo.yaml"):  # a hang would end, and fail, here
        fifo = plan(tmp_path, "status", "box", "--hosts", "fifo.yaml")
    assert fifo.returncode == 2
    assert fifo.stderr == "plan: fifo.yaml:1:1: error[H001]: a FIFO (named pipe), not a hosts file\n"
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(PlanError) as caught:
        load_hosts(tmp_path / "empty.yaml")
    assert str(caught.value) == f"{tmp_path / 'empty.yaml'}:1:1: error[H001]: hosts file is empty"
    result = plan(tmp_path, "status", "box", "--hosts", "empty.yaml")
    assert result.returncode == 2
    assert result.stderr == "plan: empty.yaml:1:1: error[H001]: hosts file is empty\n"


# 11. --set


def test_a_set_of_a_var_the_plan_lacks_is_a_warning_with_a_suggestion(tmp_path: Path) -> None:
    result = plan(tmp_path, "check", str(REPO / "plans/demo.yaml"), "--set", "wrok=/tmp/x", cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout
        == "plans/demo.yaml:1:1: warning[P013]: --set wrok: no such var in this plan; did you mean 'work'?\n"
    )
    strict = plan(tmp_path, "check", "--strict", str(REPO / "plans/demo.yaml"), "--set", "wrok=/tmp/x", cwd=REPO)
    assert strict.returncode == 1


def test_a_cycle_made_by_set_says_so(tmp_path: Path) -> None:
    result = plan(tmp_path, "check", str(REPO / "plans/demo.yaml"), "--set", "work={{ models }}", cwd=REPO)
    assert result.returncode == 1
    assert result.stdout.splitlines()[0] == (
        "plans/demo.yaml:9:3: error[P010]: vars refer to each other in a "
        "cycle: work -> models -> work (made by --set work)"
    )
    undefined = plan(tmp_path, "check", str(REPO / "plans/demo.yaml"), "--set", "work={{ nope }}", cwd=REPO)
    assert undefined.stdout.splitlines()[0] == (
        "plans/demo.yaml:9:9: error[P011]: var 'work' (--set work={{ nope }}): undefined variable: 'nope' is undefined"
    )


# 21. --templates help


def test_the_templates_help_names_every_directory_template_dirs_searches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    option = typing.get_args(cli.TemplatesOpt)[1]
    assert option.help == (
        "look for templates here first (repeatable); then in templates/ beside the plan, "
        "templates/ in the plan's parent directory, and ./templates"
    )
    for place in ("extra", "a/b/templates", "a/templates", "cwd/templates"):
        (tmp_path / place).mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert template_dirs(tmp_path / "a/b/p.yaml", [tmp_path / "extra"]) == [
        tmp_path / p for p in ("extra", "a/b/templates", "a/templates", "cwd/templates")
    ]

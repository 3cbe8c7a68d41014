"""Every quoting context × a seeded corpus of hostile values, rendered and run by real bash: byte-exact, inert."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from plancompiler.compile import compile_plan

FRAGMENTS = ["$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "&& touch PWNED", "| tee PWNED", "'", '"',
             "\\", "\\\\", "\n", "${IFS}", "!", "*", "?", "EOF", "\nEOF\n", "EOF\n", "\t", " ", "  ", "$HOME",
             "~", "#", "{a,b}", "\\n", "$'x'", "%s", "-n", "--", ")", "(", "<", ">", ">PWNED", "$((1+1))",
             "'$(touch PWNED)'", "\"$(touch PWNED)\"", "\\\"; touch PWNED; \\\"", "'\\''", "é", "\x01", "$", "`",
             "Q", "\nQ\n", "x=1", "$1", "$@", "\\$(touch PWNED)"]


def corpus(seed: int = 13, count: int = 40) -> list[str]:
    rng = random.Random(seed)
    values = [f for f in FRAGMENTS]
    while len(values) < len(FRAGMENTS) + count:
        values.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(2, 5))))
    return values


def _lines_of(prefix: str, value: str, suffix: str) -> list[str]:
    return (prefix + value + suffix).split("\n")


# name: (bash that prints the value, what it prints, whether the value must be refused instead)
Context = tuple[str, Callable[[str], str], Callable[[str], bool]]
CONTEXTS: dict[str, Context] = {
    "bare": ("printf '%s' {{ v }}", lambda v: v, lambda v: False),
    "bare-joined": ("printf '%s' x{{ v }}=y{{ v }}", lambda v: f"x{v}=y{v}", lambda v: False),
    "assignment": ("x={{ v }}\nprintf '%s' \"$x\"", lambda v: v, lambda v: False),
    "double": ('printf \'%s\' "{{ v }}"', lambda v: v, lambda v: False),
    "double-inside": ('printf \'%s\' "<{{ v }}|${HOME_UNSET}{{ v }}>"', lambda v: f"<{v}|{v}>", lambda v: False),
    "single": ("printf '%s' '{{ v }}'", lambda v: v, lambda v: False),
    "single-inside": ("printf '%s' '<{{ v }}>'\"{{ v }}\"", lambda v: f"<{v}>{v}", lambda v: False),
    "heredoc": ("cat <<EOF\n{{ v }}\nEOF", lambda v: v + "\n", lambda v: "EOF" in v.split("\n")),
    "heredoc-framed": ("cat <<EOF\n<{{ v }}> $HOME_UNSET\nEOF", lambda v: f"<{v}> \n",
                       lambda v: "EOF" in _lines_of("<", v, "> $HOME_UNSET")),
    "heredoc-quoted": ("cat <<'Q'\n{{ v }}\nQ", lambda v: v + "\n", lambda v: "Q" in v.split("\n")),
    "heredoc-dash": ("cat <<-EOF\n\t{{ v }}\n\tEOF", lambda v: v + "\n",
                     lambda v: any(ln.lstrip("\t") == "EOF" or ln.startswith("\t") for ln in ("\t" + v).split("\n")[1:])
                     or v.startswith("\t") or v.lstrip("\t") == "EOF" or v.split("\n")[0].lstrip("\t") == "EOF"),
    "cmdsub-in-double": ('x="$(printf \'%s\' {{ v }}; printf x)"\nprintf \'%s\' "${x%x}"', lambda v: v,
                         lambda v: False),
    "double-in-cmdsub": ('x="$(printf \'%s\' "{{ v }}"; printf x)"\nprintf \'%s\' "${x%x}"', lambda v: v,
                         lambda v: False),
    "procsub": ("cat <(printf '%s' {{ v }})", lambda v: v, lambda v: False),
    "herestring": ("cat <<<{{ v }}", lambda v: v + "\n", lambda v: False),
    "if-block": ("if true; then\n  printf '%s' {{ v }}\nfi", lambda v: v, lambda v: False),
    "for-list": ("for w in {{ v }} {{ v }}; do printf '%s|' \"$w\"; done", lambda v: f"{v}|{v}|", lambda v: False),
    "case": ("case {{ v }} in\n  {{ v }}) printf '%s' {{ v }};;\nesac", lambda v: v, lambda v: False),
    "comment": ("# note: {{ v }}\nprintf ok", lambda v: "ok", lambda v: "\n" in v),
    "function-arg": ("show() { printf '%s' \"$1\"; }\nshow {{ v }}", lambda v: v, lambda v: False),
    "bash-c-argument": ("bash -c 'printf \"%s\" \"$1\"' _ {{ v }}", lambda v: v, lambda v: False),
    "printf-string-format": ("printf '%s|%s' {{ v }} 1", lambda v: f"{v}|1", lambda v: False),
    "string-compare": ("[[ {{ v }} == {{ v }} ]] && printf '%s' {{ v }}", lambda v: v, lambda v: False),
    "awk-variable": ("awk -v x=1 'BEGIN { printf \"%s\", ARGV[1] }' {{ v }}", lambda v: v, lambda v: False),
    "sed-file-argument": ("printf '%s' {{ v }} >f\nsed -n p f\nrm f", lambda v: v, lambda v: False),
}


def _plan(tmp_path: Path, values: list[str]) -> Path:
    jobs = []
    for name, (body, _, _) in CONTEXTS.items():
        run = textwrap.indent(body.replace("{{ v }}", "{{ values[i] }}"), "      ")
        jobs.append(f"  - name: \"{name}-{{{{ i }}}}\"\n    foreach: {{i: {list(range(len(values)))}}}\n"
                    f"    run: |\n{run}\n")
    plan = tmp_path / "escape.yaml"
    plan.write_text("plan: escape\nvars:\n  values: " + json.dumps(values) + "\njobs:\n" + "".join(jobs))
    return plan


def test_every_context_prints_every_hostile_value_byte_exact_and_runs_none(tmp_path: Path) -> None:
    values = corpus()
    compiled = compile_plan(_plan(tmp_path, values), lint=False)
    refused = {(d.line, d.message.split(":")[0]) for d in compiled.diagnostics}
    assert all(d.code == "R006" for d in compiled.diagnostics), [d.text() for d in compiled.diagnostics][:5]
    rendered = {job.name: job for job in compiled.jobs}
    work = tmp_path / "work"
    out = tmp_path / "out"
    work.mkdir()
    out.mkdir()
    script = []
    expected: dict[str, str] = {}
    for name, (_, prints, must_refuse) in CONTEXTS.items():
        for i, value in enumerate(values):
            job = rendered.get(f"{name}-{i}")
            if must_refuse(value):
                assert job is None, f"{name} should refuse {value!r}:\n{job.text if job else ''}"
                continue
            assert job is not None, f"{name} refused {value!r}: {sorted(refused)[:3]}"
            body = job.text.split("\n", job.header_lines)[-1]
            # Each case in its own subshell, its stdout to its own file: one bash process runs them all.
            script.append(f"(\n{body}\n) >{out}/{name}-{i} 2>{out}/{name}-{i}.err\n")
            expected[f"{name}-{i}"] = prints(value)
    assert len(expected) >= 600
    (tmp_path / "cases.sh").write_text("".join(script))
    run = subprocess.run(["bash", str(tmp_path / "cases.sh")], cwd=work, capture_output=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home"})
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    wrong = {case: (json.dumps(want), (out / case).read_bytes()) for case, want in expected.items()
             if (out / case).read_bytes() != want.encode()}
    assert not wrong, list(wrong.items())[:5]
    errors = {case: (out / f"{case}.err").read_text() for case in expected if (out / f"{case}.err").stat().st_size}
    assert not errors, list(errors.items())[:5]
    assert sorted(p.name for p in work.iterdir()) == []  # nothing was created: no value ran


@pytest.mark.parametrize("value, what", [("a\0b", "a NUL byte"), ("a\r\nb", "a carriage return"),
                                         ("ok\r", "a carriage return")])
def test_nul_and_cr_are_refused_in_every_context_with_the_place(tmp_path: Path, value: str, what: str) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: t\nvars:\n  v: " + json.dumps(value) + "\njobs:\n" + "".join(
        f"  - name: j{i}\n    run: |\n{textwrap.indent(body, '      ')}\n"
        for i, (body, _, _) in enumerate(CONTEXTS.values())))
    compiled = compile_plan(plan, lint=False)
    assert not compiled.jobs
    assert len(compiled.diagnostics) == len(CONTEXTS)
    for d in compiled.diagnostics:
        assert d.code == "R006" and what in d.message
        line = plan.read_text().split("\n")[d.line - 1]
        assert line[d.col - 1:].startswith("{{ v }}"), (d.text(), line)


UNDECIDABLE = [
    ("echo $(( {{ n }} + 1 ))", "$(( )) arithmetic"),
    ("(( {{ n }} > 1 )) && echo big", "(( )) arithmetic"),
    ("for ((i = 0; i < {{ n }}; i++)); do echo $i; done", "(( )) arithmetic"),
    ("echo $[ {{ n }} + 1 ]", "$[ ] arithmetic"),
    ("echo `echo {{ n }}`", "backticks"),
    ('echo "${x:-{{ n }}}"', "${ } parameter expansion"),
    ("eval echo {{ n }}", "in an eval"),
    ('bash -c "echo {{ n }}"', "after -c"),
    ("sh -c {{ n }}", "after -c"),
    ("sudo -u nobody bash -lc 'echo {{ n }}'", "after -lc"),
    ("ssh host echo {{ n }}", "in an ssh command"),
    ("trap 'echo {{ n }}' EXIT", "as trap's first argument"),
    ("echo ${{ n }}", "right after '$'"),
    ('echo "$HOME{{ n }}"', "would lengthen the variable's name; write ${HOME}"),
    ('echo "\\{{ n }}"', "right after a backslash"),
    ("cat <<{{ n }}\nx\n", "heredoc delimiter"),
    ("echo $'{{ n }}'", "$' ' quoting"),
    ('{% filter upper %}echo {{ n }}{% endfilter %}', "filter"),
    ("bash <<EOF\necho {{ n }}\nEOF", "in a heredoc that bash reads as code"),
    ("ssh host bash <<'EOF'\necho {{ n }}\nEOF", "in a heredoc that ssh reads as code"),
    ("python3 - <<'PY'\nprint({{ n }})\nPY", "in a heredoc that python3 reads as code"),
    ("bash <<<{{ n }}", "in a here-string that bash reads as code"),
    ("[[ 1 -eq {{ n }} ]]", "after -eq inside [[ ]], which is evaluated as arithmetic"),
    ("[[ {{ n }} -gt 1 ]] && echo big", "before -gt inside [[ ]] is evaluated as arithmetic"),
    ("let x={{ n }}+1", "in let's arithmetic"),
    ("declare -i x={{ n }}", "in an integer (-i) assignment"),
    ("arr[{{ n }}]=1", "in an array subscript"),
    ("printf '%05d\\n' {{ n }}", "printf integer format"),
    ("awk '{print \"{{ n }}\"}' file", "as awk's program"),
    ("sed -e 's/a/{{ n }}/' file", "as sed's program"),
    ("perl -e 'print \"{{ n }}\"'", "as perl's program"),
    ("jq '.a == \"{{ n }}\"' f.json", "as jq's program"),
    ('echo "{% if n %}{% endif %}\n{% if n %}"{% endif %}{{ n }}', "differs from where the block opened"),
]


@pytest.mark.parametrize("body, why", UNDECIDABLE)
def test_undecidable_contexts_are_errors_at_the_expression(tmp_path: Path, body: str, why: str) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: t\njobs:\n  - name: a\n    with: {n: 1}\n    run: |\n"
                    + textwrap.indent(body, "      ") + "\n")
    compiled = compile_plan(plan, lint=False)
    assert not compiled.jobs
    assert [d.code for d in compiled.diagnostics] and {d.code for d in compiled.diagnostics} == {"R005"}
    assert any(why in d.message for d in compiled.diagnostics), [d.text() for d in compiled.diagnostics]
    first = compiled.diagnostics[0]
    text = plan.read_text().split("\n")[first.line - 1]
    assert text[first.col - 1:].startswith(("{{", "{%")), (first.text(), text)


def test_sh_is_the_one_way_to_write_code_on_purpose(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(textwrap.dedent("""\
        plan: t
        jobs:
          - name: a
            with: {n: "2 * 3", cmd: "printf '%s' done", words: [a, "b c"]}
            run: |
              echo $(( {{ n | sh }} ))
              {{ cmd | sh }}
              printf '<%s>' {{ words }}
              printf '[%s]' "{{ words }}"
        """))
    compiled = compile_plan(plan)
    assert compiled.clean(), [d.text() for d in compiled.diagnostics]
    body = compiled.jobs[0].text.split("\n", compiled.jobs[0].header_lines)[-1]
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True).stdout
    assert out == "6\ndone<a><b c>[a b c]"


def test_a_body_comment_is_never_read_as_a_header_key(tmp_path: Path) -> None:
    from runner import jobfile

    plan = tmp_path / "p.yaml"
    plan.write_text("plan: t\njobs:\n  - name: a\n    with: {note: 'REQUIRES=touch PWNED'}\n"
                    "    run: |\n      # {{ note }}\n      echo ok\n")
    compiled = compile_plan(plan)
    assert compiled.clean()
    parsed = jobfile.parse("a.job", compiled.jobs[0].text.encode())
    assert isinstance(parsed, jobfile.JobFile) and parsed.requires is None


def test_templates_without_values_are_never_refused_and_case_in_cmdsub_only_refuses_values(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    body = "x=$(case a in a) echo A;; esac)\necho $(( 1 << 2 )) `date` \"${x:-y}\"\neval true\n"
    plan.write_text("plan: t\njobs:\n  - name: a\n    run: |\n" + textwrap.indent(body, "      ")
                    + "  - name: b\n    with: {v: 1}\n    run: |\n"
                    + textwrap.indent(body + "echo {{ v }}\n", "      "))
    compiled = compile_plan(plan, lint=False)
    assert [j.name for j in compiled.jobs] == ["a"]
    assert [(d.code, d.line) for d in compiled.diagnostics] == [("R005", 14)]
    assert "after `case` inside $( )" in compiled.diagnostics[0].message


def test_values_in_an_sh_requirement_are_escaped_like_a_job_body(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(textwrap.dedent("""\
        plan: t
        vars: {evil: "x'; touch PWNED; '"}
        jobs:
          - name: a
            run: echo a
            requires: [{sh: "grep -q {{ evil }} /etc/hostname", external: true}]
          - name: b
            run: echo b
            requires: [{sh: "test $(( {{ evil }} )) -gt 0", external: true}]
        """))
    compiled = compile_plan(plan, lint=False)
    assert [(d.code, d.line) for d in compiled.diagnostics] == [("P011", 9)]
    assert "$(( )) arithmetic" in compiled.diagnostics[0].message
    header = compiled.jobs[0].text.splitlines()[1]
    assert header == "# REQUIRES=grep -q 'x'\"'\"'; touch PWNED; '\"'\"'' /etc/hostname"
    subprocess.run(["bash", "-c", header.removeprefix("# REQUIRES=")], cwd=tmp_path)
    assert not (tmp_path / "PWNED").exists()


def test_an_escaped_dollar_or_backslash_before_a_value_is_fine(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: t\njobs:\n  - name: a\n    with: {v: \"$(touch PWNED)\"}\n    run: |\n"
                    "      printf '%s|' \"\\${{ v }}\" \"\\\\{{ v }}\" \\\\{{ v }} \"\\$x{{ v }}\"\n")
    compiled = compile_plan(plan, lint=False)
    assert compiled.clean(), [d.text() for d in compiled.diagnostics]
    body = compiled.jobs[0].text.split("\n", compiled.jobs[0].header_lines)[-1]
    out = subprocess.run(["bash", "-c", body], cwd=tmp_path, capture_output=True, text=True).stdout
    assert out == "$$(touch PWNED)|\\$(touch PWNED)|\\$(touch PWNED)|$x$(touch PWNED)|"
    assert not (tmp_path / "PWNED").exists()


HOSTILE = ["$(touch PWNED)", "`touch PWNED`", "'; touch PWNED; '", "\"; touch PWNED; \"", "\nEOF\ntouch PWNED\n",
           "a[$(touch PWNED)]", "\\\"; touch PWNED #", "x\ntouch PWNED", "\n\tEOF\ntouch PWNED\n", ")$(touch PWNED)(",
           "} ; touch PWNED ; {", "esac; touch PWNED; case x in x)", "EOF", "-n", "\\", "!$(touch PWNED)"]


class _Grammar:
    """Random but well-formed job bodies: commands, quotes, $( ), blocks, case, heredocs, each with values."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, *options: str) -> str:
        return self.rng.choice(options)

    def dq(self, d: int) -> str:
        parts = ["text ", "{{ v }}", "$x", "${x}", "\\$", '\\"', "-", "'"] + (["$(" + self.stmt(d + 1) + ")"] if d < 3 else [])
        return '"' + "".join(self.rng.choice(parts) for _ in range(self.rng.randint(1, 3))) + '"'

    def arg(self, d: int) -> str:
        sq = "'" + self.pick("text", "{{ v }}", '"', "$x") + "'"
        return self.pick("word", self.dq(d), sq, "pre{{ v }}post", "x={{ v }}", "{{ v }}",
                         "$(" + self.stmt(d + 1) + ")" if d < 3 else "{{ v }}")

    def stmt(self, d: int = 0) -> str:
        simple = self.pick("echo", "printf '%s\\n'", ":", "test -n", "export") + " " + " ".join(
            self.arg(d) for _ in range(self.rng.randint(1, 3)))
        if d > 2:
            return simple
        body = "\n".join(self.pick("line {{ v }}", "{{ v }}", "$x {{ v }}", "plain") for _ in range(2))
        return self.pick(simple, simple, "if true; then " + self.stmt(d + 1) + "; fi", "{ " + self.stmt(d + 1) + "; }",
                         "for i in 1; do " + self.stmt(d + 1) + "; done", "case x in x) " + self.stmt(d + 1) + " ;; esac",
                         "cat <<EOF\n" + body + "\nEOF", "cat <<'EOF'\n" + body + "\nEOF", "x=" + self.dq(d) + "; " + simple)


def test_random_well_formed_templates_never_run_a_value(tmp_path: Path) -> None:
    rng = random.Random(13)
    grammar = _Grammar(rng)
    cases = [("x=1\n" + "\n".join(grammar.stmt() for _ in range(rng.randint(1, 3))) + "\n# {{ v }}\n",
              rng.choice(HOSTILE)) for _ in range(150)]
    plan = tmp_path / "p.yaml"
    plan.write_text("plan: t\njobs:\n" + "".join(f"  - name: j{i}\n    with: {{v: {json.dumps(v)}}}\n    run: "
                                                 f"{json.dumps(t)}\n" for i, (t, v) in enumerate(cases)))
    compiled = compile_plan(plan, lint=False)
    assert {d.code for d in compiled.diagnostics} <= {"R005", "R006"}
    assert len(compiled.jobs) > 60  # most well-formed templates render; the rest are refused with a place
    work = tmp_path / "work"
    for job in compiled.jobs:
        work.mkdir()
        subprocess.run(["bash", "-c", job.text], cwd=work, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
        assert not (work / "PWNED").exists(), (cases[int(job.name[1:])], job.text)
        shutil.rmtree(work)

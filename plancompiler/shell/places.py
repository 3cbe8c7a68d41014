"""Stage 4's shell reader, its placeholders: what quoting each `{{ }}` stands in, and what each `{% %}` does to it.

The scanner (shellscan) reads the text between them; at each placeholder it calls expression() or tag()
here, which judge the value in the scanner's state (is it data, a name, code?) and keep if/for branches
apart, so that a value after them is judged under the words of every branch.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from plancompiler.shell import commands as shellcmd
from plancompiler.shell.frame import EXPR, TAG, Frame, ScanState, Site, signature, words_now

_NAME_PART = re.compile(r"[A-Za-z0-9_\x00]*")
_ASSIGNED = re.compile(r"[A-Za-z0-9_\x00]*(\[[^\]]*\])?\+?=")


def expression(sc: ScanState, line: int, col: int, is_sh: bool, around: tuple[str, str], program: bool = False) -> None:
    """A `{{ }}` at LINE:COL, with AROUND the template text before and after it (PROGRAM: marked | program)."""
    preceding, following = around
    stack = sc.stack
    top = stack[-1]
    cmd = next(f for f in reversed(stack) if f.kind == "cmd")
    _mark_value(sc, top, cmd, line, col)
    if is_sh:
        sc.sites.append(Site(line, col, "sh"))
        return
    if sc.confused:
        sc.problems.append(
            (
                line,
                col,
                "a value after `case` inside $( ): the patterns' ) cannot be told "
                "from the end of the $( ); set a variable with the case outside it",
            )
        )
    if top.kind == "opaque":
        sc.problems.append(
            (
                line,
                col,
                f"a value inside {top.reason} would be read as shell code; "
                'pass it through a variable (x={{ v }}, then "$x") or mark code with | sh',
            )
        )
        sc.sites.append(Site(line, col, "sh"))
        return
    if top.kind in ("cmd", "dq") or (top.kind == "heredoc" and not top.quoted):
        _check_before(sc, line, col, preceding)  # where bash expands: a `$` before it would join it
    if top.kind == "cmd" and top.comment:
        sc.sites.append(Site(line, col, "comment"))
        return
    code, check = _value_code(sc, top, cmd, line, col)
    code = code or _enclosing_code(sc, cmd)
    if cmd.pattern and code.startswith("in command-name position"):
        code = ""  # a case pattern, not a command
    code, check = _named(sc, cmd, line, col, code, check, following, program)
    if code:
        sc.problems.append(
            (
                line,
                col,
                f"a value {code} would be read as code, not data; pass it as an "
                "argument (bash -c '... \"$1\"' _ {{ v }}) or mark code on purpose with | sh",
            )
        )
    if top.kind == "heredoc":
        sc.sites.append(Site(line, col, "qheredoc" if top.quoted else "heredoc", top.delim, top.dash))
    elif top.kind in ("dq", "sq"):
        sc.sites.append(Site(line, col, top.kind, check=check))
    elif cmd.cond:
        sc.sites.append(Site(line, col, "cond", check=check))  # always quoted: -n would be an operator
    else:
        sc.sites.append(Site(line, col, "bare", check=check))


def _named(
    sc: ScanState, cmd: Frame, line: int, col: int, code: str, check: str, following: str, program: bool
) -> tuple[str, str]:
    """A value that names what bash runs or assigns: an assignment's name is refused; a program marked
    `{{ v | program }}` is allowed, checked as a program's name (CODE, CHECK: as judged so far)."""
    if (
        code.startswith("in command-name position")
        and _NAME_PART.fullmatch(cmd.word[:-1])
        and _ASSIGNED.match(following)
    ):
        sc.problems.append(
            (
                line,
                col,
                "a value in an assignment's name: bash assigns only to a name written in the template "
                "(a name with a quoted value in it is run as a command); write the name in the template, "
                "or use printf -v {{ name }} %s VALUE, whose name must be a plain one",
            )
        )
        return "", check
    if not (program and code.endswith(shellcmd.PROGRAM)):
        return code, check
    if re.match(r"in [A-Z_]+, which picks", code):
        return "", check  # a directory or library path in PATH=, LD_PRELOAD=: not a word a wrapper reads
    # `{{ v | program }}`: the template trusts the value as a program to run, by a name no wrapper misreads
    return "", "program" if not cmd.word[:-1].strip("'\"") else "program-in"


def _mark_value(sc: ScanState, top: Frame, cmd: Frame, line: int, col: int) -> None:
    """A value stands here: its heredoc line or command word holds one, and so does every enclosing command."""
    if top.kind == "heredoc":
        top.line_expr = True
    elif not cmd.comment:
        cmd.word_expr = (line, col)
        cmd.word += EXPR  # the word holds a value: it is not empty, and not a comment's start
    if not cmd.comment:
        for frame in sc.stack:
            if frame.kind == "cmd":
                frame.values.append((line, col))  # what a pipeline's later command may read as code
                frame.seen.append((line, col))


def _value_code(sc: ScanState, top: Frame, cmd: Frame, line: int, col: int) -> tuple[str, str]:
    """Why the value would be code where it stands ("" if data), and the check its text must pass."""
    if top.kind == "heredoc":
        return top.code, ""
    if cmd.array:
        subscript = re.match(r"\[[^\]]*$", cmd.word)
        return ("in an array subscript, which is evaluated as arithmetic," if subscript else ""), ""
    if re.match(r"[A-Za-z_][A-Za-z0-9_]*\[[^\]]*$", cmd.word):
        return "in an array subscript, which is evaluated as arithmetic,", ""
    verdicts = [shellcmd.analyse(words, current[:-1], sc.integers) for words, current in words_now(sc.stack)]
    verdict = next((v for v in verdicts if v.code), verdicts[0])
    check = "name" if any(v.check == "name" for v in verdicts) else next((v.check for v in verdicts), "")
    if any(v.herestring for v in verdicts):
        cmd.strings.append((line, col))  # code or not is known when the command ends
    return verdict.code, check


def _enclosing_code(sc: ScanState, cmd: Frame) -> str:
    """Why the output of the $( ) or <( ) a value is in (at any depth) would be code: it lands in an
    interpreter's heredoc, in a code argument (`eval "$(echo {{ v }})"`), or is the file `source` reads."""
    inner = cmd
    depth = next(i for i, f in enumerate(sc.stack) if f is cmd)
    for frame in reversed(sc.stack[:depth]):
        if frame.kind == "heredoc" and frame.code:
            return f"inside a $( ) {frame.code}"
        if frame.kind != "cmd":
            continue
        if inner.procsub and frame.words and frame.words[-1] in ("<", "0<"):
            why = shellcmd.stdin_program(frame.words[:-1])  # `bash < <(...)`: the output is its stdin
            if why:
                return "inside a <( ) " + why.replace("in a heredoc that ", "whose output ").replace(" as code", "")
        name = shellcmd.command(frame.words)[:1]
        if inner.procsub and name and shellcmd.runs_files(name[0]):
            return f"inside a <( ) whose output {name[0]} runs"
        verdict = shellcmd.analyse(frame.words, frame.word, sc.integers)
        if verdict.code:
            return f"inside a $( ) whose output lands {verdict.code}"
        inner = frame
    return ""


def _check_before(sc: ScanState, line: int, col: int, preceding: str) -> None:
    """A `$`, `$NAME` or lone backslash right before a value would join it (`${{ v }}` is `$'...'`). A tag
    between them writes nothing or text of its own: the value may still follow the `$` directly."""
    preceding = preceding.rstrip(TAG)
    slashes = len(preceding) - len(preceding.rstrip("\\"))
    if slashes % 2:
        sc.problems.append(
            (
                line,
                col,
                "a value right after a backslash cannot be escaped: the backslash would join the value's quoting",
            )
        )
        return
    name = re.search(r"(\\*)\$([A-Za-z_][A-Za-z0-9_]*)?$", preceding)
    if name and len(name.group(1)) % 2 == 0:  # the $ is not itself escaped
        if name.group(2):
            sc.problems.append(
                (
                    line,
                    col,
                    f"a value right after ${name.group(2)} would lengthen the "
                    f"variable's name; write ${{{name.group(2)}}}",
                )
            )
        else:
            sc.problems.append(
                (line, col, "a value right after '$' cannot be escaped: the $ would join the value's quoting")
            )


def dangling(sc: ScanState, line: int, col: int, preceding: str) -> None:
    """A `$` or lone backslash right before a tag (or the template's end) joins whatever is written next:
    a value in one of the tag's branches, or the text after an include; what that makes cannot be told."""
    top = sc.stack[-1]
    if not (top.kind == "dq" or (top.kind == "cmd" and not top.comment) or (top.kind == "heredoc" and not top.quoted)):
        return
    preceding = preceding.rstrip(TAG)
    slashes = len(preceding) - len(preceding.rstrip("\\"))
    dollar = re.search(r"(\\*)\$$", preceding)
    if slashes % 2 or (dollar and len(dollar.group(1)) % 2 == 0):
        what = "a backslash" if slashes % 2 else "'$'"
        sc.problems.append(
            (
                line,
                col,
                f"{what} right before a {{% %}} tag or the template's end would join "
                "whatever is written after it; write it inside the tag's branches",
            )
        )


def tag(sc: ScanState, line: int, col: int, info: tuple[str, bool, Any]) -> None:
    name, has_assign, saved = info
    if name in ("if", "for", "block", "with"):
        saved.append(["open", name, _state(sc), [], False])
    elif name in ("elif", "else"):
        if saved and saved[-1][0] == "open":
            _check_same(sc, saved[-1][2], line, col, name)
            saved[-1][3].extend(words_now(sc.stack))
            saved[-1][4] = saved[-1][4] or name == "else"
            _restore(sc, saved[-1][2])
    elif name in ("endif", "endfor", "endblock", "endwith"):
        if saved and saved[-1][0] == "open":
            _close_block(sc, line, col, name, saved.pop())
    else:
        _other_tag(sc, line, col, name, has_assign, saved)


def _other_tag(sc: ScanState, line: int, col: int, name: str, has_assign: bool, saved: list[Any]) -> None:
    """Tags that are no if/for block: macros and set blocks are read on their own, others allowed or not."""
    if name in ("call", "endcall"):
        sc.problems.append(
            (
                line,
                col,
                "{% call %} is not allowed in a job template: its body is written into "
                "the macro's text, in quoting this template cannot see; pass the macro arguments",
            )
        )
    elif name == "macro" or (name == "set" and not has_assign):
        saved.append(("fragment", name, _state(sc)))
        sc.stack, sc.pending = [Frame("cmd")], []
    elif name in ("endmacro", "endset"):
        if saved and saved[-1][0] == "fragment":
            if len(sc.stack) > 1 or sc.pending or sc.stack[0].comment:
                sc.problems.append((line, col, f"the {{% {saved[-1][1]} %}} body ends inside quotes or a heredoc"))
            _restore(sc, saved.pop()[2])
    elif name == "include":
        top = sc.stack[-1]
        if len(sc.stack) > 1 or sc.pending or top.comment or top.word or top.words:
            sc.problems.append((line, col, "include a template only where a command may start"))
    elif name not in ("set", "do", "import", "from", "raw", "endraw"):
        sc.problems.append(
            (
                line,
                col,
                f"{{% {name} %}} is not allowed in a job template: its output could undo the escaping of values",
            )
        )


def _close_block(sc: ScanState, line: int, col: int, name: str, block: list[Any]) -> None:
    """An if/for block ends: a value after it is judged under the words of every branch it may have taken."""
    _, opened, state, alts, had_else = block
    if not _check_same(sc, state, line, col, name) or opened not in ("if", "for"):
        return
    if not had_else or opened == "for":
        alts.extend(words_now(state[0]))  # no branch taken, or no iteration
    cmd = next(f for f in reversed(sc.stack) if f.kind == "cmd")
    now = words_now(sc.stack)
    alts.extend(now[1:])
    cmd.alts = [(a[0], [a[1]]) for i, a in enumerate(alts) if a != now[0] and a not in alts[:i]]
    cmd.alt_cut = len(cmd.word)


def _state(sc: ScanState) -> tuple[list[Frame], list[tuple[str, bool, bool, str]]]:
    return copy.deepcopy(sc.stack), list(sc.pending)


def _restore(sc: ScanState, state: tuple[list[Frame], list[tuple[str, bool, bool, str]]]) -> None:
    sc.stack, sc.pending = copy.deepcopy(state[0]), list(state[1])


def _check_same(
    sc: ScanState, state: tuple[list[Frame], list[tuple[str, bool, bool, str]]], line: int, col: int, name: str
) -> bool:
    if signature(state[0], state[1]) != signature(sc.stack, sc.pending):
        sc.problems.append(
            (
                line,
                col,
                f"the quoting at {{% {name} %}} differs from where the block opened: "
                "open and close quotes and heredocs inside each branch",
            )
        )
        return False
    return True

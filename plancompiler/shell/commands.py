"""What a value does as an argument of a simple command: ordinary data, code, a variable name, or undecidable.

The scanner hands over the command's words as written (quotes kept) and the text of the word the value is
in, before the value. The command is normalised the way bash and the usual wrappers would run it
(assignments, redirections anywhere, `timeout 5`, `env -u X`, `flock F`, ...), then the interpreter it
names is asked where its program comes from (the tables of shelltables).
"""

from __future__ import annotations

import os
import re

from plancompiler.shell.tables import (
    ALWAYS,
    ARITH_OPS,
    ASSIGN,
    DECLARE,
    EXPR,
    FLAGGED,
    KEYWORDS,
    LAUNCHERS,
    POSITIONAL,
    REDIR,
    SHELL,
    WRAPPERS,
)
from plancompiler.shell.verdicts import Verdict, verdict

__all__ = ["ARITH_OPS", "DECLARE", "EXPR", "KEYWORDS", "Verdict", "analyse", "command", "runs_files", "stdin_program"]


PROGRAM = "(mark a trusted program with {{ v | program }})"


def _program(what: str) -> Verdict:
    return Verdict(f"{what} {PROGRAM}")


def unquote(word: str) -> str:
    return re.sub(r"\\(.)", r"\1", word, flags=re.S).replace("'", "").replace('"', "")


def _expansion(word: str) -> bool:
    return "$" in word or "`" in word


def _split(words: list[str]) -> tuple[list[str], int | None, bool]:
    """WORDS (the last holds the value) without redirections and leading assignments: the command's words, the
    index of the value's word among them (None: the value is not one of them) and whether it is a here-string."""
    out: list[str] = []
    at: int | None = None
    herestring = False
    i, last = 0, len(words) - 1
    while i < len(words):
        word = words[i]
        redir = REDIR.fullmatch(word)
        if redir and not word.startswith(("'", '"')):
            target = i if redir.group(3) else i + 1
            if target == last:
                herestring = redir.group(2) == "<<<"
            i = target + 1
            continue
        if not out and (ASSIGN.fullmatch(word) or word in KEYWORDS) and i != last:
            i += 1
            continue
        if i == last:
            at = len(out)
        out.append(word)
        i += 1
    return out, at, herestring


def _unwrap(words: list[str], at: int | None) -> tuple[list[str], int | None]:
    """The command the wrappers in front of WORDS run, and the value's index in it (None: not in it)."""
    while words:
        name = os.path.basename(unquote(words[0]))
        if name in WRAPPERS:
            j = _wrapper_end(name, words)
            handed = _wrapper_shell(name, words, at, j)
            if handed is not None:
                return handed
            j += WRAPPERS[name][1]
            if name == "flock" and j < len(words) and unquote(words[j]) in ("-c", "--command"):
                return ["sh", *words[j:]], (None if at is None or at < j else at - j + 1)
        elif name in LAUNCHERS:
            found = [k for k in range(1, len(words)) if _interpreter(os.path.basename(unquote(words[k])))]
            if not found or name in ALWAYS:
                return words, at
            j = found[0]
        else:
            return words, at
        if at is not None and at < j:
            return [], None  # the value is a wrapper's option or argument
        words, at = words[j:], (None if at is None else at - j)
    return words, at


def _wrapper_end(name: str, words: list[str]) -> int:
    """The index of the first word after wrapper NAME's options (and env's assignments)."""
    takes = WRAPPERS[name][0]
    j = 1
    while j < len(words):
        w = unquote(words[j])
        if w == "--":
            return j + 1
        if w.startswith("-") and len(w) > 1:
            j += 2 if w in takes else 1
        elif name in ("env", "sudo") and ASSIGN.fullmatch(w):
            j += 1
        else:
            break
    return j


def _wrapper_shell(name: str, words: list[str], at: int | None, j: int) -> tuple[list[str], int | None] | None:
    """`env -S` hands its words to a shell, `command -v` runs nothing: what is run then; None otherwise."""
    if name == "env" and any(unquote(w).startswith(("-S", "--split-string")) for w in words[1 : j + 1]):
        return ["sh", "-c", *words[j:]], (None if at is None or at < j else at - j + 2)
    if name == "command" and any(unquote(w) in ("-v", "-V") for w in words[1:j]):
        return [], None
    return None


def _interpreter(name: str) -> bool:
    return bool(
        SHELL.fullmatch(name)
        or any(p.fullmatch(name) for p, _, _ in FLAGGED)
        or any(p[0].fullmatch(name) for p in POSITIONAL)
        or name in ALWAYS
        or name in ("source", ".")
    )


def runs_files(name: str) -> bool:
    """NAME runs a file it is given as code (`source <(...)`, `bash <(...)`)."""
    return name in ("source", ".") or bool(SHELL.fullmatch(name)) or any(p.fullmatch(name) for p, _, _ in FLAGGED)


def command(words: list[str]) -> list[str]:
    """The command WORDS run, wrappers and redirections removed, names unquoted (for the scanner's checks)."""
    split, _, _ = _split([*words, ""])
    found, _ = _unwrap(split[:-1], None)
    return [os.path.basename(unquote(found[0])), *map(unquote, found[1:])] if found else []


def analyse(words: list[str], current: str, integers: set[str]) -> Verdict:
    """What a value in the word CURRENT (its text before the value), after the finished WORDS, is."""
    code_var = re.match(r"(BASH_ENV|ENV|PS[0-4]|PROMPT_COMMAND)\+?=", unquote(current))
    if code_var:
        return Verdict(f"in {code_var.group(1)}, whose value bash expands and runs,")
    path_var = re.match(r"(PATH|LD_PRELOAD|LD_LIBRARY_PATH|LD_AUDIT)\+?=", unquote(current))
    if path_var:
        return _program(f"in {path_var.group(1)}, which picks the programs run")
    split, at, herestring = _split([*words, current + EXPR])
    if herestring:
        return Verdict(herestring=True)
    if at is None:
        return Verdict()
    if at == 0:
        assigned = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=", current)
        if assigned and assigned.group(1) in integers:
            return Verdict("in an assignment to an integer (-i) variable, which is evaluated as arithmetic,")
        if not assigned and current + EXPR == split[0]:
            return _program("in command-name position")
        return Verdict()
    execs = ("-exec", "-execdir", "-ok", "-okdir")
    if unquote(split[at - 1]) in execs and "find" in [os.path.basename(unquote(w)) for w in split[: at - 1]]:
        return _program(f"as the program find {unquote(split[at - 1])} runs")
    found, k = _unwrap(split, at)
    if found and k == 0:
        return _program(f"as the program {unquote(split[0])} runs")
    if not found or k is None:
        return Verdict()
    head = unquote(found[0])
    if _expansion(head):
        return Verdict(
            f"as an argument of {head}, a command that is itself an expansion (what it runs cannot be told),"
        )
    name = os.path.basename(head)
    args = [unquote(w) for w in found[1:k]]
    cur = unquote(current)
    if name in (".", "source") and not args and not cur.startswith("-"):
        return _program(f"as the file {name} runs")
    if SHELL.fullmatch(name) and not cur.startswith(("-", "+")) and _shell_script(args):
        return _program(f"as the script {name} runs")
    return verdict(name, args, cur, integers)


def _shell_script(args: list[str]) -> bool:
    """The next positional word after ARGS is the script file a shell runs (no -c, no script yet)."""
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == "--":
            continue
        elif a.startswith(("-", "+")) and len(a) > 1:
            if ("c" in a[1:] or "s" in a[1:]) and not a.startswith("--"):
                return False
            skip = a in ("--rcfile", "--init-file", "-o", "+o", "-O", "+O")
        else:
            return False
    return not skip


def stdin_program(words: list[str]) -> str:
    """Why a heredoc or here-string feeding WORDS would be read as code: the command reads its program from
    stdin (an interpreter with no program argument), or "" when it reads data."""
    split, _, _ = _split([*words, ""])
    found, _ = _unwrap(split[:-1], None)
    if not found:
        wrapper = os.path.basename(unquote(split[0])) if split else ""
        return f"in a heredoc that {wrapper} reads as code" if wrapper in ("sudo", "doas", "su", "runuser") else ""
    head = unquote(found[0])
    name = os.path.basename(head)
    args = [unquote(w) for w in found[1:]]
    reason = f"in a heredoc that {name} reads as code"
    if split and os.path.basename(unquote(split[0])) == "xargs" and found is not split:
        if not _expansion(head) and verdict(name, args, "", set()).code:  # xargs makes stdin the program
            return f"in a heredoc that xargs {name} reads as code"
    if _expansion(head):
        return f"in a heredoc fed to {head}, a command that is itself an expansion (what it runs cannot be told),"
    if name in ("ssh", "source", ".", "eval"):
        return reason
    if name in LAUNCHERS:
        return ""
    return reason if _program_from_stdin(name, args) else ""


def _program_from_stdin(name: str, args: list[str]) -> bool:
    """Whether interpreter NAME, given ARGS, reads its program from stdin (a shell with -s or no script, ...)."""
    positionals = [a for a in args if not a.startswith(("-", "+")) or a == "-"]
    from_stdin = not positionals or positionals[0] in ("-", "/dev/stdin")
    if name in ("su", "runuser"):  # the positional is the user; without -c the user's shell reads stdin
        return not any(_program_option(a, "c", ("--command", "--session-command")) for a in args)
    if SHELL.fullmatch(name):
        options = "".join(a[1:] for a in args if a.startswith(("-", "+")) and not a.startswith("--"))
        if "c" in options:
            return False
        return "s" in options or from_stdin
    for pattern, letters, longs in FLAGGED:
        if pattern.fullmatch(name):
            code = letters.replace("m", "").replace("M", "")
            return not any(_program_option(a, code, longs) for a in args) and from_stdin
    return False


def _program_option(arg: str, letters: str, longs: tuple[str, ...]) -> bool:
    """ARG gives an interpreter its program: a long option such as --eval, or a cluster holding one of LETTERS."""
    return arg in longs or (arg.startswith("-") and not arg.startswith("--") and any(c in letters for c in arg[1:]))

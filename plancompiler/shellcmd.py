"""What a value does as an argument of a simple command: ordinary data, code, a variable name, or undecidable.

The scanner hands over the command's words as written (quotes kept) and the text of the word the value is
in, before the value. The command is normalised the way bash and the usual wrappers would run it
(assignments, redirections anywhere, `timeout 5`, `env -u X`, `flock F`, ...), then the interpreter it
names is asked where its program comes from (the tables of shelltables).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from plancompiler.shelltables import (
    ALWAYS,
    ARITH_OPS,
    ASSIGN,
    DECLARE,
    EXPR,
    FLAGGED,
    INT_FORMAT,
    KEYWORDS,
    KNOWN_FLAGS,
    LAUNCHERS,
    POSITIONAL,
    REDIR,
    SHELL,
    WRAPPERS,
)

__all__ = ["ARITH_OPS", "DECLARE", "EXPR", "KEYWORDS", "Verdict", "analyse", "command", "runs_files", "stdin_program"]


@dataclass
class Verdict:
    code: str = ""  # why the value would be run or evaluated ("" when it is data)
    check: str = ""  # name: must be a plain variable name; decl: must not start a ( ) compound assignment
    herestring: bool = False  # the value is a here-string: code if the command reads its program from stdin


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
    split, at, herestring = _split([*words, current + EXPR])
    if herestring:
        return Verdict(herestring=True)
    if at is None:
        return Verdict()
    if at == 0:
        assigned = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?\+?=", current)
        if assigned and assigned.group(1) in integers:
            return Verdict("in an assignment to an integer (-i) variable, which is evaluated as arithmetic,")
        return Verdict()
    found, k = _unwrap(split, at)
    if not found or k is None or k == 0:
        return Verdict()
    head = unquote(found[0])
    if _expansion(head):
        return Verdict(
            f"as an argument of {head}, a command that is itself an expansion (what it runs cannot be told),"
        )
    name = os.path.basename(head)
    args = [unquote(w) for w in found[1:k]]
    cur = unquote(current)
    return _verdict(name, args, cur, integers)


def _verdict(name: str, args: list[str], cur: str, integers: set[str]) -> Verdict:
    """ARGS are the finished arguments before the value's word, whose text before the value is CUR."""
    if name in ALWAYS:
        if name == "watch" and args and args[-1] in ("-n", "--interval"):
            return Verdict()
        return Verdict(ALWAYS[name])
    if name in DECLARE:
        return _declare(name, args, cur, integers)
    builtin = _BUILTINS.get(name)
    found = builtin(name, args, cur) if builtin is not None else None
    if found is not None:
        return found
    if SHELL.fullmatch(name):
        return _shell(name, args, cur)
    for pattern, letters, longs in FLAGGED:
        if pattern.fullmatch(name):
            return _flagged(name, args, cur, letters, longs)
    for pattern, takes, code, files, pairs in POSITIONAL:
        if pattern.fullmatch(name):
            return _positional(name, args, cur, takes, code, files, pairs)
    return Verdict()


def _trap(name: str, args: list[str], cur: str) -> Verdict:
    options = [a for a in args if a.startswith("-")]
    if len(options) == len(args) and "--" not in options[:-1] and not cur.startswith("-"):
        return Verdict("as trap's first argument")
    return Verdict()


def _printf(name: str, args: list[str], cur: str) -> Verdict:
    if (args and args[-1] == "-v") or cur.startswith("-v"):
        return Verdict(check="name")
    rest = args[args.index("-v") + 2 :] if "-v" in args else [w for w in args if not w.startswith("-")]
    if rest and EXPR in rest[0]:
        return Verdict(
            "as an argument of printf after a format that is a value (a %d in it would evaluate this as arithmetic),"
        )
    if rest and INT_FORMAT.search(rest[0]):  # the format is written: the value is one of its arguments
        return Verdict("as an argument of a printf integer format (%d), which is evaluated as arithmetic,")
    return Verdict()


_READ_STRINGS = {"-p", "-d", "-i", "-t", "-n", "-N", "-u"}  # options whose argument is a string, not a name
_MAPFILE_STRINGS = {"-d", "-n", "-O", "-s", "-u", "-C", "-c"}


def _read(name: str, args: list[str], cur: str) -> Verdict:
    strings = (
        {"-p", "-d", "-i", "-t", "-n", "-N", "-u"} if name == "read" else {"-d", "-n", "-O", "-s", "-u", "-C", "-c"}
    )
    if name != "read" and (args and args[-1] == "-C" or cur.startswith("-C")):
        return Verdict(f"as {name}'s -C callback, which is run as code")
    return Verdict() if args and args[-1] in strings else Verdict(check="name")


def _complete(name: str, args: list[str], cur: str) -> Verdict | None:
    if args and args[-1] in ("-W", "-C", "-F") or cur.startswith(("-W", "-C")):
        return Verdict(f"after {name} {args[-1] if args else cur[:2]}, which expands or runs it as code")
    return None


def _getopts(name: str, args: list[str], cur: str) -> Verdict | None:
    return Verdict(check="name") if len([a for a in args if not a.startswith("-")]) == 1 else None


def _test(name: str, args: list[str], cur: str) -> Verdict | None:
    if args and args[-1] in ("-v", "-R"):
        return Verdict(check="name")
    if name == "[[" and args and args[-1] in ARITH_OPS:
        return Verdict(f"after {args[-1]} inside [[ ]], which is evaluated as arithmetic,")
    return None


# Builtins that judge their own arguments; None: the command is then judged as any other.
_BUILTINS: dict[str, Callable[[str, list[str], str], Verdict | None]] = {
    "trap": _trap,
    "printf": _printf,
    "unset": lambda name, args, cur: Verdict(check="name"),
    "read": _read,
    "mapfile": _read,
    "readarray": _read,
    "compgen": _complete,
    "complete": _complete,
    "getopts": _getopts,
    "[[": _test,
    "test": _test,
    "[": _test,
}


def _declare(name: str, args: list[str], cur: str, integers: set[str]) -> Verdict:
    flags = "".join(a[1:] for a in args if a.startswith(("-", "+")))
    if cur.startswith(("-", "+")):
        return Verdict()
    if name in ("export", "readonly") and "=" not in cur:
        return Verdict()  # bash 5 refuses a name that is not an identifier here, before reading any subscript
    if "=" not in cur:
        return Verdict(check="name")  # the value is (part of) a variable's name
    var, assigned = cur.split("=", 1)
    if "n" in flags:
        return Verdict(check="name")  # a nameref's target is a name
    if "i" in flags or var.rstrip("+").split("[")[0] in integers:
        return Verdict("in an integer (-i) assignment, which is evaluated as arithmetic,")
    if name in ("export", "readonly"):
        return Verdict()
    if assigned.startswith("("):
        return Verdict("in a compound ( ) assignment, which is evaluated as code,")
    return Verdict(check="decl") if not assigned else Verdict()


def _shell(name: str, args: list[str], cur: str) -> Verdict:
    """bash/sh: with -c anywhere among the options, the first positional argument is the program."""
    has_c = ""
    positional = 0
    skip = False
    ended = False
    for a in args:
        if skip:
            skip = False
        elif not ended and a == "--":
            ended = True
        elif not ended and a.startswith(("-", "+")) and len(a) > 1:
            if a in ("--rcfile", "--init-file"):
                skip = True
            elif not a.startswith("--"):
                has_c = has_c or (a if "c" in a else "")
                skip = "o" in a[1:] or "O" in a[1:]
        else:
            positional += 1
            ended = True
    if not ended and not skip and cur.startswith(("-", "+")):
        return Verdict(f"in an option of {name}, which may be its program")
    if has_c and positional == 0 and not skip:
        return Verdict(f"as {name}'s program (after {has_c})")
    return Verdict()


def _flagged(name: str, args: list[str], cur: str, letters: str, longs: tuple[str, ...]) -> Verdict:
    """python -c, perl -e/-ne/-E, node -p ...: the word after the option (or the rest of its cluster) is code."""

    def flag(a: str) -> bool:
        return a in longs or (a.startswith("-") and not a.startswith("--") and any(c in letters for c in a[1:]))

    if cur.startswith("-") and flag(cur):
        return Verdict(f"in {name}'s program option {cur.rstrip(EXPR)}")
    if args and flag(args[-1]) and (args[-1] in longs or args[-1][-1] in letters):
        return Verdict(f"as {name}'s program (after {args[-1]})")
    return Verdict()


def _positional(
    name: str, args: list[str], cur: str, takes: set[str], code: set[str], files: set[str], pairs: set[str]
) -> Verdict:
    """awk/sed/jq: the program is the first positional argument unless a file option gives it. An option this
    table does not know may or may not take an argument: the value is code if it is the program either way."""
    if args and args[-1] in code or (cur.startswith("-") and any(cur.startswith(c) for c in code if len(c) == 2)):
        return Verdict(f"as {name}'s program (after {args[-1] if args else cur})")
    if any(a in files or a in code or (a[:2] in files | code and not a.startswith("--")) for a in args):
        return Verdict()
    if cur.startswith("-"):
        return Verdict()
    for unknown_takes in (False, True):
        if _program_next(args, takes, pairs, unknown_takes):
            return Verdict(f"as {name}'s program")
    return Verdict()


def _program_next(args: list[str], takes: set[str], pairs: set[str], unknown_takes: bool) -> bool:
    """Whether ARGS hold options only, so that the next word is the program; UNKNOWN_TAKES: an option the
    tables do not know is read as taking an argument."""
    i, positional = 0, 0
    while i < len(args):
        a = args[i]
        if a == "--":
            positional += len(args) - i - 1
            break
        if a.startswith("-") and len(a) > 1:
            if a in pairs:
                i += 3
            elif a in takes or (unknown_takes and "=" not in a and len(a) == 2 and not _known(a, takes)):
                i += 2
            elif unknown_takes and a.startswith("--") and "=" not in a and not _known(a, takes):
                i += 2
            else:
                i += 1  # a flag, `--opt=value`, or a short option with its argument attached (`-F,`)
            continue
        positional += 1
        i += 1
    return positional == 0 and i == len(args)


def _known(option: str, takes: set[str]) -> bool:
    """An option the tables know takes no argument (so is not ambiguous): flags such as -n, -r, -s."""
    return option in KNOWN_FLAGS and option not in takes


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

"""What a value does as an argument of a known command (a builtin, a shell, an interpreter, awk/sed/jq): its Verdict.

shellcmd finds the command a value is an argument of (wrappers, redirections and assignments removed);
verdict() then judges the finished arguments before the value's word and that word's text so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plancompiler.shell.tables import (
    ALWAYS,
    ARITH_OPS,
    DECLARE,
    EXPR,
    FLAGGED,
    INT_FORMAT,
    KNOWN_FLAGS,
    POSITIONAL,
    SHELL,
)


@dataclass
class Verdict:
    code: str = ""  # why the value would be run or evaluated ("" when it is data)
    check: str = ""  # name: must be a plain variable name; decl: must not start a ( ) compound assignment
    herestring: bool = False  # the value is a here-string: code if the command reads its program from stdin


def verdict(name: str, args: list[str], cur: str, integers: set[str]) -> Verdict:
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

"""What a value does as an argument of a simple command: ordinary data, code, a variable name, or undecidable.

The scanner hands over the command's words as written (quotes kept) and the text of the word the value is
in, before the value. The command is normalised the way bash and the usual wrappers would run it
(assignments, redirections anywhere, `timeout 5`, `env -u X`, `flock F`, ...), then the interpreter it
names is asked where its program comes from.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

EXPR = "\x00"  # a value's placeholder, as in shellscan

KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "time", "fi", "done", "esac"}
ARITH_OPS = {"-eq", "-ne", "-lt", "-le", "-gt", "-ge"}
DECLARE = {"declare", "typeset", "local", "export", "readonly"}
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=.*", re.S)
_REDIR = re.compile(r"(\d+|\{[A-Za-z_][A-Za-z0-9_]*\})?(&>>|&>|>>|>\||>&|<&|<>|<<<|<|>)(.*)", re.S)
_SHELL = re.compile(r"(?:ba|da|z|k|mk|c|tc|ya|rba|a|)sh[\d.]*|fish|busybox")
_INT_FORMAT = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[diouxXc]")
# Interpreters whose program is an option's argument: the option letters (in a cluster) and long names.
_FLAGGED = [
    (re.compile(r"python[\d.]*|pypy[\d.]*"), "c", ()),
    (re.compile(r"perl[\d.]*"), "eEmM", ()),
    (re.compile(r"ruby[\d.]*|jruby"), "e", ()),
    (re.compile(r"node(js)?[\d.]*|bun"), "ep", ("--eval", "--print")),
    (re.compile(r"php[\d.]*"), "rBRE", ()),
    (re.compile(r"lua[\d.]*|luajit"), "e", ()),
    (re.compile(r"Rscript|R"), "e", ()),
    (re.compile(r"tclsh[\d.]*|wish[\d.]*|osascript"), "e", ()),
    (re.compile(r"su|runuser"), "c", ("--command", "--session-command")),
]
# Programs whose first positional argument is the program, unless a file option gives it: (options with an
# argument, options whose argument is code, options naming a program file, options taking two arguments).
_POSITIONAL = [
    (
        re.compile(r"[gmn]?awk|busybox-awk"),
        {"-F", "-v", "-W", "-i", "-l", "-E", "--assign", "--field-separator", "--include", "--load"},
        {"-e", "--source"},
        {"-f", "--file", "-E", "--exec"},
        set(),
    ),
    (re.compile(r"sed|gsed"), {"-l", "--line-length"}, {"-e", "--expression"}, {"-f", "--file"}, set()),
    (
        re.compile(r"jq|gojq|jaq"),
        {"--indent", "-L"},
        set(),
        {"-f", "--from-file"},
        {"--arg", "--argjson", "--slurpfile", "--rawfile"},
    ),
]
# Wrappers that run their arguments as a command: options taking an argument, positionals before the command.
_WRAPPERS: dict[str, tuple[set[str], int]] = {
    "sudo": (
        {
            "-u",
            "-g",
            "-C",
            "-D",
            "-h",
            "-p",
            "-r",
            "-t",
            "-U",
            "-T",
            "-R",
            "--user",
            "--group",
            "--chdir",
            "--host",
            "--prompt",
            "--role",
            "--type",
            "--other-user",
            "--command-timeout",
            "--chroot",
        },
        0,
    ),
    "doas": ({"-u", "-C"}, 0),
    "env": ({"-u", "-C", "--unset", "--chdir"}, 0),
    "exec": ({"-a"}, 0),
    "command": (set(), 0),
    "builtin": (set(), 0),
    "time": (set(), 0),
    "nohup": (set(), 0),
    "nice": ({"-n", "--adjustment"}, 0),
    "ionice": ({"-c", "-n", "-p", "-P", "-u", "--class", "--classdata"}, 0),
    "stdbuf": ({"-i", "-o", "-e", "--input", "--output", "--error"}, 0),
    "setsid": (set(), 0),
    "timeout": ({"-s", "-k", "--signal", "--kill-after"}, 1),
    "flock": ({"-w", "-E", "--timeout"}, 1),
    "xargs": (
        {
            "-a",
            "-d",
            "-E",
            "-I",
            "-L",
            "-n",
            "-P",
            "-s",
            "--arg-file",
            "--delimiter",
            "--eof",
            "--replace",
            "--max-lines",
            "--max-args",
            "--max-procs",
            "--max-chars",
            "--process-slot-var",
        },
        0,
    ),
    "chrt": (set(), 1),
    "taskset": (set(), 1),
    "unbuffer": (set(), 0),
    "chroot": ({"--userspec", "--groups"}, 1),
    "coproc": (set(), 0),
}
# Launchers whose options are too many to model: the command they run is their first interpreter-like word.
_LAUNCHERS = {
    "srun",
    "salloc",
    "mpirun",
    "mpiexec",
    "apptainer",
    "singularity",
    "docker",
    "podman",
    "numactl",
    "strace",
    "ltrace",
    "find",
    "uv",
    "conda",
    "poetry",
    "pipenv",
    "pixi",
    "nsenter",
    "unshare",
    "parallel",
}
# Commands whose argument is always code.
_ALWAYS = {
    "eval": "in an eval",
    "ssh": "in an ssh command (the remote shell reads it)",
    "let": "in let's arithmetic",
    "alias": "in an alias, which is read as code",
    "watch": "in a watch command (watch runs it with sh -c)",
    "parallel": "in a parallel command (parallel runs it with a shell)",
}


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
        redir = _REDIR.fullmatch(word)
        if redir and not word.startswith(("'", '"')):
            target = i if redir.group(3) else i + 1
            if target == last:
                herestring = redir.group(2) == "<<<"
            i = target + 1
            continue
        if not out and (_ASSIGN.fullmatch(word) or word in KEYWORDS) and i != last:
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
        if name in _WRAPPERS:
            takes, positionals = _WRAPPERS[name]
            j = 1
            while j < len(words):
                w = unquote(words[j])
                if w == "--":
                    j += 1
                    break
                if w.startswith("-") and len(w) > 1:
                    j += 2 if w in takes else 1
                elif name in ("env", "sudo") and _ASSIGN.fullmatch(w):
                    j += 1
                else:
                    break
            if name == "env" and any(unquote(w).startswith(("-S", "--split-string")) for w in words[1 : j + 1]):
                return ["sh", "-c", *words[j:]], (None if at is None or at < j else at - j + 2)
            if name == "command" and any(unquote(w) in ("-v", "-V") for w in words[1:j]):
                return [], None
            j += positionals
            if name == "flock" and j < len(words) and unquote(words[j]) in ("-c", "--command"):
                return ["sh", *words[j:]], (None if at is None or at < j else at - j + 1)
        elif name in _LAUNCHERS:
            found = [k for k in range(1, len(words)) if _interpreter(os.path.basename(unquote(words[k])))]
            if not found or name in _ALWAYS:
                return words, at
            j = found[0]
        else:
            return words, at
        if at is not None and at < j:
            return [], None  # the value is a wrapper's option or argument
        words, at = words[j:], (None if at is None else at - j)
    return words, at


def _interpreter(name: str) -> bool:
    return bool(
        _SHELL.fullmatch(name)
        or any(p.fullmatch(name) for p, _, _ in _FLAGGED)
        or any(p[0].fullmatch(name) for p in _POSITIONAL)
        or name in _ALWAYS
        or name in ("source", ".")
    )


def runs_files(name: str) -> bool:
    """NAME runs a file it is given as code (`source <(...)`, `bash <(...)`)."""
    return name in ("source", ".") or bool(_SHELL.fullmatch(name)) or any(p.fullmatch(name) for p, _, _ in _FLAGGED)


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
    if name in _ALWAYS:
        if name == "watch" and args and args[-1] in ("-n", "--interval"):
            return Verdict()
        return Verdict(_ALWAYS[name])
    if name == "trap":
        options = [a for a in args if a.startswith("-")]
        if len(options) == len(args) and "--" not in options[:-1] and not cur.startswith("-"):
            return Verdict("as trap's first argument")
        return Verdict()
    if name in DECLARE:
        return _declare(name, args, cur, integers)
    if name == "printf":
        if (args and args[-1] == "-v") or cur.startswith("-v"):
            return Verdict(check="name")
        rest = args[args.index("-v") + 2 :] if "-v" in args else [w for w in args if not w.startswith("-")]
        if rest and EXPR in rest[0]:
            return Verdict(
                "as an argument of printf after a format that is a value (a %d in it would evaluate "
                "this as arithmetic),"
            )
        if rest and _INT_FORMAT.search(rest[0]):  # the format is written: the value is one of its arguments
            return Verdict("as an argument of a printf integer format (%d), which is evaluated as arithmetic,")
        return Verdict()
    if name == "unset":
        return Verdict(check="name")
    if name in ("read", "mapfile", "readarray"):
        strings = (
            {"-p", "-d", "-i", "-t", "-n", "-N", "-u"} if name == "read" else {"-d", "-n", "-O", "-s", "-u", "-C", "-c"}
        )
        if name != "read" and (args and args[-1] == "-C" or cur.startswith("-C")):
            return Verdict(f"as {name}'s -C callback, which is run as code")
        return Verdict() if args and args[-1] in strings else Verdict(check="name")
    if name in ("compgen", "complete") and (args and args[-1] in ("-W", "-C", "-F") or cur.startswith(("-W", "-C"))):
        return Verdict(f"after {name} {args[-1] if args else cur[:2]}, which expands or runs it as code")
    if name == "getopts" and len([a for a in args if not a.startswith("-")]) == 1:
        return Verdict(check="name")
    if name in ("[[", "test", "[") and args and args[-1] in ("-v", "-R"):
        return Verdict(check="name")
    if name == "[[" and args and args[-1] in ARITH_OPS:
        return Verdict(f"after {args[-1]} inside [[ ]], which is evaluated as arithmetic,")
    if _SHELL.fullmatch(name):
        return _shell(name, args, cur)
    for pattern, letters, longs in _FLAGGED:
        if pattern.fullmatch(name):
            return _flagged(name, args, cur, letters, longs)
    for pattern, takes, code, files, pairs in _POSITIONAL:
        if pattern.fullmatch(name):
            return _positional(name, args, cur, takes, code, files, pairs)
    return Verdict()


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
        if positional == 0 and i == len(args):
            return Verdict(f"as {name}'s program")
    return Verdict()


def _known(option: str, takes: set[str]) -> bool:
    """An option the tables know takes no argument (so is not ambiguous): flags such as -n, -r, -s."""
    return (
        option
        in {
            "-n",
            "-r",
            "-s",
            "-E",
            "-z",
            "-u",
            "-c",
            "-e",
            "-j",
            "-a",
            "-S",
            "-C",
            "-M",
            "--tab",
            "--args",
            "--jsonargs",
            "--raw-output",
            "--compact-output",
            "--slurp",
            "--null-input",
            "-i",
            "-P",
        }
        and option not in takes
    )


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
    if name in _LAUNCHERS:
        return ""
    positionals = [a for a in args if not a.startswith(("-", "+")) or a == "-"]
    if _SHELL.fullmatch(name):
        options = "".join(a[1:] for a in args if a.startswith(("-", "+")) and not a.startswith("--"))
        if "c" in options:
            return ""
        return reason if "s" in options or not positionals or positionals[0] in ("-", "/dev/stdin") else ""
    for pattern, letters, longs in _FLAGGED:
        if pattern.fullmatch(name):
            code = letters.replace("m", "").replace("M", "")
            if any(
                a in longs or (a.startswith("-") and not a.startswith("--") and any(c in code for c in a[1:]))
                for a in args
            ):
                return ""
            return reason if not positionals or positionals[0] in ("-", "/dev/stdin") else ""
    return ""

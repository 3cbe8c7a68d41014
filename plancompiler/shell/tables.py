"""The shell's commands as shellcmd judges them: keywords, wrappers, launchers, and where interpreters take code.

Data only: which options take an argument, which option's argument is a program, which commands run their
arguments as code. shellcmd reads these; a command this table does not name is ordinary.
"""

from __future__ import annotations

import re

EXPR = "\x00"  # a value's placeholder, as in shellscan

KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "time", "fi", "done", "esac"}
ARITH_OPS = {"-eq", "-ne", "-lt", "-le", "-gt", "-ge"}
DECLARE = {"declare", "typeset", "local", "export", "readonly"}
ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=.*", re.S)
REDIR = re.compile(r"(\d+|\{[A-Za-z_][A-Za-z0-9_]*\})?(&>>|&>|>>|>\||>&|<&|<>|<<<|<|>)(.*)", re.S)
SHELL = re.compile(r"(?:ba|da|z|k|mk|c|tc|ya|rba|a|)sh[\d.]*|fish|busybox")
INT_FORMAT = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[diouxXc]")
# Interpreters whose program is an option's argument: the option letters (in a cluster) and long names.
FLAGGED = [
    (re.compile(r"python[\d.]*|pypy[\d.]*"), "c", ()),
    (re.compile(r"perl[\d.]*"), "eEmM", ()),
    (re.compile(r"ruby[\d.]*|jruby"), "e", ()),
    (re.compile(r"node(js)?[\d.]*|bun"), "ep", ("--eval", "--print")),
    (re.compile(r"php[\d.]*"), "rBRE", ()),
    (re.compile(r"lua[\d.]*|luajit"), "e", ()),
    (re.compile(r"Rscript|R"), "e", ()),
    (re.compile(r"tclsh[\d.]*|wish[\d.]*|osascript"), "e", ()),
    (re.compile(r"su|runuser"), "c", ("--command", "--session-command")),
    (re.compile(r"script"), "c", ("--command",)),  # script -c runs its argument with $SHELL -c
]
# Programs whose first positional argument is the program, unless a file option gives it: (options with an
# argument, options whose argument is code, options naming a program file, options taking two arguments).
POSITIONAL = [
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
WRAPPERS: dict[str, tuple[set[str], int]] = {
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
LAUNCHERS = {
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
ALWAYS = {
    "eval": "in an eval",
    "ssh": "in an ssh command (the remote shell reads it)",
    "let": "in let's arithmetic",
    "alias": "in an alias, which is read as code",
    "watch": "in a watch command (watch runs it with sh -c)",
    "parallel": "in a parallel command (parallel runs it with a shell)",
}
# Builtins a quoted name still runs, that run their arguments as code, hand them to another command, or take
# variable names (whose subscripts are code): a value marked | program may not name one (a path may: /usr/bin/x).
CODE_BUILTINS = frozenset(
    "eval source . trap let alias fc bind complete compgen enable mapfile readarray read declare typeset local "
    "export readonly unset builtin command exec coproc hash getopts".split()
)
# Options the tables know take no argument (so are not ambiguous): flags such as -n, -r, -s.
KNOWN_FLAGS = frozenset(
    {
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
)

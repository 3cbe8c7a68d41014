"""Stage 4's shell reader: where in bash's quoting each `{{ }}` of a job template stands, or why it cannot be told.

The template's literal text is read the way bash will read the job (quotes, `$( )`, heredocs, comments,
the words of each command), with placeholders for the jinja parts; each `{{ }}` gets a Site (its quoting
context) or a problem with its line and column.
"""
from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from typing import Any

EXPR, TAG = "\x00", "\x01"  # placeholders for `{{ }}` and `{% %}` in the scanned text

_SHELLS = {"bash", "sh", "zsh", "dash", "ksh", "mksh", "fish", "su", "python", "python2", "python3", "busybox"}
_PREFIXES = {"sudo", "env", "exec", "nohup", "command", "time", "nice", "ionice", "stdbuf", "setsid", "builtin"}
_ARITH_OPS = {"-eq", "-ne", "-lt", "-le", "-gt", "-ge"}
_PROGRAMS = {"awk": ({"-F", "-v"}, None), "gawk": ({"-F", "-v"}, None), "mawk": ({"-F", "-v"}, None),
             "nawk": ({"-F", "-v"}, None), "sed": ({"-l"}, "-e"), "jq": ({"--indent", "--tab"}, None),
             "perl": (set(), "-e"), "ruby": (set(), "-e"), "node": (set(), "-e")}
_INT_FORMAT = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?[diouxXc]")
_KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "time", "fi", "done", "esac"}


@dataclass
class _Frame:
    kind: str  # cmd, dq, sq, heredoc, opaque
    closer: str = ""  # cmd: ")" inside $( ); opaque: what ends it
    reason: str = ""  # opaque: why a value cannot go here
    depth: int = 0  # cmd: open ( ; opaque: nesting
    delim: str = ""  # heredoc
    dash: bool = False  # heredoc: <<- strips leading tabs
    quoted: bool = False  # heredoc: <<'EOF' (no expansion)
    words: list[str] = field(default_factory=list)  # cmd: the current simple command's finished words
    word: str = ""  # cmd: the word being read
    comment: bool = False  # cmd: inside a # comment
    code: str = ""  # heredoc: why its body is code (the command it feeds is an interpreter)
    word_expr: tuple[int, int] | None = None  # cmd: where a value stands in the word being read
    last_expr: tuple[int, int] | None = None  # cmd: where a value stood in the last finished word
    line: str = ""  # heredoc: the current line so far
    line_expr: bool = False  # heredoc: the current line holds a value


@dataclass
class Site:
    line: int
    col: int
    context: str  # bare, dq, sq, heredoc, qheredoc, comment, sh
    delim: str = ""
    dash: bool = False


def _signature(stack: list[_Frame], pending: list[tuple[str, bool, bool, str]]) -> tuple[Any, ...]:
    return tuple((f.kind, f.closer, f.delim, f.comment, f.quoted) for f in stack) + (tuple(pending),)


class Scanner:
    """Reads template text as bash would, one character at a time; placeholders stand for jinja parts."""

    def __init__(self) -> None:
        self.places: list[tuple[int, int, bool, Any]] = []
        self.k = 0
        self.confused = False
        self.stack: list[_Frame] = [_Frame("cmd")]
        self.pending: list[tuple[str, bool, bool, str]] = []  # heredocs whose bodies start at the next newline
        self.sites: list[Site] = []
        self.problems: list[tuple[int, int, str]] = []

    # -- the whole text --------------------------------------------------------------------------
    def scan(self, text: str, places: list[tuple[int, int, bool, Any]]) -> None:
        """TEXT with one placeholder per entry of PLACES: (line, col, is_sh, tag-info) each."""
        i, n = 0, len(text)
        self.places, self.k = places, 0
        while i < n:
            ch = text[i]
            if ch == EXPR:
                line, col, is_sh, _ = places[self.k]
                self.k += 1
                self._expression(line, col, is_sh, text[max(0, i - 80):i])
                i += 1
                continue
            if ch == TAG:
                line, col, _, tag = places[self.k]
                self.k += 1
                self._tag(line, col, tag)
                i += 1
                continue
            i = self._char(text, i)

    def _here(self) -> tuple[int, int]:
        """The place of the next placeholder (or the last one): where a problem in plain text is reported."""
        if not self.places:
            return 0, 0
        line, col, _, _ = self.places[min(self.k, len(self.places) - 1)]
        return line, col

    def finish(self, line: int) -> None:
        top = self.stack[-1]
        if len(self.stack) > 1 or self.pending:
            what = {"dq": "a double quote", "sq": "a single quote", "heredoc": f"heredoc {top.delim!r}",
                    "opaque": top.reason, "cmd": "a $( )"}.get(top.kind, top.kind)
            if self.sites or self.problems:
                self.problems.append((line, 1, f"the template ends inside {what}: its values' quoting "
                                      "cannot be decided"))

    # -- one character ---------------------------------------------------------------------------
    def _char(self, text: str, i: int) -> int:
        top = self.stack[-1]
        ch = text[i]
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if top.kind in ("sq", "dq") and len(self.stack) > 1 and self.stack[-2].kind == "cmd":
            self.stack[-2].word += ch  # quoted text is part of the command's word (`printf '%d'`, `-c 'x'`)
        if top.kind == "sq":
            if ch == "'":
                self.stack.pop()
            return i + 1
        if top.kind == "dq":
            if ch == "\\":
                return skip(text, i)
            if ch == '"':
                self.stack.pop()
                return i + 1
            return self._dollar(text, i) if ch in "$`" else i + 1
        if top.kind == "opaque":
            return self._opaque(top, text, i)
        if top.kind == "heredoc":
            return self._heredoc(top, text, i)
        return self._cmd(top, text, i, ch, nxt)

    def _dollar(self, text: str, i: int) -> int:
        """`$(`, `$((`, `${`, `$'`, `` ` `` in any context that expands them."""
        ch, rest = text[i], text[i + 1:i + 3]
        if ch == "`":
            self.stack.append(_Frame("opaque", "`", "backticks"))
            return i + 1
        if rest.startswith("(("):
            self.stack.append(_Frame("opaque", "))", "$(( )) arithmetic"))
            return i + 3
        if rest.startswith("("):
            self.stack.append(_Frame("cmd", ")"))
            return i + 2
        if rest.startswith("{"):
            self.stack.append(_Frame("opaque", "}", "a ${ } parameter expansion"))
            return i + 2
        if rest.startswith("["):
            self.stack.append(_Frame("opaque", "]", "$[ ] arithmetic"))
            return i + 2
        if rest.startswith("'") and self.stack[-1].kind == "cmd":
            self.stack.append(_Frame("opaque", "'", "$' ' quoting"))
            return i + 2
        return i + 1

    def _opaque(self, top: _Frame, text: str, i: int) -> int:
        ch = text[i]
        if ch == "\\":
            return skip(text, i)
        if top.closer == "))":
            if ch == "(":
                top.depth += 1
            elif ch == ")":
                if top.depth:
                    top.depth -= 1
                elif text.startswith("))", i):
                    self.stack.pop()
                    return i + 2
            return i + 1
        if top.closer == "}" and ch == "{":
            top.depth += 1
        elif ch == top.closer:
            if top.depth:
                top.depth -= 1
            else:
                self.stack.pop()
        return i + 1

    def _heredoc(self, top: _Frame, text: str, i: int) -> int:
        ch = text[i]
        if ch == "\n":
            line = top.line.lstrip("\t") if top.dash else top.line
            if line == top.delim and not top.line_expr:
                self.stack.pop()
            top.line, top.line_expr = "", False
            return i + 1
        top.line += ch
        if not top.quoted:
            if ch == "\\":
                if i + 1 < len(text) and text[i + 1] not in (EXPR, TAG):
                    top.line += text[i + 1]
                return skip(text, i)
            if ch in "$`":
                return self._dollar(text, i)
        return i + 1

    def _cmd(self, top: _Frame, text: str, i: int, ch: str, nxt: str) -> int:
        if top.comment:
            if ch == "\n":
                top.comment = False
                return self._newline(top, i)
            return i + 1
        if ch == "\\":
            if nxt == "\n":
                return i + 2
            top.word += ch
            return skip(text, i)
        if ch in " \t":
            self._end_word(top)
            return i + 1
        if ch == "\n":
            self._end_word(top)
            top.words = []
            return self._newline(top, i)
        if ch == "#" and not top.word:
            top.comment = True
            return i + 1
        if ch == "'":
            self.stack.append(_Frame("sq"))
            top.word += ch
            return i + 1
        if ch == '"':
            self.stack.append(_Frame("dq"))
            top.word += ch
            return i + 1
        if ch in "$`":
            top.word += ch
            return self._dollar(text, i)
        if ch in "<>" and nxt == "(":
            self.stack.append(_Frame("cmd", ")"))
            top.word += ch
            return i + 2
        if ch == "<" and nxt == "<":
            return self._heredoc_op(top, text, i)
        if ch == "(":
            if text.startswith("((", i) and not top.word and (not top.words or top.words == ["for"]):
                self.stack.append(_Frame("opaque", "))", "(( )) arithmetic"))
                return i + 2
            top.depth += 1
            self._end_word(top)
            top.words = []
            return i + 1
        if ch == ")":
            self._end_word(top)
            top.words = []
            if top.depth:
                top.depth -= 1
            elif top.closer == ")":
                self.stack.pop()
            return i + 1
        if ch in ";&|":
            self._end_word(top)
            top.words = []
            return i + 1
        top.word += ch
        return i + 1

    def _end_word(self, top: _Frame) -> None:
        if top.word:
            word = top.word
            top.word = ""
            last, top.last_expr, top.word_expr = top.last_expr, top.word_expr, None
            if top.words and top.words[0] == "[[" and word in _ARITH_OPS and last:
                self.problems.append((*last, f"a value before {word} inside [[ ]] is evaluated as arithmetic, "
                                      "which runs $( ) in it; compare strings with ==, or check it is a number"))
            if not top.words and (word in _KEYWORDS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word)):
                return  # a keyword or an assignment before the command: the command is still to come
            if top.closer == ")" and word == "case":
                self.confused = True  # a pattern's `)` would read as the end of the $( ): values after it are unsure
            top.words.append(word)

    def _newline(self, top: _Frame, i: int) -> int:
        if self.pending:
            # Bodies follow in the order their operators appeared; the first one read is on top.
            for delim, dash, quoted, why in reversed(self.pending):
                self.stack.append(_Frame("heredoc", delim=delim, dash=dash, quoted=quoted, code=why))
            self.pending = []
        return i + 1

    def _heredoc_op(self, top: _Frame, text: str, i: int) -> int:
        j = i + 2
        if text.startswith("<", j):
            top.word += "<<<"
            return j + 1  # a here-string: the next word is an ordinary word
        dash = text.startswith("-", j)
        j += dash
        while j < len(text) and text[j] in " \t":
            j += 1
        start = j
        while j < len(text) and text[j] not in " \t\n;&|<>()" + EXPR + TAG:
            j += 1
        word = text[start:j]
        if j < len(text) and text[j] in (EXPR, TAG) or not word:
            self.problems.append((*self._here(), "a heredoc delimiter must be written in the template, not a "
                                  "value"))
            return j
        quoted = any(c in word for c in "'\"\\")
        command = _command(top.words)
        why = f"in a heredoc that {command[0]} reads as code" if command and command[0] in _INTERPRETERS else ""
        self.pending.append((word.replace("'", "").replace('"', "").replace("\\", ""), dash, quoted, why))
        self._end_word(top)
        return j

    # -- placeholders ----------------------------------------------------------------------------
    def _expression(self, line: int, col: int, is_sh: bool, preceding: str) -> None:
        stack = self.stack
        top = stack[-1]
        cmd = next(f for f in reversed(stack) if f.kind == "cmd")
        if top.kind == "heredoc":
            top.line_expr = True
        elif not cmd.comment:
            cmd.word_expr = (line, col)
            cmd.word += EXPR  # the word holds a value: it is not empty, and not a comment's start
        if is_sh:
            self.sites.append(Site(line, col, "sh"))
            return
        if self.confused:
            self.problems.append((line, col, "a value after `case` inside $( ): the patterns' ) cannot be told "
                                  "from the end of the $( ); set a variable with the case outside it"))
        if top.kind == "opaque":
            self.problems.append((line, col, f"a value inside {top.reason} would be read as shell code; "
                                  "pass it through a variable (x={{ v }}, then \"$x\") or mark code with | sh"))
            self.sites.append(Site(line, col, "sh"))
            return
        expands = top.kind in ("cmd", "dq") or (top.kind == "heredoc" and not top.quoted)
        if expands:
            self._check_before(line, col, preceding)
        if top.kind == "cmd" and top.comment:
            self.sites.append(Site(line, col, "comment"))
            return
        code = top.code if top.kind == "heredoc" else self._code_position(cmd)
        if code:
            self.problems.append((line, col, f"a value {code} would be read as code, not data; pass it as an "
                                  "argument (bash -c '... \"$1\"' _ {{ v }}) or mark code on purpose with | sh"))
        if top.kind == "heredoc":
            self.sites.append(Site(line, col, "qheredoc" if top.quoted else "heredoc", top.delim, top.dash))
        elif top.kind in ("dq", "sq"):
            self.sites.append(Site(line, col, top.kind))
        elif _command(cmd.words)[:1] == ["[["]:
            self.sites.append(Site(line, col, "cond"))  # always quoted: a bare -n would be read as an operator
        else:
            self.sites.append(Site(line, col, "bare"))

    def _check_before(self, line: int, col: int, preceding: str) -> None:
        """A `$`, `$NAME` or lone backslash right before a value would join it (`${{ v }}` is `$'...'`)."""
        slashes = len(preceding) - len(preceding.rstrip("\\"))
        if slashes % 2:
            self.problems.append((line, col, "a value right after a backslash cannot be escaped: the backslash would "
                                  "join the value's quoting"))
            return
        name = re.search(r"(\\*)\$([A-Za-z_][A-Za-z0-9_]*)?$", preceding)
        if name and len(name.group(1)) % 2 == 0:  # the $ is not itself escaped
            if name.group(2):
                self.problems.append((line, col, f"a value right after ${name.group(2)} would lengthen the "
                                      f"variable's name; write ${{{name.group(2)}}}"))
            else:
                self.problems.append((line, col, "a value right after '$' cannot be escaped: the $ would join "
                                      "the value's quoting"))

    @staticmethod
    def _code_position(cmd: _Frame) -> str:
        """Why a value in CMD's current word would be run or evaluated, or "" when it is an ordinary argument."""
        words = _command(cmd.words)
        if not words:
            if re.match(r"[A-Za-z_][A-Za-z0-9_]*\[[^\]]*$", cmd.word):
                return "in an array subscript, which is evaluated as arithmetic,"
            return ""
        name, args = words[0], words[1:]
        if re.match(r"[A-Za-z_][A-Za-z0-9_]*\[[^\]]*$", cmd.word):
            return "in an array subscript, which is evaluated as arithmetic,"
        if cmd.word.startswith("<<<") and name in _INTERPRETERS:
            return f"in a here-string that {name} reads as code"
        if name == "eval":
            return "in an eval"
        if name == "ssh":
            return "in an ssh command (the remote shell reads it)"
        if name == "let":
            return "in let's arithmetic"
        if name in ("declare", "typeset", "local", "export", "readonly") and any(
                re.fullmatch(r"-[A-Za-z]*i[A-Za-z]*", w) for w in args):
            return "in an integer (-i) assignment, which is evaluated as arithmetic,"
        if name == "[[" and args and args[-1] in _ARITH_OPS:
            return f"after {args[-1]} inside [[ ]], which is evaluated as arithmetic,"
        if name == "printf":
            rest = args[args.index("-v") + 2:] if "-v" in args else [w for w in args if not w.startswith("-")]
            if rest and _INT_FORMAT.search(rest[0]):  # the format is written: the value is one of its arguments
                return "as an argument of a printf integer format (%d), which is evaluated as arithmetic,"
        if name in ("trap", "alias", "watch") and not args:
            return f"as {name}'s first argument"
        if args and re.fullmatch(r"-[A-Za-z]*c", args[-1]) and any(w in _SHELLS for w in [name, *args[:-1]]):
            return f"after {args[-1]}"
        if name in _PROGRAMS:
            takes, program_flag = _PROGRAMS[name]
            if program_flag and args and args[-1] == program_flag:
                return f"as {name}'s program"
            if program_flag == "-e" and name in ("perl", "ruby", "node"):
                return ""
            if "-f" in args or (program_flag and program_flag in args):
                return ""
            positional = [w for i, w in enumerate(args) if not w.startswith("-") and not (i and args[i - 1] in takes)]
            if not positional:
                return f"as {name}'s program"
        return ""

    def _tag(self, line: int, col: int, tag: tuple[str, bool, Any]) -> None:
        name, has_assign, saved = tag
        if name in ("if", "for", "block", "with"):
            saved.append(("open", name, self._state()))
            return
        if name in ("elif", "else"):
            if saved and saved[-1][0] == "open":
                self._check_same(saved[-1][2], line, col, name)
                self._restore(saved[-1][2])
            return
        if name in ("endif", "endfor", "endblock", "endwith"):
            if saved and saved[-1][0] == "open":
                self._check_same(saved.pop()[2], line, col, name)
            return
        if name in ("macro", "call") or (name == "set" and not has_assign):
            saved.append(("fragment", name, self._state()))
            self.stack, self.pending = [_Frame("cmd")], []
            return
        if name in ("endmacro", "endcall", "endset"):
            if saved and saved[-1][0] == "fragment":
                if len(self.stack) > 1 or self.pending or self.stack[0].comment:
                    self.problems.append((line, col, f"the {{% {saved[-1][1]} %}} body ends inside quotes or a "
                                          "heredoc"))
                self._restore(saved.pop()[2])
            return
        if name == "include":
            top = self.stack[-1]
            if len(self.stack) > 1 or self.pending or top.comment or top.word:
                self.problems.append((line, col, "include a template only where a command may start"))
            return
        if name in ("set", "do", "import", "from", "raw", "endraw"):
            return
        self.problems.append((line, col, f"{{% {name} %}} is not allowed in a job template: its output could "
                              "undo the escaping of values"))

    def _state(self) -> tuple[list[_Frame], list[tuple[str, bool, bool, str]]]:
        return copy.deepcopy(self.stack), list(self.pending)

    def _restore(self, state: tuple[list[_Frame], list[tuple[str, bool, bool, str]]]) -> None:
        self.stack, self.pending = copy.deepcopy(state[0]), list(state[1])

    def _check_same(self, state: tuple[list[_Frame], list[tuple[str, bool, bool, str]]], line: int, col: int,
                    name: str) -> None:
        if _signature(state[0], state[1]) != _signature(self.stack, self.pending):
            self.problems.append((line, col, f"the quoting at {{% {name} %}} differs from where the block opened: "
                                  "open and close quotes and heredocs inside each branch"))


_INTERPRETERS = _SHELLS | {"ssh", "eval", "source", "."} | set(_PROGRAMS)


def _command(words: list[str]) -> list[str]:
    """WORDS without the wrappers before the real command (sudo -u x, env A=b, timeout 5, nohup ...)."""
    found = [os.path.basename(w.strip("'\"")) if i == 0 else w.strip("'\"") for i, w in enumerate(words)]
    while found and found[0] in _PREFIXES:
        found.pop(0)
        while found and (found[0].startswith("-") or re.fullmatch(r"[\d.]+[smhd]?|\w+=.*", found[0])):
            found.pop(0)
        if found:
            found[0] = os.path.basename(found[0])
    return found


def skip(text: str, i: int) -> int:
    """Past the backslash at I and the character it escapes, unless that is a placeholder."""
    return i + 1 if i + 1 < len(text) and text[i + 1] in (EXPR, TAG) else i + 2

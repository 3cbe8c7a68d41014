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

_SHELLS = {"bash", "sh", "zsh", "dash", "ksh", "mksh", "fish", "su", "python", "python2", "python3", "perl",
           "ruby", "node", "busybox"}
_PREFIXES = {"sudo", "env", "exec", "nohup", "command", "time", "nice", "ionice", "stdbuf", "setsid", "builtin"}
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
    line: str = ""  # heredoc: the current line so far
    line_expr: bool = False  # heredoc: the current line holds a value


@dataclass
class Site:
    line: int
    col: int
    context: str  # bare, dq, sq, heredoc, qheredoc, comment, sh
    delim: str = ""
    dash: bool = False


def _signature(stack: list[_Frame], pending: list[tuple[str, bool, bool]]) -> tuple[Any, ...]:
    return tuple((f.kind, f.closer, f.delim, f.comment, f.quoted) for f in stack) + (tuple(pending),)


class Scanner:
    """Reads template text as bash would, one character at a time; placeholders stand for jinja parts."""

    def __init__(self) -> None:
        self.places: list[tuple[int, int, bool, Any]] = []
        self.k = 0
        self.confused = False
        self.stack: list[_Frame] = [_Frame("cmd")]
        self.pending: list[tuple[str, bool, bool]] = []  # heredocs whose bodies start at the next newline
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
                return i + 2
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
            if text.startswith("((", i) and not top.word and not top.words:
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
            if not top.words and (word in _KEYWORDS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word)):
                return  # a keyword or an assignment before the command: the command is still to come
            if top.closer == ")" and word == "case":
                self.confused = True  # a pattern's `)` would read as the end of the $( ): values after it are unsure
            top.words.append(word)

    def _newline(self, top: _Frame, i: int) -> int:
        if self.pending:
            # Bodies follow in the order their operators appeared; the first one read is on top.
            for delim, dash, quoted in reversed(self.pending):
                self.stack.append(_Frame("heredoc", delim=delim, dash=dash, quoted=quoted))
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
        self.pending.append((word.replace("'", "").replace('"', "").replace("\\", ""), dash, quoted))
        self._end_word(top)
        return j

    # -- placeholders ----------------------------------------------------------------------------
    def _expression(self, line: int, col: int, is_sh: bool, preceding: str) -> None:
        stack = self.stack
        top = stack[-1]
        cmd = next(f for f in reversed(stack) if f.kind == "cmd")
        if top.kind == "heredoc":
            top.line_expr = True
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
        before = preceding[-1:]
        if expands and (before == "$" or before == "\\"):
            self.problems.append((line, col, f"a value right after {before!r} cannot be escaped: the {before} would "
                                  "join the value's quoting"))
        name = re.search(r"(?<!\\)\$([A-Za-z_][A-Za-z0-9_]*)$", preceding)
        if expands and name:
            self.problems.append((line, col, f"a value right after ${name.group(1)} would lengthen the variable's "
                                  f"name; write ${{{name.group(1)}}}"))
        if top.kind == "cmd" and top.comment:
            self.sites.append(Site(line, col, "comment"))
            return
        if top.kind != "heredoc" or not top.quoted:
            code = self._code_position(cmd)
            if code:
                self.problems.append((line, col, f"a value {code} is run as shell code; pass it as an argument "
                                      "(bash -c '... \"$1\"' _ {{ v }}) or mark code on purpose with | sh"))
        if top.kind == "heredoc":
            self.sites.append(Site(line, col, "qheredoc" if top.quoted else "heredoc", top.delim, top.dash))
        elif top.kind in ("dq", "sq"):
            self.sites.append(Site(line, col, top.kind))
        else:
            self.sites.append(Site(line, col, "bare"))

    @staticmethod
    def _code_position(cmd: _Frame) -> str:
        words = [os.path.basename(w.strip("'\"")) for w in cmd.words]
        while words and words[0] in _PREFIXES:
            words.pop(0)
            while words and (words[0].startswith("-") or re.fullmatch(r"[\d.]+[smhd]?|\w+=.*", words[0])):
                words.pop(0)
        if not words:
            return ""
        if words[0] == "eval":
            return "in an eval"
        if words[0] == "ssh":
            return "in an ssh command"
        if words[0] in ("trap", "alias", "watch") and len(words) == 1:
            return f"as {words[0]}'s first argument"
        if re.fullmatch(r"-[A-Za-z]*c", words[-1]) and any(w in _SHELLS for w in words[:-1]):
            return f"after {words[-1]}"
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

    def _state(self) -> tuple[list[_Frame], list[tuple[str, bool, bool]]]:
        return copy.deepcopy(self.stack), list(self.pending)

    def _restore(self, state: tuple[list[_Frame], list[tuple[str, bool, bool]]]) -> None:
        self.stack, self.pending = copy.deepcopy(state[0]), list(state[1])

    def _check_same(self, state: tuple[list[_Frame], list[tuple[str, bool, bool]]], line: int, col: int,
                    name: str) -> None:
        if _signature(state[0], state[1]) != _signature(self.stack, self.pending):
            self.problems.append((line, col, f"the quoting at {{% {name} %}} differs from where the block opened: "
                                  "open and close quotes and heredocs inside each branch"))


def skip(text: str, i: int) -> int:
    """Past the backslash at I and the character it escapes, unless that is a placeholder."""
    return i + 1 if i + 1 < len(text) and text[i + 1] in (EXPR, TAG) else i + 2

"""Stage 4's shell reader: where in bash's quoting each `{{ }}` of a job template stands, or why it cannot be told.

The template's literal text is read the way bash will read the job (quotes, `$( )`, heredocs, comments,
the words of each command), with placeholders for the jinja parts; each `{{ }}` gets a Site (its quoting
context) or a problem with its line and column.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from plancompiler import shellcmd
from plancompiler.shellcmd import ARITH_OPS, DECLARE, EXPR, KEYWORDS

TAG = "\x01"  # placeholder for `{% %}` in the scanned text (EXPR, "\x00", stands for `{{ }}`)
_REDIR_START = re.compile(r"(\d+|\{[A-Za-z_][A-Za-z0-9_]*\})?[<>&]*")  # a word a redirection may go on
_ARRAY_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


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
    cond: bool = False  # cmd: inside [[ ]], where && || ( ) are the test's operators, not the command's end
    array: bool = False  # cmd: the elements of a compound array assignment a=( ... )
    heredocs: list[int] = field(default_factory=list)  # cmd: pending heredocs of this command, decided at its end
    strings: list[tuple[int, int]] = field(default_factory=list)  # cmd: values in this command's here-strings
    values: list[tuple[int, int]] = field(default_factory=list)  # cmd: values in this command (nested ones too)
    piped: list[tuple[int, int]] = field(default_factory=list)  # cmd: values of the pipeline's earlier commands
    piped_docs: list[int] = field(default_factory=list)  # cmd: their heredocs (pending indices)
    alts: list[tuple[list[str], list[str]]] = field(default_factory=list)  # cmd: other {% if %} branches' words
    procsub: bool = False  # cmd: the inside of <( ): its output is a file the outer command reads
    alt_cut: int = 0  # cmd: how much of `word` was read before the branches closed (alts have their own start)


@dataclass
class Site:
    line: int
    col: int
    context: str  # bare, dq, sq, heredoc, qheredoc, comment, sh
    delim: str = ""
    dash: bool = False
    check: str = ""  # name: the value must be a plain variable name; decl: must not start a ( ) array


def _signature(stack: list[_Frame], pending: list[tuple[str, bool, bool, str]]) -> tuple[Any, ...]:
    return tuple((f.kind, f.closer, f.delim, f.comment, f.quoted, f.cond, f.array) for f in stack) + (tuple(pending),)


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
        self.integers: set[str] = set()  # names declared -i: assigning a value to them is arithmetic
        self.text = ""

    # -- the whole text --------------------------------------------------------------------------
    def scan(self, text: str, places: list[tuple[int, int, bool, Any]]) -> None:
        """TEXT with one placeholder per entry of PLACES: (line, col, is_sh, tag-info) each."""
        i, n = 0, len(text)
        self.places, self.k, self.text = places, 0, text
        while i < n:
            ch = text[i]
            if ch == EXPR:
                line, col, is_sh, _ = places[self.k]
                self.k += 1
                self._expression(line, col, is_sh, text[max(0, i - 80) : i])
                i += 1
                continue
            if ch == TAG:
                line, col, _, tag = places[self.k]
                self.k += 1
                self._dangling(line, col, text[max(0, i - 80) : i])
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
        """Every template must end where it started (an included one is read on its own, and whatever follows
        its include would be read in the quoting it left open). A heredoc's last line needs no newline."""
        top = self.stack[-1]
        if (
            top.kind == "heredoc"
            and not top.line_expr
            and (top.line.lstrip("\t") if top.dash else top.line) == top.delim
        ):
            self.stack.pop()
            top = self.stack[-1]
        if top.kind == "cmd" and len(self.stack) == 1:
            self._end_word(top)
            self._end_command(top)
        if len(self.stack) > 1 or self.pending:
            what = {
                "dq": "a double quote",
                "sq": "a single quote",
                "heredoc": f"heredoc {top.delim!r}",
                "opaque": top.reason,
                "cmd": "a $( )",
            }.get(top.kind, top.kind)
            if top.kind == "cmd" and top.array:
                what = "an array's ( )"
            self.problems.append(
                (
                    line,
                    1,
                    f"the template ends inside {what}: the quoting of what follows it "
                    "(its values, or the text after an include of it) cannot be decided",
                )
            )
        elif not top.comment:
            self._dangling(line, 1, self.text[-80:])

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
                if nxt not in (EXPR, TAG, "") and self.stack[-2].kind == "cmd":
                    self.stack[-2].word += nxt  # the escaped character is part of the word too
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
        ch, rest = text[i], text[i + 1 : i + 3]
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
            top.word += ch if nxt in (EXPR, TAG, "") else ch + nxt  # `\eval` is still eval
            return skip(text, i)
        if ch in " \t\n":
            self._end_word(top)
            if ch == "\n":
                if not top.cond:
                    self._end_command(top)
                return self._newline(top, i)
            return i + 1
        if ch == "#" and not top.word:
            top.comment = True
            return i + 1
        if ch in "'\"$`":
            return self._quote(top, text, i, ch)
        if ch in "<>&|()":
            done = self._operator(top, text, i, ch, nxt)
            if done is not None:
                return done
        if ch in "()":
            return self._paren(top, text, i, ch)
        if ch in ";&|":
            self._end_word(top)
            pipe = ch == "|" and nxt != "|" and text[i - 1 : i] != "|" or ch == "&" and text[i - 1 : i] == "|"
            self._end_command(top, pipe)
            return i + 1
        top.word += ch
        return i + 1

    def _quote(self, top: _Frame, text: str, i: int, ch: str) -> int:
        """A quote, `$` or backtick in a command: part of the word, and the start of what it opens."""
        top.word += ch
        if ch == "'":
            self.stack.append(_Frame("sq"))
            return i + 1
        if ch == '"':
            self.stack.append(_Frame("dq"))
            return i + 1
        return self._dollar(text, i)

    def _operator(self, top: _Frame, text: str, i: int, ch: str, nxt: str) -> int | None:
        """Process substitutions, redirections, heredocs and [[ ]]'s operators; None: CH is none of them."""
        if ch in "<>":
            if nxt == "(":
                self.stack.append(_Frame("cmd", ")", procsub=ch == "<"))
                top.word += ch
                return i + 2
            if top.word and not _REDIR_START.fullmatch(top.word):
                self._end_word(top)  # `eval>&2`, `bash<<<x`: bash splits the word before a redirection
            if ch == "<" and nxt == "<" and not top.cond:
                return self._heredoc_op(top, text, i)
        if top.cond and ch in "&|()":
            self._end_word(top)  # an operator of the test: the [[ goes on
            top.words.append(ch)
            return i + 1
        if ch == "&" and (nxt == ">" or top.word[-1:] in ("<", ">")) or ch == "|" and top.word[-1:] == ">":
            if nxt == ">" and top.word[-1:] not in ("<", ">"):
                self._end_word(top)  # `&>file`: a redirection word
            top.word += ch
            return i + 1
        return None

    def _paren(self, top: _Frame, text: str, i: int, ch: str) -> int:
        """( and ) in a command: an array's elements, (( )) arithmetic, a subshell, or the end of a $( )."""
        if ch == "(":
            if _ARRAY_START.fullmatch(top.word):
                self.stack.append(_Frame("cmd", ")", array=True))
                return i + 1
            if text.startswith("((", i) and not top.word and (not top.words or top.words == ["for"]):
                self.stack.append(_Frame("opaque", "))", "(( )) arithmetic"))
                return i + 2
            top.depth += 1
            self._end_word(top)
            self._end_command(top)
            return i + 1
        self._end_word(top)
        self._end_command(top)
        if top.depth:
            top.depth -= 1
        elif top.closer == ")":
            self.stack.pop()
        return i + 1

    def _end_word(self, top: _Frame) -> None:
        for words, partial in top.alts:
            piece = partial[0] + top.word[top.alt_cut :]
            if piece:
                words.append(piece)
            partial[0] = ""
        top.alt_cut = 0
        if top.word:
            word = top.word
            top.word = ""
            last, top.last_expr, top.word_expr = top.last_expr, top.word_expr, None
            if top.cond and word in ARITH_OPS and last:
                self.problems.append(
                    (
                        *last,
                        f"a value before {word} inside [[ ]] is evaluated as arithmetic, "
                        "which runs $( ) in it; compare strings with ==, or check it is a number",
                    )
                )
            if not top.words and (word in KEYWORDS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word, re.S)):
                return  # a keyword or an assignment before the command: the command is still to come
            if top.closer == ")" and word == "case":
                self.confused = True  # a pattern's `)` would read as the end of the $( ): values after it are unsure
            top.words.append(word)
            if top.cond and word == "]]":
                top.cond = False
            elif not top.cond and not top.array and word == "[[" and shellcmd.command(top.words) == ["[["]:
                top.cond = True

    def _end_command(self, top: _Frame, pipe: bool = False) -> None:
        """The simple command in TOP is over (PIPE: its output feeds the next one): decide its heredocs and
        here-strings, and whether the pipeline's earlier commands feed their values to an interpreter."""
        if top.heredocs or top.strings or top.piped or top.piped_docs:
            self._fed_to_stdin(top)
        if pipe:
            top.piped, top.piped_docs = top.piped + top.values, top.piped_docs + top.heredocs
        else:
            top.piped, top.piped_docs = [], []
        top.values = []
        words = shellcmd.command(top.words)
        if (
            words[:1]
            and words[0] in DECLARE - {"export", "readonly"}
            and any(re.fullmatch(r"-[A-Za-z]*i[A-Za-z]*", w) for w in words[1:])
        ):
            self.integers.update(re.split(r"[=\[+]", w)[0] for w in words[1:] if not w.startswith(("-", "+")))
        top.words, top.heredocs, top.strings, top.alts = [], [], [], []

    def _fed_to_stdin(self, top: _Frame) -> None:
        """The command's heredocs, here-strings and piped values are code if it reads its program from stdin."""
        why = next(filter(None, (shellcmd.stdin_program(w) for w in [top.words, *(w for w, _ in top.alts)])), "")
        for index in top.heredocs + (top.piped_docs if why else []):
            if index < len(self.pending):
                delim, dash, quoted, _ = self.pending[index]
                self.pending[index] = (delim, dash, quoted, why)
        if not why:
            return
        piped = why.replace("in a heredoc that ", "piped into ").replace(
            " reads as code", ", which reads its program from stdin,"
        )
        for line, col, reason in [(ln, col, piped) for ln, col in top.piped] + [
            (ln, col, why.replace("heredoc", "here-string")) for ln, col in top.strings
        ]:
            self.problems.append(
                (
                    line,
                    col,
                    f"a value {reason} would be read as code, not data; pass it "
                    "as an argument (bash -c '... \"$1\"' _ {{ v }}) or mark code on "
                    "purpose with | sh",
                )
            )

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
            self.problems.append((*self._here(), "a heredoc delimiter must be written in the template, not a value"))
            return j
        quoted = any(c in word for c in "'\"\\")
        # What reads the body is known at the command's end (`<<EOF bash`, `bash 2>&1 <<EOF`): _end_command.
        top.heredocs.append(len(self.pending))
        self.pending.append((word.replace("'", "").replace('"', "").replace("\\", ""), dash, quoted, ""))
        self._end_word(top)
        return j

    # -- placeholders ----------------------------------------------------------------------------
    def _expression(self, line: int, col: int, is_sh: bool, preceding: str) -> None:
        stack = self.stack
        top = stack[-1]
        cmd = next(f for f in reversed(stack) if f.kind == "cmd")
        self._mark_value(top, cmd, line, col)
        if is_sh:
            self.sites.append(Site(line, col, "sh"))
            return
        if self.confused:
            self.problems.append(
                (
                    line,
                    col,
                    "a value after `case` inside $( ): the patterns' ) cannot be told "
                    "from the end of the $( ); set a variable with the case outside it",
                )
            )
        if top.kind == "opaque":
            self.problems.append(
                (
                    line,
                    col,
                    f"a value inside {top.reason} would be read as shell code; "
                    'pass it through a variable (x={{ v }}, then "$x") or mark code with | sh',
                )
            )
            self.sites.append(Site(line, col, "sh"))
            return
        if top.kind in ("cmd", "dq") or (top.kind == "heredoc" and not top.quoted):
            self._check_before(line, col, preceding)  # where bash expands: a `$` before it would join it
        if top.kind == "cmd" and top.comment:
            self.sites.append(Site(line, col, "comment"))
            return
        code, check = self._value_code(top, cmd, line, col)
        code = code or self._enclosing_code(cmd)
        if code:
            self.problems.append(
                (
                    line,
                    col,
                    f"a value {code} would be read as code, not data; pass it as an "
                    "argument (bash -c '... \"$1\"' _ {{ v }}) or mark code on purpose with | sh",
                )
            )
        if top.kind == "heredoc":
            self.sites.append(Site(line, col, "qheredoc" if top.quoted else "heredoc", top.delim, top.dash))
        elif top.kind in ("dq", "sq"):
            self.sites.append(Site(line, col, top.kind, check=check))
        elif cmd.cond:
            self.sites.append(Site(line, col, "cond", check=check))  # always quoted: -n would be an operator
        else:
            self.sites.append(Site(line, col, "bare", check=check))

    def _mark_value(self, top: _Frame, cmd: _Frame, line: int, col: int) -> None:
        """A value stands here: its heredoc line or command word holds one, and so does every enclosing command."""
        if top.kind == "heredoc":
            top.line_expr = True
        elif not cmd.comment:
            cmd.word_expr = (line, col)
            cmd.word += EXPR  # the word holds a value: it is not empty, and not a comment's start
        if not cmd.comment:
            for frame in self.stack:
                if frame.kind == "cmd":
                    frame.values.append((line, col))  # what a pipeline's later command may read as code

    def _value_code(self, top: _Frame, cmd: _Frame, line: int, col: int) -> tuple[str, str]:
        """Why the value would be code where it stands ("" if data), and the check its text must pass."""
        if top.kind == "heredoc":
            return top.code, ""
        if cmd.array:
            subscript = re.match(r"\[[^\]]*$", cmd.word)
            return ("in an array subscript, which is evaluated as arithmetic," if subscript else ""), ""
        if re.match(r"[A-Za-z_][A-Za-z0-9_]*\[[^\]]*$", cmd.word):
            return "in an array subscript, which is evaluated as arithmetic,", ""
        verdicts = [
            shellcmd.analyse(words, current[:-1], self.integers) for words, current in self._words_now(self.stack)
        ]
        verdict = next((v for v in verdicts if v.code), verdicts[0])
        check = "name" if any(v.check == "name" for v in verdicts) else next((v.check for v in verdicts), "")
        if any(v.herestring for v in verdicts):
            cmd.strings.append((line, col))  # code or not is known when the command ends
        return verdict.code, check

    def _enclosing_code(self, cmd: _Frame) -> str:
        """Why the output of the $( ) or <( ) a value is in (at any depth) would be code: it lands in an
        interpreter's heredoc, in a code argument (`eval "$(echo {{ v }})"`), or is the file `source` reads."""
        inner = cmd
        depth = next(i for i, f in enumerate(self.stack) if f is cmd)
        for frame in reversed(self.stack[:depth]):
            if frame.kind == "heredoc" and frame.code:
                return f"inside a $( ) {frame.code}"
            if frame.kind != "cmd":
                continue
            name = shellcmd.command(frame.words)[:1]
            if inner.procsub and name and shellcmd.runs_files(name[0]):
                return f"inside a <( ) whose output {name[0]} runs"
            verdict = shellcmd.analyse(frame.words, frame.word, self.integers)
            if verdict.code:
                return f"inside a $( ) whose output lands {verdict.code}"
            inner = frame
        return ""

    def _check_before(self, line: int, col: int, preceding: str) -> None:
        """A `$`, `$NAME` or lone backslash right before a value would join it (`${{ v }}` is `$'...'`). A tag
        between them writes nothing or text of its own: the value may still follow the `$` directly."""
        preceding = preceding.rstrip(TAG)
        slashes = len(preceding) - len(preceding.rstrip("\\"))
        if slashes % 2:
            self.problems.append(
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
                self.problems.append(
                    (
                        line,
                        col,
                        f"a value right after ${name.group(2)} would lengthen the "
                        f"variable's name; write ${{{name.group(2)}}}",
                    )
                )
            else:
                self.problems.append(
                    (line, col, "a value right after '$' cannot be escaped: the $ would join the value's quoting")
                )

    def _dangling(self, line: int, col: int, preceding: str) -> None:
        """A `$` or lone backslash right before a tag (or the template's end) joins whatever is written next:
        a value in one of the tag's branches, or the text after an include; what that makes cannot be told."""
        top = self.stack[-1]
        if not (
            top.kind == "dq" or (top.kind == "cmd" and not top.comment) or (top.kind == "heredoc" and not top.quoted)
        ):
            return
        preceding = preceding.rstrip(TAG)
        slashes = len(preceding) - len(preceding.rstrip("\\"))
        dollar = re.search(r"(\\*)\$$", preceding)
        if slashes % 2 or (dollar and len(dollar.group(1)) % 2 == 0):
            what = "a backslash" if slashes % 2 else "'$'"
            self.problems.append(
                (
                    line,
                    col,
                    f"{what} right before a {{% %}} tag or the template's end would join "
                    "whatever is written after it; write it inside the tag's branches",
                )
            )

    def _tag(self, line: int, col: int, tag: tuple[str, bool, Any]) -> None:
        name, has_assign, saved = tag
        if name in ("if", "for", "block", "with"):
            saved.append(["open", name, self._state(), [], False])
        elif name in ("elif", "else"):
            if saved and saved[-1][0] == "open":
                self._check_same(saved[-1][2], line, col, name)
                saved[-1][3].extend(self._words_now(self.stack))
                saved[-1][4] = saved[-1][4] or name == "else"
                self._restore(saved[-1][2])
        elif name in ("endif", "endfor", "endblock", "endwith"):
            if saved and saved[-1][0] == "open":
                self._close_block(line, col, name, saved.pop())
        else:
            self._other_tag(line, col, name, has_assign, saved)

    def _other_tag(self, line: int, col: int, name: str, has_assign: bool, saved: list[Any]) -> None:
        """Tags that are no if/for block: macros and set blocks are read on their own, others allowed or not."""
        if name in ("call", "endcall"):
            self.problems.append(
                (
                    line,
                    col,
                    "{% call %} is not allowed in a job template: its body is written into "
                    "the macro's text, in quoting this template cannot see; pass the macro arguments",
                )
            )
        elif name == "macro" or (name == "set" and not has_assign):
            saved.append(("fragment", name, self._state()))
            self.stack, self.pending = [_Frame("cmd")], []
        elif name in ("endmacro", "endset"):
            if saved and saved[-1][0] == "fragment":
                if len(self.stack) > 1 or self.pending or self.stack[0].comment:
                    self.problems.append(
                        (line, col, f"the {{% {saved[-1][1]} %}} body ends inside quotes or a heredoc")
                    )
                self._restore(saved.pop()[2])
        elif name == "include":
            top = self.stack[-1]
            if len(self.stack) > 1 or self.pending or top.comment or top.word or top.words:
                self.problems.append((line, col, "include a template only where a command may start"))
        elif name not in ("set", "do", "import", "from", "raw", "endraw"):
            self.problems.append(
                (
                    line,
                    col,
                    f"{{% {name} %}} is not allowed in a job template: its output could undo the escaping of values",
                )
            )

    def _close_block(self, line: int, col: int, name: str, block: list[Any]) -> None:
        """An if/for block ends: a value after it is judged under the words of every branch it may have taken."""
        _, opened, state, alts, had_else = block
        if not self._check_same(state, line, col, name) or opened not in ("if", "for"):
            return
        if not had_else or opened == "for":
            alts.extend(self._words_now(state[0]))  # no branch taken, or no iteration
        cmd = next(f for f in reversed(self.stack) if f.kind == "cmd")
        now = self._words_now(self.stack)
        alts.extend(now[1:])
        cmd.alts = [(a[0], [a[1]]) for i, a in enumerate(alts) if a != now[0] and a not in alts[:i]]
        cmd.alt_cut = len(cmd.word)

    @staticmethod
    def _words_now(stack: list[_Frame]) -> list[tuple[list[str], str]]:
        """The words (and the word being read) of the command in STACK so far, then the other branches' ones:
        a value after the branches is judged under each (`{% if x %}eval{% else %}echo{% endif %} {{ v }}`)."""
        cmd = next(f for f in reversed(stack) if f.kind == "cmd")
        return [(list(cmd.words), cmd.word)] + [(list(w), p[0] + cmd.word[cmd.alt_cut :]) for w, p in cmd.alts]

    def _state(self) -> tuple[list[_Frame], list[tuple[str, bool, bool, str]]]:
        return copy.deepcopy(self.stack), list(self.pending)

    def _restore(self, state: tuple[list[_Frame], list[tuple[str, bool, bool, str]]]) -> None:
        self.stack, self.pending = copy.deepcopy(state[0]), list(state[1])

    def _check_same(
        self, state: tuple[list[_Frame], list[tuple[str, bool, bool, str]]], line: int, col: int, name: str
    ) -> bool:
        if _signature(state[0], state[1]) != _signature(self.stack, self.pending):
            self.problems.append(
                (
                    line,
                    col,
                    f"the quoting at {{% {name} %}} differs from where the block opened: "
                    "open and close quotes and heredocs inside each branch",
                )
            )
            return False
        return True


def skip(text: str, i: int) -> int:
    """Past the backslash at I and the character it escapes, unless that is a placeholder."""
    return i + 1 if i + 1 < len(text) and text[i + 1] in (EXPR, TAG) else i + 2

"""Stage 4's shell reader: where in bash's quoting each `{{ }}` of a job template stands, or why it cannot be told.

The template's literal text is read the way bash will read the job (quotes, `$( )`, heredocs, comments,
the words of each command), with placeholders for the jinja parts; each `{{ }}` gets a Site (its quoting
context) or a problem with its line and column.
"""

from __future__ import annotations

import re
from typing import Any

from plancompiler.shell import commands as shellcmd
from plancompiler.shell import places as shellplaces
from plancompiler.shell.commands import ARITH_OPS, DECLARE, KEYWORDS
from plancompiler.shell.frame import EXPR, TAG, Frame, Site, skip

_REDIR_START = re.compile(r"(\d+|\{[A-Za-z_][A-Za-z0-9_]*\})?[<>&]*")  # a word a redirection may go on
_OPENERS = {"{", "if", "for", "while", "until", "case", "select"}  # a compound command's start and end words
_CLOSERS = {"}", "fi", "done", "esac"}
_ARRAY_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


class Scanner:
    """Reads template text as bash would, one character at a time; placeholders stand for jinja parts."""

    def __init__(self) -> None:
        self.places: list[tuple[int, int, bool, Any]] = []
        self.k = 0
        self.confused = False
        self.stack: list[Frame] = [Frame("cmd")]
        self.pending: list[tuple[str, bool, bool, str]] = []  # heredocs whose bodies start at the next newline
        self.sites: list[Site] = []
        self.problems: list[tuple[int, int, str]] = []
        self.functions: dict[str, list[tuple[int, int]]] = {}  # a function's name: the values in its body
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
                line, col, is_sh, info = places[self.k]
                self.k += 1
                around = (text[max(0, i - 80) : i], text[i + 1 : i + 81])
                shellplaces.expression(self, line, col, is_sh, around, info == "program")
                i += 1
                continue
            if ch == TAG:
                line, col, _, tag = places[self.k]
                self.k += 1
                shellplaces.dangling(self, line, col, text[max(0, i - 80) : i])
                shellplaces.tag(self, line, col, tag)
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
            shellplaces.dangling(self, line, 1, self.text[-80:])

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
            self.stack.append(Frame("opaque", "`", "backticks"))
            return i + 1
        if rest.startswith("(("):
            self.stack.append(Frame("opaque", "))", "$(( )) arithmetic"))
            return i + 3
        if rest.startswith("("):
            self.stack.append(Frame("cmd", ")"))
            return i + 2
        if rest.startswith("{"):
            self.stack.append(Frame("opaque", "}", "a ${ } parameter expansion"))
            return i + 2
        if rest.startswith("["):
            self.stack.append(Frame("opaque", "]", "$[ ] arithmetic"))
            return i + 2
        if rest.startswith("'") and self.stack[-1].kind == "cmd":
            self.stack.append(Frame("opaque", "'", "$' ' quoting"))
            return i + 2
        return i + 1

    def _opaque(self, top: Frame, text: str, i: int) -> int:
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

    def _heredoc(self, top: Frame, text: str, i: int) -> int:
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

    def _cmd(self, top: Frame, text: str, i: int, ch: str, nxt: str) -> int:
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
        if ch == "|" and top.pattern:
            self._end_word(top)  # `a|b)`: another pattern of the same case item, not a pipe
            return i + 1
        if ch in ";&|":
            self._end_word(top)
            pipe = ch == "|" and nxt != "|" and text[i - 1 : i] != "|" or ch == "&" and text[i - 1 : i] == "|"
            self._end_command(top, pipe)
            if ch == ";" and nxt in (";", "&") or ch == "&" and text[i - 1 : i] == ";":
                top.pattern = True  # `;;`, `;&`, `;;&`: the next case pattern
            return i + 1
        top.word += ch
        return i + 1

    def _quote(self, top: Frame, text: str, i: int, ch: str) -> int:
        """A quote, `$` or backtick in a command: part of the word, and the start of what it opens."""
        top.word += ch
        if ch == "'":
            self.stack.append(Frame("sq"))
            return i + 1
        if ch == '"':
            self.stack.append(Frame("dq"))
            return i + 1
        return self._dollar(text, i)

    def _operator(self, top: Frame, text: str, i: int, ch: str, nxt: str) -> int | None:
        """Process substitutions, redirections, heredocs and [[ ]]'s operators; None: CH is none of them."""
        if ch in "<>":
            if nxt == "(":
                self.stack.append(Frame("cmd", ")", procsub=ch == "<"))
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

    def _paren(self, top: Frame, text: str, i: int, ch: str) -> int:
        """( and ) in a command: an array's elements, (( )) arithmetic, a subshell, or the end of a $( )."""
        if ch == "(":
            if _ARRAY_START.fullmatch(top.word):
                self.stack.append(Frame("cmd", ")", array=True))
                return i + 1
            if text.startswith("((", i) and not top.word and (not top.words or top.words == ["for"]):
                self.stack.append(Frame("opaque", "))", "(( )) arithmetic"))
                return i + 2
            if top.pattern and not top.word and not top.words:
                return i + 1  # `(a)`: a case pattern's optional opening parenthesis
            if (
                text.startswith("()", i)
                and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]*", top.word)
                and top.words in ([], ["function"])
            ):
                top.func = (top.word, len(top.marks))  # `name()`: its body is the next compound command
            top.depth += 1
            self._end_word(top)
            self._end_command(top)
            top.marks.append(len(top.seen))
            return i + 1
        self._end_word(top)
        if top.pattern:
            top.pattern = False  # the `)` of a case pattern: its commands follow
            self._end_command(top)
            return i + 1
        self._end_command(top)
        if top.depth:
            top.depth -= 1
            self._close(top)
        elif top.closer == ")":
            self.stack.pop()
        return i + 1

    def _end_word(self, top: Frame) -> None:
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
            if not top.words and word in _OPENERS:
                top.marks.append(len(top.seen))
            elif not top.words and word in _CLOSERS:
                top.pattern = top.pattern and word != "esac"
                self._close(top)
            if not top.words and (word in KEYWORDS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word, re.S)):
                return  # a keyword or an assignment before the command: the command is still to come
            if top.words == ["function"] and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]*", word):
                top.func, top.words = (word, len(top.marks)), []  # `function f { ... }`: the body comes next
                return
            if top.closer == ")" and word == "case":
                self.confused = True  # a pattern's `)` would read as the end of the $( ): values after it are unsure
            top.words.append(word)
            if len(top.words) == 3 and top.words[0] == "case" and word == "in":
                self._end_command(top)  # the patterns start: `case x in a) ...` on one line too
                return
            if top.cond and word == "]]":
                top.cond = False
            elif not top.cond and not top.array and word == "[[" and shellcmd.command(top.words) == ["[["]:
                top.cond = True

    def _close(self, top: Frame) -> None:
        """A compound command ends: its values are what it may pipe into an interpreter (or a function's body)."""
        if not top.marks:
            return
        top.closed = top.seen[top.marks.pop() :]
        if top.func and len(top.marks) == top.func[1] and top.closed:
            self.functions[top.func[0]] = top.closed
            top.func = None

    def _end_command(self, top: Frame, pipe: bool = False) -> None:
        """The simple command in TOP is over (PIPE: its output feeds the next one): decide its heredocs and
        here-strings, and whether the pipeline's earlier commands feed their values to an interpreter."""
        if top.heredocs or top.strings or top.piped or top.piped_docs:
            self._fed_to_stdin(top)
        if top.words[:1] == ["case"] and top.words[-1:] == ["in"]:
            top.pattern = True
        if pipe:
            called = shellcmd.command(top.words)[:1]
            body = self.functions.get(called[0], []) if called else []
            top.piped = top.piped + top.values + top.closed + body
            top.piped_docs = top.piped_docs + top.heredocs
        else:
            top.piped, top.piped_docs = [], []
        top.values, top.closed = [], []
        words = shellcmd.command(top.words)
        if (
            words[:1]
            and words[0] in DECLARE - {"export", "readonly"}
            and any(re.fullmatch(r"-[A-Za-z]*i[A-Za-z]*", w) for w in words[1:])
        ):
            self.integers.update(re.split(r"[=\[+]", w)[0] for w in words[1:] if not w.startswith(("-", "+")))
        top.words, top.heredocs, top.strings, top.alts = [], [], [], []

    def _fed_to_stdin(self, top: Frame) -> None:
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

    def _newline(self, top: Frame, i: int) -> int:
        if self.pending:
            # Bodies follow in the order their operators appeared; the first one read is on top.
            for delim, dash, quoted, why in reversed(self.pending):
                self.stack.append(Frame("heredoc", delim=delim, dash=dash, quoted=quoted, code=why))
            self.pending = []
        return i + 1

    def _heredoc_op(self, top: Frame, text: str, i: int) -> int:
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


__all__ = ["EXPR", "TAG", "Scanner", "Site"]

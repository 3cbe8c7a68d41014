"""The report's HTML page read back: its tables, and each timeline bar's state, job, label and tooltip."""

from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    """The report page's bars (with their labels) and tables, by id, as rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.bars: list[dict[str, str]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.external: list[str] = []
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._in_label = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "bar" in a.get("class", "").split():
            self.bars.append(a | {"label": ""})
        self._in_label = tag == "span" and a.get("class") == "label"
        if tag == "table":
            self._table = a.get("id", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th"):
            self._cell = []
        for key in ("src", "href"):
            if a.get(key):
                self.external.append(a[key])

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag == "span":
            self._in_label = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._in_label and self.bars:
            self.bars[-1]["label"] += data

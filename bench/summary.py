"""Regenerate docs/benchmarks.md's performance table from bench/README.md: the block between the targets markers."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START, END = "<!-- bench-targets:start -->", "<!-- bench-targets:end -->"


def block(text: str, where: str) -> tuple[int, int]:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{where}: no {START} ... {END} block")
    return start, end + len(END)


def main() -> int:
    source = (REPO / "bench" / "README.md").read_text()
    start, end = block(source, "bench/README.md")
    readme_path = REPO / "docs" / "benchmarks.md"
    readme = readme_path.read_text()
    if START not in readme:  # the first time: the block goes at the end of the page
        readme = readme.rstrip("\n") + "\n\n" + START + "\n" + END + "\n"
    r_start, r_end = block(readme, "docs/benchmarks.md")
    updated = readme[:r_start] + source[start:end] + readme[r_end:]
    if updated != readme:
        readme_path.write_text(updated)
        print("docs/benchmarks.md: performance table regenerated from bench/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A re-check lints only the jobs whose text changed: the rest come from the per-job memo, and say the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plancompiler.compile import compile_plan

PLAN = """plan: t
vars:
  roster: [{m: m1}, {m: m2}, {m: m3}]
jobs:
  - name: "f-{{ m }}"
    foreach: roster
    run: |
      echo {{ m }}
      cd /srv/{{ m }}
"""


pytestmark = pytest.mark.usefixtures("plan_env")  # a shellcheck cache of its own, no hosts file from outside


def _texts(compiled) -> list[str]:
    return sorted(d.text() for d in compiled.diagnostics)


def _memo(tmp_path: Path) -> tuple[Path, dict]:
    (entry,) = (tmp_path / "cache" / "lint-jobs").rglob("*.json")
    return entry, json.loads(entry.read_text())


def test_a_recheck_says_what_a_fresh_check_says(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN)
    first = compile_plan(plan)
    assert any(d.code == "SC2164" for d in first.diagnostics)  # cd without || exit, in every job
    _, memo = _memo(tmp_path)
    assert len(memo["jobs"]) == 3
    # one job changed; the others come from the memo
    plan.write_text(PLAN.replace("{m: m3}", "{m: m9}"))
    second = compile_plan(plan)
    assert _texts(second) == _texts(compile_plan(plan, use_cache=False))
    assert "f-m9" in " ".join(_texts(second)) and "f-m3" not in " ".join(_texts(second))
    _, memo = _memo(tmp_path)
    assert len(memo["jobs"]) == 3  # the entries of the old texts are dropped


def test_the_memo_is_read_and_only_under_its_salt(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN)
    compile_plan(plan)
    entry, memo = _memo(tmp_path)
    planted = [[5, 1, "warning", "SC9999", "planted"]]
    memo["jobs"] = {k: planted for k in memo["jobs"]}
    entry.write_text(json.dumps(memo))
    assert [d.code for d in compile_plan(plan).diagnostics] == ["SC9999"]  # one place, naming the three jobs
    memo["salt"] = "another compiler"
    entry.write_text(json.dumps(memo))
    assert "SC9999" not in {d.code for d in compile_plan(plan).diagnostics}
    entry.write_text("{not json")
    assert _texts(compile_plan(plan)) == _texts(compile_plan(plan, use_cache=False))


def test_shellcheck_is_asked_its_version_once_a_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The version (part of every cache key) is remembered by the cache's marker and, for a process that lints
    with another cache (a long-lived one, the tests' own caches), in the process: one `shellcheck --version`."""
    from plancompiler import lint

    asked: list[str] = []
    real = lint._ask_version
    monkeypatch.setattr(lint, "_ASKED", {})
    monkeypatch.setattr(lint, "_ask_version", lambda exe: asked.append(exe) or real(exe))
    said = []
    for n in (1, 2):
        monkeypatch.setenv("PLAN_CACHE_DIR", str(tmp_path / f"c{n}"))
        said.append(lint._shellcheck_version())
    assert len(asked) == 1 and said[0] == said[1] and said[0][0].isdigit()
    assert [p.parent.name for p in tmp_path.glob("c*/shellcheck-version/*")] == ["shellcheck-version"] * 2

"""The pre-push hook where the venv is not on PATH (an IDE's git, a plain shell): shellcheck is still found."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_the_hook_checks_with_a_bare_path_and_a_cold_cache(tmp_path: Path) -> None:
    assert shutil.which("shellcheck", path="/usr/bin:/bin") is None, "this test needs shellcheck off the bare PATH"
    repo = tmp_path / "repo"
    (repo / "plans").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "plans/good.yaml").write_text("plan: good\njobs:\n  - name: a\n    run: echo a\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PLAN_CACHE_DIR": str(tmp_path / "cold-cache")}
    install = subprocess.run(
        [
            "/usr/bin/env",
            "-i",
            *(f"{k}={v}" for k, v in env.items()),
            sys.executable,
            "-m",
            "plancompiler.cli",
            "hooks",
            "install",
            "--repo",
            str(repo),
        ],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr
    hook = repo / ".git/hooks/pre-push"
    ok = subprocess.run(
        ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), str(hook)],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "shellcheck not found" not in ok.stderr
    (repo / "plans/bad.yaml").write_text("plan: bad\njobs:\n  - name: a\n    run: exit $rc\n")
    bad = subprocess.run(
        ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), str(hook)],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "SC2154" in bad.stdout, bad.stdout + bad.stderr

"""The pre-push hook, run as git runs it where the venv is not on PATH (an IDE's git, a plain shell): shellcheck
is still found, a good plan passes (the hosts file beside it skipped), a plan with errors refuses the push."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO
from tests.inprocess import plan_main


def _bare_path(bin_dir: Path) -> str:
    """A PATH of every command in /usr/bin and /bin but shellcheck (Debian's may be there): the hook must find
    the shellcheck of the package it belongs to, not one the machine happens to have."""
    bin_dir.mkdir()
    for directory in ("/usr/bin", "/bin"):
        for entry in os.scandir(directory):
            target = bin_dir / entry.name
            if entry.name != "shellcheck" and not target.exists() and not target.is_symlink():
                target.symlink_to(entry.path)
    assert shutil.which("shellcheck", path=str(bin_dir)) is None
    return str(bin_dir)


def test_the_hook_checks_with_a_bare_path_and_a_cold_cache(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "plans").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "plans/good.yaml").write_text("plan: good\njobs:\n  - name: a\n    run: echo a\n")
    (repo / "plans/hosts.yaml").write_text("hosts:\n  a9: {ssh: a9, root: /home/user/jobs}\n")  # not a plan
    env = {
        "PATH": _bare_path(tmp_path / "bin"),
        "PYTHONPATH": str(REPO),
        "PLAN_CACHE_DIR": str(tmp_path / "cold-cache"),
    }
    # Installing writes this interpreter's path into the hook, whatever the environment: done in this process.
    install = plan_main("hooks", "install", "--repo", str(repo), cwd=tmp_path, cache=tmp_path / "cache")
    assert install.returncode == 0, install.stderr
    hook = repo / ".git/hooks/pre-push"
    assert os.access(hook, os.X_OK)
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

"""A real full disk for the tests: a small tmpfs mounted over a directory, and a file that fills it to the last
byte. Mounting needs root; CI runs as root, so there a refusal is a failure, elsewhere a skip."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.sshd import IN_CI  # the suite's one reading of CI


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """PATH (made if missing) with a tmpfs of SIZE (mount's units: 1m, 256k) over it while the block runs, then
    unmounted (lazily: a process of the test may still hold a file there)."""
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode != 0:
        if IN_CI:
            pytest.fail("CI runs as root and must be able to mount a small tmpfs for the disk-full tests")
        pytest.skip("needs root to mount a small tmpfs (a real full disk)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """PATH's file system filled to the last byte (unbuffered writes: no flush left to fail at close); the
    filler file, whose removal gives the space back."""
    filler = path / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (65536, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:  # full, not refused
                    raise
    finally:
        os.close(fd)
    return filler

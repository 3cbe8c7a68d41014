"""Fixtures of the runner's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpubox import GpuBox


@pytest.fixture
def box(tmp_path: Path) -> Iterator[GpuBox]:
    """A fake machine's GPU files (sysfs, /proc fdinfo) under TMP_PATH: tests/gpubox.py."""
    made = GpuBox(tmp_path)
    yield made
    made.close()

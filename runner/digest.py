"""sha1 and sha256 as hex, from the interpreter's own builtin modules where it has them: `hashlib` loads OpenSSL,
~4 MB of a runner's resident memory for a few short digests (a root's id, a pushed file, a job's body)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _builtin(names: tuple[tuple[str, str], ...], fallback: str) -> Callable[[bytes], Any]:
    for module, attr in names:
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    import hashlib

    return getattr(hashlib, fallback)


_sha1 = _builtin((("_sha1", "sha1"),), "sha1")
_sha256 = _builtin((("_sha2", "sha256"), ("_sha256", "sha256")), "sha256")


def sha1_hex(data: bytes) -> str:
    return str(_sha1(data).hexdigest())


def sha256_hex(data: bytes) -> str:
    return str(_sha256(data).hexdigest())

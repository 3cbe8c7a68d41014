"""Kept for imports written before the runner was split into parts: the runner is runner.service.Runner."""

from __future__ import annotations

from runner.service import AlreadyRunning, Runner

__all__ = ["AlreadyRunning", "Runner"]

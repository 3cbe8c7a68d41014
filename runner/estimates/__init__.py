"""Estimates: how long jobs took (history.json, written by the service when a run ends done), and from that and
their progress when running jobs end and queued jobs start (eta, computed by the host agent on request).
This is the door: the service and the agent import the names below, from `runner.estimates`."""

from __future__ import annotations

from runner.estimates.eta import PER_LANE, estimate, from_root, progress_left
from runner.estimates.history import History

__all__ = ["PER_LANE", "History", "estimate", "from_root", "progress_left"]

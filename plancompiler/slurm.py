"""Kept for `plan report`'s import: the Slurm backend now lives in plancompiler.backends.slurm."""
from __future__ import annotations

from plancompiler.backends.slurm import sacct_events, sbatch_args

__all__ = ["sacct_events", "sbatch_args"]

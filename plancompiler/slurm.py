"""Kept for older imports: the Slurm backend lives in plancompiler.backends.slurm."""

from __future__ import annotations

from plancompiler.backends.slurm import sbatch_args

__all__ = ["sbatch_args"]

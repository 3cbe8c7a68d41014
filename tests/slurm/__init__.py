"""The Slurm backend on a real single-node cluster (tests/slurm/cluster.py), and its helpers (jobs.py)."""

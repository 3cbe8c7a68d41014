"""The box side: a standard-library queue runner for bash job files (contracts 1, 2, 3, 5)."""

__version__ = "0.1.0"
# Bumped when a job file written by the compiler needs a newer runner to be read.
FORMAT_VERSION = 1

"""The box side: a standard-library queue runner for bash job files (contracts 1, 2, 3, 5)."""

__version__ = "0.1.0"
# Bumped when a job file written by the compiler needs a newer runner to be read.
FORMAT_VERSION = 1
# The oldest Python the runner package imports and runs under (a login node's own, often 3.8 or 3.9): the
# loader that starts it on a host checks this first (plancompiler/transport.py); tests/test_python_floor.py
# and vermin in .ci/run hold the package to it.
PYTHON_MIN = (3, 8)

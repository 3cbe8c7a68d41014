"""`python -m plancompiler.cli ...`: the `plan` command."""

import sys

from plancompiler.cli import entry

sys.exit(entry())

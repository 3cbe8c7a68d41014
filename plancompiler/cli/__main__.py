"""`python -m plancompiler.cli ...`: the `plan` command."""

import sys

from plancompiler.cli import main

sys.exit(main())

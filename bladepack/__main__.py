"""`python -m bladepack`: the command line (bladepack/cli.py)."""

import sys

from bladepack.cli import main

sys.exit(main())

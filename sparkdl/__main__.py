"""``python -m sparkdl``: batch training from the command line (see :mod:`sparkdl.cli`)."""

import sys

from sparkdl.cli import main

sys.exit(main())

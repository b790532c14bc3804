"""``python -m sparkdl``: batch training from the command line (see :mod:`sparkdl.tools.cli`)."""

import sys

from sparkdl.tools.cli import main

sys.exit(main())

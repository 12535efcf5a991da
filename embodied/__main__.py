"""``python -m embodied`` = the ``embodied`` command."""

import sys

from embodied.cli import main

sys.exit(main())

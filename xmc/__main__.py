"""``python -m xmc``: see ``xmc.cli``."""

import sys

from xmc.cli import main

sys.exit(main())

"""``python -m xmc_resumption``: the ``xmc`` command (``xmc_resumption.cli``)."""

import sys

from xmc_resumption.cli import main

sys.exit(main())

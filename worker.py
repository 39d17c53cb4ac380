"""Run the xmc-resumption worker from a checkout: ``python -m worker`` (installed: ``python -m xmc_resumption.worker``).

Everything it does is ``xmc_resumption.worker.cli``: settings from the environment, one line and exit 2
on an operator error, SIGINT/SIGTERM stop it cleanly.
"""

import sys

from xmc_resumption.worker import cli

if __name__ == "__main__":
    sys.exit(cli())

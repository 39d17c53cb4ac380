"""The ``xmc`` command (Click): every command of the operator, ``demo`` and ``reconcile`` among them.

Redis from ``XMC_REDIS_URL``, Temporal from envconfig (``TEMPORAL_ADDRESS``, ...), like the worker.
Every command but ``demo`` takes ``--json``: one JSON document on stdout instead of text, never
both. Progress and warnings go to stderr.

Exit codes:
    0: done (with ``--wait``: the run returned a result, whatever its outcome; the output says it).
    1: ``--wait``: the awaited run ended without a result (failed, terminated, cancelled, timed
       out); one line on stderr names the run and the cause.
    2: an error the operator can mend or a refusal: bad arguments or settings, Redis or Temporal
       unreachable, a key holding garbage, a resumption already running, nothing to resume, a
       change a running resumption rejected. One line on stderr naming the argument, setting,
       key or field, never a secret (``xmc_resumption.errors``). ``xmc status`` prints every
       part it could read first, the others marked unknown, and one such line per unknown part.
    130: interrupted (Ctrl-C); 141: stdout was closed (``xmc status E | head``), quietly.
Any other exception is a bug and keeps its traceback.

Modules: ``common`` (the group, shared options, output, ``main``'s error handling), ``params``
(the parameter types: every value checked at parse time),
``experiments`` (the Redis-side commands), ``runs`` (the Temporal-side ones), ``reconcile``, ``planning``
(``plan`` and ``rate``), ``watch`` (``resume --wait``), ``demo``.
"""

from xmc_resumption.cli import demo, experiments, planning, reconcile, runs  # noqa: F401  (each registers its commands)
from xmc_resumption.cli.common import EXPERIMENT_ID, GROUP_NAME, INPUT_OPTIONS, STREAM_NAME, AppState, cli, main

__all__ = ["EXPERIMENT_ID", "GROUP_NAME", "INPUT_OPTIONS", "STREAM_NAME", "AppState", "cli", "main"]

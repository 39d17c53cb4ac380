"""xmc-resumption: durable, backpressure-aware replay of paused tasks into a Redis Streams task queue, on Temporal.

The one import package of the ``xmc-resumption`` distribution.

Embedding it in a platform's own worker: ``xmc_resumption.plugin.ResumptionPlugin``
(docs/embedding.md). The operator's command: ``xmc`` (``xmc_resumption.cli``).
"""

from importlib.metadata import version

__version__: str = version("xmc-resumption")
"""The installed distribution's version (PEP 440), read from its metadata: ``pyproject.toml``'s
``version`` is the one source. Raises ``importlib.metadata.PackageNotFoundError`` at import when
the package is imported from a source tree that was never installed (``pip install -e .`` first)."""

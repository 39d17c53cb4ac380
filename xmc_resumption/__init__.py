"""xmc-resumption: durable, backpressure-aware replay of paused tasks into a Redis Streams task queue, on Temporal.

The one import package of the ``xmc-resumption`` distribution.

Embedding it in a platform's own worker: ``xmc_resumption.plugin.ResumptionPlugin``
(docs/embedding.md). The operator's command: ``xmc`` (``xmc_resumption.cli``).
"""

from importlib.metadata import version

__version__: str
"""The installed distribution's version (PEP 440), read from its metadata: ``pyproject.toml``'s
``version`` is the one source. Read at its first use (``__getattr__``), not at import: every run of
``ResumptionWorkflow`` imports this package again in its sandbox. Raises
``importlib.metadata.PackageNotFoundError`` when the package is imported from a source tree that was
never installed (``pip install -e .`` first)."""


def __getattr__(name: str) -> str:
    """``__version__``, read from the distribution's metadata the first time, then kept as the module's attribute.

    Raises:
        AttributeError: any other name.
        importlib.metadata.PackageNotFoundError: the distribution is not installed.
    """
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found = globals()["__version__"] = version("xmc-resumption")
    return found

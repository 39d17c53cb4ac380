"""The registry of the workflow's patches: every ``workflow.patched`` and ``workflow.deprecate_patch`` ID in use.

When a patch is needed and its lifecycle: docs/development.md, "Changing the workflow" (checked by
tests/test_versions.py). Release 1.0.0 has none.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    """One patch of the workflow code.

    Attributes:
        id: the ``workflow.patched`` ID (kebab case; recorded in the history's ``core_patch`` marker).
        added_in: the release whose code first asked for it (``pyproject.toml``'s version, e.g. ``1.1.0``).
        guards: what the patched branch does that the code before it did not, in one sentence.
        histories: the recorded histories the patch needs, as paths under ``tests/histories/``: at least one of a
            release before ``added_in`` (it replays on the old branch) and one recorded with the patch (its marker
            is in it: the new branch).
        deprecated_in: the release that replaced ``patched`` by ``deprecate_patch`` (no run of the code before
            ``added_in`` can be open any more), or None while both branches are kept.
    """

    id: str
    added_in: str
    guards: str
    histories: tuple[str, ...]
    deprecated_in: str | None = None


PATCHES: tuple[Patch, ...] = ()
"""Every patch in use under workflows/, oldest first."""

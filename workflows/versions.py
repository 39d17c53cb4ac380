"""The registry of the workflow's patches: docs/development.md, "Changing the workflow" (checked by its tests)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    """One patch of the workflow code; its fields: docs/development.md, "Changing the workflow"."""

    id: str
    added_in: str
    guards: str
    histories: tuple[str, ...]
    deprecated_in: str | None = None


PATCHES: tuple[Patch, ...] = ()
"""Every patch in use under workflows/, oldest first."""

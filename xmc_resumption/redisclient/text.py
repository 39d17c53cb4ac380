"""Text for one-line messages: a reply or a name found in Redis, shown on one line.

No Temporal and no Redis import, so workflow code may use it.
"""

from __future__ import annotations

MAX_DETAIL_CHARS = 300
"""Longest detail (a server's reply, a validation message) one line carries."""


def one_line(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` on one line (line breaks become ``; ``), cut at ``limit`` characters."""
    flat = "; ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."

"""The throttle policy, as pure functions (no I/O, deterministic)."""

from __future__ import annotations


def must_wait(backlog: int, threshold: int) -> bool:
    """True when the replay must wait: ``backlog >= threshold`` (entries; DESIGN.md section 4)."""
    return backlog >= threshold


def wait_reason(pending: int, lag: int, capped: bool, threshold: int) -> str:
    """A one-line reason for the UI, e.g. ``backlog 501+ >= 500 (pending 120 + lag 381+)``.

    A ``+`` marks a count that stopped at the cap: the true value may be larger.
    """
    plus = "+" if capped else ""
    lag_text = "not counted" if capped and lag == 0 else f"{lag}{plus}"
    return f"backlog {pending + lag}{plus} >= {threshold} (pending {pending} + lag {lag_text})"


def room(backlog: int, threshold: int, batch_size: int) -> int:
    """Tasks (entries) the next publish may move: ``min(batch_size, threshold - backlog)``, >= 0."""
    return max(0, min(batch_size, threshold - backlog))

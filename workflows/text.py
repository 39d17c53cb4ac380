"""What the replay says to people (the UI's summary and details, durations, the ETA): wording, not contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xmc_resumption.redisclient.text import show_name

# the module, not its names: models.py imports this one for ``ResumptionInput.start_options``
from xmc_resumption.workflows import models

if TYPE_CHECKING:
    from xmc_resumption.workflows.models import Progress, ResumptionInput


def groups_text(inp: ResumptionInput) -> str:
    """The groups that bound the replay, for the UI: the names, or the consumer group and every one with a consumer."""
    if inp.consumer_groups is None:
        return f"`{inp.consumer_group}` and every group with a consumer"
    return ", ".join(f"`{g}`" for g in inp.consumer_groups)


def ui_summary(inp: ResumptionInput) -> str:
    """One line for the start's ``static_summary`` (Temporal UI, "User Metadata")."""
    return f"Resume experiment {inp.experiment_id} into {inp.stream} (group {inp.consumer_group})"


def ui_details(inp: ResumptionInput) -> str:
    """Markdown for the start's ``static_details``: the settings this resumption runs with."""
    return (
        f"Replays the held tasks of **{inp.experiment_id}** into `{inp.stream}`, throttled by the "
        f"largest backlog of {groups_text(inp)} (group `{inp.consumer_group}` must exist).\n\n"
        f"- threshold: {inp.max_backlog_threshold} entries (waits at or above it)\n"
        f"- batch: {batch_text(inp)}\n"
        f"- pacing: {pacing_text(inp)}; claim lease: {inp.claim_lease_seconds:g} s\n"
        f"- stalled after {inp.stall_window_seconds:g} s without the backlog going down"
        + (f"; ends the run after {inp.max_stall_seconds:g} s" if inp.max_stall_seconds else "")
        + "\n"
        f"- missing consumer group: {inp.missing_group.value}; continue-as-new every {inp.turns_per_run} turns "
        f"or {inp.max_run_seconds:g} s"
        + (f"\n- rate cap: {inp.max_tasks_per_second:g} tasks/s" if inp.max_tasks_per_second else "")
    )


def batch_text(inp: ResumptionInput) -> str:
    """The batch setting for people: automatic and its bound, or the input's."""
    if inp.batch_size is None:
        kib, most = models.AUTO_SCRIPT_BYTES // 1024, models.AUTO_BATCH_SIZE
        return f"automatic, about {kib} KiB of tasks (at most {most}) per script"
    return f"up to {inp.batch_size} tasks per script"


def pacing_text(inp: ResumptionInput) -> str:
    """The throttle policy and its waits' bounds for people."""
    if inp.throttle_policy is models.ThrottlePolicy.FIXED:
        return f"fixed, {inp.throttle_seconds:g} s waits"
    return f"adaptive, waits of {inp.min_wait_seconds:g}..{inp.longest_wait_seconds:g} s"


def details_markdown(p: Progress) -> str:
    """The UI's current details (markdown; ``workflow.set_current_details``)."""
    unknown = "?"
    lines = [
        f"**{p.experiment_id}**: {p.phase.value}" + (f" ({p.outcome.value})" if p.outcome else ""),
        "",  # a blank line, so that markdown renders the list below as a list
        f"- replayed: {p.replayed}, remaining: {unknown if p.remaining is None else p.remaining}",
        f"- backlog: {unknown if p.backlog is None else p.backlog} / threshold {p.threshold}"
        + (f" (group `{show_name(p.limiting_group)}`)" if p.limiting_group else ""),
        f"- pacing: {p.policy.value}"
        + (f", drain ~{p.drain_rate:,.0f}/s" if p.drain_rate is not None else "")
        + (f", low watermark {p.low_watermark}" if p.low_watermark is not None else ""),
        f"- throttle waits: {p.throttles}" + (f", last: {p.throttle_reason}" if p.throttle_reason else ""),
    ]
    if p.wait_plan:
        lines.append(f"- wait: {p.wait_plan}")
    if p.phase is models.Phase.WAITING_FOR_GROUP:
        lines.append(f"- **waiting for a consumer group**: {p.throttle_reason}")
    lines.append(f"- ETA: {eta_text(p)}")
    if p.rate_waits or p.max_tasks_per_second or p.stream_rate_limit:
        lines.append(
            f"- rate cap: {rate_caps_text(p)}; waits: {p.rate_waits}"
            + (f", last: {p.rate_reason}" if p.rate_reason else "")
        )
    if p.stalled:
        lines.append(f"- **stalled** for {p.stalled_seconds:,.0f} s: {p.stall_reason}")
    if p.redis_waits:
        lines.append(f"- Redis unavailable: {p.redis_waits} waits, last: {p.last_error}")
    if p.set_aside:
        lines.append(
            f"- **set aside**: {p.set_aside} tasks too large to move (`{p.dead_letter_key}`; "
            f"`xmc dead {p.experiment_id}` to retry or drop)"
        )
    if p.stopping:
        lines.append("- **stopping**: paused by the pause Update at the next turn")
    if p.release_error:
        lines.append(f"- **{p.release_error}**")
    lines.append(f"- turns: {p.turns}, run {p.runs}, fencing token {p.token}")
    phase = models.Phase
    if p.phase in (phase.THROTTLED, phase.STALLED, phase.RATE_LIMITED, phase.WAITING_FOR_GROUP) and p.throttled_until:
        lines.append(f"- waiting until {p.throttled_until.isoformat(timespec='seconds')}")
    return "\n".join(lines)


def eta_text(p: Progress) -> str:
    """The ETA for people: ``~1m 05s (at 12:34:56Z), net ~412/s``, ``0s (nothing left to move)``, or ``-`` and why."""
    if p.eta_seconds is None or p.eta_at is None:
        why = "no net drain rate measured yet" if p.net_rate is None else f"net ~{p.net_rate:,.0f}/s"
        return f"- ({why})"
    if p.eta_seconds == 0:
        return "0s (nothing left to move)"
    rate = f", net ~{p.net_rate:,.0f}/s" if p.net_rate is not None else ""
    return f"~{duration_text(p.eta_seconds)} (at {p.eta_at.strftime('%H:%M:%SZ')}){rate}"


def rate_caps_text(p: Progress) -> str:
    """The rate caps in force: ``replay 50/s, stream 200/s`` or ``none``."""
    caps = [f"replay {p.max_tasks_per_second:g}/s"] if p.max_tasks_per_second else []
    caps += [f"stream {p.stream_rate_limit:g}/s"] if p.stream_rate_limit else []
    return ", ".join(caps) or "none"


def duration_text(seconds: float) -> str:
    """``seconds`` for people: ``42s``, ``3m 07s``, ``2h 05m``, ``3d 04h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3_600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3_600}h {s % 3_600 // 60:02d}m"
    return f"{s // 86_400}d {s % 86_400 // 3_600:02d}h"

"""The hand-back at a resumption's end: release the claim and revoke its token (docs/contract.md, "Faults")."""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.requests import ReleaseRequest
    from xmc_resumption.activities.resumption import ResumptionActivities
    from xmc_resumption.redisclient.text import one_line
    from xmc_resumption.workflows.calls import FAILED_CALL, RELEASE_RETRY, call, failure_text, permanent, waited
    from xmc_resumption.workflows.calls import now as clock_now
    from xmc_resumption.workflows.models import Outcome
    from xmc_resumption.workflows.state import RunState

MAX_RELEASE_ROUNDS = 5
"""The most rounds of release tries (each ``RELEASE_RETRY``'s attempts), so a run ends while Redis stays away."""


async def release_claim(state: RunState, *, back_to_paused: bool, outcome: str) -> str | None:
    """Release the claim of ``state``'s token, revoke the token and record ``outcome``: docs/contract.md, "Faults".

    Token 0 releases whatever claim the owner holds. Returns None once released, else ``release_error`` (one line).
    """
    inp = state.input
    rounds = 0
    while True:
        rounds += 1
        try:
            release = await call(
                ResumptionActivities.release_claim,
                ReleaseRequest(
                    ref=state.ref, token=state.token, owner=state.owner, back_to_paused=back_to_paused, outcome=outcome
                ),
                summary=f"release the claim (token {state.token or 'of this workflow'})",
                retry_policy=RELEASE_RETRY,
            )
            state.released(release)
            return None
        except FAILED_CALL as err:
            error, now = one_line(failure_text(err), 300), clock_now()
            left = (state.lease_until - now).total_seconds() if state.lease_until else 0.0
            last = permanent(err) or rounds >= MAX_RELEASE_ROUNDS or left <= 0
            if last or state.progress.outcome is Outcome.CANCELLED:
                break
            workflow.logger.warning(
                "claim not released yet; trying again",
                extra={"experiment_id": inp.experiment_id, "token": state.token, "error": error, "round": rounds},
            )
            await workflow.sleep(
                timedelta(seconds=min(inp.redis_retry_seconds, left)),
                summary=f"release failed ({rounds} of at most {MAX_RELEASE_ROUNDS} rounds): trying again",
            )
            waited()
    told = f"claim not released after {rounds} round(s) of tries: {error}; {next_step(state, back_to_paused, now)}"
    workflow.logger.error(
        "claim not released",
        extra={
            "experiment_id": inp.experiment_id,
            "token": state.token,
            "error": error,
            "lease_until": state.lease_until.isoformat() if state.lease_until else None,
            "release_error": told,
        },
    )
    return told


def next_step(state: RunState, back_to_paused: bool, now: datetime) -> str:
    """What happens to a claim that could not be released, as of workflow time ``now``."""
    e, until = state.input.experiment_id, state.lease_until
    lease = (
        f"its lease lapses by {until:%Y-%m-%d %H:%M:%S} UTC (claim_lease_seconds after the last call that extended it)"
        if until is not None and until > now
        else "its lease has lapsed"
    )
    text = f"the token is not revoked, and {lease}; a new resume of {e} takes over at once (newest claim wins)"
    if back_to_paused:
        text += (
            f"; meanwhile {e} stays resuming with its held tasks kept, and once the lease lapsed `xmc status {e}` "
            "shows it orphaned (resuming, no live claim) until it is resumed or paused again"
        )
    return text

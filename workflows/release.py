"""The hand-back at a resumption's end: release the claim and revoke its token.

Retried while the claim's lease lasts, and said in the result, the log and ``xmc status`` when it could not be done
(docs/contract.md, "Result and outcomes"). Workflow code only.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.requests import ReleaseRequest
    from xmc_resumption.activities.resumption import ResumptionActivities
    from xmc_resumption.redisclient.text import one_line
    from xmc_resumption.workflows.calls import FAILED_CALL, RELEASE_RETRY, call, failure_text, permanent
    from xmc_resumption.workflows.models import Outcome
    from xmc_resumption.workflows.state import RunState

MAX_RELEASE_ROUNDS = 5
"""The most rounds of release tries (each ``RELEASE_RETRY``'s 7 attempts, about 10 s of backoff),
so a run ends even while Redis stays away."""


async def release_claim(state: RunState, *, back_to_paused: bool, outcome: str) -> str | None:
    """Release the claim of ``state``'s token, revoke the token and record ``outcome``.

    Token 0 releases whatever claim the owner holds; the outcome goes into the release log
    (``{S}:experiment:E:released``); ``back_to_paused`` moves a resuming experiment back to paused. The reply's counts
    go into ``state`` (``RunState.released``).

    A round is one call with ``RELEASE_RETRY``'s tries; after a round failed on a fault that
    retrying may mend (Redis away), the next one follows a durable wait of
    ``redis_retry_seconds`` (at most until the lease lapses) while the claim's lease is live, at
    most ``MAX_RELEASE_ROUNDS`` rounds. A fault retrying cannot mend (a key of the wrong type,
    an ACL refusal) ends the tries at once, and so does a cancel (the run ends within one round:
    a cancelled run has no result, so its log line tells).

    Returns:
        None once released (or nothing to release); else why not and what happens next, one line,
        which the caller puts in the result (``release_error``); it is also logged, as one line.
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
            error, now = one_line(failure_text(err), 300), workflow.now()
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

"""Failover behind a stable address: drop a client's pooled connections when they point at a
server that is no longer the primary.

A managed Redis fails over by promoting a replica and moving its DNS name (or a proxy's target) to
it; the old primary becomes a replica. Connections opened before the switch stay open to the old
server, which now answers every write with ``READONLY`` (or, as a cluster node that lost the slot,
``MOVED``), and redis-py hands them out of its pool for ever: an error reply leaves a connection
healthy in its eyes. A reset connection is closed by redis-py, but only that one; the pool's other
connections to the same server fail one by one.

``drop_stale_connections`` is the remedy, called by the activities (``activities.resumption``) on
any of ``STALE_CONNECTION_ERRORS`` before the error is re-raised for Temporal's retry: idle
connections are closed at once, connections in use by other calls are closed when they are
released (redis-py >= 7), and every connection opens afresh on its next use, resolving the
stable address again. Nothing is resent here: the retry is Temporal's, so it stays bounded and
visible.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, MovedError, ReadOnlyError, TimeoutError

logger = logging.getLogger(__name__)

STALE_CONNECTION_ERRORS: tuple[type[Exception], ...] = (ReadOnlyError, MovedError, ConnectionError, TimeoutError)
"""Errors after which a pooled connection may point at the wrong server: ``READONLY`` (the old
primary, now a replica), ``MOVED`` (a cluster node that no longer serves the slot), a connection
reset, refused or closed (redis' ``ConnectionError``, which includes ``LOADING``) and a timeout (a
server gone silent). A reconnect after any of them costs one TCP (and TLS) handshake."""


async def drop_stale_connections(redis: Redis) -> None:
    """Close ``redis``'s pooled connections so the next command connects afresh.

    Idle connections are closed now; connections that other calls are using right now are marked to
    be closed when they go back to the pool (where the redis-py version supports it), so a command
    in flight is never cut. Never raises: a failure to close a socket is logged at debug level and
    the caller's own error is what matters.
    """
    pool = redis.connection_pool
    try:
        await pool.disconnect(inuse_connections=False)
        mark_in_use = getattr(pool, "update_active_connections_for_reconnect", None)  # redis-py >= 7
        if mark_in_use is not None:
            await mark_in_use()
    except Exception:  # closing is best effort; the next command reconnects whatever state a socket is in
        logger.debug("closing pooled Redis connections failed", exc_info=True)

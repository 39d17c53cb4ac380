"""The client type of the Redis layer, and failover behind a stable address.

After a failover, a client's pooled connections that point at a server that is no longer the
primary are dropped.

``RedisClient`` is what every function of ``redisclient`` takes: a single Redis (``Redis``) or a
Redis Cluster (``RedisCluster``, ``XMC_REDIS_CLUSTER``). Both speak the same commands; a cluster
client routes each command to the primary that owns its keys' slot, so every script and the
dead-letter transaction touch keys of one slot only (the ``{S}`` hash tag, ``redisclient.keys``).

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

A client may also require replica acknowledgements (``require_replica_acks``,
``XMC_REPLICA_ACKS``): then the scripts that write what must survive a failover count as done only
once that many replicas have their writes (``redisclient.scripts.run_script``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
import redis.cluster
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ConnectionError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TimeoutError,
)

logger = logging.getLogger(__name__)

RedisClient = Redis | RedisCluster
"""An asyncio client of a single Redis or of a Redis Cluster (``xmc_resumption.settings.Settings.redis``)."""

SyncRedisClient = redis.Redis | redis.cluster.RedisCluster
"""A blocking client of a single Redis or of a Redis Cluster (``Settings.sync_redis``): a producer's
client in sync code (``xmc_resumption.client.XmcSyncClient``)."""


class ClusterClient(RedisCluster):
    """redis-py's asyncio cluster client, failing like a single Redis client when it cannot learn the slot map.

    It raises the last seed node's own error (``ConnectionError``, ``TimeoutError``,
    ``AuthenticationError``: a ``RedisError``, so the activities retry it and the CLI and the worker
    report it in one line), or a ``ResponseError`` when a seed answers but is no cluster node.
    (redis-py raises ``RedisClusterException``, which is no ``RedisError``, for both.)
    """

    async def initialize(
        self,
        additional_startup_nodes_info: list[tuple[str, int]] | None = None,
        last_failed_node_name: str | None = None,
    ) -> RedisCluster:
        """Learn the slot map (``CLUSTER SLOTS``) if not known yet; see the class for the errors."""
        try:
            return await super().initialize(additional_startup_nodes_info, last_failed_node_name)
        except RedisClusterException as err:
            cause = err.__cause__
            if isinstance(cause, RedisError):
                raise cause from err
            if isinstance(cause, RedisClusterException):  # "Cluster mode is not enabled on this node"
                raise ResponseError(f"{cause}: a Redis Cluster was expected (XMC_REDIS_CLUSTER)") from err
            raise


STALE_CONNECTION_ERRORS: tuple[type[Exception], ...] = (ReadOnlyError, MovedError, ConnectionError, TimeoutError)
"""Errors after which a pooled connection may point at the wrong server: ``READONLY`` (the old
primary, now a replica), ``MOVED`` (a cluster node that no longer serves the slot), a connection
reset, refused or closed (redis' ``ConnectionError``, which includes ``LOADING``) and a timeout (a
server gone silent). A reconnect after any of them costs one TCP (and TLS) handshake."""

WRONG_NODE_ERRORS: tuple[type[Exception], ...] = (ReadOnlyError, MovedError)
"""Errors that mean a cluster client's slot map is out of date: the node it took for a slot's
primary is a replica now, or serves the slot no longer. (The cluster client follows a MOVED
itself; one reaches the caller only after its tries ran out.)"""


async def drop_stale_connections(redis: RedisClient, error: BaseException | None = None) -> None:
    """Close ``redis``'s pooled connections so the next command connects afresh.

    Idle connections are closed now; connections that other calls are using right now are marked to
    be closed when they go back to the pool (where the redis-py version supports it), so a command
    in flight is never cut. A cluster client does this on every node, and after one of
    ``WRONG_NODE_ERRORS`` (``error``) also re-reads the slot map (``CLUSTER SLOTS``) so the retry
    goes to the slot's primary of now; after a connection fault or a timeout the cluster client has
    marked its map for a re-read itself. Never raises: a failure to close a socket or to read the
    map is logged at debug level and the caller's own error is what matters.
    """
    try:
        if isinstance(redis, RedisCluster):
            if isinstance(error, WRONG_NODE_ERRORS):
                await redis.nodes_manager.initialize()
            for node in redis.get_nodes():
                node.update_active_connections_for_reconnect()
                await node.disconnect_free_connections()
            return
        pool = redis.connection_pool
        await pool.disconnect(inuse_connections=False)
        mark_in_use = getattr(pool, "update_active_connections_for_reconnect", None)  # redis-py >= 7
        if mark_in_use is not None:
            await mark_in_use()
    except Exception:  # closing is best effort; the next command reconnects whatever state a socket is in
        logger.debug("closing pooled Redis connections failed", exc_info=True)


MAX_REPLICA_ACKS = 16
"""The most replicas ``ReplicaAcks`` may require."""

MAX_REPLICA_ACK_TIMEOUT_MS = 5_000
"""The longest ``WAIT`` (milliseconds): a Redis call of the replay has 10 s in all
(``workflows.calls``), and a replica that has not acknowledged by then is a fault to retry."""


@dataclass(frozen=True)
class ReplicaAcks:
    """How many replicas must have a script's writes before it counts as done, and how long to wait.

    Attributes:
        replicas: replicas that must acknowledge (1..``MAX_REPLICA_ACKS``).
        timeout_ms: how long ``WAIT`` waits for them (1..``MAX_REPLICA_ACK_TIMEOUT_MS`` ms; never
            0, which would wait for ever).

    Raises:
        ValueError: either out of its bounds, naming its setting.
    """

    replicas: int
    timeout_ms: int

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not 1 <= self.replicas <= MAX_REPLICA_ACKS:
            raise ValueError(f"XMC_REPLICA_ACKS must be 0 (off) or 1..{MAX_REPLICA_ACKS}, got {self.replicas!r}")
        if isinstance(self.timeout_ms, bool) or not 1 <= self.timeout_ms <= MAX_REPLICA_ACK_TIMEOUT_MS:
            raise ValueError(
                f"XMC_REPLICA_ACK_TIMEOUT_MS must be 1..{MAX_REPLICA_ACK_TIMEOUT_MS}, got {self.timeout_ms!r}"
            )


_ACKS_ATTRIBUTE = "_xmc_replica_acks"


def require_replica_acks(client: RedisClient | SyncRedisClient, acks: ReplicaAcks | None) -> None:
    """Make ``client``'s acknowledged scripts wait for ``acks`` (None: no more waiting).

    The claim, every publish, the release and the enqueue (``redisclient.scripts.ACKNOWLEDGED``)
    then run on one connection followed by ``WAIT replicas timeout_ms``, and raise
    ``errors.ReplicaAckError`` when fewer replicas acknowledged.

    Raises:
        ValueError: ``client`` is a Redis Cluster client (a cluster client sends WAIT to every
            primary, not after the script on its connection).
    """
    if acks is not None and isinstance(client, RedisCluster | redis.cluster.RedisCluster):
        raise ValueError("XMC_REPLICA_ACKS is not supported with XMC_REDIS_CLUSTER")
    client.__dict__[_ACKS_ATTRIBUTE] = acks


def replica_acks(client: RedisClient | SyncRedisClient) -> ReplicaAcks | None:
    """The replica acknowledgements ``client``'s acknowledged scripts wait for (None: none)."""
    acks = client.__dict__.get(_ACKS_ATTRIBUTE)
    return acks if isinstance(acks, ReplicaAcks) else None

"""Settings from the environment (pydantic-settings) and the clients built from them.

Redis and the task queue come from ``XMC_*`` variables; the Temporal connection comes from the
SDK's environment configuration (``temporalio.envconfig``: ``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_PROFILE`` and the TOML profiles), so the
worker and the CLI connect exactly like the ``temporal`` CLI does.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry as SyncRetry
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig, ClientConnectConfig
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from xmc_resumption.redisclient.connection import (
    MAX_REPLICA_ACK_TIMEOUT_MS,
    MAX_REPLICA_ACKS,
    ClusterClient,
    RedisClient,
    ReplicaAcks,
    SyncRedisClient,
    require_replica_acks,
)
from xmc_resumption.workflows import metrics
from xmc_resumption.workflows.models import TASK_QUEUE

DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"

MAX_REDIS_TIMEOUT_SECONDS = 300.0
"""The longest socket timeout ``XMC_REDIS_TIMEOUT_SECONDS`` accepts: a Redis call of the replay is
retried for about 6 s, so a timeout of minutes already means an unresponsive Redis."""

CLUSTER_RETRIES = 3
"""How often the cluster client re-reads the slot map and retries a call after a refused or reset
connection, a timeout or CLUSTERDOWN (redis-py's default is 10). Each try may wait a socket timeout
for a silent node, and the activity's call has 10 s (``REDIS_CALL_TIMEOUT``): longer outages are
Temporal's retry (``REDIS_RETRY``), bounded and visible. redis-py retries at once (it uses the
retry object for its count only), so no backoff is set."""

MAX_VERSION_PART_LENGTH = 255
"""The longest ``XMC_DEPLOYMENT_NAME`` and ``XMC_BUILD_ID`` (characters): the Temporal server's for a build ID."""

UNVERSIONED_BUILD_ID = "__unversioned__"
"""The build ID the Temporal server reserves for the workers without versioning."""

SECRET_QUERY_ARGS = frozenset({"password", "username"})
"""Query arguments of a Redis URL that ``redacted_url`` masks (redis-py passes unknown ones on)."""


def redacted_url(url: str) -> str:
    """``url`` with its password (and any ``password=`` query argument) replaced by ``***``.

    Every URL the CLI and the worker print goes through this. The password is what follows the
    first ``:`` of the user part, up to the last ``@`` before the host, so ``@``, ``:`` and ``%``
    in it (escaped or not) are masked with it. A URL that cannot be parsed at all is shown as
    ``<unparseable URL>``, and so is one whose password holds an unescaped ``/``, ``?`` or ``#``
    (it ends the host part early, spilling the rest of the password into the path: redis-py cannot
    read such a URL either): printing it could print a secret.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostport = netloc.rpartition("@")
            user = userinfo.partition(":")[0]
            netloc = f"{user}:***@{hostport}"
        pairs = [(k, "***" if k in SECRET_QUERY_ARGS else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
        if "@" in parts.path + parts.fragment + "".join(k + v for k, v in pairs):
            return "<unparseable URL>"  # a user part that did not end at its '@': see above
        query = urlencode(pairs, safe="*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<unparseable URL>"


def redis_db_of(url: str) -> int:
    """The database index a valid ``XMC_REDIS_URL`` selects (0 when it names none)."""
    return int(parse_url(url).get("db", 0))


DEFAULT_WORKFLOW_TASKS = 10
"""The standalone worker's workflow tasks at once (the SDK's default is 100): docs/scale.md, "How many workers"."""

MAX_WORKFLOW_TASKS = 1_000
"""The most workflow tasks at once ``XMC_MAX_CONCURRENT_WORKFLOW_TASKS`` takes."""


class Settings(BaseSettings):
    """The process's settings, read from ``XMC_*`` environment variables.

    ``XMC_REDIS_URL`` (redis://, rediss:// or unix:// URL), ``XMC_TASK_QUEUE``, ``XMC_METRICS_BIND``
    (host:port for a Prometheus ``/metrics`` endpoint, off when unset), ``XMC_REDIS_TIMEOUT_SECONDS``
    (0 < s <= 300), ``XMC_REDIS_CONNECT_TIMEOUT_SECONDS`` (a new connection's, 0 < s <= 300, default 2, at most the
    socket timeout: a worker cut off from Redis learns it from its first connect), ``XMC_REDIS_CLUSTER`` (``true``:
    the URL is a seed node of a Redis Cluster, reached with redis-py's cluster client; default ``false``); TLS to
    Redis (``rediss://`` only): ``XMC_REDIS_TLS_CA_FILE``, ``XMC_REDIS_TLS_CERT_FILE``, ``XMC_REDIS_TLS_KEY_FILE``
    (PEM files, see ``redis_tls_kwargs``); ``XMC_LOG_FORMAT`` (the worker's log lines: ``json``, one JSON object a line
    with every ``extra`` field, or ``text``); ``XMC_DEPLOYMENT_NAME`` and ``XMC_BUILD_ID`` (together: the
    worker's Worker Deployment Version, see ``deployment_version``; unset, the worker is unversioned);
    ``XMC_REPLICA_ACKS`` (0, the default: off; N in 1..16: the claim, every publish, the release and the enqueue
    count as done only once N replicas have their writes, each followed by ``WAIT N
    XMC_REPLICA_ACK_TIMEOUT_MS``; a shorter count is a retryable ``ReplicaAckError``; single Redis only) and
    ``XMC_REPLICA_ACK_TIMEOUT_MS`` (1..5,000, default 1,000, below the socket timeout);
    ``XMC_MAX_CONCURRENT_WORKFLOW_TASKS`` (2..1,000: the SDK's core refuses 1 with a workflow cache; default
    ``DEFAULT_WORKFLOW_TASKS``): the standalone worker's
    workflow tasks at once (docs/scale.md, "How many workers").

    Every field is checked when the settings are read, so a bad value fails before any
    connection, with a message naming the variable and never its secret (see ``xmc_resumption.errors``).
    """

    model_config = SettingsConfigDict(env_prefix="XMC_")

    redis_url: str = "redis://127.0.0.1:6379/0"
    task_queue: str = Field(default=TASK_QUEUE, min_length=1, max_length=1000)
    metrics_bind: str | None = None
    redis_timeout_seconds: float = Field(default=5.0, gt=0, le=MAX_REDIS_TIMEOUT_SECONDS, allow_inf_nan=False)
    redis_connect_timeout_seconds: float = Field(default=2.0, gt=0, le=MAX_REDIS_TIMEOUT_SECONDS, allow_inf_nan=False)
    log_format: Literal["json", "text"] = "json"
    redis_cluster: bool = False
    redis_tls_ca_file: Path | None = None
    redis_tls_cert_file: Path | None = None
    redis_tls_key_file: Path | None = None
    deployment_name: str | None = Field(default=None, max_length=MAX_VERSION_PART_LENGTH)
    build_id: str | None = Field(default=None, max_length=MAX_VERSION_PART_LENGTH)
    replica_acks: int = Field(default=0, ge=0, le=MAX_REPLICA_ACKS)
    replica_ack_timeout_ms: int = Field(default=1_000, ge=1, le=MAX_REPLICA_ACK_TIMEOUT_MS)
    max_concurrent_workflow_tasks: int = Field(default=DEFAULT_WORKFLOW_TASKS, ge=2, le=MAX_WORKFLOW_TASKS)

    @field_validator("deployment_name", "build_id")
    @classmethod
    def _version_part(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Printable text (empty means unset); a deployment name without ``.``, a build ID not ``__unversioned__``.

        The Temporal server joins the two as ``<name>.<build_id>`` and refuses to make a version current when the
        name holds a ``.``; it reserves ``__unversioned__`` for the workers without versioning.
        """
        if not value:
            return None
        if not value.isprintable() or value != value.strip():
            raise ValueError("must be printable, without leading or trailing spaces")
        if info.field_name == "deployment_name" and "." in value:
            raise ValueError("must not contain '.' (Temporal writes a version as <deployment name>.<build ID>)")
        if value == UNVERSIONED_BUILD_ID:
            raise ValueError(f"{UNVERSIONED_BUILD_ID} is reserved by Temporal for the workers without versioning")
        return value

    @field_validator("redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file")
    @classmethod
    def _readable_file(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        """A PEM file that exists and this process may read (empty means unset), with a ``rediss://`` URL only.

        redis-py ignores TLS files on ``redis://``, and the operator would believe the connection
        encrypted. Only the path is ever shown: the file may hold a key.
        """
        if path is None or str(path) in ("", "."):
            return None
        if urlsplit(str(info.data.get("redis_url", ""))).scheme != "rediss":
            raise ValueError("needs a rediss:// XMC_REDIS_URL (TLS)")
        if not path.is_file():
            raise ValueError(f"no such file: {str(path)[:200]}")
        if not os.access(path, os.R_OK):
            raise ValueError(f"not readable by this process: {str(path)[:200]}")
        return path

    @model_validator(mode="after")
    def _replica_acks_where_they_work(self) -> Settings:
        """Replica acknowledgements on a single Redis only, and a ``WAIT`` shorter than the socket timeout."""
        if self.replica_acks and self.redis_cluster:
            raise ValueError("XMC_REPLICA_ACKS is not supported with XMC_REDIS_CLUSTER (a cluster client sends WAIT "
                             "to every primary, not after the script on its connection)")  # fmt: skip
        if self.replica_acks and self.replica_ack_timeout_ms >= self.redis_timeout_seconds * 1000:
            raise ValueError(
                f"XMC_REPLICA_ACK_TIMEOUT_MS ({self.replica_ack_timeout_ms}) must be below XMC_REDIS_TIMEOUT_SECONDS "
                f"({self.redis_timeout_seconds:g} s): the socket would time out before WAIT answers"
            )
        return self

    def replica_acks_required(self) -> ReplicaAcks | None:
        """What ``XMC_REPLICA_ACKS`` asks of the scripts' writes (None: off)."""
        return ReplicaAcks(self.replica_acks, self.replica_ack_timeout_ms) if self.replica_acks else None

    @model_validator(mode="after")
    def _client_certificate_with_its_key(self) -> Settings:
        """A client certificate needs its private key, and a key its certificate."""
        if (self.redis_tls_cert_file is None) != (self.redis_tls_key_file is None):
            raise ValueError("XMC_REDIS_TLS_CERT_FILE and XMC_REDIS_TLS_KEY_FILE go together (a client certificate)")
        return self

    @model_validator(mode="after")
    def _deployment_name_with_its_build_id(self) -> Settings:
        """A Worker Deployment Version is a deployment name and a build ID: both or neither."""
        if (self.deployment_name is None) != (self.build_id is None):
            raise ValueError("XMC_DEPLOYMENT_NAME and XMC_BUILD_ID go together (a Worker Deployment Version)")
        return self

    def deployment_version(self) -> WorkerDeploymentVersion | None:
        """The worker's Worker Deployment Version (``XMC_DEPLOYMENT_NAME``, ``XMC_BUILD_ID``); None: unversioned.

        ``ResumptionPlugin`` turns it on (docs/operating.md, "Rolling out a release").
        """
        if self.deployment_name is None or self.build_id is None:
            return None
        return WorkerDeploymentVersion(deployment_name=self.deployment_name, build_id=self.build_id)

    def redis_tls_kwargs(self) -> dict[str, Any]:
        """The redis-py TLS keywords of these settings (empty for ``redis://`` and ``unix://``).

        The CA that verifies the server's certificate (``ssl_ca_certs``; the system's CAs when unset), the
        client certificate and key (``ssl_certfile``, ``ssl_keyfile``) for a server that requires one
        (``tls-auth-clients``). The server's certificate is always verified, its host name too (redis-py's
        defaults for ``rediss://``).
        """
        if urlsplit(self.redis_url).scheme != "rediss":
            return {}
        kwargs: dict[str, Any] = {"ssl_cert_reqs": "required"}
        if self.redis_tls_ca_file:
            kwargs["ssl_ca_certs"] = str(self.redis_tls_ca_file)
        if self.redis_tls_cert_file and self.redis_tls_key_file:
            kwargs["ssl_certfile"] = str(self.redis_tls_cert_file)
            kwargs["ssl_keyfile"] = str(self.redis_tls_key_file)
        return kwargs

    @field_validator("redis_url")
    @classmethod
    def _valid_redis_url(cls, url: str) -> str:
        """Parse the URL with redis-py's own parser (what the client does); refuse a non-numeric database path.

        redis-py silently reads ``redis://host/abc`` as database 0.
        """
        try:
            kwargs = parse_url(url)
        except ValueError as err:  # the scheme, a port that is no number, a bad query argument
            message = str(err).rstrip(".")
            if message.startswith("Port could not be cast"):
                # urllib quotes what it took for the port: the rest of a password whose unescaped
                # '/', '?' or '#' ended the host part early
                message = "the port is not a number (in a password, '/', '?' and '#' must be escaped: %2F, %3F, %23)"
            raise ValueError(message) from None
        parts = urlsplit(url)
        if parts.scheme in ("redis", "rediss"):
            # redis-py reads the path with int(), which takes any script's digits (Arabic-Indic 1 as 1)
            db = parts.path.strip("/")
            if db and not (db.isascii() and db.isdigit()):
                raise ValueError(f"the database must be a number (redis://host:port/0), got {db[:40]!r}")
        for name, value in parse_qsl(parts.query):
            if isinstance(kwargs.get(name), int | float) and not value.isascii():
                raise ValueError(f"{name} must be a number in ASCII digits, got {value[:40]!r}")
        return url

    @field_validator("redis_cluster")
    @classmethod
    def _valid_cluster_url(cls, cluster: bool, info: ValidationInfo) -> bool:
        """Refuse a cluster URL that is not TCP or names a database other than 0.

        A cluster is reached over TCP (redis:// or rediss://, any one node as the seed) and has database 0
        only (Redis Cluster spec: "Redis Cluster does not support multiple databases").
        """
        url = info.data.get("redis_url")
        if not cluster or url is None:  # a bad URL is reported on its own
            return cluster
        scheme = urlsplit(url).scheme
        if scheme not in ("redis", "rediss"):
            raise ValueError(f"a Redis Cluster is reached by a redis:// or rediss:// seed URL, got {scheme}://")
        if redis_db_of(url) != 0:
            raise ValueError(f"a Redis Cluster has database 0 only, XMC_REDIS_URL selects {redis_db_of(url)}")
        return cluster

    @field_validator("metrics_bind")
    @classmethod
    def _valid_metrics_bind(cls, bind: str | None) -> str | None:
        """``host:port`` with a port in 1..65535 (empty means off)."""
        if not bind:
            return None
        host, sep, port = bind.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            raise ValueError(f"must be host:port with a port in 1..65535, got {bind[:80]!r}")
        return bind

    def redis_location(self) -> str:
        """The Redis URL for messages and logs, its password masked."""
        return redacted_url(self.redis_url)

    def redis(self, *, retries: int | None = None) -> RedisClient:
        """A new asyncio Redis client; bytes in, bytes out (task field maps move byte for byte).

        With ``XMC_REDIS_CLUSTER`` a cluster client (``redis_cluster_client``).

        Args:
            retries: how often redis-py sends a command again after a connection error or a
                timeout, at once; None keeps redis-py's default (``CLUSTER_RETRIES`` for a
                cluster). 0 for a producer: a command resent after its reply was lost runs twice
                (``xmc_resumption.client`` retries only what is idempotent).
        """
        if self.redis_cluster:
            return self.redis_cluster_client(retries=retries)
        return self._single_redis(None if retries is None else Retry(NoBackoff(), retries))

    def worker_redis(self) -> RedisClient:
        """The Redis client of a worker's activities (``ResumptionPlugin``): one reconnect, no resend after a timeout.

        A command that finds its pooled connection closed (an idle connection a proxy or Redis's ``timeout`` ended)
        is sent once more on a new one, so a worker that reaches Redis does not hand its replays on
        (workflows/calls.py, ``HandOff``); a command that timed out is not sent again: Temporal retries the call.
        A cluster client keeps redis-py's retries (it re-reads its slot map on them).
        """
        if self.redis_cluster:
            return self.redis()
        return self._single_redis(Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)))

    def _single_redis(self, retry: Retry | None) -> Redis:
        """A single-node asyncio client with ``retry`` (None: redis-py's default) and the replica-ack check."""
        kwargs: dict[str, Any] = self._client_kwargs() | ({} if retry is None else {"retry": retry})
        client = Redis.from_url(self.redis_url, **kwargs)
        require_replica_acks(client, self.replica_acks_required())
        return client

    def sync_redis(self, *, retries: int | None = None) -> SyncRedisClient:
        """A new blocking Redis client with the same settings as ``redis``, for producers in sync code.

        Bytes, timeouts, TLS; with ``XMC_REDIS_CLUSTER`` redis-py's blocking cluster client. Used by
        ``xmc_resumption.client.XmcSyncClient``; ``retries`` as for ``redis``.
        """
        if self.redis_cluster:
            return SyncRedisCluster.from_url(
                self.redis_url,
                retry=SyncRetry(NoBackoff(), CLUSTER_RETRIES if retries is None else retries),
                **self._client_kwargs(),
            )
        retry: dict[str, Any] = {} if retries is None else {"retry": SyncRetry(NoBackoff(), retries)}
        client = SyncRedis.from_url(self.redis_url, **retry, **self._client_kwargs())
        require_replica_acks(client, self.replica_acks_required())
        return client

    def _client_kwargs(self) -> dict[str, Any]:
        """What both clients are built with: bytes, the socket timeouts, health checks, TLS."""
        return {
            "decode_responses": False,
            "socket_timeout": self.redis_timeout_seconds,
            "socket_connect_timeout": min(self.redis_connect_timeout_seconds, self.redis_timeout_seconds),
            "health_check_interval": 30,
            **self.redis_tls_kwargs(),
        }

    def redis_cluster_client(self, *, retries: int | None = None) -> RedisCluster:
        """A new asyncio Redis Cluster client (a ``ClusterClient``) seeded by ``XMC_REDIS_URL``; bytes in, bytes out.

        It learns the slot map from the seed on its first command and follows the cluster itself:
        MOVED updates its map, ASK and TRYAGAIN (a slot being migrated) are retried (16 tries at
        most), and a refused or reset connection, a timeout or CLUSTERDOWN re-reads the map and
        retries, ``CLUSTER_RETRIES`` times; what it cannot mend reaches the activities, which hand
        it to Temporal's retry (``activities.resumption._classified``). Every script of the product
        touches one slot (``redisclient.scripts.run_script`` checks it before a call). A cluster
        that cannot be reached fails like a single Redis (``redisclient.connection.ClusterClient``).
        """
        return ClusterClient.from_url(
            self.redis_url,
            retry=Retry(NoBackoff(), retries=CLUSTER_RETRIES if retries is None else retries),
            **self._client_kwargs(),
        )


class TemporalUnreachableError(Exception):
    """Temporal could not be reached at the configured address.

    The message is one line naming ``TEMPORAL_ADDRESS`` (never the API key).
    """


def temporal_target() -> tuple[str, str]:
    """The address and namespace envconfig selects, with the SDK's defaults; for messages.

    Read from ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE`` and profiles.
    """
    config = ClientConfig.load_client_connect_config()
    return str(config.get("target_host") or DEFAULT_TEMPORAL_ADDRESS), str(config.get("namespace") or "default")


def temporal_connect_config() -> ClientConnectConfig:
    """The keywords ``connect_temporal`` passes to ``Client.connect``, as envconfig reads them.

    Address, namespace, API key (``TEMPORAL_API_KEY``; it turns TLS on), TLS (``TEMPORAL_TLS``,
    ``TEMPORAL_TLS_SERVER_CA_CERT_PATH``, ``TEMPORAL_TLS_CLIENT_CERT_PATH``,
    ``TEMPORAL_TLS_CLIENT_KEY_PATH``, ``TEMPORAL_TLS_SERVER_NAME`` or a profile's ``[profile.X.tls]`` in
    ``TEMPORAL_CONFIG_FILE``, chosen by ``TEMPORAL_PROFILE``); the address defaults to
    ``localhost:7233``. The result holds secrets (the API key, the client key's bytes): never print it.

    Raises:
        RuntimeError, ValueError, OSError: a malformed profile file, or a TLS file that cannot be read.
    """
    config = ClientConfig.load_client_connect_config()
    config.setdefault("target_host", DEFAULT_TEMPORAL_ADDRESS)
    return config


CORE_LOGGER = "temporalio.core"
"""The Python logger the SDK core's (Rust) log lines are forwarded to (``sdk_runtime``), the target
appended to its name (e.g. ``temporalio.core.temporalio_client::retry``)."""


def prometheus_runtime(bind_address: str) -> Runtime:
    """A Temporal SDK runtime serving Prometheus ``/metrics`` on ``bind_address`` (``host:port``).

    It follows the metric conventions of ``workflows/metrics.py`` (docs/embedding.md): counters end in
    ``_total`` (``counters_total_suffix``; the SDK's own ``temporal_*`` counters gain it too), durations
    in seconds, and ``xmc_resumption_throttle_wait_seconds``'s buckets from 50 ms to an hour.

    Pass it to ``Client.connect(runtime=...)``; a process needs one (each runtime has its own
    threads and its own endpoint).

    Raises:
        ValueError: ``bind_address`` is not ``host:port``; the SDK's error when the port is taken.
    """
    return sdk_runtime(bind_address, forward_core_logs=False)


def sdk_runtime(metrics_bind: str | None, *, forward_core_logs: bool) -> Runtime:
    """A Temporal SDK runtime with optional Prometheus metrics and the SDK core's log lines forwarded.

    Prometheus metrics on ``metrics_bind`` as ``prometheus_runtime`` serves them (None: none), and with
    ``forward_core_logs`` the SDK core's log lines (its warnings and errors) forwarded to the Python
    logger ``CORE_LOGGER``, so the process's log handler formats them (one JSON object a line,
    ``xmc_resumption.worker.setup_logging``) instead of the core printing ANSI-coloured text to stderr;
    else the SDK's default (the core prints them).

    Raises:
        ValueError: as ``prometheus_runtime``.
    """
    logging_config = (
        LoggingConfig(
            filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
            forwarding=LogForwardingConfig(logger=logging.getLogger(CORE_LOGGER)),
        )
        if forward_core_logs
        else LoggingConfig.default
    )
    prometheus = (
        PrometheusConfig(
            bind_address=metrics_bind,
            counters_total_suffix=True,
            durations_as_seconds=True,
            histogram_bucket_overrides=metrics.BUCKET_OVERRIDES,
        )
        if metrics_bind
        else None
    )
    return Runtime(telemetry=TelemetryConfig(logging=logging_config, metrics=prometheus))


async def connect_temporal(*, metrics_bind: str | None = None, forward_core_logs: bool = False) -> Client:
    """Connect to Temporal as configured by envconfig, with the pydantic data converter.

    Args:
        metrics_bind: ``host:port`` to serve Prometheus metrics on (the SDK's and the workflow's
            ``xmc_*`` counters); None for no metrics.
        forward_core_logs: forward the SDK core's log lines to Python logging (``sdk_runtime``):
            the worker's, whose every log line is JSON.

    Raises:
        TemporalUnreachableError: the server cannot be reached, or the address is malformed.
    """
    config = temporal_connect_config()
    runtime = sdk_runtime(metrics_bind, forward_core_logs=True) if forward_core_logs else None
    if runtime is None and metrics_bind:
        runtime = prometheus_runtime(metrics_bind)
    try:
        return await Client.connect(**config, data_converter=pydantic_data_converter, runtime=runtime)
    except (RuntimeError, ValueError) as err:  # the SDK's connect errors: unreachable, or a bad target URL
        raise TemporalUnreachableError(
            f"cannot reach Temporal at TEMPORAL_ADDRESS={config['target_host']}: {err}"
        ) from err

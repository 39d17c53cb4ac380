"""Settings from the environment (pydantic-settings) and the clients built from them.

Redis and the task queue come from ``XMC_*`` variables; the Temporal connection comes from the
SDK's environment configuration (``temporalio.envconfig``: ``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_PROFILE`` and the TOML profiles), so the
worker and the CLI connect exactly like the ``temporal`` CLI does.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.asyncio import Redis
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from workflows.models import TASK_QUEUE

DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"


class Settings(BaseSettings):
    """``XMC_REDIS_URL`` (redis:// URL), ``XMC_TASK_QUEUE``, ``XMC_METRICS_BIND`` (host:port for a
    Prometheus ``/metrics`` endpoint, off when unset), ``XMC_REDIS_TIMEOUT_SECONDS``."""

    model_config = SettingsConfigDict(env_prefix="XMC_")

    redis_url: str = "redis://127.0.0.1:6379/0"
    task_queue: str = TASK_QUEUE
    metrics_bind: str | None = None
    redis_timeout_seconds: float = 5.0

    def redis(self) -> Redis:
        """A new asyncio Redis client; bytes in, bytes out (task field maps move byte for byte)."""
        return Redis.from_url(
            self.redis_url,
            decode_responses=False,
            socket_timeout=self.redis_timeout_seconds,
            socket_connect_timeout=self.redis_timeout_seconds,
            health_check_interval=30,
        )


async def connect_temporal(*, metrics_bind: str | None = None) -> Client:
    """Connect to Temporal as configured by envconfig, with the pydantic data converter.

    Args:
        metrics_bind: ``host:port`` to serve Prometheus metrics on (the SDK's and the workflow's
            ``xmc_*`` counters); None for no metrics.

    Raises:
        RuntimeError: the server cannot be reached.
    """
    config = ClientConfig.load_client_connect_config()
    config.setdefault("target_host", DEFAULT_TEMPORAL_ADDRESS)
    runtime = None
    if metrics_bind:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=metrics_bind)))
    return await Client.connect(**config, data_converter=pydantic_data_converter, runtime=runtime)

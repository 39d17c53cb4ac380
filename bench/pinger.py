"""Another Redis client in its own process: ``python -m bench.pinger URL``.

No GIL shared with the bench: it PINGs every millisecond until its stdin closes, then prints the latencies (ms) as
JSON.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import redis


def ping_until(url: str, stop: threading.Event, every: float = 0.001) -> list[float]:
    """PING ``url`` every ``every`` seconds until ``stop`` is set; the round trips (ms)."""
    client = redis.Redis.from_url(url)
    latencies: list[float] = []
    client.ping()  # connect before timing
    while not stop.is_set():
        started = time.perf_counter()
        client.ping()
        latencies.append((time.perf_counter() - started) * 1000)
        time.sleep(every)
    client.close()
    return latencies


def main() -> None:
    """Ping ``sys.argv[1]`` until stdin reaches its end; print the latencies."""
    stop = threading.Event()

    def until_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_eof, daemon=True).start()
    print("ready", flush=True)
    print(json.dumps(ping_until(sys.argv[1], stop)))


if __name__ == "__main__":
    main()

"""Hardware-affinity routing: domain -> preferred generation pool, with fallback to a live pool.

Liveness comes from Kafka itself: a pool is live when its consumer group has members. The group
metadata is refreshed in a background thread so routing never blocks the env worker's poll loop.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from rollstream.config import Config
from rollstream.topics.admin import TopicAdmin

log = logging.getLogger(__name__)


def group_id(prefix: str, run_id: str, role: str, pool: str | None = None) -> str:
    """Consumer group of a role (and pool) in a run: ``<prefix>.<run>.<role>[.<pool>]``."""
    base = f"{prefix}.{run_id}.{role}"
    return f"{base}.{pool}" if pool else base


class PoolRouter:
    def __init__(self, cfg: Config, run_id: str, admin: TopicAdmin | None) -> None:
        self.domain_pools = dict(cfg.rollout.domain_pools)
        self.fallbacks = {k: list(v) for k, v in cfg.rollout.pool_fallbacks.items()}
        self._group_of = {
            pool: group_id(cfg.kafka.topic_prefix, run_id, "gen", pool)
            for pool in set(self.domain_pools.values()) | {p for v in self.fallbacks.values() for p in v}
        }
        self._admin = admin
        self._interval = cfg.rollout.pool_check_interval_s
        self._live: set[str] | None = None  # None: unknown yet -> route to the preferred pool
        self.fallback_counts: Counter[tuple[str, str]] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._admin is not None and self._thread is None:
            try:  # one synchronous look first: requests must not wait on a pool with no consumers
                self.refresh()
            except Exception as exc:
                log.debug("initial pool refresh failed: %s", exc)
            self._thread = threading.Thread(target=self._refresh_loop, name="pool-router", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def refresh(self) -> None:
        if self._admin is None:
            return
        groups = self._admin.live_groups()
        self._live = {pool for pool, gid in self._group_of.items() if gid in groups}

    def _refresh_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # metadata hiccup: keep the last known view
                log.debug("pool refresh failed: %s", exc)
            self._stop.wait(self._interval)

    def route(self, domain: str) -> tuple[str, str]:
        """(pool, fallback_from): fallback_from is the preferred pool when the request was rerouted."""
        preferred = self.domain_pools[domain]
        live = self._live
        if live is None or preferred in live:
            return preferred, ""
        for pool in self.fallbacks.get(preferred, []):
            if pool in live:
                self.fallback_counts[(preferred, pool)] += 1
                return pool, preferred
        return preferred, ""  # nothing live: wait in the preferred pool's topic

"""Prometheus metrics every worker exports (``--metrics-port``; 0 = an ephemeral port)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _Metrics:
    def __init__(self) -> None:
        self.consumed = Counter("rollstream_consumed_total", "Events consumed", ["role", "pool"])
        self.dead_letters = Counter(
            "rollstream_dead_letters_total", "Events dead-lettered", ["role", "reason"]
        )
        self.consumer_lag = Gauge(
            "rollstream_consumer_lag", "Consumer lag per partition", ["group", "topic", "partition"]
        )
        self.trajectories_in_flight = Gauge(
            "rollstream_trajectories_in_flight", "Trajectories held by this worker", ["role", "pool"]
        )
        self.terminal_states = Counter(
            "rollstream_terminal_states_total", "Trajectories ended, by terminal state", ["role", "state"]
        )
        self.failures = Counter("rollstream_failures_total", "Failures by reason", ["role", "reason"])
        self.env_step_seconds = Histogram(
            "rollstream_env_step_seconds", "Environment reset/step time", ["domain"], buckets=_LATENCY_BUCKETS
        )
        self.gen_batch_seconds = Histogram(
            "rollstream_gen_batch_seconds",
            "Generation time per micro-batch",
            ["pool"],
            buckets=_LATENCY_BUCKETS,
        )
        self.gen_batch_size = Histogram(
            "rollstream_gen_batch_size",
            "Requests per micro-batch",
            ["pool"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        )
        self.gen_tokens = Counter("rollstream_gen_tokens_total", "Tokens generated", ["pool"])
        self.fallbacks = Counter(
            "rollstream_pool_fallbacks_total",
            "Requests routed away from their preferred pool",
            ["preferred", "used"],
        )
        self.stale_aborts = Counter(
            "rollstream_stale_aborts_total", "Trajectories aborted by the staleness gate", ["pool"]
        )
        self.policy_version = Gauge("rollstream_policy_version", "Policy version in use", ["role", "pool"])
        self.swap_pause_seconds = Histogram(
            "rollstream_weight_swap_pause_seconds",
            "Generation pause to swap in new weights",
            ["pool"],
            buckets=_LATENCY_BUCKETS,
        )
        self.weight_pull_seconds = Histogram(
            "rollstream_weight_pull_seconds",
            "Background pull of a version's buckets",
            ["pool"],
            buckets=_LATENCY_BUCKETS,
        )
        self.train_step_seconds = Histogram(
            "rollstream_train_step_seconds", "Trainer step time", buckets=_LATENCY_BUCKETS
        )
        self.scored = Counter("rollstream_scored_total", "Trajectories scored", ["domain", "source"])


METRICS = _Metrics()


class LagSampler:
    """Sets ``rollstream_consumer_lag`` (high watermark - position) per assigned partition every `interval_s`.

    Uses librdkafka's cached high watermark (refreshed by every fetch response) and the local position, so
    a sample costs no broker round trip inside the worker loop.
    """

    def __init__(self, consumer: Any, group: str, interval_s: float = 5.0) -> None:
        self.consumer = consumer
        self.group = group
        self.interval_s = interval_s
        self._next = 0.0
        self._labels: set[tuple[str, str]] = set()

    def maybe_sample(self) -> None:
        now = time.monotonic()
        if now < self._next or not self.group:
            return
        self._next = now + self.interval_s
        try:
            positions = self.consumer.position(self.consumer.assignment())
        except Exception:  # mid-rebalance: try again next interval
            return
        seen = set()
        for tp in positions:
            _low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                continue  # nothing fetched from this partition yet
            lag = max(0, high - tp.offset) if tp.offset >= 0 else high
            label = (tp.topic, str(tp.partition))
            seen.add(label)
            METRICS.consumer_lag.labels(group=self.group, topic=label[0], partition=label[1]).set(lag)
        for topic, partition in self._labels - seen:  # revoked partitions: stop reporting a frozen lag
            METRICS.consumer_lag.remove(self.group, topic, partition)
        self._labels = seen


def serve_metrics(port: int) -> int:
    """Start the /metrics endpoint on 127.0.0.1; returns the bound port."""
    server, _thread = start_http_server(port, addr="127.0.0.1")
    return int(server.server_port)

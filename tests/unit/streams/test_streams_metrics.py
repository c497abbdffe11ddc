"""The metrics endpoint serves the documented series; the lag sampler reports per partition."""

from __future__ import annotations

import urllib.request
from typing import Any

from confluent_kafka import TopicPartition

from rollstream.workers.metrics import METRICS, LagSampler, serve_metrics

DOCUMENTED = [
    "rollstream_consumed_total",
    "rollstream_dead_letters_total",
    "rollstream_consumer_lag",
    "rollstream_trajectories_in_flight",
    "rollstream_terminal_states_total",
    "rollstream_failures_total",
    "rollstream_env_step_seconds",
    "rollstream_gen_batch_seconds",
    "rollstream_gen_batch_size",
    "rollstream_gen_tokens_total",
    "rollstream_pool_fallbacks_total",
    "rollstream_stale_aborts_total",
    "rollstream_policy_version",
    "rollstream_weight_swap_pause_seconds",
    "rollstream_weight_pull_seconds",
    "rollstream_train_step_seconds",
    "rollstream_scored_total",
]


class FakeConsumer:
    def __init__(self) -> None:
        self.parts = [TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)]
        self.pos = {0: 10, 1: -1001, 2: 5}
        self.high = {0: 25, 1: 7, 2: -1001}

    def assignment(self) -> list[TopicPartition]:
        return self.parts

    def position(self, parts: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(p.topic, p.partition, self.pos[p.partition]) for p in parts]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        assert cached, "the worker loop must not make a broker round trip"
        return 0, self.high[tp.partition]


def test_lag_sampler() -> None:
    consumer: Any = FakeConsumer()
    sampler = LagSampler(consumer, "g.test", interval_s=0)
    sampler.maybe_sample()
    lag = METRICS.consumer_lag
    assert lag.labels(group="g.test", topic="t", partition="0")._value.get() == 15
    assert lag.labels(group="g.test", topic="t", partition="1")._value.get() == 7  # nothing consumed yet
    consumer.parts = consumer.parts[:1]  # partitions 1, 2 revoked
    sampler.maybe_sample()
    body = _scrape()
    assert 'rollstream_consumer_lag{group="g.test",partition="0",topic="t"} 15.0' in body
    assert 'group="g.test",partition="1"' not in body


_PORT: list[int] = []


def _scrape() -> str:
    if not _PORT:
        _PORT.append(serve_metrics(0))
    with urllib.request.urlopen(f"http://127.0.0.1:{_PORT[0]}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_endpoint_serves_documented_series() -> None:
    METRICS.gen_tokens.labels(pool="h20").inc(3)
    body = _scrape()
    for name in DOCUMENTED:
        assert f"# TYPE {name} " in body, name
    assert 'rollstream_gen_tokens_total{pool="h20"}' in body


def test_grafana_dashboard_uses_documented_series() -> None:
    import json
    import re
    from importlib import resources

    dash = json.loads(resources.files("rollstream.infra.grafana").joinpath("rollstream.json").read_text())
    used = {
        re.sub(r"_(bucket|count|sum)$", "", m)
        for p in dash["panels"]
        for t in p["targets"]
        for m in re.findall(r"rollstream_[a-z_]+", t["expr"])
    }
    assert used and used <= set(DOCUMENTED), used - set(DOCUMENTED)
    assert "rollstream_consumer_lag" in used

"""Kafka clients with the defaults rollstream relies on; every setting can be overridden in config.

Defaults: idempotent producer (no duplicates on retry), lz4, a short linger (latency over batch size,
since every trajectory turn waits on a produce), manual commits, read_committed (trainer writes
transactionally), cooperative rebalancing (or the KIP-848 protocol with `group_protocol = "consumer"`).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, Producer

from rollstream.config import Config

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": 1,
    "batch.num.messages": 10000,
    "queue.buffering.max.kbytes": 262144,
}

CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
    "fetch.wait.max.ms": 5,
    "session.timeout.ms": 10000,
    "heartbeat.interval.ms": 1000,
    "max.poll.interval.ms": 300000,
}


def base_conf(cfg: Config, bootstrap: str) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    conf.update(cfg.kafka.client)
    return conf


def producer_conf(cfg: Config, bootstrap: str, client_id: str, **extra: Any) -> dict[str, Any]:
    conf = base_conf(cfg, bootstrap)
    conf.update(PRODUCER_DEFAULTS)
    conf["client.id"] = client_id
    conf["message.max.bytes"] = cfg.kafka.max_message_bytes
    conf.update(cfg.kafka.producer)
    conf.update(extra)
    return conf


def consumer_conf(cfg: Config, bootstrap: str, group_id: str, client_id: str, **extra: Any) -> dict[str, Any]:
    conf = base_conf(cfg, bootstrap)
    conf.update(CONSUMER_DEFAULTS)
    conf.update({"group.id": group_id, "client.id": client_id})
    conf["fetch.message.max.bytes"] = cfg.kafka.max_message_bytes
    if cfg.kafka.group_protocol == "consumer":
        # KIP-848: the broker assigns; session/heartbeat settings belong to the broker then.
        conf["group.protocol"] = "consumer"
        for key in ("session.timeout.ms", "heartbeat.interval.ms"):
            conf.pop(key, None)
    else:
        conf["partition.assignment.strategy"] = "cooperative-sticky"
    conf.update(cfg.kafka.consumer)
    conf.update(extra)
    return conf


def make_producer(cfg: Config, bootstrap: str, client_id: str, **extra: Any) -> Producer:
    return Producer(producer_conf(cfg, bootstrap, client_id, **extra))


def make_consumer(cfg: Config, bootstrap: str, group_id: str, client_id: str, **extra: Any) -> Consumer:
    return Consumer(consumer_conf(cfg, bootstrap, group_id, client_id, **extra))

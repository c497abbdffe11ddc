"""Kafka produce -> consume round trip on a running broker, with the project's client defaults.

    rollstream broker up --home /tmp/bench-broker --port 19092 --controller-port 19093
    python bench/bench_roundtrip.py --bootstrap 127.0.0.1:19092
    rollstream broker down --home /tmp/bench-broker --port 19092 --controller-port 19093

* latency: one message at a time (produce, then wait until the consumer has it), p50/p90/p99/max;
* throughput: produce N messages as fast as the producer batches them, flush, then consume them all.

Messages are encoded small events (an EnvAction with 8 tokens). The bench topic is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import numpy as np
from bench_codec import small_event  # type: ignore[import-not-found]  # run from bench/ or with it on the path
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from rollstream.clients import consumer_conf, producer_conf
from rollstream.config import Config
from rollstream.schemas.codec import Codec


def _consumer(cfg: Config, bootstrap: str, topic: str, partition: int = 0) -> Consumer:
    consumer = Consumer(consumer_conf(cfg, bootstrap, f"bench-{uuid.uuid4().hex[:8]}", "bench-consumer"))
    consumer.assign([TopicPartition(topic, partition, 0)])
    return consumer


def latency(cfg: Config, bootstrap: str, topic: str, value: bytes, count: int, warmup: int) -> dict[str, Any]:
    producer = Producer(producer_conf(cfg, bootstrap, "bench-producer"))
    consumer = _consumer(cfg, bootstrap, topic)
    samples = []
    try:
        for i in range(warmup + count):
            t0 = time.perf_counter()
            producer.produce(topic, value=value, key=b"k", partition=0)
            while True:
                producer.poll(0)
                msg = consumer.poll(0.05)
                if msg is not None and msg.error() is None:
                    break
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1000)
        producer.flush(10)
    finally:
        consumer.close()
    ms = np.array(samples)
    return {
        "count": count,
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
    }


def throughput(cfg: Config, bootstrap: str, topic: str, value: bytes, count: int) -> dict[str, Any]:
    producer = Producer(producer_conf(cfg, bootstrap, "bench-producer"))
    t0 = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, value=value, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(60)
    produce_s = time.perf_counter() - t0
    assert left == 0, f"{left} messages not delivered"
    consumer = _consumer(cfg, bootstrap, topic)
    got = 0
    t1 = time.perf_counter()
    try:
        while got < count and time.perf_counter() - t1 < 120:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is None:
                    got += 1
    finally:
        consumer.close()
    consume_s = time.perf_counter() - t1
    return {
        "count": count,
        "bytes_each": len(value),
        "produce_msgs_s": count / produce_s,
        "produce_mb_s": count * len(value) / produce_s / 1e6,
        "consume_msgs_s": got / consume_s,
        "consume_mb_s": got * len(value) / consume_s / 1e6,
        "end_to_end_msgs_s": got / (produce_s + consume_s),
        "consumed": got,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--latency-count", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--throughput-count", type=int, default=200_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    cfg = Config()
    value = Codec().encode(small_event())
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    topics = [f"bench-lat-{uuid.uuid4().hex[:8]}", f"bench-tput-{uuid.uuid4().hex[:8]}"]
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        fut.result(30)
    time.sleep(1.0)  # let the metadata settle
    try:
        results = {
            "latency": latency(cfg, args.bootstrap, topics[0], value, args.latency_count, args.warmup),
            "throughput": throughput(cfg, args.bootstrap, topics[1], value, args.throughput_count),
        }
    finally:
        for fut in admin.delete_topics(topics).values():
            fut.result(30)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    lat, tp = results["latency"], results["throughput"]
    print(
        f"round trip, one at a time ({lat['count']} msgs of {len(value)} B): p50 {lat['p50_ms']:.2f} ms, "
        f"p90 {lat['p90_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms"
    )
    print(
        f"throughput ({tp['count']} msgs of {tp['bytes_each']} B): produce {tp['produce_msgs_s']:,.0f} msg/s "
        f"({tp['produce_mb_s']:.1f} MB/s), consume {tp['consume_msgs_s']:,.0f} msg/s "
        f"({tp['consume_mb_s']:.1f} MB/s), end to end {tp['end_to_end_msgs_s']:,.0f} msg/s"
    )


if __name__ == "__main__":
    main()

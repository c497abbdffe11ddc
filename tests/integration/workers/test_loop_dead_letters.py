"""The worker loop on a real broker: bad messages become dead letters, the worker goes on, offsets commit.

Also the SIGTERM path of `python -m rollstream worker`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from rollstream.clients import base_conf
from rollstream.config import Config, load_config
from rollstream.schemas.codec import Codec
from rollstream.schemas.events import DeadLetter, Event, Observation, ScoredTrajectory
from rollstream.topics.admin import TopicAdmin
from rollstream.topics.specs import RunTopics, family_specs, run_topic_specs
from rollstream.workers.loop import LoopStats
from rollstream.workers.routing import group_id
from rollstream.workers.runtime import run_worker

MAX_BYTES = 200_000  # small, yet a dead letter (64 KiB of the original + envelope) still fits


def _cfg(max_bytes: int = MAX_BYTES) -> Config:
    parts = {family: 1 for family in family_specs()}
    return load_config(
        overrides=[f"topics.partitions={json.dumps(parts)}", f"kafka.max_message_bytes={max_bytes}"],
        environ={},
    )


@pytest.fixture
def topics(kafka_bootstrap: str, run_id: str) -> Iterator[RunTopics]:
    cfg = _cfg()
    admin = TopicAdmin(base_conf(cfg, kafka_bootstrap))
    specs = run_topic_specs(run_id, cfg)
    admin.apply(specs)
    deadline = time.monotonic() + 10
    while not {s.name for s in specs} <= set(admin.existing()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield RunTopics(run_id, cfg.kafka.topic_prefix)
    admin.delete([s.name for s in specs])


def _read_all(bootstrap: str, topic: str, want: int, timeout_s: float = 20.0) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(msg)
    finally:
        consumer.close()
    return out


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return int(consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset)
    finally:
        consumer.close()


def _terminal(run_id: str, trajectory: str) -> Observation:
    return Observation(
        run_id=run_id,
        trajectory_id=trajectory,
        group_id="g1",
        domain="frozenlake",
        terminal_state="completed",
        terminated=True,
        env_return=1.0,
        first_version=0,
    )


def _start(
    role: str, cfg: Config, bootstrap: str, run_id: str
) -> tuple[threading.Thread, threading.Event, dict[str, Any]]:
    stop = threading.Event()
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["stats"] = run_worker(role, cfg, bootstrap, run_id, stop=stop)
        except BaseException as exc:  # surfaced by the test
            result["error"] = exc

    thread = threading.Thread(target=target, name=f"test-{role}", daemon=True)
    thread.start()
    return thread, stop, result


def test_bad_messages_become_dead_letters_and_the_worker_goes_on(
    kafka_bootstrap: str, run_id: str, topics: RunTopics
) -> None:
    cfg = _cfg()
    codec = Codec()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 2_000_000})
    garbage = b"\x01not avro at all"
    oversized = codec.encode(_terminal(run_id, "big")).ljust(MAX_BYTES + 1000, b"x")
    other_run = codec.encode(_terminal("some-other-run", "foreign"))
    good = _terminal(run_id, "good")
    messages = [
        (b"k-garbage", garbage),
        (b"big", oversized),
        (b"foreign", other_run),
        (b"good", codec.encode(good)),
    ]
    for key, value in messages:
        producer.produce(topics.observations, value=value, key=key, partition=0)
    assert producer.flush(10) == 0

    thread, stop, result = _start("reward", cfg, kafka_bootstrap, run_id)
    try:
        scored = _read_all(kafka_bootstrap, topics.scored, want=1)
        letters = _read_all(kafka_bootstrap, topics.dead_letters, want=3)
        group = group_id(cfg.kafka.topic_prefix, run_id, "reward")
        deadline = time.monotonic() + 15
        while _committed(kafka_bootstrap, group, topics.observations) < len(messages):
            assert time.monotonic() < deadline, "the group's offset never covered every message"
            time.sleep(0.1)
        assert thread.is_alive(), result  # the worker kept running
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert "error" not in result, result
    stats: LoopStats = result["stats"]
    assert stats.consumed == 4
    assert stats.dead_letters == 3

    # The good one was processed after the bad ones.
    assert len(scored) == 1
    event = codec.decode(scored[0].value())
    assert isinstance(event, ScoredTrajectory)
    assert event.trajectory_id == "good" and event.run_id == run_id and event.reward == 1.0

    assert len(letters) == 3
    decoded: list[Event] = [codec.decode(m.value()) for m in letters]
    assert all(isinstance(d, DeadLetter) for d in decoded)
    by_offset = {d.original_offset: d for d in decoded if isinstance(d, DeadLetter)}
    assert set(by_offset) == {0, 1, 2}
    for offset, (reason, key, value) in enumerate(
        [
            ("undecodable", b"k-garbage", garbage),
            ("oversized", b"big", oversized),
            ("wrong-run", b"foreign", other_run),
        ]
    ):
        letter = by_offset[offset]
        assert letter.run_id == run_id
        assert letter.reason == reason
        assert letter.original_topic == topics.observations
        assert letter.original_partition == 0
        assert letter.original_key == key
        assert letter.original_size == len(value)
        assert letter.original_value == value[: 64 * 1024]
        assert letter.error
    assert "not an Avro event" in by_offset[0].error
    assert str(len(oversized)) in by_offset[1].error
    assert "some-other-run" in by_offset[2].error
    # Dead letters are keyed by the original key.
    assert sorted(m.key() for m in letters) == [b"big", b"foreign", b"k-garbage"]


def test_sigterm_drains_and_exits_zero(kafka_bootstrap: str, run_id: str, topics: RunTopics) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("ROLLSTREAM__")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rollstream",
            "worker",
            "reward",
            "--run",
            run_id,
            "--bootstrap",
            kafka_bootstrap,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    assigned = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if " assigned " in line:
                assigned.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert assigned.wait(30), "worker never got its partitions:\n" + "".join(lines)
        # It works before the signal: a terminal observation gets scored.
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(topics.observations, Codec().encode(_terminal(run_id, "t1")), key=b"t1")
        producer.flush(10)
        assert len(_read_all(kafka_bootstrap, topics.scored, want=1)) == 1

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    reader.join(5)
    assert rc == 0, "".join(lines)
    assert elapsed < 5, f"took {elapsed:.1f}s to stop"
    assert any("draining" in line for line in lines), "".join(lines)
    group = group_id("rollstream", run_id, "reward")
    assert _committed(kafka_bootstrap, group, topics.observations) == 1

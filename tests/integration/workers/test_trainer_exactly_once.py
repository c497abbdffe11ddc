"""The trainer killed with SIGKILL mid-run resumes from its last committed version, and the topics prove
that every trained sample was trained exactly once, none beyond alpha, and none was skipped."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from rollstream.config import load_config
from rollstream.runner import LocalCluster, ensure_topics
from rollstream.schemas.codec import Codec
from rollstream.schemas.events import ScoredTrajectory, WeightVersion
from rollstream.topics.specs import RunTopics
from rollstream.workers.routing import group_id

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def _watermarks(consumer: Consumer, tp: TopicPartition) -> tuple[int, int]:
    """Watermarks, retrying the transient leader errors a busy single-node broker can answer with."""
    for attempt in range(20):
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            return int(low), int(high)
        except KafkaException:
            if attempt == 19:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def read_all(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, object]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    codec = Codec()
    out = []
    try:
        for p in range(partitions):
            tp = TopicPartition(topic, p)
            low, high = _watermarks(consumer, tp)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    if consumer.position([tp])[0].offset >= high:
                        break
                    continue
                if msg.error():
                    continue
                out.append((p, msg.offset(), codec.decode(msg.value())))
                if msg.offset() + 1 >= high:
                    break
    finally:
        consumer.close()
    return out


def wait_version(bootstrap: str, topics: RunTopics, version: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = [e for _, _, e in read_all(bootstrap, topics.weight_versions, 1)]
        if any(isinstance(e, WeightVersion) and e.version >= version for e in events):
            return
        time.sleep(1)
    raise AssertionError(f"version {version} not reached in {timeout}s")


def test_trainer_sigkill_resumes_exactly_once(kafka_bootstrap: str, run_id: str, tmp_path: Path) -> None:
    cfg = load_config(
        ROOT / "examples" / "learn-frozenlake.toml",
        [
            "rollout.group_size=4",
            "trainer.groups_per_step=2",
            "trainer.min_group_size=2",
            "rollout.max_in_flight=32",
            f"trainer.weight_store={tmp_path / 'weights'}",
            "trainer.alpha=1",
        ],
    )
    ensure_topics(cfg, kafka_bootstrap, run_id)
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    cluster = LocalCluster(cfg, kafka_bootstrap, run_id, tmp_path / "run")
    try:
        cluster.start("env", "cpu")
        cluster.start("gen", "h800")
        cluster.start("reward")
        cluster.start("scheduler")
        trainer = cluster.start("trainer")
        wait_version(kafka_bootstrap, topics, 3, timeout=240)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)
        cluster.start("trainer")
        wait_version(kafka_bootstrap, topics, 8, timeout=240)
    finally:
        cluster.stop()

    versions = [e for _, _, e in read_all(kafka_bootstrap, topics.weight_versions, 1)]
    assert all(isinstance(v, WeightVersion) for v in versions)
    numbers = [v.version for v in versions]  # type: ignore[union-attr]
    # contiguous lineage, each version's parent is the one before: the restart neither skipped nor forked
    assert numbers == list(range(len(numbers))), numbers
    assert [v.parent_version for v in versions] == [-1, *numbers[:-1]]  # type: ignore[union-attr]

    trained: dict[tuple[int, int], int] = {}
    dropped: set[tuple[int, int]] = set()
    for v in versions:
        for ref in v.samples:  # type: ignore[union-attr]
            key = (ref.partition, ref.offset)
            assert key not in trained and key not in dropped, f"sample {key} consumed twice"
            trained[key] = v.version  # type: ignore[union-attr]
            # trained by version v.version from parent K = v.version - 1: K - v(t) <= alpha
            assert v.parent_version - ref.first_version <= cfg.trainer.alpha  # type: ignore[union-attr]
        for ref in v.dropped:  # type: ignore[union-attr]
            key = (ref.partition, ref.offset)
            assert key not in trained and key not in dropped, f"sample {key} consumed twice"
            dropped.add(key)
    assert trained, "nothing was trained"

    # Nothing skipped: completed samples below the trainer's committed offsets were trained or dropped.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    partitions = len(admin.list_topics(topics.scored, timeout=10).topics[topics.scored].partitions)
    gid = group_id(cfg.kafka.topic_prefix, run_id, "trainer")
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(gid)])[gid].result()
    committed = {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == topics.scored}
    for partition, offset, event in read_all(kafka_bootstrap, topics.scored, partitions):
        if not isinstance(event, ScoredTrajectory) or event.terminal_state != "completed":
            continue
        if offset < committed.get(partition, -1):
            assert (partition, offset) in trained or (partition, offset) in dropped, (
                f"completed sample {partition}@{offset} below the committed offset was skipped"
            )

"""Trainer (group ``trainer`` on ``scored-trajectories``): alpha-bounded GRPO, exactly once.

Each step: evict stale samples (ARCHITECTURE 4), take ready GRPO groups, one `train_step`, publish
version n+1's weights (and the optimizer state) to the weight store, then in ONE Kafka transaction
produce the `WeightVersion` event (parent, buckets + checksums, the exact samples trained and dropped,
hyper-parameters, seed, timings) and commit the consumed offsets. A trainer killed at any moment
resumes from the last committed version: it re-reads its own lineage on ``weight-versions`` (every
sample ever trained or dropped is named there) and skips those if they are re-delivered, so none is
trained twice and none is skipped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from rollstream.clients import make_consumer, make_producer
from rollstream.config import Config
from rollstream.schemas.codec import Codec, DecodeError, make_codec
from rollstream.schemas.events import (
    SampleRef,
    ScoredTrajectory,
    TerminalState,
    WeightBucket,
    WeightVersion,
    default_producer_id,
    unpack_logprobs,
    unpack_tokens,
)
from rollstream.topics.specs import RunTopics
from rollstream.workers.loop import LoopStats, install_stop_signals
from rollstream.workers.metrics import METRICS
from rollstream.workers.policy import build_policy, state_dict_checksum
from rollstream.workers.routing import group_id
from rollstream.workers.trainer.buffer import SampleBuffer
from rollstream.workers.trainer.grpo import GrpoConfig, Sample, make_optimizer, train_step
from rollstream.workers.trainer.weight_store import BucketRef, WeightStore, open_weight_store

log = logging.getLogger(__name__)

RefKey = tuple[str, int, int]  # topic, partition, offset


def default_store_uri(cfg: Config, run_id: str) -> str:
    if cfg.trainer.weight_store:
        return cfg.trainer.weight_store
    from rollstream.infra.kafka.broker import default_home

    return str(default_home().parent / "weights")


def grpo_config(cfg: Config) -> GrpoConfig:
    t = cfg.trainer
    return GrpoConfig(
        lr=t.lr,
        seed=t.seed,
        clip_eps=t.clip_eps,
        kl_coef=t.kl_coef,
        max_grad_norm=t.max_grad_norm,
        temperature=max(cfg.generation.temperature, 1e-3),
    )


def to_sample(event: ScoredTrajectory) -> Sample:
    turns = [
        (
            unpack_tokens(t.prompt_token_ids),
            unpack_tokens(t.action_token_ids),
            unpack_logprobs(t.behaviour_logprobs),
            t.policy_version,
        )
        for t in event.turns
    ]
    return Sample(event.trajectory_id, event.group_id, turns, float(event.reward), event.first_version)


def _buckets(refs: list[BucketRef]) -> list[WeightBucket]:
    return [WeightBucket(key=r.key, size=r.size, sha256=r.sha256) for r in refs]


def flatten_optimizer(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    flat: dict[str, torch.Tensor] = {}
    for idx, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            flat[f"{idx}.{key}"] = torch.as_tensor(value).clone()
    return flat


def restore_optimizer(optimizer: torch.optim.Optimizer, flat: dict[str, torch.Tensor]) -> None:
    sd = optimizer.state_dict()
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in flat.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    sd["state"] = state
    optimizer.load_state_dict(sd)


@dataclass
class Lineage:
    """What ``weight-versions`` says: the versions so far and every sample they consumed."""

    versions: list[WeightVersion] = field(default_factory=list)
    consumed: set[RefKey] = field(default_factory=set)

    @property
    def last(self) -> WeightVersion | None:
        return self.versions[-1] if self.versions else None

    def add(self, wv: WeightVersion) -> None:
        self.versions.append(wv)
        for ref in (*wv.samples, *wv.dropped):
            self.consumed.add((ref.topic, ref.partition, ref.offset))


def read_lineage(cfg: Config, bootstrap: str, topics: RunTopics, codec: Codec, run_id: str) -> Lineage:
    """All committed versions of the run, in order (read_committed, by assignment, no commits)."""
    consumer = make_consumer(cfg, bootstrap, f"lineage-{uuid.uuid4().hex[:8]}", "lineage")
    try:
        tp = TopicPartition(topics.weight_versions, 0)
        _, high = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([TopicPartition(topics.weight_versions, 0, OFFSET_BEGINNING)])
        lineage = Lineage()
        position = 0
        deadline = time.monotonic() + 60
        while position < high and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                # read_committed: the high watermark may include aborted/control records
                position = max(position, consumer.position([tp])[0].offset)
                continue
            if msg.error():
                continue
            position = int(msg.offset() or 0) + 1
            try:
                event = codec.decode(msg.value())
            except DecodeError:
                continue
            if isinstance(event, WeightVersion) and event.run_id == run_id:
                lineage.add(event)
        return lineage
    finally:
        consumer.close()


class Trainer:
    def __init__(self, cfg: Config, bootstrap: str, run_id: str, *, steps: int | None = None) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.steps = steps
        self.topics = RunTopics(run_id, cfg.kafka.topic_prefix)
        self.codec = make_codec(cfg.kafka.schema_registry_url or None)
        self.producer_id = default_producer_id("trainer")
        self.store_uri = default_store_uri(cfg, run_id)
        self.store: WeightStore = open_weight_store(self.store_uri, bucket_mb=cfg.trainer.bucket_mb)
        self.grpo = grpo_config(cfg)
        torch.set_num_threads(1)
        self.model = build_policy(cfg.trainer.seed)
        self.optimizer = make_optimizer(self.model, self.grpo)
        # The KL anchor is the initial policy (version 0), rebuilt bit-identically from the seed.
        self.ref_model = build_policy(cfg.trainer.seed) if cfg.trainer.kl_coef > 0 else None
        self.buffer = SampleBuffer(
            cfg.trainer.alpha,
            cfg.trainer.staleness_policy,  # type: ignore[arg-type]  # validated at config load
            cfg.trainer.gamma,
            cfg.rollout.group_size,
            cfg.trainer.min_group_size,
            group_timeout_s=cfg.trainer.group_timeout_s,
        )
        self.refs: dict[str, tuple[RefKey, int]] = {}  # trajectory id -> (where it was read, first_version)
        self.open_offsets: dict[tuple[str, int], set[int]] = {}
        self.next_offset: dict[tuple[str, int], int] = {}
        self.pending_dropped: list[SampleRef] = []
        # Transactional producer: a restarted trainer fences its zombie predecessor.
        self.producer: Producer = make_producer(
            cfg,
            bootstrap,
            self.producer_id,
            **{"transactional.id": group_id(cfg.kafka.topic_prefix, run_id, "trainer")},
        )
        self.consumer: Consumer = make_consumer(
            cfg,
            bootstrap,
            group_id(cfg.kafka.topic_prefix, run_id, "trainer"),
            self.producer_id,
            **{"isolation.level": "read_committed"},
        )
        # Fence a zombie predecessor and abort its open transaction *before* reading the lineage, so
        # the read_committed read below is not held back at the last stable offset.
        self.producer.init_transactions(30)
        self.lineage = read_lineage(cfg, bootstrap, self.topics, self.codec, run_id)
        self.version = -1
        self.stats = LoopStats()

    # -- start / resume ---------------------------------------------------------------------------
    def start(self) -> None:
        last = self.lineage.last
        if last is None:
            self._publish(0, -1, [], [], {}, {"train_s": 0.0})
            log.info("trainer: published initial version 0")
            return
        state = self.store.fetch(
            self.run_id, last.version, [BucketRef(b.key, b.size, b.sha256) for b in last.buckets]
        )
        self.model.load_state_dict(state)
        if last.trainer_state:
            opt = self.store.fetch(
                f"{self.run_id}.optim",
                last.version,
                [BucketRef(b.key, b.size, b.sha256) for b in last.trainer_state],
            )
            restore_optimizer(self.optimizer, opt)
        self.version = last.version
        log.info(
            "trainer: resumed at version %d (%d samples already consumed)",
            self.version,
            len(self.lineage.consumed),
        )

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> LoopStats:
        self.start()
        self.consumer.subscribe([self.topics.scored], on_revoke=self._on_revoke)
        try:
            while not stop.is_set() and (self.steps is None or self.version < self.steps):
                for msg in self.consumer.consume(500, 0.1):
                    self._ingest(msg)
                self._maybe_step()
        finally:
            self.consumer.close()
            self.producer.flush(10)
        return self.stats

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Single trainer per run: a revoke means shutdown or a new instance; state is rebuilt from the log.
        log.info("trainer revoked %s", partitions)

    def _ingest(self, msg: Any) -> None:
        if msg.error():
            return
        tp = (msg.topic(), msg.partition())
        key: RefKey = (msg.topic(), msg.partition(), msg.offset())
        self.next_offset[tp] = max(self.next_offset.get(tp, 0), msg.offset() + 1)
        self.stats.consumed += 1
        if key in self.lineage.consumed:
            return  # trained or dropped by an earlier instance before it died: never twice
        try:
            event = self.codec.decode(msg.value())
        except DecodeError:
            return  # the reward worker's output; a broken one is counted by the audit
        if not isinstance(event, ScoredTrajectory) or event.terminal_state != TerminalState.COMPLETED.value:
            return  # ended unscored (aborted/failed/cancelled): its terminal state is already on a topic
        if event.trajectory_id in self.refs:
            return
        sample = to_sample(event)
        if not self.buffer.add(sample, self.version):
            return
        self.refs[event.trajectory_id] = (key, event.first_version)
        self.open_offsets.setdefault(tp, set()).add(msg.offset())

    def _ref(self, sample: Sample, reason: str = "") -> SampleRef:
        (topic, partition, offset), first_version = self.refs.pop(sample.trajectory_id)
        self.open_offsets[(topic, partition)].discard(offset)
        return SampleRef(
            topic=topic,
            partition=partition,
            offset=offset,
            trajectory_id=sample.trajectory_id,
            group_id=sample.group_id,
            first_version=first_version,
            weight=float(sample.weight),
            reason=reason,
        )

    def _maybe_step(self) -> None:
        for sample, reason in self.buffer.evict(self.version):
            self.pending_dropped.append(self._ref(sample, reason))
        if self.buffer.num_ready(self.version) < self.cfg.trainer.groups_per_step:
            return  # not a full batch yet
        groups = self.buffer.ready_groups(self.version, self.cfg.trainer.groups_per_step)
        # ready_groups may also evict (redundant members, partial groups): record them now.
        for sample, reason in self.buffer.evict(self.version):
            self.pending_dropped.append(self._ref(sample, reason))
        if not groups:
            return
        t0 = time.perf_counter()
        metrics = train_step(self.model, self.optimizer, groups, self.grpo, self.ref_model)
        train_s = time.perf_counter() - t0
        METRICS.train_step_seconds.observe(train_s)
        samples = [self._ref(s) for grp in groups for s in grp]
        for s in samples:
            self.lineage.consumed.add((s.topic, s.partition, s.offset))
        self._publish(
            self.version + 1, self.version, samples, self.pending_dropped, metrics, {"train_s": train_s}
        )
        self.pending_dropped = []

    def _committable(self) -> list[TopicPartition]:
        out = []
        for tp, nxt in self.next_offset.items():
            pending = self.open_offsets.get(tp)
            out.append(TopicPartition(tp[0], tp[1], min(pending) if pending else nxt))
        return out

    def _publish(
        self,
        version: int,
        parent: int,
        samples: list[SampleRef],
        dropped: list[SampleRef],
        metrics: dict[str, float],
        timings: dict[str, float],
    ) -> None:
        t0 = time.perf_counter()
        state = {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}
        buckets = self.store.publish(self.run_id, version, state)
        opt_buckets = (
            self.store.publish(f"{self.run_id}.optim", version, flatten_optimizer(self.optimizer))
            if self.optimizer.state
            else []
        )
        timings = {**timings, "publish_s": time.perf_counter() - t0}
        event = WeightVersion(
            run_id=self.run_id,
            policy_version=version,
            producer_id=self.producer_id,
            version=version,
            parent_version=parent,
            store_uri=self.store_uri,
            buckets=_buckets(buckets),
            weights_sha256=state_dict_checksum(state),
            samples=samples,
            dropped=dropped,
            hyperparams_json=json.dumps(
                {
                    "grpo": self.grpo.to_dict(),
                    "trainer": self.cfg.to_dict()["trainer"],
                    "group_size": self.cfg.rollout.group_size,
                },
                sort_keys=True,
                default=str,
            ),
            seed=self.cfg.trainer.seed,
            timings=timings,
            metrics={k: float(v) for k, v in metrics.items() if np.isfinite(v)},
            trainer_state=_buckets(opt_buckets),
        )
        self.producer.begin_transaction()
        try:
            self.producer.produce(
                self.topics.weight_versions,
                key=self.run_id,
                value=self.codec.encode(event, self.topics.weight_versions),
            )
            offsets = self._committable()
            if offsets:
                self.producer.send_offsets_to_transaction(
                    offsets, self.consumer.consumer_group_metadata(), 30
                )
            self.producer.commit_transaction(30)
        except KafkaException:
            self.producer.abort_transaction(30)
            raise
        self.version = version
        self.lineage.add(event)
        METRICS.policy_version.labels(role="trainer", pool="").set(version)
        log.info(
            "trainer: version %d (%d samples, %d dropped) %s",
            version,
            len(samples),
            len(dropped),
            {k: round(v, 4) for k, v in metrics.items()},
        )


def run_trainer(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    *,
    stop: threading.Event | None = None,
    steps: int | None = None,
    **_: Any,
) -> LoopStats:
    stop = stop or threading.Event()
    restore = install_stop_signals(stop) if threading.current_thread() is threading.main_thread() else None
    try:
        return Trainer(cfg, bootstrap, run_id, steps=steps).run(stop)
    finally:
        if restore:
            restore()

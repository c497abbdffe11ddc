"""Generation worker (group ``gen.<pool>`` on ``gen-requests.<pool>``).

Requests are queued by the poll loop and micro-batched by one engine thread; each ACTION carries the
token ids, behaviour logprobs and the policy version that produced it. A `WeightFollower` thread reads
``weight-versions`` (every worker reads all of it, by assignment, committing nothing), pulls each
version's buckets from the weight store in the background while the engine keeps generating, and
stages them; the engine swaps between micro-batches (suspend, update, resume) and the pause is
measured. The per-turn staleness gate aborts a trajectory when K - v(t) > alpha.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from rollstream.config import Config
from rollstream.schemas.codec import Codec, DecodeError
from rollstream.schemas.events import (
    EnvAction,
    EnvActionKind,
    Event,
    GenRequest,
    WeightVersion,
    pack_logprobs,
    pack_tokens,
)
from rollstream.workers.backends import GenerationBackend, GenInput
from rollstream.workers.loop import Handler, MessageRef, WorkerContext
from rollstream.workers.metrics import METRICS

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    request: GenRequest
    ref: MessageRef
    queued_at: float


class WeightFollower(threading.Thread):
    """Tracks the trainer's version K and pre-fetches new weights without pausing generation."""

    def __init__(
        self, consumer: Consumer, topic: str, codec: Codec, backend: GenerationBackend, pool: str
    ) -> None:
        super().__init__(name="weight-follower", daemon=True)
        self.consumer = consumer
        self.topic = topic
        self.codec = codec
        self.backend = backend
        self.pool = pool
        self.latest_version = -1  # K: newest version the trainer committed
        self.staged: tuple[int, dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self.stop_event = threading.Event()

    def run(self) -> None:
        self.consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        try:
            while not self.stop_event.is_set():
                msg = self.consumer.poll(0.1)
                if msg is None or msg.error():
                    continue
                try:
                    event = self.codec.decode(msg.value())
                except DecodeError as exc:
                    log.warning("undecodable weight-version at offset %d: %s", msg.offset(), exc)
                    continue
                if isinstance(event, WeightVersion):
                    self._on_version(event)
        finally:
            self.consumer.close()

    def _on_version(self, wv: WeightVersion) -> None:
        self.latest_version = max(self.latest_version, wv.version)
        if not self.backend.needs_weights or wv.version <= self.backend.version:
            if not self.backend.needs_weights:
                with self._lock:
                    self.staged = (wv.version, {})
            return
        from rollstream.workers.trainer.weight_store import BucketRef, open_weight_store

        start = time.perf_counter()
        store = open_weight_store(wv.store_uri)
        buckets = [BucketRef(b.key, b.size, b.sha256) for b in wv.buckets]
        state = store.fetch(wv.run_id, wv.version, buckets)
        METRICS.weight_pull_seconds.labels(pool=self.pool).observe(time.perf_counter() - start)
        with self._lock:
            if self.staged is None or self.staged[0] < wv.version:
                self.staged = (wv.version, state)

    def take_staged(self) -> tuple[int, dict[str, Any]] | None:
        with self._lock:
            staged, self.staged = self.staged, None
        return staged


class GenWorker(Handler):
    role = "gen"

    def __init__(self, cfg: Config, pool: str, backend: GenerationBackend, follower: WeightFollower) -> None:
        self.cfg = cfg
        self.pool = pool
        self.backend = backend
        self.follower = follower
        self.alpha = cfg.trainer.alpha
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self._queued = 0
        self._engine: threading.Thread | None = None
        self._ctx: WorkerContext | None = None
        self.last_swap_pause_s = 0.0

    def topics(self, ctx: WorkerContext) -> list[str]:
        if self._engine is None:
            self._ctx = ctx
            self.follower.start()
            self._engine = threading.Thread(target=self._engine_loop, name="engine", daemon=True)
            self._engine.start()
        return [ctx.topics.gen_requests(self.pool)]

    def in_flight(self) -> int:
        return self._queued

    def on_event(self, event: Event, ref: MessageRef, ctx: WorkerContext) -> bool:
        if not isinstance(event, GenRequest):
            raise TypeError(f"generation worker got {type(event).__name__}, expected GenRequest")
        if self._stale(event, ctx):
            return True
        self._queued += 1
        self._queue.put(_Pending(event, ref, time.monotonic()))
        return False

    def _stale(self, req: GenRequest, ctx: WorkerContext) -> bool:
        """Per-turn gate (ARCHITECTURE 4): abort instead of generating when K - v(t) > alpha."""
        k, v = self.follower.latest_version, req.first_version
        if v < 0 or k - v <= self.alpha:
            return False
        self._abort(req, ctx, f"stale: K={k} v(t)={v} alpha={self.alpha}")
        METRICS.stale_aborts.labels(pool=self.pool).inc()
        return True

    # -- engine thread ------------------------------------------------------------------------------
    def _next_batch(self) -> list[_Pending]:
        try:
            first = self._queue.get(timeout=0.05)
        except queue.Empty:
            return []
        batch = [first]
        max_batch = self.cfg.generation.max_batch
        while len(batch) < max_batch:  # whatever queued meanwhile joins at no cost
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if len(batch) == 1:
            # A lone request (light load): waiting batch_wait_ms for company only adds latency to
            # every turn; under load requests queue up while the engine runs and batch by themselves.
            return batch
        deadline = time.monotonic() + self.cfg.generation.batch_wait_ms / 1000
        while len(batch) < max_batch:
            timeout = deadline - time.monotonic()
            try:
                batch.append(
                    self._queue.get(timeout=max(0.0, timeout)) if timeout > 0 else self._queue.get_nowait()
                )
            except queue.Empty:
                break
        return batch

    def _maybe_swap(self) -> None:
        staged = self.follower.take_staged()
        if staged is None:
            return
        start = time.perf_counter()
        self.backend.load_state_dict(*staged)  # between engine steps: generation is paused only here
        self.last_swap_pause_s = time.perf_counter() - start
        METRICS.swap_pause_seconds.labels(pool=self.pool).observe(self.last_swap_pause_s)
        METRICS.policy_version.labels(role="gen", pool=self.pool).set(self.backend.version)
        log.info(
            "%s: now on version %d (pause %.1f ms)",
            self.pool,
            self.backend.version,
            self.last_swap_pause_s * 1000,
        )

    def _engine_loop(self) -> None:
        ctx = self._ctx
        assert ctx is not None
        while not ctx.stopping.is_set() or self._queued:
            self._maybe_swap()
            batch = self._next_batch()
            if not batch:
                continue
            live = [p for p in batch if not self._stale(p.request, ctx)]
            try:
                self._generate(live, ctx)
            except Exception as exc:
                # The engine failed on this batch: abort these turns with the reason, keep serving.
                log.exception("generation failed")
                for p in live:
                    self._abort(p.request, ctx, f"generation-error: {type(exc).__name__}: {exc}")
            for p in batch:
                ctx.finish(p.ref)
            self._queued -= len(batch)

    def _generate(self, live: list[_Pending], ctx: WorkerContext) -> None:
        if not live:
            return
        start = time.perf_counter()
        outputs = self.backend.generate(
            [
                GenInput(
                    p.request.trajectory_id, p.request.domain, p.request.prompt_text, p.request.max_new_tokens
                )
                for p in live
            ]
        )
        elapsed = time.perf_counter() - start
        METRICS.gen_batch_seconds.labels(pool=self.pool).observe(elapsed)
        METRICS.gen_batch_size.labels(pool=self.pool).observe(len(live))
        version = self.backend.version
        for p, out in zip(live, outputs, strict=True):
            req = p.request
            METRICS.gen_tokens.labels(pool=self.pool).inc(len(out.token_ids))
            ctx.produce(
                ctx.topics.env_actions,
                req.trajectory_id,
                EnvAction(
                    run_id=req.run_id,
                    trajectory_id=req.trajectory_id,
                    group_id=req.group_id,
                    policy_version=version,
                    kind=EnvActionKind.ACTION,
                    domain=req.domain,
                    pool=self.pool,
                    turn=req.turn,
                    action_text=out.text,
                    prompt_token_ids=pack_tokens(out.prompt_token_ids),
                    action_token_ids=pack_tokens(out.token_ids),
                    behaviour_logprobs=pack_logprobs(out.logprobs),
                    first_version=req.first_version if req.first_version >= 0 else version,
                    gen_ms=elapsed * 1000,
                ),
            )

    def _abort(self, req: GenRequest, ctx: WorkerContext, reason: str) -> None:
        ctx.produce(
            ctx.topics.env_actions,
            req.trajectory_id,
            EnvAction(
                run_id=req.run_id,
                trajectory_id=req.trajectory_id,
                group_id=req.group_id,
                policy_version=self.backend.version,
                kind=EnvActionKind.ABORT,
                domain=req.domain,
                pool=self.pool,
                turn=req.turn,
                first_version=req.first_version,
                reason=reason,
            ),
        )

    def close(self, ctx: WorkerContext) -> None:
        if self._engine is not None:
            self._engine.join(timeout=10)
        self.follower.stop_event.set()
        self.backend.close()


def make_follower(
    cfg: Config, bootstrap: str, ctx: WorkerContext, backend: GenerationBackend, pool: str
) -> WeightFollower:
    from rollstream.clients import make_consumer

    # Read by assignment under a throwaway group id that never commits: invisible to training.
    consumer = make_consumer(
        cfg, bootstrap, f"weight-follower-{uuid.uuid4().hex[:8]}", f"{ctx.producer_id}-wf"
    )
    return WeightFollower(consumer, ctx.topics.weight_versions, ctx.codec, backend, pool)

"""The one consume -> decode -> handle -> produce -> commit loop every role runs.

A role is a `Handler`. The loop owns the Kafka clients and the guarantees:

* an offset is committed only after the handler finished that message *and* everything it produced
  was delivered (each produce is tracked to its delivery report, no flush on the poll path), so a crash
  re-delivers, never loses; a failed delivery stops the worker before the offset can commit;
* an undecodable, oversized or handler-crashing message goes to ``dead-letters`` with topic,
  partition, offset and reason, and the loop goes on;
* handlers never block the poll loop: slow work (environment steps, model batches) runs in the
  handler's own threads, which call `WorkerContext.finish` when a message is done; when too much is in
  flight the loop pauses its partitions instead of stopping to poll;
* SIGTERM/SIGINT drain: stop fetching, let in-flight messages finish, flush, commit, leave the group.
"""

from __future__ import annotations

import functools
import logging
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from rollstream.schemas.codec import Codec, DecodeError
from rollstream.schemas.events import DeadLetter, Event
from rollstream.topics.specs import RunTopics
from rollstream.workers.metrics import LagSampler

log = logging.getLogger(__name__)

DEAD_LETTER_VALUE_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class MessageRef:
    """Where a consumed message came from: what `finish` and dead letters refer to."""

    topic: str
    partition: int
    offset: int
    key: bytes | None = None

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)


class OffsetTracker:
    """Per partition: offsets handed to the handler and not yet finished. Commit below the oldest."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], set[int]] = {}
        self._next: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}

    def started(self, ref: MessageRef) -> None:
        self._pending.setdefault(ref.tp, set()).add(ref.offset)
        self._next[ref.tp] = max(self._next.get(ref.tp, 0), ref.offset + 1)

    def finished(self, ref: MessageRef) -> None:
        pending = self._pending.get(ref.tp)
        if pending is not None:
            pending.discard(ref.offset)

    def pending_count(self) -> int:
        return sum(len(p) for p in self._pending.values())

    def committable(self, tps: Iterable[tuple[str, int]] | None = None) -> list[TopicPartition]:
        out = []
        for tp in list(self._next) if tps is None else tps:
            if tp not in self._next:
                continue
            pending = self._pending.get(tp)
            offset = min(pending) if pending else self._next[tp]
            if self._committed.get(tp) != offset:
                out.append(TopicPartition(tp[0], tp[1], offset))
        return out

    def mark_committed(self, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset

    def forget(self, tps: Iterable[tuple[str, int]]) -> None:
        for tp in tps:
            self._pending.pop(tp, None)
            self._next.pop(tp, None)
            self._committed.pop(tp, None)


class WorkerContext:
    """What a handler may do: produce events, finish messages (from any thread), dead-letter."""

    def __init__(
        self,
        *,
        role: str,
        producer: Producer,
        codec: Codec,
        topics: RunTopics,
        producer_id: str,
        max_message_bytes: int,
    ) -> None:
        self.role = role
        self.producer = producer
        self.codec = codec
        self.topics = topics
        self.producer_id = producer_id
        self.max_message_bytes = max_message_bytes
        self.stopping = threading.Event()
        # finish() records how many produces were issued by then; the message counts as done once all
        # of those are delivered (ids below the lowest undelivered one).
        self._finished: queue.SimpleQueue[tuple[MessageRef, int]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._issued = 0
        self._undelivered: set[int] = set()
        self.delivery_errors = 0
        self.fatal_error: str | None = None

    def produce(self, topic: str, key: str | bytes | None, event: Event) -> None:
        """Encode and produce (async, batched by the producer). Thread-safe."""
        if not event.producer_id:
            event.producer_id = self.producer_id
        value = self.codec.encode(event, topic)
        with self._lock:
            self._issued += 1
            produce_id = self._issued
            self._undelivered.add(produce_id)
        on_delivery = functools.partial(self._on_delivery, produce_id)
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                return
            except BufferError:
                # Local queue full: serve delivery reports, then retry (backpressure, not loss).
                self.producer.poll(0.05)
            except BaseException:
                with self._lock:
                    self._undelivered.discard(produce_id)  # never queued: nothing to wait for
                raise

    def _on_delivery(self, produce_id: int, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            # Left undelivered on purpose: nothing after it may commit; the loop stops the worker.
            self.delivery_errors += 1
            self.fatal_error = f"delivery to {msg.topic()} failed: {err}"
            log.error("%s", self.fatal_error)
            return
        with self._lock:
            self._undelivered.discard(produce_id)

    def produce_mark(self) -> int:
        """How many produces were issued so far (what a finished message must wait for)."""
        with self._lock:
            return self._issued

    def delivered_through(self) -> int:
        """Every produce with an id up to this one has been delivered."""
        with self._lock:
            return min(self._undelivered) - 1 if self._undelivered else self._issued

    def finish(self, ref: MessageRef) -> None:
        """The handler is done with this message; call it after producing its outputs. Thread-safe."""
        with self._lock:
            self._finished.put((ref, self._issued))

    def take_finished(self) -> list[tuple[MessageRef, int]]:
        out = []
        while True:
            try:
                out.append(self._finished.get_nowait())
            except queue.Empty:
                return out

    def dead_letter(self, ref: MessageRef, value: bytes | None, reason: str, error: str) -> None:
        # Keep the copy of the original well under the topic's limit, leaving room for the envelope.
        keep = min(DEAD_LETTER_VALUE_LIMIT, max(0, self.max_message_bytes - 8192))
        letter = DeadLetter(
            run_id=self.topics.run_id,
            trajectory_id=ref.key.decode(errors="replace") if ref.key else "",
            original_topic=ref.topic,
            original_partition=ref.partition,
            original_offset=ref.offset,
            original_key=ref.key,
            original_value=None if value is None else value[:keep],
            original_size=0 if value is None else len(value),
            reason=reason,
            error=error[:4000],
        )
        try:
            self.produce(self.topics.dead_letters, ref.key, letter)
        except KafkaException:
            letter.original_value = None  # still too large: keep the reason and where it came from
            self.produce(self.topics.dead_letters, ref.key, letter)
        log.warning(
            "dead-lettered %s[%d]@%d: %s: %s", ref.topic, ref.partition, ref.offset, reason, error[:200]
        )


class Handler:
    """One role's logic. Override what the role needs; defaults do nothing."""

    role = "worker"

    def topics(self, ctx: WorkerContext) -> list[str]:
        raise NotImplementedError

    def on_event(self, event: Event, ref: MessageRef, ctx: WorkerContext) -> bool:
        """Handle one event. Return True when done now; False to call `ctx.finish(ref)` later."""
        raise NotImplementedError

    def tick(self, ctx: WorkerContext) -> None:
        """Called every loop turn (timeouts, batching deadlines)."""

    def in_flight(self) -> int:
        """Work the handler holds; above the loop's limit the partitions are paused."""
        return 0

    def on_assigned(self, ctx: WorkerContext, partitions: list[tuple[str, int]]) -> None:
        pass

    def on_revoked(self, ctx: WorkerContext, partitions: list[tuple[str, int]]) -> None:
        pass

    def close(self, ctx: WorkerContext) -> None:
        pass

    def done(self) -> bool:
        """A handler with a finite job (the scheduler) returns True when the worker may exit."""
        return False


@dataclass
class LoopStats:
    consumed: int = 0
    dead_letters: int = 0
    commits: int = 0
    paused: bool = False
    started_at: float = field(default_factory=time.monotonic)


class WorkerLoop:
    def __init__(
        self,
        handler: Handler,
        *,
        consumer: Consumer,
        ctx: WorkerContext,
        commit_interval_s: float = 0.2,
        max_in_flight: int = 10_000,
        poll_batch: int = 500,
        poll_timeout_s: float = 0.02,
        drain_timeout_s: float = 15.0,
        group: str = "",
    ) -> None:
        self.handler = handler
        self.consumer = consumer
        self.ctx = ctx
        self.tracker = OffsetTracker()
        self.stats = LoopStats()
        self.commit_interval_s = commit_interval_s
        self.max_in_flight = max_in_flight
        self.poll_batch = poll_batch
        self.poll_timeout_s = poll_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self._assigned: set[tuple[str, int]] = set()
        self._last_commit = 0.0
        self._awaiting_delivery: list[tuple[MessageRef, int]] = []
        self._lag = LagSampler(consumer, group)  # no-op without a group name

    # -- rebalance callbacks (run inside consume()) -------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        self._assigned.update(tps)
        log.info("%s assigned %s", self.ctx.role, tps)
        self.handler.on_assigned(self.ctx, tps)
        if self.stats.paused:
            consumer.pause(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        log.info("%s revoked %s", self.ctx.role, tps)
        self._commit(tps, force=True)
        self.handler.on_revoked(self.ctx, tps)
        self.tracker.forget(tps)
        self._assigned.difference_update(tps)

    # -- the loop -----------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> LoopStats:
        stop = stop or self.ctx.stopping
        self.consumer.subscribe(
            self.handler.topics(self.ctx),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        try:
            while not stop.is_set() and not self.handler.done():
                self._turn(fetch=True)
            self.ctx.stopping.set()
            self._drain()
        finally:
            self.handler.close(self.ctx)
            self.ctx.producer.flush(10)
            self.consumer.close()
        return self.stats

    def _turn(self, fetch: bool) -> None:
        if fetch:
            # consume(n, timeout) would wait out the whole timeout unless n messages arrive: take what
            # is there now, and only block (briefly) in poll() when nothing is.
            msgs = self.consumer.consume(self.poll_batch, 0)
            if not msgs:
                msg = self.consumer.poll(self.poll_timeout_s)
                msgs = [msg] if msg is not None else []
            for msg in msgs:
                self._dispatch(msg)
        else:
            self.consumer.poll(0)  # keep the group session and rebalance callbacks alive
            time.sleep(0.005)
        self.handler.tick(self.ctx)
        self.ctx.producer.poll(0)
        self._release_delivered()
        self._backpressure()
        if time.monotonic() - self._last_commit >= self.commit_interval_s:
            self._commit()
        self._lag.maybe_sample()

    def _dispatch(self, msg: Message) -> None:
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consume error: %s", err)
            return
        # A message without an error always has its topic, partition and offset.
        ref = MessageRef(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0), msg.key())
        self.tracker.started(ref)
        self.stats.consumed += 1
        value = msg.value()
        if value is not None and len(value) > self.ctx.max_message_bytes:
            self._reject(ref, value, "oversized", f"{len(value)} bytes > {self.ctx.max_message_bytes}")
            return
        try:
            event = self.ctx.codec.decode(value)
        except DecodeError as exc:
            self._reject(ref, value, "undecodable", str(exc))
            return
        if event.run_id != self.ctx.topics.run_id:
            self._reject(ref, value, "wrong-run", f"event of run {event.run_id!r} on {ref.topic}")
            return
        try:
            done = self.handler.on_event(event, ref, self.ctx)
        except Exception as exc:
            self._reject(
                ref, value, "handler-error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            )
            return
        if done:
            self._awaiting_delivery.append((ref, self.ctx.produce_mark()))

    def _reject(self, ref: MessageRef, value: bytes | None, reason: str, error: str) -> None:
        self.ctx.dead_letter(ref, value, reason, error)
        self.stats.dead_letters += 1
        self._awaiting_delivery.append((ref, self.ctx.produce_mark()))

    def _release_delivered(self) -> None:
        """Finished messages become committable once everything produced before they finished is delivered."""
        if self.ctx.fatal_error:
            raise RuntimeError(f"{self.ctx.role}: {self.ctx.fatal_error}; stopping without committing")
        self._awaiting_delivery.extend(self.ctx.take_finished())
        if not self._awaiting_delivery:
            return
        through = self.ctx.delivered_through()
        waiting = []
        for ref, mark in self._awaiting_delivery:
            if mark <= through:
                self.tracker.finished(ref)
            else:
                waiting.append((ref, mark))
        self._awaiting_delivery = waiting

    def _backpressure(self) -> None:
        load = self.tracker.pending_count() + self.handler.in_flight()
        assigned = [TopicPartition(t, p) for t, p in self._assigned]
        if not self.stats.paused and load >= self.max_in_flight and assigned:
            self.consumer.pause(assigned)
            self.stats.paused = True
        elif self.stats.paused and load < self.max_in_flight // 2:
            if assigned:
                self.consumer.resume(assigned)
            self.stats.paused = False

    def _commit(self, tps: Iterable[tuple[str, int]] | None = None, force: bool = False) -> None:
        self._last_commit = time.monotonic()
        if force:
            # Rebalance or shutdown: wait for outstanding deliveries so finished work can commit now.
            self.ctx.producer.flush(10)
            self._release_delivered()
        offsets = self.tracker.committable(tps)
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # a rebalance in progress: the next commit retries
            log.info("commit skipped: %s", exc)
            return
        self.tracker.mark_committed(offsets)
        self.stats.commits += 1

    def _drain(self) -> None:
        """Stop fetching; give in-flight messages time to finish, then commit what finished."""
        assigned = [TopicPartition(t, p) for t, p in self._assigned]
        if assigned:
            self.consumer.pause(assigned)
        deadline = time.monotonic() + self.drain_timeout_s
        while self.tracker.pending_count() and time.monotonic() < deadline:
            self._turn(fetch=False)
        self._commit(force=True)


def install_stop_signals(stop: threading.Event) -> Callable[[], None]:
    """SIGTERM and SIGINT set `stop` (drain, then exit); returns a function restoring the old handlers."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handle(signum: int, frame: Any) -> None:
        log.info("signal %d: draining", signum)
        stop.set()

    for s in previous:
        signal.signal(s, handle)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore

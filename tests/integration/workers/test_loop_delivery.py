"""A finished message becomes committable only once everything produced before it is delivered; a failed
delivery blocks every later commit and marks the worker fatal."""

from __future__ import annotations

from rollstream.clients import make_producer
from rollstream.config import load_config
from rollstream.runner import ensure_topics
from rollstream.schemas.codec import Codec
from rollstream.schemas.events import EnvAction, EnvActionKind
from rollstream.topics.specs import RunTopics
from rollstream.workers.loop import MessageRef, WorkerContext


def _context(bootstrap: str, run_id: str, **producer: object) -> WorkerContext:
    cfg = load_config(None, [])
    return WorkerContext(
        role="test",
        producer=make_producer(cfg, bootstrap, "delivery-test", **producer),
        codec=Codec(),
        topics=RunTopics(run_id),
        producer_id="delivery-test",
        max_message_bytes=cfg.kafka.max_message_bytes,
    )


def _action(run_id: str, i: int) -> EnvAction:
    return EnvAction(run_id=run_id, trajectory_id=f"t{i}", kind=EnvActionKind.RESET, domain="math")


def test_finish_waits_for_the_deliveries_before_it(kafka_bootstrap: str, run_id: str) -> None:
    ensure_topics(load_config(None, []), kafka_bootstrap, run_id)
    ctx = _context(kafka_bootstrap, run_id)
    for i in range(3):
        ctx.produce(ctx.topics.env_actions, f"t{i}", _action(run_id, i))
    ctx.finish(MessageRef("in", 0, 7))
    [(ref, mark)] = ctx.take_finished()
    assert ref.offset == 7 and mark == 3
    assert ctx.producer.flush(30) == 0
    assert ctx.delivered_through() >= mark
    assert ctx.fatal_error is None


def test_failed_delivery_blocks_later_commits(kafka_bootstrap: str, run_id: str) -> None:
    ensure_topics(load_config(None, []), kafka_bootstrap, run_id)
    ctx = _context(kafka_bootstrap, run_id, **{"message.timeout.ms": 1500})
    # The broker does not auto-create topics: this delivery fails once the message times out.
    ctx.produce(f"{ctx.topics.env_actions}-missing", "t0", _action(run_id, 0))
    ctx.produce(ctx.topics.env_actions, "t1", _action(run_id, 1))
    ctx.producer.flush(30)
    assert ctx.fatal_error is not None and "failed" in ctx.fatal_error
    assert ctx.delivered_through() == 0  # the failed first produce holds back everything after it

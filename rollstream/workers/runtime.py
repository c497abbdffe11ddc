"""Build one role's worker against any Kafka cluster and run it until stopped (`rollstream worker`)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from rollstream.clients import base_conf, make_consumer, make_producer
from rollstream.config import Config
from rollstream.schemas.codec import make_codec
from rollstream.schemas.events import default_producer_id
from rollstream.topics.admin import TopicAdmin
from rollstream.topics.specs import RunTopics
from rollstream.workers.loop import Handler, LoopStats, WorkerContext, WorkerLoop, install_stop_signals
from rollstream.workers.metrics import serve_metrics
from rollstream.workers.routing import PoolRouter, group_id

log = logging.getLogger(__name__)

ROLES = ("env", "gen", "reward", "scheduler", "trainer")

# Poll timeout of the roles on the per-turn path. librdkafka's consume(n, timeout) waits out the whole
# timeout unless n messages arrive, and the env worker picks up finished steps only between polls, so
# the loop's 20 ms default added ~10-30 ms to every hop (bench/bench_turn_latency.py: 46 -> 12 ms/turn).
TURN_PATH_POLL_TIMEOUT_S = {"env": 0.001, "gen": 0.001}


def build_context(cfg: Config, bootstrap: str, run_id: str, role: str, pool: str | None) -> WorkerContext:
    producer_id = default_producer_id(f"{role}.{pool}" if pool else role)
    return WorkerContext(
        role=role,
        producer=make_producer(cfg, bootstrap, producer_id),
        codec=make_codec(cfg.kafka.schema_registry_url or None),
        topics=RunTopics(run_id, cfg.kafka.topic_prefix),
        producer_id=producer_id,
        max_message_bytes=cfg.kafka.max_message_bytes,
    )


def build_handler(
    role: str, pool: str | None, cfg: Config, bootstrap: str, ctx: WorkerContext, **options: Any
) -> Handler:
    if role == "env":
        from rollstream.workers.env_worker import EnvWorker

        router = PoolRouter(cfg, ctx.topics.run_id, TopicAdmin(base_conf(cfg, bootstrap)))
        router.start()
        return EnvWorker(cfg, pool or "cpu", router)
    if role == "gen":
        if not pool:
            raise ValueError("a generation worker needs --pool (e.g. h800, h20)")
        from rollstream.workers.backends import make_backend
        from rollstream.workers.gen_worker import GenWorker, make_follower

        backend = make_backend(cfg, pool)
        return GenWorker(cfg, pool, backend, make_follower(cfg, bootstrap, ctx, backend, pool))
    if role == "reward":
        from rollstream.workers.reward_worker import RewardWorker

        return RewardWorker(cfg)
    if role == "scheduler":
        from rollstream.workers.scheduler import Scheduler

        return Scheduler(cfg, max_trajectories=options.get("trajectories"))
    raise ValueError(f"unknown role {role!r} (known: {', '.join(ROLES)})")


def run_worker(
    role: str,
    cfg: Config,
    bootstrap: str,
    run_id: str,
    pool: str | None = None,
    *,
    stop: threading.Event | None = None,
    metrics_port: int | None = None,
    **options: Any,
) -> LoopStats:
    if role == "trainer":
        from rollstream.workers.trainer.service import run_trainer

        return run_trainer(cfg, bootstrap, run_id, stop=stop, **options)
    ctx = build_context(cfg, bootstrap, run_id, role, pool)
    handler = build_handler(role, pool, cfg, bootstrap, ctx, **options)
    gid = group_id(cfg.kafka.topic_prefix, run_id, role, pool if role in ("gen", "env") else None)
    consumer = make_consumer(cfg, bootstrap, gid, ctx.producer_id)
    if metrics_port is not None:
        log.info("metrics on 127.0.0.1:%d", serve_metrics(metrics_port))
    loop = WorkerLoop(handler, consumer=consumer, ctx=ctx, group=gid)
    if role in TURN_PATH_POLL_TIMEOUT_S:
        loop.poll_timeout_s = TURN_PATH_POLL_TIMEOUT_S[role]
    stop = stop or ctx.stopping
    restore = install_stop_signals(stop) if threading.current_thread() is threading.main_thread() else None
    try:
        return loop.run(stop)
    finally:
        if restore:
            restore()

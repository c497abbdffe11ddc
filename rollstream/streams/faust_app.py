"""`rollstream analytics`: live windowed analytics of a run, as a faust-streaming app (or in-process).

Both engines read the run's ``scored-trajectories``, ``gen-requests.*``, ``dead-letters`` and
``weight-versions`` as their own consumer group ``<prefix>.<run>.analytics`` (never a training group), feed
`analytics.WindowedAggregator`, and every `emit_s` produce the windows that changed to
``<prefix>.<run>.analytics`` (key ``<window>|<domain>|<pool>|<version>``, JSON value with the summary and the
mergeable state). Web views: ``/analytics/`` (roll-ups by domain, pool, version) and ``/analytics/rows/``.

The aggregator lives in memory, not in a faust Table: a table writes a changelog record per event, which
would cost the broker as much as the pipeline's own turns. After a restart the group resumes from its
committed offsets and the half-finished window is re-emitted as a second row of the same key; rows carry
sums, so a reader merges them (`Agg.merge`) instead of taking the last.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from rollstream.clients import base_conf, make_consumer
from rollstream.config import Config
from rollstream.schemas.codec import DecodeError, make_codec
from rollstream.streams.analytics import WindowedAggregator
from rollstream.topics.specs import DEAD_LETTERS, GEN_REQUESTS, SCORED, WEIGHT_VERSIONS, RunTopics

log = logging.getLogger(__name__)

ANALYTICS = "analytics"


def analytics_topic(topics: RunTopics) -> str:
    return topics.name(ANALYTICS)


def analytics_group(topics: RunTopics) -> str:
    return f"{topics.prefix}.{topics.run_id}.analytics"


def source_topics(cfg: Config, bootstrap: str, topics: RunTopics) -> list[str]:
    existing = set(AdminClient(base_conf(cfg, bootstrap)).list_topics(timeout=10).topics)
    gen_prefix = topics.name(GEN_REQUESTS) + "."
    names = [topics.name(f) for f in (SCORED, DEAD_LETTERS, WEIGHT_VERSIONS)]
    names += sorted(t for t in existing if t.startswith(gen_prefix))
    missing = [n for n in names if n not in existing]
    if missing:
        raise SystemExit(f"run {topics.run_id!r}: missing topics {missing} (start the run first)")
    return names


def ensure_analytics_topic(cfg: Config, bootstrap: str, topics: RunTopics) -> str:
    name = analytics_topic(topics)
    admin = AdminClient(base_conf(cfg, bootstrap))
    if name not in admin.list_topics(timeout=10).topics:
        fut = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name]
        try:
            fut.result(timeout=30)
        except Exception as exc:  # created concurrently by another instance
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return name


def encode_rows(rows: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    return [
        (
            f"{r['window_start_ms']}|{r['domain']}|{r['pool']}|{r['version']}".encode(),
            json.dumps(r, separators=(",", ":")).encode(),
        )
        for r in rows
    ]


def views(agg: WindowedAggregator, since_s: float = 300.0) -> dict[str, Any]:
    """What the web view serves: roll-ups over the last `since_s` seconds of event time."""
    since_ms = int(time.time() * 1000 - since_s * 1000)

    def table(by: tuple[str, ...]) -> list[dict[str, Any]]:
        return [dict(zip(by, k, strict=True)) | s for k, s in agg.rollup(by, since_ms=since_ms).items()]

    return {
        "window_s": agg.window_s,
        "since_s": since_s,
        "version": agg.version,
        "events": agg.events,
        "by_domain": table(("domain",)),
        "by_pool": table(("pool",)),
        "by_version": table(("version",)),
        "by_domain_pool_version": table(("domain", "pool", "version")),
    }


# -- in-process engine (no faust) ---------------------------------------------------------------------------
class _Web:
    """A tiny JSON server with the faust app's routes, for the in-process engine."""

    def __init__(self, port: int, routes: dict[str, Callable[[], Any]]) -> None:
        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fn = routes.get(self.path.rstrip("/") + "/")
                body = json.dumps(fn() if fn else {"routes": sorted(routes)}).encode()
                self.send_response(200 if fn else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True, name="analytics-web").start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_inprocess(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    *,
    window_s: float = 10.0,
    emit_s: float = 2.0,
    web_port: int | None = 0,
    stop: threading.Event | None = None,
    duration_s: float | None = None,
    on_ready: Callable[[int | None], None] | None = None,
) -> WindowedAggregator:
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    out_topic = ensure_analytics_topic(cfg, bootstrap, topics)
    sources = source_topics(cfg, bootstrap, topics)
    codec = make_codec(cfg.kafka.schema_registry_url or None)
    agg = WindowedAggregator(window_s)
    consumer = make_consumer(cfg, bootstrap, analytics_group(topics), "analytics")
    producer = Producer({**base_conf(cfg, bootstrap), "linger.ms": 50, "compression.type": "lz4"})
    lock = threading.Lock()
    web = None
    if web_port is not None:

        def locked(fn: Callable[[], Any]) -> Callable[[], Any]:
            def call() -> Any:
                with lock:
                    return fn()

            return call

        web = _Web(
            web_port,
            {"/analytics/": locked(lambda: views(agg)), "/analytics/rows/": locked(lambda: agg.rows())},
        )
        log.info("analytics web view on http://127.0.0.1:%d/analytics/", web.port)
    if on_ready:
        on_ready(web.port if web else None)
    stop = stop or threading.Event()
    deadline = None if duration_s is None else time.monotonic() + duration_s
    consumer.subscribe(sources)
    last_emit = time.monotonic()

    def emit() -> None:
        with lock:
            rows = agg.rows(agg.take_dirty())
        for key, value in encode_rows(rows):
            producer.produce(out_topic, key=key, value=value)
        # commit only what the emitted rows already include
        if producer.flush(10) == 0:
            try:
                consumer.commit(asynchronous=False)
            except Exception as exc:  # nothing consumed yet / rebalance: next emit retries
                log.debug("analytics commit skipped: %s", exc)

    try:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            msgs = consumer.consume(1000, 0.2)
            with lock:
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("analytics consume error: %s", err)
                        continue
                    try:
                        agg.add(codec.decode(msg.value()))
                    except DecodeError:
                        continue  # the workers dead-letter it; analytics just skips it
                    consumer.store_offsets(msg)
            if time.monotonic() - last_emit >= emit_s:
                emit()
                last_emit = time.monotonic()
        emit()
    finally:
        consumer.close()
        if web:
            web.close()
    return agg


# -- faust engine -----------------------------------------------------------------------------------------
def build_faust_app(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    *,
    window_s: float = 10.0,
    emit_s: float = 2.0,
    web_port: int = 6066,
) -> tuple[Any, WindowedAggregator]:
    import faust

    if web_port == 0:  # faust wants a real port: pick a free one, like the in-process engine
        from rollstream.infra.kafka.broker import free_port

        web_port = free_port()
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    out_name = ensure_analytics_topic(cfg, bootstrap, topics)
    sources = source_topics(cfg, bootstrap, topics)
    codec = make_codec(cfg.kafka.schema_registry_url or None)
    agg = WindowedAggregator(window_s)
    app = faust.App(
        analytics_group(topics),  # the app id is its consumer group
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_host="127.0.0.1",
        web_port=web_port,
        web_in_thread=False,
        topic_disable_leader=True,  # no <app>-__assignor-__leader topic per run
        topic_allow_declare=False,  # run topics are the project's to create, with their specs
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        key_serializer="raw",
        value_serializer="raw",
    )
    source = app.topic(*sources, key_type=bytes, value_type=bytes, value_serializer="raw")
    out = app.topic(out_name, key_type=bytes, value_type=bytes, value_serializer="raw")

    @app.agent(source)
    async def aggregate(stream: Any) -> None:
        async for value in stream:
            try:
                agg.add(codec.decode(value))
            except DecodeError:
                continue

    @app.timer(interval=emit_s)
    async def publish() -> None:
        for key, value in encode_rows(agg.rows(agg.take_dirty())):
            await out.send(key=key, value=value)

    @app.page("/analytics/")
    async def summary(web: Any, request: Any) -> Any:
        return web.json(views(agg))

    @app.page("/analytics/rows/")
    async def rows(web: Any, request: Any) -> Any:
        return web.json(agg.rows())

    return app, agg


def faust_available() -> bool:
    try:
        import faust  # noqa: F401
    except Exception:  # not installed, or broken on this Python
        return False
    return True


def run_faust(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    *,
    window_s: float = 10.0,
    emit_s: float = 2.0,
    web_port: int = 6066,
    duration_s: float | None = None,
) -> WindowedAggregator:
    from faust.worker import Worker

    app, agg = build_faust_app(cfg, bootstrap, run_id, window_s=window_s, emit_s=emit_s, web_port=web_port)
    worker = Worker(app, loglevel="WARNING", quiet=True, override_logging=False)
    if duration_s is not None:

        @app.task
        async def stop_later() -> None:
            import asyncio

            await asyncio.sleep(duration_s)
            await worker.stop()
            worker.loop.stop()

    with contextlib.suppress(SystemExit):  # mode's Worker exits the process when it stops
        worker.execute_from_commandline()
    return agg

"""Helpers for rollout integration tests: run workers (threads or processes) and read topics back.

Workers started with :meth:`Rollout.start` run in this process as threads through
``rollstream.workers.runtime.run_worker`` (each with its own stop event), so a test may monkeypatch
module attributes such as ``rollstream.workers.env_worker.make_env``. :meth:`Rollout.spawn` starts a
real ``python -m rollstream worker ...`` process (what a user starts on another machine), which a test
may SIGKILL. :class:`TopicReader` reads topics by assignment from the beginning, committing nothing.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from rollstream.clients import make_consumer, make_producer
from rollstream.config import Config, load_config
from rollstream.runner import LocalCluster, ensure_topics
from rollstream.schemas.codec import DecodeError, make_codec
from rollstream.schemas.events import (
    EnvAction,
    EnvActionKind,
    Event,
    Observation,
    ScoredTrajectory,
)
from rollstream.topics.specs import RunTopics
from rollstream.workers.envs import TextEnv
from rollstream.workers.loop import LoopStats
from rollstream.workers.routing import group_id
from rollstream.workers.runtime import run_worker

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)


def fast_config(*overrides: str) -> Config:
    """A config for fast tests: quick pool liveness checks, small in-flight window."""
    return load_config(
        None,
        ["rollout.pool_check_interval_s=0.2", "rollout.max_in_flight=32", *overrides],
        environ={},
    )


@dataclass
class WorkerThread:
    role: str
    pool: str | None
    thread: threading.Thread
    stop: threading.Event
    stats: LoopStats | None = None
    error: BaseException | None = None

    def alive(self) -> bool:
        return self.thread.is_alive()


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    event: Event


class TopicReader:
    """Reads whole topics from the beginning by assignment (no group offsets, nothing committed)."""

    def __init__(self, cfg: Config, bootstrap: str, topics: Iterable[str], admin: Any) -> None:
        self.codec = make_codec(cfg.kafka.schema_registry_url or None)
        self.consumer: Consumer = make_consumer(
            cfg, bootstrap, f"test-reader-{id(self):x}", "test-reader", **{"enable.partition.eof": False}
        )
        parts = []
        meta = admin.list_topics(timeout=30)
        for topic in topics:
            parts += [
                TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.topics[topic].partitions)
            ]
        self.consumer.assign(parts)
        self.records: list[Record] = []
        self.undecodable = 0

    def poll(self, budget_s: float = 0.3) -> list[Record]:
        deadline = time.monotonic() + budget_s
        new: list[Record] = []
        while time.monotonic() < deadline:
            msgs = self.consumer.consume(1000, 0.05)
            if not msgs:
                continue
            for msg in msgs:
                if msg.error():
                    continue
                try:
                    event = self.codec.decode(msg.value())
                except DecodeError:
                    self.undecodable += 1
                    continue
                new.append(
                    Record(
                        str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0), msg.key(), event
                    )
                )
        self.records += new
        return new

    def events(self, kind: type[E], topic: str | None = None) -> list[E]:
        return [
            r.event for r in self.records if isinstance(r.event, kind) and (topic is None or r.topic == topic)
        ]

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.poll(0.2)
            if predicate():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")

    def close(self) -> None:
        self.consumer.close()


@dataclass
class Accounting:
    """Terminal states per trajectory from ``observations`` and ``scored-trajectories``."""

    terminals: dict[str, list[Observation]] = field(default_factory=lambda: defaultdict(list))
    scored: dict[str, list[ScoredTrajectory]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def of(cls, reader: TopicReader, topics: RunTopics) -> Accounting:
        acc = cls()
        for obs in reader.events(Observation, topics.observations):
            if obs.terminal_state:
                acc.terminals[obs.trajectory_id].append(obs)
        for st in reader.events(ScoredTrajectory, topics.scored):
            acc.scored[st.trajectory_id].append(st)
        return acc

    def states(self) -> dict[str, str]:
        return {tid: obs[0].terminal_state for tid, obs in self.terminals.items()}

    def duplicates(self) -> dict[str, list[str]]:
        return {tid: [o.terminal_state for o in obs] for tid, obs in self.terminals.items() if len(obs) > 1}


class Rollout:
    """One run's topics and workers for a test; `close` stops everything it started."""

    def __init__(self, cfg: Config, bootstrap: str, run_id: str, admin: Any) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.run_id = run_id
        self.admin = admin
        ensure_topics(cfg, bootstrap, run_id)
        self.topics = RunTopics(run_id, cfg.kafka.topic_prefix)
        self.threads: list[WorkerThread] = []
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"rollout-{run_id}-"))
        self._cluster: LocalCluster | None = None
        self._readers: list[TopicReader] = []
        self._producer: Producer | None = None

    # -- workers ------------------------------------------------------------------------------------
    def start(self, role: str, pool: str | None = None, **options: Any) -> WorkerThread:
        stop = threading.Event()
        holder: dict[str, WorkerThread] = {}

        def target() -> None:
            w = holder["w"]
            try:
                w.stats = run_worker(role, self.cfg, self.bootstrap, self.run_id, pool, stop=stop, **options)
            except BaseException as exc:
                log.exception("%s worker crashed", role)
                w.error = exc

        thread = threading.Thread(target=target, name=f"test-{role}-{pool or ''}", daemon=True)
        w = WorkerThread(role, pool, thread, stop)
        holder["w"] = w
        self.threads.append(w)
        thread.start()
        return w

    def spawn(self, role: str, pool: str | None = None, *extra: str) -> Any:
        """A worker as its own process (`python -m rollstream worker ...`); returns the Popen."""
        if self._cluster is None:
            self._cluster = LocalCluster(self.cfg, self.bootstrap, self.run_id, self._run_dir)
        return self._cluster.start(role, pool, *extra)

    def log_of(self, proc: Any) -> str:
        assert self._cluster is not None
        for name, p in self._cluster.procs:
            if p is proc:
                return (self._run_dir / f"{name}.log").read_text(errors="replace")
        return ""

    def wait_thread(self, w: WorkerThread, timeout: float) -> None:
        w.thread.join(timeout)
        if w.thread.is_alive():
            raise AssertionError(f"{w.role} worker still running after {timeout:g}s")
        if w.error is not None:
            raise AssertionError(f"{w.role} worker crashed: {w.error!r}")

    def group_members(self, role: str, pool: str | None = None) -> list[Any]:
        gid = group_id(self.cfg.kafka.topic_prefix, self.run_id, role, pool)
        desc = self.admin.describe_consumer_groups([gid], request_timeout=10)[gid].result()
        return list(desc.members)

    def wait_members(self, role: str, pool: str | None, n: int, timeout: float = 30) -> list[Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                members = self.group_members(role, pool)
            except Exception:
                members = []
            assigned = [m for m in members if m.assignment and m.assignment.topic_partitions]
            if len(members) >= n and len(assigned) >= n:
                return members
            if time.monotonic() > deadline:
                raise AssertionError(f"group {role}.{pool}: {len(members)} members, wanted {n}")
            time.sleep(0.1)

    # -- topics -------------------------------------------------------------------------------------
    def reader(self, *topics: str) -> TopicReader:
        r = TopicReader(
            self.cfg, self.bootstrap, topics or (self.topics.observations, self.topics.scored), self.admin
        )
        self._readers.append(r)
        return r

    def produce(self, topic: str, key: str, event: Event) -> None:
        if self._producer is None:
            self._producer = make_producer(self.cfg, self.bootstrap, "test-producer")
        codec = make_codec(self.cfg.kafka.schema_registry_url or None)
        self._producer.produce(topic, key=key, value=codec.encode(event, topic))
        assert self._producer.flush(10) == 0

    def close(self) -> None:
        for w in self.threads:
            w.stop.set()
        for w in self.threads:
            w.thread.join(30)
        if self._cluster is not None:
            self._cluster.stop(timeout=20)
        for r in self._readers:
            r.close()
        if self._producer is not None:
            self._producer.flush(5)


def actions_of(reader: TopicReader, topics: RunTopics, kind: EnvActionKind) -> list[EnvAction]:
    return [a for a in reader.events(EnvAction, topics.env_actions) if a.kind is kind]


class FaultyEnv:
    """Wraps a TextEnv; the hooks run in the env worker's step threads (sleep, raise, ...)."""

    def __init__(
        self,
        env: TextEnv,
        on_reset: Callable[[FaultyEnv], None] | None,
        on_step: Callable[[FaultyEnv], object] | None,
    ) -> None:
        self.env = env
        self.on_reset = on_reset
        self.on_step = on_step
        self.domain = env.domain
        self.max_turns = env.max_turns
        self.seed = -1
        self.mark: Any = None  # for the test's hooks

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.seed = seed
        if self.on_reset is not None:
            self.on_reset(self)
        return self.env.reset(seed)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.on_step is not None:
            self.on_step(self)
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()


def wrap_make_env(
    monkeypatch: Any,
    *,
    on_step: Callable[[FaultyEnv], object] | None = None,
    on_reset: Callable[[FaultyEnv], None] | None = None,
) -> None:
    """Env workers run in threads of this process: wrap every env they create in a FaultyEnv."""
    import rollstream.workers.env_worker as env_worker
    from rollstream.workers.envs import make_env

    def factory(domain: str, **options: Any) -> TextEnv:
        return FaultyEnv(make_env(domain, **options), on_reset, on_step)

    monkeypatch.setattr(env_worker, "make_env", factory)


def check_run(r: Rollout, n: int, timeout: float = 60) -> Accounting:
    """Wait for n terminals and n scored; every RESET ends exactly once, in both topics."""
    reader = r.reader(r.topics.env_actions, r.topics.observations, r.topics.scored)

    def ended() -> bool:
        acc = Accounting.of(reader, r.topics)
        return len(acc.terminals) >= n and len(acc.scored) >= n

    reader.wait_until(ended, timeout, f"{n} trajectories ended and scored")
    reader.poll(0.5)  # anything produced twice shows up now
    acc = Accounting.of(reader, r.topics)
    launched = {a.trajectory_id for a in actions_of(reader, r.topics, EnvActionKind.RESET)}
    assert len(launched) == n
    assert set(acc.terminals) == launched, "a launched trajectory has no terminal state (or vice versa)"
    assert not acc.duplicates(), f"trajectories with more than one terminal: {acc.duplicates()}"
    assert set(acc.scored) == launched
    assert all(len(s) == 1 for s in acc.scored.values()), "scored twice"
    return acc

"""Taps, analytics, top and report against a real broker, on synthetic events of one run."""

from __future__ import annotations

import io
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer
from rich.console import Console

from rollstream.config import Config, load_config
from rollstream.runner import ensure_topics
from rollstream.schemas.codec import Codec
from rollstream.schemas.events import Event, GenRequest, Observation, ScoredTrajectory
from rollstream.streams.analytics import Agg
from rollstream.streams.faust_app import analytics_topic, faust_available, run_inprocess
from rollstream.streams.report import build_report
from rollstream.streams.tap import TopicReader, run_tap
from rollstream.streams.top import RunView
from rollstream.topics.specs import RunTopics

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "streams"))
from test_streams_analytics import make_events


@pytest.fixture
def run(kafka_bootstrap: str, run_id: str) -> tuple[Config, str, str, list[Event]]:
    cfg = load_config(None, [])
    ensure_topics(cfg, kafka_bootstrap, run_id)
    topics = RunTopics(run_id)
    codec = Codec()
    now = int(time.time() * 1000) - 60_000
    events = make_events(seed=3, n=120)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    for e in events:
        e.run_id = run_id
        e.created_at_ms = now + (e.created_at_ms - 1_700_000_000_000)  # the last minute, in order of windows
        if isinstance(e, ScoredTrajectory):
            topic = topics.scored
        elif isinstance(e, GenRequest):
            topic = topics.gen_requests(e.pool)
        elif type(e).__name__ == "DeadLetter":
            topic = topics.dead_letters
        else:
            topic = topics.weight_versions
        producer.produce(topic, key=e.trajectory_id or "k", value=codec.encode(e))
    for i in range(20):
        obs = Observation(
            run_id=run_id, trajectory_id=f"o{i}", domain="math" if i % 2 else "code", reward=i / 20
        )
        producer.produce(topics.observations, key=obs.trajectory_id, value=codec.encode(obs))
    producer.flush(30)
    return cfg, kafka_bootstrap, run_id, events


def _committed(admin: Any, groups: list[str]) -> dict[str, list[tuple[str, int, int]]]:
    out = {}
    for gid in groups:
        fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(gid)])[gid]
        out[gid] = sorted(
            (tp.topic, tp.partition, tp.offset) for tp in fut.result(timeout=30).topic_partitions
        )
    return out


def test_tap_commits_nothing(run: Any, kafka_admin: Any) -> None:
    cfg, bootstrap, run_id, _ = run
    topics = RunTopics(run_id)
    # a "training" group that has consumed and committed part of the observations topic
    gid = f"rollstream.{run_id}.reward"
    trainer = Consumer({"bootstrap.servers": bootstrap, "group.id": gid, "enable.auto.commit": False,
                        "auto.offset.reset": "earliest"})  # fmt: skip
    trainer.subscribe([topics.observations])
    got = 0
    deadline = time.monotonic() + 30
    while got < 5 and time.monotonic() < deadline:
        got += len([m for m in trainer.consume(5 - got, 1.0) if not m.error()])
    trainer.commit(asynchronous=False)
    trainer.close()
    groups = [g.group_id for g in kafka_admin.list_consumer_groups().result(timeout=30).valid]
    before = _committed(kafka_admin, groups)
    assert before[gid], "the training group committed something"

    out = io.StringIO()
    shown = run_tap(cfg, bootstrap, run_id, "observations", where='domain=="math" and reward>0.5',
                    start="beginning", out=out, idle_exit_s=2)  # fmt: skip
    lines = out.getvalue().splitlines()
    assert shown == len(lines) == 5  # math is odd i, reward i/20 > 0.5: i = 11, 13, 15, 17, 19
    out = io.StringIO()
    run_tap(cfg, bootstrap, run_id, "scored-trajectories", start="beginning", limit=7, as_json=True, out=out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(rows) == 7 and all(r["type"] == "ScoredTrajectory" and "staleness" in r for r in rows)
    out = io.StringIO()
    run_tap(
        cfg, bootstrap, run_id, "gen-requests", start=int(time.time() * 1000) + 60_000, out=out, idle_exit_s=1
    )
    assert out.getvalue() == ""  # --since in the future: nothing yet

    groups_after = [g.group_id for g in kafka_admin.list_consumer_groups().result(timeout=30).valid]
    assert _committed(kafka_admin, groups) == before
    assert not [g for g in set(groups_after) - set(groups) if _committed(kafka_admin, [g])[g]]


def test_analytics_equals_independent_computation(run: Any) -> None:
    cfg, bootstrap, run_id, events = run
    agg = run_inprocess(cfg, bootstrap, run_id, window_s=10, emit_s=1, web_port=None, duration_s=6)
    scored = [e for e in events if isinstance(e, ScoredTrajectory)]
    assert agg.events == len(events)
    # what the analytics topic holds, merged, equals a plain computation over the events
    reader = TopicReader(cfg, bootstrap, [analytics_topic(RunTopics(run_id))], "beginning")
    by_domain: dict[str, Agg] = {}
    for msg, _ in reader.drain(20):
        row = json.loads(msg.value())
        by_domain.setdefault(row["domain"], Agg()).merge(Agg.from_state(row["state"]))
    reader.close()
    for domain in ("math", "code", "frozenlake"):
        done = [s for s in scored if s.domain == domain and s.terminal_state == "completed"]
        summary = by_domain[domain].summary(60)
        assert summary["completed"] == len(done)
        assert summary["reward_mean"] == pytest.approx(statistics.fmean(s.reward for s in done))
        assert summary["reward_std"] == pytest.approx(statistics.pstdev([s.reward for s in done]), abs=1e-9)
        assert summary["gen_ms_mean"] == pytest.approx(
            statistics.fmean(t.gen_ms for s in done for t in s.turns)
        )
    assert by_domain[""].dead_letters == 3


@pytest.mark.skipif(not faust_available(), reason="faust-streaming is not installed")
def test_faust_app_publishes(run: Any, tmp_path: Path) -> None:
    cfg, bootstrap, run_id, events = run
    cmd = [sys.executable, "-m", "rollstream", "analytics", "--run", run_id, "--bootstrap", bootstrap,
           "--engine", "faust", "--duration", "10", "--emit", "1", "--web-port", "0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reader = TopicReader(cfg, bootstrap, [analytics_topic(RunTopics(run_id))], "beginning")
    completed = 0
    for msg, _ in reader.drain(10):
        completed += json.loads(msg.value())["state"]["completed"]
    reader.close()
    assert completed == sum(
        isinstance(e, ScoredTrajectory) and e.terminal_state == "completed" for e in events
    )


def test_top_and_report_render(run: Any, tmp_path: Path) -> None:
    cfg, bootstrap, run_id, _ = run
    view = RunView(cfg, bootstrap, run_id)
    view.catch_up()
    console = Console(file=io.StringIO(), width=160)
    console.print(view.render())
    view.close()
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "h20" in text and "frozenlake" in text and "policy version 7" in text
    assert view.pools == sorted(set(view.pools)), "a pool listed once per partition"
    assert sum(line.lstrip("│ ").startswith("h20 ") for line in text.splitlines()) == 1
    index = build_report(cfg, bootstrap, run_id, tmp_path / "report")
    html = index.read_text()
    assert html.count("data:image/png;base64,") == 4
    for name in ("reward_vs_version.png", "latency.png", "staleness.png", "pools.png"):
        assert (tmp_path / "report" / name).stat().st_size > 5000

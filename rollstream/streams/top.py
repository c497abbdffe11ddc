"""`rollstream top`: a live terminal dashboard of a run (rich), read by assignment, committing nothing."""

from __future__ import annotations

import time

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rollstream.config import Config
from rollstream.streams.analytics import WindowedAggregator
from rollstream.streams.faust_app import source_topics
from rollstream.streams.tap import TopicReader
from rollstream.topics.specs import GEN_REQUESTS, RunTopics
from rollstream.workers.routing import group_id


class RunView:
    """A run's analytics plus per-pool generation lag, refreshed from the topics."""

    def __init__(self, cfg: Config, bootstrap: str, run_id: str, window_s: float = 5.0) -> None:
        self.topics = RunTopics(run_id, cfg.kafka.topic_prefix)
        self.prefix = cfg.kafka.topic_prefix
        self.agg = WindowedAggregator(window_s)
        self.reader = TopicReader(cfg, bootstrap, source_topics(cfg, bootstrap, self.topics), "beginning")
        gen_prefix = self.topics.name(GEN_REQUESTS) + "."
        # one entry per pool, not per partition
        self.pools = sorted(
            {t.removeprefix(gen_prefix) for t, _ in self.reader.partitions if t.startswith(gen_prefix)}
        )
        self.lag: dict[str, int | None] = {}
        self.started = time.monotonic()

    def update(self, budget_s: float = 0.5) -> None:
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            got = False
            for _msg, event in self.reader.poll(2000, 0.1):
                got = True
                if event is not None:
                    self.agg.add(event)
            if not got:
                break
        self._update_lag()

    def catch_up(self, timeout_s: float = 30.0) -> None:
        for _msg, event in self.reader.drain(timeout_s):
            if event is not None:
                self.agg.add(event)
        self._update_lag()

    def _update_lag(self) -> None:
        """Per pool: sum over partitions of high watermark - the gen group's committed offset."""
        admin, consumer = self.reader.admin, self.reader.consumer
        for pool in self.pools:
            topic = self.topics.gen_requests(pool)
            gid = group_id(self.prefix, self.topics.run_id, "gen", pool)
            try:
                fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(gid)])[gid]
                committed = {
                    tp.partition: tp.offset
                    for tp in fut.result(timeout=5).topic_partitions
                    if tp.topic == topic
                }
                total = 0
                for p in sorted({p for t, p in self.reader.partitions if t == topic}):
                    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
                    total += max(0, high - max(committed.get(p, 0), 0))
                self.lag[pool] = total
            except Exception:  # the group does not exist yet / broker hiccup
                self.lag[pool] = None

    def render(self, recent_s: float = 60.0) -> Group:
        agg = self.agg
        since = int(time.time() * 1000 - recent_s * 1000)
        recent = agg.rollup(("pool",), since_ms=since)
        scope = f"last {recent_s:.0f}s"
        if not any(s["turns"] or s["requests"] for s in recent.values()):
            recent, scope = agg.rollup(("pool",)), "whole run, active windows"
        pools = Table(title=f"pools ({scope})", expand=False)
        for col in ("pool", "turns/s", "tokens/s", "gen ms p50/p95", "requests", "fallback", "lag"):
            pools.add_column(col, justify="right" if col != "pool" else "left")
        for pool in self.pools:
            s = recent.get((pool,), {})
            lag = self.lag.get(pool)
            pools.add_row(
                pool,
                f"{s.get('turns_per_s', 0):.2f}",
                f"{s.get('tokens_per_s', 0):.1f}",
                f"{s.get('gen_ms_p50', 0):g}/{s.get('gen_ms_p95', 0):g}",
                str(s.get("requests", 0)),
                f"{s.get('fallback_rate', 0):.1%}",
                "-" if lag is None else str(lag),
            )
        domains = Table(title="domains (whole run)")
        for col in ("domain", "ended", "completed", "reward", "turns", "tokens", "aborted", "staleness"):
            domains.add_column(col, justify="right" if col != "domain" else "left")
        reasons: dict[str, int] = {}
        dead = 0
        for (domain,), s in agg.rollup(("domain",)).items():
            for r, n in s["reasons"].items():
                reasons[r] = reasons.get(r, 0) + n
            dead += s["dead_letters"]
            if not domain:
                continue
            domains.add_row(
                domain,
                str(s["trajectories"]),
                str(s["completed"]),
                f"{s['reward_mean']:.3f} ± {s['reward_std']:.3f}",
                f"{s['turns_mean']:.2f}",
                f"{s['tokens_mean']:.1f}",
                f"{s['abort_rate']:.1%}",
                f"{s['staleness_mean']:.2f}",
            )
        header = Text(
            f"run {self.topics.run_id} | policy version {agg.version} | events {agg.events} | "
            f"dead letters {dead} | {time.strftime('%H:%M:%S')}",
            style="bold",
        )
        ends = ", ".join(f"{k}={v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])) or "none"
        return Group(header, pools, domains, Text(f"not completed, by reason: {ends}"))

    def close(self) -> None:
        self.reader.close()


def run_top(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    *,
    once: bool = False,
    refresh_s: float = 2.0,
    console: Console | None = None,
) -> None:
    console = console or Console()
    view = RunView(cfg, bootstrap, run_id)
    try:
        if once:
            view.catch_up()
            console.print(view.render())
            return
        with Live(view.render(), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                view.update(refresh_s)
                live.update(view.render())
    except KeyboardInterrupt:
        pass
    finally:
        view.close()

"""`rollstream report`: a self-contained HTML report of a run, made from its topics.

Reads ``scored-trajectories``, ``env-actions`` (one ACTION per generated turn, with pool, time and tokens),
``gen-requests.*``, ``dead-letters`` and ``weight-versions`` from the beginning to their current end, by
assignment (commits nothing). Plots are matplotlib PNGs, written next to ``index.html`` and embedded in it.
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollstream.config import Config
from rollstream.schemas.events import EnvAction, EnvActionKind, ScoredTrajectory, TerminalState, WeightVersion
from rollstream.streams.analytics import WindowedAggregator
from rollstream.streams.faust_app import source_topics
from rollstream.streams.tap import TopicReader
from rollstream.topics.specs import RunTopics


@dataclass
class RunData:
    agg: WindowedAggregator
    scored: list[ScoredTrajectory] = field(default_factory=list)
    actions: list[tuple[int, str, float, int]] = field(default_factory=list)  # (ts ms, pool, gen_ms, tokens)
    versions: list[WeightVersion] = field(default_factory=list)


def collect(
    cfg: Config, bootstrap: str, run_id: str, window_s: float = 10.0, timeout_s: float = 120.0
) -> RunData:
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    data = RunData(WindowedAggregator(window_s, retain_windows=1_000_000))
    reader = TopicReader(
        cfg, bootstrap, [*source_topics(cfg, bootstrap, topics), topics.env_actions], "beginning"
    )
    try:
        for _msg, event in reader.drain(timeout_s):
            if isinstance(event, EnvAction):
                if event.kind == EnvActionKind.ACTION:
                    data.actions.append(
                        (event.created_at_ms, event.pool, event.gen_ms, len(event.action_token_ids) // 4)
                    )
                continue
            if event is None:
                continue
            data.agg.add(event)
            if isinstance(event, ScoredTrajectory):
                data.scored.append(event)
            elif isinstance(event, WeightVersion):
                data.versions.append(event)
    finally:
        reader.close()
    return data


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path, name: str) -> Path:
    path = out / name
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return path


def plot_reward_by_version(data: RunData, out: Path) -> Path:
    plt = _plt()
    by: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in data.scored:
        if s.terminal_state == TerminalState.COMPLETED.value:
            by[s.domain][s.first_version].append(s.reward)
    fig, ax = plt.subplots(figsize=(7, 4))
    for domain, versions in sorted(by.items()):
        xs = sorted(versions)
        ax.plot(xs, [sum(versions[v]) / len(versions[v]) for v in xs], marker="o", ms=3, label=domain)
    ax.set_xlabel("policy version (first action)")
    ax.set_ylabel("mean reward")
    ax.set_title("reward against version, per domain")
    ax.grid(alpha=0.3)
    if by:
        ax.legend()
    return _save(fig, out, "reward_vs_version.png")


def plot_latency(data: RunData, out: Path) -> Path:
    plt = _plt()
    gen = [t.gen_ms for s in data.scored for t in s.turns]
    env = [t.env_ms for s in data.scored for t in s.turns]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, values, name in ((axes[0], gen, "generation"), (axes[1], env, "environment")):
        ax.hist(values or [0.0], bins=40, color="tab:blue" if name == "generation" else "tab:orange")
        ax.set_xlabel(f"{name} time per turn (ms)")
        ax.set_ylabel("turns")
        ax.set_yscale("log")
        ax.set_title(f"{name} latency ({len(values)} turns)")
    return _save(fig, out, "latency.png")


def plot_staleness(data: RunData, out: Path) -> Path:
    plt = _plt()
    counts: dict[int, int] = defaultdict(int)
    for s in data.scored:
        if s.terminal_state == TerminalState.COMPLETED.value:
            counts[s.last_version - s.first_version] += 1
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = sorted(counts)
    ax.bar(xs, [counts[x] for x in xs])
    ax.set_xticks(xs)
    ax.set_xlabel("staleness (last_version - first_version)")
    ax.set_ylabel("completed trajectories")
    ax.set_title("staleness distribution")
    return _save(fig, out, "staleness.png")


def plot_pools(data: RunData, out: Path, bin_s: float = 5.0) -> Path:
    """Per pool over time: turns/s, and generation busy (gen time per wall second = requests in flight)."""
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    if data.actions:
        t0 = min(a[0] for a in data.actions)
        series: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
        for ts, pool, gen_ms, _tokens in data.actions:
            b = int((ts - t0) / 1000 // bin_s)
            series[pool][b][0] += 1
            series[pool][b][1] += gen_ms / 1000
        last = max(b for s in series.values() for b in s)
        for pool, bins in sorted(series.items()):
            xs = list(range(last + 1))
            axes[0].plot([x * bin_s for x in xs], [bins[x][0] / bin_s for x in xs], label=pool)
            axes[1].plot([x * bin_s for x in xs], [bins[x][1] / bin_s for x in xs], label=pool)
        axes[0].legend()
    axes[0].set_ylabel("turns / s")
    axes[1].set_ylabel("generation busy (s/s)")
    axes[1].set_xlabel("seconds since the first action")
    axes[0].set_title("pool utilisation over time")
    for ax in axes:
        ax.grid(alpha=0.3)
    return _save(fig, out, "pools.png")


def _table(rows: dict[tuple[Any, ...], dict[str, Any]], dims: tuple[str, ...], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in (*dims, *cols))
    body = []
    for key, s in rows.items():
        cells = [html.escape(str(k)) for k in key]
        for c in cols:
            v = s.get(c, "")
            cells.append(
                f"{v:.4g}"
                if isinstance(v, float)
                else html.escape(json.dumps(v) if isinstance(v, dict) else str(v))
            )
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


_CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}img{max-width:100%}"
)


def build_report(cfg: Config, bootstrap: str, run_id: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = collect(cfg, bootstrap, run_id)
    plots = [
        ("Reward against version, per domain", plot_reward_by_version(data, out_dir)),
        ("Turn latency: generation and environment", plot_latency(data, out_dir)),
        ("Staleness", plot_staleness(data, out_dir)),
        ("Pool utilisation over time", plot_pools(data, out_dir)),
    ]
    cols = ["trajectories", "completed", "reward_mean", "reward_std", "turns_mean", "tokens_mean",
            "abort_rate", "staleness_mean", "gen_ms_mean", "env_ms_mean", "states", "reasons"]  # fmt: skip
    pool_cols = [
        "turns",
        "tokens",
        "gen_ms_mean",
        "gen_ms_p95",
        "requests",
        "fallback_rate",
        "gen_tokens_per_s",
    ]
    agg = data.agg
    dead = sum(s["dead_letters"] for s in agg.rollup(()).values())
    parts = [
        f"<h1>rollstream run {html.escape(run_id)}</h1>",
        f"<p>{len(data.scored)} trajectories scored, {len(data.actions)} generated turns, "
        f"{len(data.versions)} weight versions (newest {agg.version}), {dead} dead letters.</p>",
        "<h2>By domain</h2>",
        _table(agg.rollup(("domain",)), ("domain",), cols),
        "<h2>By pool</h2>",
        _table(agg.rollup(("pool",)), ("pool",), pool_cols),
        "<h2>By version</h2>",
        _table(agg.rollup(("version",)), ("version",), cols[:9]),
    ]
    for title, path in plots:
        b64 = base64.b64encode(path.read_bytes()).decode()
        parts.append(
            f"<h2>{html.escape(title)}</h2><img alt='{path.name}' src='data:image/png;base64,{b64}'>"
        )
    index = out_dir / "index.html"
    index.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>rollstream {html.escape(run_id)}</title>"
        f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>"
    )
    return index

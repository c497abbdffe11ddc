"""`rollstream run`: every role of one run as local processes, with live progress.

The broker comes from config (`kafka.bootstrap_servers`) or is the embedded one, started if needed.
Each worker is a separate `python -m rollstream worker ...` process, exactly what a user starts by
hand on another machine, so scaling a pool mid-run is just starting one more of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rollstream.clients import base_conf
from rollstream.config import Config
from rollstream.schemas.events import Observation, ScoredTrajectory, WeightVersion
from rollstream.streams.tap import TopicReader
from rollstream.topics.admin import TopicAdmin
from rollstream.topics.specs import RunTopics, run_topic_specs


def parse_counts(text: str, what: str) -> dict[str, int]:
    """``h800=1,h20=2`` -> {"h800": 1, "h20": 2}; a bare number means pool "default"."""
    counts: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        pool, sep, n = item.rpartition("=")
        try:
            counts[pool if sep else "default"] = int(n)
        except ValueError:
            raise ValueError(f"--{what}: expected pool=count[,pool=count], got {text!r}") from None
    return counts


@dataclass
class Progress:
    """What the run's topics say so far (read by assignment, committing nothing)."""

    terminal: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    scored: int = 0
    turns: int = 0
    version: int = -1
    version_rewards: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    version_metrics: dict[int, dict[str, float]] = field(default_factory=dict)

    def line(self, run_id: str, elapsed: float, target: str) -> str:
        ended = sum(self.terminal.values())
        reward = " ".join(
            f"{d}={sum(v[-200:]) / len(v[-200:]):.2f}" for d, v in sorted(self.rewards.items()) if v
        )
        states = " ".join(f"{k}={v}" for k, v in sorted(self.terminal.items()))
        return (
            f"[{elapsed:6.1f}s] run {run_id} | ended {ended}{target} ({states}) | turns {self.turns} "
            f"({self.turns / max(elapsed, 1e-9):.0f}/s) | reward {reward or '-'} | version {self.version}"
        )


class ProgressTap:
    """Counts what the run's topics say, through a tap (`TopicReader`): by assignment, committing nothing."""

    def __init__(self, cfg: Config, bootstrap: str, topics: RunTopics) -> None:
        self.reader = TopicReader(
            cfg, bootstrap, [topics.observations, topics.scored, topics.weight_versions], "beginning"
        )
        self.topics = topics
        self.progress = Progress()

    def poll(self, budget_s: float = 0.5) -> Progress:
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            got = False
            for _msg, event in self.reader.poll(1000, 0.05):
                got = True
                if event is not None:
                    self._count(event)
            if not got:
                break
        return self.progress

    def _count(self, event: object) -> None:
        p = self.progress
        if isinstance(event, Observation):
            p.turns += max(1, len(event.turns)) if event.terminal_state else 0
            if event.terminal_state:
                p.terminal[event.terminal_state] += 1
                if event.terminal_state != "completed":
                    p.reasons[event.reason.split(":")[0]] += 1
        elif isinstance(event, ScoredTrajectory):
            if event.terminal_state == "completed":
                p.scored += 1
                p.rewards[event.domain].append(event.reward)
                p.version_rewards[event.last_version].append(event.reward)
        elif isinstance(event, WeightVersion):
            p.version = max(p.version, event.version)
            p.version_metrics[event.version] = dict(event.metrics)

    def close(self) -> None:
        self.reader.close()


class LocalCluster:
    """Starts, watches and stops the worker processes of one run on this machine."""

    def __init__(self, cfg: Config, bootstrap: str, run_id: str, run_dir: Path) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.run_id = run_id
        self.run_dir = run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_file = run_dir / "config.json"
        self.config_file.write_text(json.dumps(cfg.to_dict(), indent=2))
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._logs: list[TextIO] = []

    def start(self, role: str, pool: str | None = None, *extra: str) -> subprocess.Popen[bytes]:
        name = f"{role}-{pool}-{len(self.procs)}" if pool else f"{role}-{len(self.procs)}"
        cmd = [
            sys.executable,
            "-m",
            "rollstream",
            "worker",
            role,
            "--run",
            self.run_id,
            "--config",
            str(self.config_file),
            "--bootstrap",
            self.bootstrap,
            *extra,
        ]
        if pool:
            cmd += ["--pool", pool]
        log_file = open(self.run_dir / f"{name}.log", "w")  # noqa: SIM115 - closed in stop()
        self._logs.append(log_file)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        self.procs.append((name, proc))
        return proc

    def failed(self) -> list[str]:
        return [f"{name} exited with {p.returncode}" for name, p in self.procs if p.poll() not in (None, 0)]

    def stop(self, timeout: float = 30, grace_s: float = 3.0) -> None:
        """Trainer and scheduler first (the scheduler CANCELs what is in flight), then, after a grace
        period in which the env workers turn those CANCELs into terminal states, everything else."""
        first = [(n, p) for n, p in self.procs if n.startswith(("trainer-", "scheduler-"))]
        self._terminate(first, timeout)
        if first and any(p.poll() is None for _, p in self.procs):
            time.sleep(grace_s)
        self._terminate(self.procs, timeout)
        for f in self._logs:
            f.close()

    @staticmethod
    def _terminate(procs: list[tuple[str, subprocess.Popen[bytes]]], timeout: float) -> None:
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def ensure_topics(cfg: Config, bootstrap: str, run_id: str) -> None:
    TopicAdmin(base_conf(cfg, bootstrap)).apply(run_topic_specs(run_id, cfg))


def run_local(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    run_dir: Path,
    *,
    gen: dict[str, int],
    env: dict[str, int],
    reward: int,
    trajectories: int | None,
    steps: int | None,
    out: TextIO = sys.stdout,
    progress_interval_s: float = 2.0,
) -> Progress:
    ensure_topics(cfg, bootstrap, run_id)
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    cluster = LocalCluster(cfg, bootstrap, run_id, run_dir)
    tap = ProgressTap(cfg, bootstrap, topics)
    start = time.monotonic()
    print(f"run {run_id}: broker {bootstrap}, topics {topics.prefix}.{run_id}.*, logs in {run_dir}", file=out)
    try:
        for pool, n in env.items():
            for _ in range(n):
                cluster.start("env", "cpu" if pool == "default" else pool)
        for pool, n in gen.items():
            for _ in range(n):
                cluster.start("gen", pool)
        for _ in range(reward):
            cluster.start("reward")
        if steps is not None:
            cluster.start("trainer", None, "--steps", str(steps))
        sched_args = ["--trajectories", str(trajectories)] if trajectories is not None else []
        scheduler = cluster.start("scheduler", None, *sched_args)
        target = f"/{trajectories}" if trajectories is not None else ""
        last = 0.0
        while True:
            progress = tap.poll()
            now = time.monotonic()
            if now - last >= progress_interval_s:
                print(progress.line(run_id, now - start, target), file=out, flush=True)
                last = now
            if cluster.failed():
                raise RuntimeError(f"worker failed: {cluster.failed()} (logs in {run_dir})")
            if steps is not None and progress.version >= steps:
                break
            if steps is None and scheduler.poll() == 0:
                tap.poll(2.0)
                break
    except KeyboardInterrupt:
        print(f"run {run_id}: interrupted, stopping the workers", file=out, flush=True)
    finally:
        cluster.stop()
        progress = tap.poll(1.0)
        tap.close()
    print(progress.line(run_id, time.monotonic() - start, target), file=out, flush=True)
    if progress.reasons:
        print(
            "ended without completing: " + ", ".join(f"{k}={v}" for k, v in progress.reasons.most_common()),
            file=out,
        )
    if progress.version_metrics:
        plot = plot_reward_curve(progress, run_dir / "reward_vs_version.png", run_id)
        print(f"reward curve: {plot}", file=out)
    print(f"run {run_id} finished", file=out, flush=True)
    return progress


def plot_reward_curve(progress: Progress, path: Path, run_id: str) -> Path:
    """Mean training reward of each version's batch against the version (from weight-versions)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = sorted(v for v, m in progress.version_metrics.items() if "reward_mean" in m)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(
        versions, [progress.version_metrics[v]["reward_mean"] for v in versions], lw=1, label="batch reward"
    )
    ax.set_xlabel("policy version")
    ax.set_ylabel("mean reward")
    ax.set_title(f"run {run_id}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

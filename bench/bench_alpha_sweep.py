"""Alpha sweep (issue 4): step time, abort rate and mean staleness against alpha = 0..4.

Scripted policy (oracle FrozenLake, no model cost) with heavy-tailed environment latency (Pareto), a
real trainer, the real per-turn gate and buffer eviction. Run by hand against a broker:

    rollstream broker up
    python bench/bench_alpha_sweep.py --alphas 0 1 2 3 4 --steps 12
"""

from __future__ import annotations

import argparse
import io
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from rollstream.config import load_config
from rollstream.runner import run_local
from rollstream.schemas.codec import Codec
from rollstream.schemas.events import Observation, WeightVersion
from rollstream.topics.specs import RunTopics


def read_topic(bootstrap: str, topic: str) -> list[object]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    codec = Codec()
    out: list[object] = []
    meta = consumer.list_topics(topic, timeout=10).topics[topic]
    for p in meta.partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        consumer.assign([TopicPartition(topic, p, low)])
        while low < high:
            msg = consumer.poll(1.0)
            if msg is None:
                break
            if not msg.error():
                out.append(codec.decode(msg.value()))
            low = msg.offset() + 1
    consumer.close()
    return out


def sweep_one(bootstrap: str, alpha: int, steps: int, latency: str) -> dict[str, float]:
    run_id = f"alpha{alpha}-{int(time.time())}"
    cfg = load_config(
        None,
        [
            'rollout.domains=["frozenlake"]',
            "rollout.group_size=8",
            "rollout.max_in_flight=96",
            "generation.backend=scripted",
            "generation.scripted_policy=random",
            f"env.latency={latency}",
            f"trainer.alpha={alpha}",
            "trainer.groups_per_step=2",
            "trainer.min_group_size=2",
            f"trainer.weight_store={tempfile.mkdtemp(prefix='alpha-ws-')}",
        ],
    )
    start = time.monotonic()
    run_local(
        cfg,
        bootstrap,
        run_id,
        Path(tempfile.mkdtemp(prefix="alpha-run-")),
        gen={"h800": 1},
        env={"cpu": 1},
        reward=1,
        trajectories=None,
        steps=steps,
        out=io.StringIO(),
    )
    wall = time.monotonic() - start
    topics = RunTopics(run_id)
    versions = [v for v in read_topic(bootstrap, topics.weight_versions) if isinstance(v, WeightVersion)]
    terminals = [
        o
        for o in read_topic(bootstrap, topics.observations)
        if isinstance(o, Observation) and o.terminal_state
    ]
    created = [v.created_at_ms for v in versions]
    step_s = (
        statistics.mean((b - a) / 1000 for a, b in itertools.pairwise(created[1:]))
        if len(created) > 2
        else float("nan")
    )
    stale = sum(1 for o in terminals if o.reason.startswith("stale"))
    staleness = [v.parent_version - s.first_version for v in versions for s in v.samples]
    dropped = sum(len(v.dropped) for v in versions)
    return {
        "alpha": alpha,
        "wall_s": wall,
        "step_s": step_s,
        "trajectories": len(terminals),
        "abort_rate": stale / max(1, len(terminals)),
        "dropped": dropped,
        "mean_staleness": statistics.mean(staleness) if staleness else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--alphas", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--latency", default="pareto:5:1.5", help="heavy-tailed env step latency")
    args = ap.parse_args()
    print(f"{'alpha':>5} {'step s':>7} {'abort rate':>10} {'dropped':>7} {'mean staleness':>14} {'trajs':>6}")
    for alpha in args.alphas:
        r = sweep_one(args.bootstrap, alpha, args.steps, args.latency)
        print(
            f"{alpha:>5} {r['step_s']:7.2f} {r['abort_rate']:10.1%} {r['dropped']:>7} "
            f"{r['mean_staleness']:14.2f} {r['trajectories']:>6}",
            flush=True,
        )


if __name__ == "__main__":
    main()

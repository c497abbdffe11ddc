"""Replay speed: wall time of `rollstream replay` against the wall time of the run it reproduces.

    python bench/bench_replay.py --bootstrap 127.0.0.1:9092 --steps 5            # train a run, then replay it
    python bench/bench_replay.py --bootstrap 127.0.0.1:9092 --run R --run-wall 97  # replay an existing run

Prints one JSON line: run wall time (measured around `run_local`), the run's training span (v0 -> last
version, from the events), replay wall / fetch / train seconds, the speed-ups, and whether every checksum
matched.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from rollstream.config import load_config
from rollstream.replay import replay
from rollstream.runner import run_local


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--config", default="examples/learn-frozenlake.toml")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--run", help="replay this existing run instead of training one")
    p.add_argument("--run-wall", type=float, help="with --run: its measured wall time, seconds")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    cfg = load_config(args.config, [f"trainer.weight_store={tmp / 'weights'}", *args.set])
    run_id, run_wall = args.run, args.run_wall
    if run_id is None:
        run_id = f"bench-replay-{int(time.time())}"
        t0 = time.monotonic()
        run_local(
            cfg,
            args.bootstrap,
            run_id,
            tmp / "run",
            gen={"h800": 1},
            env={"cpu": 1},
            reward=1,
            trajectories=None,
            steps=args.steps,
            out=sys.stderr,
        )
        run_wall = time.monotonic() - t0
    results = [replay(cfg, args.bootstrap, run_id, out=io.StringIO()) for _ in range(args.repeats)]
    best = min(results, key=lambda r: r.wall_s)
    d = best.as_dict()
    print(
        json.dumps(
            {
                "run": run_id,
                "versions": d["versions_checked"],
                "samples": sum(v.samples for v in best.versions),
                "run_wall_s": round(run_wall, 2) if run_wall else None,
                "run_train_span_s": d["recorded_span_s"],
                "run_train_s": d["recorded_train_s"],
                "replay_wall_s": d["wall_s"],
                "replay_fetch_s": d["fetch_s"],
                "replay_train_s": d["train_s"],
                "speedup_vs_run_wall": round(run_wall / best.wall_s, 1) if run_wall else None,
                "speedup_vs_train_span": round(d["recorded_span_s"] / best.wall_s, 1),
                "all_identical": all(r.ok for r in results),
            }
        )
    )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

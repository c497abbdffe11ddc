"""Cost of taps + analytics to the pipeline: turns/s of `rollstream run` with and without them.

    python bench/bench_taps.py --bootstrap 127.0.0.1:9092 --trajectories 120 --pairs 2

Each pair runs the same rollout twice on fresh run ids (baseline, then with `rollstream tap observations`
printing every event to /dev/null and `rollstream analytics` running), alternating the order between pairs so
drift on a shared machine does not favour one side. Prints one JSON line per run and the median overhead.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from rollstream.config import load_config
from rollstream.runner import ensure_topics, run_local


def _cpu_s(pid: int) -> float:
    """utime + stime of a live process (before it is reaped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one(bootstrap: str, trajectories: int, with_taps: bool, engine: str, run_dir: Path) -> float:
    cfg = load_config(None, [])
    run_id = f"bench-taps-{uuid.uuid4().hex[:8]}"
    ensure_topics(cfg, bootstrap, run_id)
    procs: list[subprocess.Popen[bytes]] = []
    cpu0 = _children_cpu_s()
    tap_cpu = 0.0
    if with_taps:
        base = [sys.executable, "-m", "rollstream"]
        common = ["--run", run_id, "--bootstrap", bootstrap]
        procs.append(subprocess.Popen([*base, "tap", "observations", *common], stdout=subprocess.DEVNULL))
        procs.append(
            subprocess.Popen(
                [*base, "analytics", *common, "--engine", engine, "--web-port", "0"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        time.sleep(6)  # let them start and join first: their start-up is not the steady cost
    start = time.monotonic()
    try:
        progress = run_local(
            cfg, bootstrap, run_id, run_dir / run_id, gen={"h800": 1, "h20": 1}, env={"cpu": 1}, reward=1,
            trajectories=trajectories, steps=None, out=io.StringIO(),
        )  # fmt: skip
    finally:
        tap_cpu = sum(_cpu_s(p.pid) for p in procs if p.poll() is None)
        for p in procs:
            p.terminate()
            p.wait(30)
    elapsed = time.monotonic() - start
    rate = progress.turns / elapsed
    # On a shared box wall-clock turns/s drifts more than 5% between identical runs; the CPU the taps burn
    # against the CPU of the pipeline's workers (all children of this process) is the steadier measure.
    pipeline_cpu = _children_cpu_s() - cpu0 - tap_cpu
    print(json.dumps({"run": run_id, "taps": with_taps, "turns": progress.turns, "s": round(elapsed, 2),
                      "turns_per_s": round(rate, 3), "pipeline_cpu_s": round(pipeline_cpu, 2),
                      "taps_cpu_s": round(tap_cpu, 2)}), flush=True)  # fmt: skip
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--trajectories", type=int, default=120)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--engine", default="auto", choices=["auto", "faust", "inprocess"])
    ap.add_argument("--run-dir", default="/tmp/rollstream-bench-taps")
    args = ap.parse_args()
    overheads = []
    for i in range(args.pairs):
        order = [False, True] if i % 2 == 0 else [True, False]
        rates = {t: one(args.bootstrap, args.trajectories, t, args.engine, Path(args.run_dir)) for t in order}
        overheads.append(1 - rates[True] / rates[False])
    print(json.dumps({"overhead_median": round(statistics.median(overheads), 4), "overheads": overheads}))


if __name__ == "__main__":
    main()

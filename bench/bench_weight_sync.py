"""Exposed generation pause of the live weight swap vs a stop-the-world push+pull (issue 4).

Stop-the-world: generation stops while the trainer publishes the version's buckets, the worker pulls
them (checksums verified) and loads them. Live sync (what `gen_worker.WeightFollower` does): the pull
happens in a background thread while generation goes on; generation pauses only for
`load_state_dict` between engine steps. Run by hand:

    python bench/bench_weight_sync.py --sizes-mb 10 100 1000 [--store /tmp/ws]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from rollstream.workers.trainer.weight_store import DirectoryWeightStore

TENSOR_MB = 8  # bucket-sized tensors, as a real model's layers are


def make_state(size_mb: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = max(1, size_mb // TENSOR_MB)
    per = size_mb * 1024 * 1024 // 4 // n
    return {f"layer{i}.weight": torch.randn(per, generator=gen) for i in range(n)}


class Engine(torch.nn.Module):
    """Holds parameters shaped like the state dict: what `load_state_dict` swaps into."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, t in state.items():
            self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(torch.zeros_like(t)))

    def load(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, t in state.items():
                getattr(self, name.replace(".", "_")).copy_(t)


def bench(size_mb: int, root: Path, bucket_mb: float) -> dict[str, float]:
    store = DirectoryWeightStore(root, bucket_mb=bucket_mb)
    v1 = make_state(size_mb, 1)
    engine = Engine(v1)
    t0 = time.perf_counter()
    refs = store.publish("bench", 1, v1)
    push = time.perf_counter() - t0
    t0 = time.perf_counter()
    pulled = store.fetch("bench", 1, refs)
    pull = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.load(pulled)
    swap = time.perf_counter() - t0
    return {
        "size_mb": size_mb,
        "push_s": push,
        "pull_s": pull,
        "swap_s": swap,
        "stop_the_world_s": push + pull + swap,
        "exposed_s": swap,
        "ratio": swap / (push + pull + swap),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--bucket-mb", type=float, default=64)
    ap.add_argument("--store", type=Path)
    args = ap.parse_args()
    root = args.store or Path(tempfile.mkdtemp(prefix="ws-bench-"))
    torch.set_num_threads(1)
    print(f"{'size':>7} {'push s':>8} {'pull s':>8} {'swap s':>8} {'stop-world s':>12} {'exposed/stw':>11}")
    try:
        for size in args.sizes_mb:
            r = bench(size, root / f"{size}", args.bucket_mb)
            print(
                f"{size:>5}MB {r['push_s']:8.3f} {r['pull_s']:8.3f} {r['swap_s']:8.3f} "
                f"{r['stop_the_world_s']:12.3f} {r['ratio']:10.1%}",
                flush=True,
            )
            shutil.rmtree(root / f"{size}", ignore_errors=True)
    finally:
        if args.store is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

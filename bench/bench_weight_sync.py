"""Exposed generation pause of the live weight swap vs a stop-the-world push+pull (issue 4).

Stop-the-world: generation stops while the trainer publishes the version's buckets, the worker pulls
them (checksums verified) and loads them. Live sync (what `gen_worker.WeightFollower` does): the pull
happens in a background thread while generation goes on; generation pauses only for
`load_state_dict` between engine steps. Run by hand:

    python bench/bench_weight_sync.py --sizes-mb 10 100 1000 [--store /tmp/ws]
    python bench/bench_weight_sync.py --sizes-mb 10 100 1000 --mooncake            # starts its own master
    python bench/bench_weight_sync.py --mooncake --master 127.0.0.1:50051          # a running master

With ``--mooncake`` the same push/pull/swap goes through `MooncakeWeightStore` (TCP, P2P handshake): a
publisher client that holds the buckets in its segment, and a fetch-only client, both in this process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from rollstream.workers.trainer.weight_store import DirectoryWeightStore, MooncakeWeightStore, WeightStore

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


@contextmanager
def mooncake_master() -> Iterator[str]:
    """A `mooncake_master` on free loopback ports (no metadata server: P2P handshake); stopped by PID."""
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cmd = [
        "mooncake_master",
        "--rpc_address=127.0.0.1",
        f"--rpc_port={ports[0]}",
        "--metrics_host=127.0.0.1",
        f"--metrics_port={ports[1]}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", ports[0])) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mooncake_master did not start (rc={proc.poll()})")
            time.sleep(0.1)
        yield f"127.0.0.1:{ports[0]}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bench(size_mb: int, root: Path, bucket_mb: float, master: str | None = None) -> dict[str, float]:
    if master is None:
        store: WeightStore = DirectoryWeightStore(root, bucket_mb=bucket_mb)
        reader: WeightStore = store
    else:
        # Segment: the version's buckets plus safetensors headers and allocator slack.
        segment = int(size_mb * 1.25 + 2 * bucket_mb + 64) * 1024 * 1024
        store = MooncakeWeightStore(master, global_segment_size=segment, bucket_mb=bucket_mb)
        reader = MooncakeWeightStore(master, global_segment_size=0)
    try:
        return _bench(size_mb, store, reader)
    finally:
        for s in (reader, store):
            if isinstance(s, MooncakeWeightStore):
                s.close()


def _bench(size_mb: int, store: WeightStore, reader: WeightStore) -> dict[str, float]:
    v1 = make_state(size_mb, 1)
    engine = Engine(v1)
    t0 = time.perf_counter()
    refs = store.publish("bench", 1, v1)
    push = time.perf_counter() - t0
    t0 = time.perf_counter()
    pulled = reader.fetch("bench", 1, refs)
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


def run(sizes_mb: list[int], bucket_mb: float, root: Path, master: str | None) -> None:
    torch.set_num_threads(1)
    kind = f"mooncake {master}" if master else f"directory {root}"
    print(f"store: {kind}, bucket {bucket_mb:g} MB")
    print(f"{'size':>7} {'push s':>8} {'pull s':>8} {'swap s':>8} {'stop-world s':>12} {'exposed/stw':>11}")
    for size in sizes_mb:
        r = bench(size, root / f"{size}", bucket_mb, master)
        print(
            f"{size:>5}MB {r['push_s']:8.3f} {r['pull_s']:8.3f} {r['swap_s']:8.3f} "
            f"{r['stop_the_world_s']:12.3f} {r['ratio']:10.1%}",
            flush=True,
        )
        shutil.rmtree(root / f"{size}", ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--bucket-mb", type=float, default=64)
    ap.add_argument("--store", type=Path)
    ap.add_argument("--mooncake", action="store_true", help="use MooncakeWeightStore, not a directory")
    ap.add_argument("--master", help="with --mooncake: a running master host:port (default: start one)")
    args = ap.parse_args()
    root = args.store or Path(tempfile.mkdtemp(prefix="ws-bench-"))
    try:
        with ExitStack() as stack:
            master = None
            if args.mooncake:
                master = args.master or stack.enter_context(mooncake_master())
            run(args.sizes_mb, args.bucket_mb, root, master)
    finally:
        if args.store is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

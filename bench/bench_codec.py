"""Codec throughput per core: encode and decode events/s of a small and a large event.

    python bench/bench_codec.py [--seconds 2] [--json]

Single thread, so events/s is per core. Reports CPU time (what one core can do) and wall time (what it
did on this machine, other load included).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rollstream.schemas.codec import Codec
from rollstream.schemas.events import (
    EnvAction,
    EnvActionKind,
    Event,
    Observation,
    Turn,
    pack_logprobs,
    pack_tokens,
)


def small_event() -> EnvAction:
    """One generated turn: ~8 action tokens with their logprobs."""
    return EnvAction(
        run_id="run-20261130",
        trajectory_id="9f3c2a1b7d4e4f0a8b6c5d4e3f2a1b0c",
        group_id="1a2b3c4d5e6f4a7b8c9d0e1f2a3b4c5d",
        policy_version=12,
        producer_id="gen.h20@worker-3:41235",
        kind=EnvActionKind.ACTION,
        domain="math",
        pool="h20",
        turn=2,
        task_seed=123456,
        action_text="The answer is 42.",
        action_token_ids=pack_tokens([791, 4320, 374, 220, 2983, 13, 151643, 151645]),
        behaviour_logprobs=pack_logprobs([-0.11, -0.02, -0.3, -1.2, -0.05, -0.01, -0.4, -0.02]),
        first_version=11,
        gen_ms=38.5,
    )


def terminal_observation(total_tokens: int = 4096, turns: int = 8) -> Observation:
    """A finished trajectory: `turns` turns carrying `total_tokens` token ids in all."""
    rng = np.random.default_rng(0)
    per_turn = total_tokens // turns
    action = per_turn // 8
    prompt = per_turn - action
    return Observation(
        run_id="run-20261130",
        trajectory_id="9f3c2a1b7d4e4f0a8b6c5d4e3f2a1b0c",
        group_id="1a2b3c4d5e6f4a7b8c9d0e1f2a3b4c5d",
        policy_version=12,
        producer_id="env.cpu@worker-1:1234",
        domain="frozenlake",
        pool="h800",
        turn=turns,
        task_seed=99,
        text="You reached the goal.",
        reward=1.0,
        terminated=True,
        terminal_state="completed",
        env_return=1.0,
        env_ms=2.5,
        first_version=11,
        info_json='{"map": "4x4"}',
        turns=[
            Turn(
                turn=i,
                prompt_text="x" * (prompt * 3),
                prompt_token_ids=pack_tokens(rng.integers(0, 150_000, prompt)),
                action_text="y" * (action * 3),
                action_token_ids=pack_tokens(rng.integers(0, 150_000, action)),
                behaviour_logprobs=pack_logprobs(-rng.random(action)),
                policy_version=11 + i // 4,
                reward=0.0,
                gen_ms=30.0,
                env_ms=1.0,
                pool="h800",
            )
            for i in range(turns)
        ],
    )


def _rate(fn: Callable[[], Any], seconds: float, repeats: int = 5) -> dict[str, float]:
    """Median events/s over `repeats` runs of about `seconds / repeats` each."""
    # Calibrate a batch size that takes ~10 ms.
    batch = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        if time.perf_counter() - t0 > 0.01:
            break
        batch *= 2
    cpu_rates, wall_rates = [], []
    for _ in range(repeats):
        n = 0
        w0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - w0 < seconds / repeats:
            for _ in range(batch):
                fn()
            n += batch
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        wall_rates.append(n / wall)
        cpu_rates.append(n / cpu)
    return {"per_cpu_s": statistics.median(cpu_rates), "per_wall_s": statistics.median(wall_rates)}


def bench(event: Event, seconds: float) -> dict[str, Any]:
    codec = Codec()
    data = codec.encode(event)
    assert codec.decode(data) == event
    enc = _rate(lambda: codec.encode(event), seconds)
    dec = _rate(lambda: codec.decode(data), seconds)
    both = _rate(lambda: codec.decode(codec.encode(event)), seconds)
    return {"bytes": len(data), "encode": enc, "decode": dec, "round_trip": both}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {
        "small EnvAction (8 tokens)": bench(small_event(), args.seconds),
        "terminal Observation (4096 tokens, 8 turns)": bench(terminal_observation(), args.seconds),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"python {platform.python_version()} on {platform.machine()}, one thread")
    print(f"{'event':45} {'bytes':>7} {'encode/s':>18} {'decode/s':>18} {'enc+dec/s':>18}")
    print(f"{'':45} {'':>7} {'cpu (wall)':>18} {'cpu (wall)':>18} {'cpu (wall)':>18}")
    for name, r in results.items():
        cols = [
            f"{r[k]['per_cpu_s']:,.0f} ({r[k]['per_wall_s']:,.0f})"
            for k in ("encode", "decode", "round_trip")
        ]
        print(f"{name:45} {r['bytes']:>7} {cols[0]:>18} {cols[1]:>18} {cols[2]:>18}")


if __name__ == "__main__":
    main()

"""Pre-check that the policy + GRPO stack can learn at all on CPU (the FrozenLake run via Kafka is bigger).

Task: prompt "a=<d>\\n" -> the first response token must be <d>; reward 1 if so, else 0.
Random init answers correctly ~1% of the time, so this needs group sampling to find any signal.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rollstream.workers.policy.model import build_policy, generate
from rollstream.workers.policy.tokenizer import CharTokenizer
from rollstream.workers.trainer.buffer import SampleBuffer
from rollstream.workers.trainer.grpo import GrpoConfig, Sample, make_optimizer, train_step

# Learned in ~45 steps (~2-3 s on 2 CPU threads); lr 1e-3 also works, group size 8 can stall (sparse reward).
LR, GROUP_SIZE, MAX_STEPS = 3e-3, 16, 200


@pytest.mark.slow
def test_grpo_learns_single_token_task() -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    tok = CharTokenizer()
    digits = "0123456789"
    prompts = {d: tok.encode(f"a={d}\n", add_bos=True) for d in digits}
    model = build_policy(0)
    cfg = GrpoConfig(lr=LR, seed=0)
    opt = make_optimizer(model, cfg)
    buf = SampleBuffer(alpha=0, policy="drop", gamma=0.0, group_size=GROUP_SIZE, min_group_size=GROUP_SIZE)

    def greedy_accuracy() -> float:
        gens = generate(model, [prompts[d] for d in digits], max_new_tokens=1, greedy=True)
        return sum(tok.decode(g.token_ids) == d for g, d in zip(gens, digits, strict=True)) / len(digits)

    start_acc = greedy_accuracy()
    assert start_acc <= 0.3
    t0, acc, version = time.monotonic(), start_acc, 0
    for step in range(MAX_STEPS):
        batch = [(d, j) for d in digits for j in range(GROUP_SIZE)]
        gens = generate(model, [prompts[d] for d, _ in batch], max_new_tokens=1, seed=step)
        for (d, j), g in zip(batch, gens, strict=True):
            turn = (np.array(prompts[d]), np.array(g.token_ids), np.array(g.logprobs, np.float32), version)
            reward = float(tok.decode(g.token_ids) == d)
            buf.add(Sample(f"s{step:04d}-{d}-{j:02d}", f"s{step:04d}-{d}", [turn], reward, version), version)
        groups = buf.ready_groups(version, max_groups=len(digits))
        assert len(groups) == len(digits) and buf.evict(version) == []
        train_step(model, opt, groups, cfg)
        version += 1
        if step % 5 == 4:
            acc = greedy_accuracy()
            if acc >= 0.8:
                break
    elapsed = time.monotonic() - t0
    print(f"greedy accuracy {start_acc:.1f} -> {acc:.1f} after {version} steps, {elapsed:.1f}s")
    assert acc >= 0.8
    assert elapsed < 300  # ~3 s on an idle 2-core box; generous for loaded CI machines

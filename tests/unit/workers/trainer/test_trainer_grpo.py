from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rollstream.workers.policy.model import build_policy, generate, sequence_logprobs, state_dict_checksum
from rollstream.workers.policy.tokenizer import CharTokenizer
from rollstream.workers.trainer.grpo import GrpoConfig, Sample, group_advantages, make_optimizer, train_step

torch.set_num_threads(min(2, torch.get_num_threads()))


def test_group_advantages() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert group_advantages([]) == []
    assert sum(group_advantages([0.1, 0.7, 0.3])) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lr", 0.0),
        ("lr", float("nan")),
        ("clip_eps", 0.0),
        ("clip_eps", 1.5),
        ("kl_coef", -1.0),
        ("max_grad_norm", 0.0),
        ("seed", -1),
        ("micro_batch_size", 0),
        ("temperature", 0.0),
    ],
)
def test_config_validation_names_key(key: str, value: float) -> None:
    kwargs = {"lr": 1e-3, key: value}
    with pytest.raises(ValueError, match=key):
        GrpoConfig(**kwargs)  # type: ignore[arg-type]


def _groups(model: torch.nn.Module, n_groups: int = 3, size: int = 4, turns: int = 1) -> list[list[Sample]]:
    tok = CharTokenizer()
    groups = []
    for g in range(n_groups):
        members = []
        for j in range(size):
            ts = []
            ctx = tok.encode(f"task {g}:", add_bos=True)
            for k in range(turns):
                gen = generate(model, [ctx], max_new_tokens=6, seed=100 * g + 10 * j + k)[0]
                ts.append((np.array(ctx), np.array(gen.token_ids), np.array(gen.logprobs, np.float32), 0))
                ctx = ctx + gen.token_ids + tok.encode(" ok ")
            members.append(Sample(f"t{g}-{j}", f"g{g}", ts, reward=float(j % 2), first_version=0))
        groups.append(members)
    return groups


def test_train_step_is_bit_deterministic() -> None:
    base = build_policy(0)
    groups = _groups(base, turns=2)
    cfg = GrpoConfig(lr=1e-2, seed=1, micro_batch_size=5)
    sums = []
    for order in (1, -1):
        m = build_policy(0)
        opt = make_optimizer(m, cfg)
        # Input order must not matter: train_step sorts by group id / trajectory id.
        shuffled = [g[::order] for g in groups[::order]]
        for _ in range(2):
            metrics = train_step(m, opt, shuffled, cfg)
        sums.append(state_dict_checksum(m))
        assert np.isfinite(metrics["loss"]) and metrics["num_samples"] == 12
    assert sums[0] == sums[1] != state_dict_checksum(base)


def test_on_policy_ratio_is_one_and_weights_change() -> None:
    m = build_policy(0)
    groups = _groups(m)
    cfg = GrpoConfig(lr=1e-3)
    metrics = train_step(m, make_optimizer(m, cfg), groups, cfg)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_frac"] == 0.0 and metrics["grad_norm"] > 0


def test_zero_advantage_and_zero_weight_give_no_update() -> None:
    m = build_policy(0)
    before = state_dict_checksum(m)
    flat = [[dataclasses.replace(s, reward=1.0) for s in g] for g in _groups(m)]
    cfg = GrpoConfig(lr=1e-2)
    opt = make_optimizer(m, cfg)
    metrics = train_step(m, opt, flat, cfg)
    assert metrics["grad_norm"] == 0.0 and state_dict_checksum(m) == before
    zero_w = [[dataclasses.replace(s, weight=0.0) for s in g] for g in _groups(m)]
    assert train_step(m, opt, zero_w, cfg)["grad_norm"] == 0.0


def test_policy_moves_towards_positive_advantage() -> None:
    m = build_policy(0)
    groups = _groups(m, n_groups=1, size=2)
    good = groups[0][1]  # reward 1
    p, r = good.turns[0][0].tolist(), good.turns[0][1].tolist()
    with torch.no_grad():
        before = sequence_logprobs(m, [p], [r])[0].sum()
    cfg = GrpoConfig(lr=1e-2)
    opt = make_optimizer(m, cfg)
    for _ in range(3):
        train_step(m, opt, groups, cfg)
    with torch.no_grad():
        after = sequence_logprobs(m, [p], [r])[0].sum()
    assert after > before


def test_kl_term_with_ref_model() -> None:
    m, ref = build_policy(0), build_policy(1)
    cfg = GrpoConfig(lr=1e-3, kl_coef=0.1)
    metrics = train_step(m, make_optimizer(m, cfg), _groups(m), cfg, ref_model=ref)
    assert metrics["kl"] > 0


def test_mismatched_logprobs_rejected() -> None:
    m = build_policy(0)
    bad = Sample("t", "g", [(np.array([1, 5]), np.array([6, 7]), np.array([-1.0], np.float32), 0)], 1.0, 0)
    cfg = GrpoConfig(lr=1e-3)
    with pytest.raises(ValueError, match="mismatch"):
        train_step(m, make_optimizer(m, cfg), [[bad]], cfg)

"""GRPO objective and one deterministic optimizer step.

Loss (per response token i of a trajectory with group-normalised advantage A and sample weight w):
    ratio_i = exp(logp_new_i - logp_behaviour_i)
    pg_i    = -min(ratio_i * A, clip(ratio_i, 1 - eps, 1 + eps) * A)
    kl_i    = exp(ref_i - new_i) - (ref_i - new_i) - 1          (k3 estimator, only with a ref model)
    loss    = sum_i w * (pg_i + kl_coef * kl_i) / N_tokens       (token-mean over the whole batch)
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from rollstream.workers.policy.model import sequence_logprobs

# One turn: (prompt_ids, response_ids, behaviour_logprobs, policy_version). prompt_ids is the full context
# the policy saw for that turn (earlier turns + observations), so each turn is scored independently.
Turn = tuple[np.ndarray, np.ndarray, np.ndarray, int]


@dataclass
class Sample:
    trajectory_id: str
    group_id: str
    turns: list[Turn]
    reward: float
    first_version: int  # v(t): version that generated the first action (staleness reference)
    weight: float = 1.0  # set by the buffer's downweight policy

    @property
    def num_response_tokens(self) -> int:
        return int(sum(len(t[1]) for t in self.turns))


def group_advantages(rewards: list[float] | np.ndarray, eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) with population std; all zeros when the group has no spread."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return []
    std = float(r.std())
    if std < 1e-12:  # no spread -> no learning signal (and avoids amplifying float noise)
        return [0.0] * int(r.size)
    return ((r - r.mean()) / (std + eps)).tolist()


@dataclass(frozen=True)
class GrpoConfig:
    lr: float
    seed: int = 0
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    adv_eps: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    micro_batch_size: int = 64  # rows per forward/backward; bounds memory, does not change the loss math
    temperature: float = 1.0  # must equal the sampling temperature so ratios compare like with like
    extra: dict[str, Any] = field(default_factory=dict)  # free-form, echoed into weight-version events

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"GrpoConfig.{key}={getattr(self, key)!r}: {why}")

        def finite(key: str) -> float:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise bad(key, "must be a finite number")
            return float(v)

        if finite("lr") <= 0:
            raise bad("lr", "must be > 0")
        if finite("clip_eps") <= 0 or self.clip_eps >= 1:
            raise bad("clip_eps", "must be in (0, 1)")
        if finite("kl_coef") < 0:
            raise bad("kl_coef", "must be >= 0")
        if finite("max_grad_norm") <= 0:
            raise bad("max_grad_norm", "must be > 0")
        if finite("adv_eps") <= 0:
            raise bad("adv_eps", "must be > 0")
        if finite("weight_decay") < 0:
            raise bad("weight_decay", "must be >= 0")
        if finite("temperature") <= 0:
            raise bad("temperature", "must be > 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise bad("seed", "must be an int >= 0")
        mbs = self.micro_batch_size
        if isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 1:
            raise bad("micro_batch_size", "must be an int >= 1")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise bad("betas", "must be two numbers in [0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_optimizer(model: PreTrainedModel, cfg: GrpoConfig) -> torch.optim.AdamW:
    # foreach=False: the single-tensor path is the simplest to keep bit-reproducible across runs.
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=False
    )


def enable_determinism() -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by cuBLAS in deterministic mode
    torch.use_deterministic_algorithms(True)


def _ordered(groups: list[list[Sample]]) -> list[tuple[Sample, float]]:
    """Fixed order (group id, trajectory id) so identical inputs give identical float summation order."""
    out: list[tuple[Sample, float]] = []
    for grp in sorted(groups, key=lambda g: g[0].group_id if g else ""):
        members = sorted(grp, key=lambda s: s.trajectory_id)
        advs = group_advantages([s.reward for s in members])
        out.extend(zip(members, advs, strict=True))
    return out


def train_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    groups: list[list[Sample]],
    cfg: GrpoConfig,
    ref_model: PreTrainedModel | None = None,
) -> dict[str, float]:
    """One GRPO update over all turns of all samples in ``groups``; returns scalar metrics."""
    enable_determinism()
    rows: list[tuple[list[int], list[int], torch.Tensor, float, float]] = []  # prompt, resp, blp, adv, w
    rewards: list[float] = []
    for s, adv in _ordered(groups):
        rewards.append(float(s.reward))
        for prompt, resp, blp, _v in s.turns:
            if len(resp) != len(blp):
                raise ValueError(f"trajectory {s.trajectory_id}: response/logprob length mismatch")
            if len(resp) == 0:
                continue
            rows.append(
                (
                    [int(x) for x in prompt],
                    [int(x) for x in resp],
                    torch.as_tensor(np.asarray(blp, dtype=np.float32)),
                    float(adv),
                    float(s.weight),
                )
            )
    n_tok = sum(len(r[1]) for r in rows)
    metrics: dict[str, float] = {
        "num_samples": float(len(rewards)),
        "num_tokens": float(n_tok),
        "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
        "lr": float(optimizer.param_groups[0]["lr"]),
    }
    if n_tok == 0:
        return {
            **metrics,
            "loss": 0.0,
            "pg_loss": 0.0,
            "kl": 0.0,
            "clip_frac": 0.0,
            "ratio_mean": 1.0,
            "grad_norm": 0.0,
            "skipped": 1.0,
        }

    dev = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    tot = {"loss": 0.0, "pg": 0.0, "kl": 0.0, "clip": 0.0, "ratio": 0.0}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)  # any stochastic layer (dropout) sees the same stream every run
        for start in range(0, len(rows), cfg.micro_batch_size):
            mb = rows[start : start + cfg.micro_batch_size]
            prompts, resps = [r[0] for r in mb], [r[1] for r in mb]
            new_lp = torch.cat(sequence_logprobs(model, prompts, resps, temperature=cfg.temperature))
            old_lp = torch.cat([r[2] for r in mb]).to(dev)
            adv_t = torch.cat([torch.full((len(r[1]),), r[3]) for r in mb]).to(dev)
            w_t = torch.cat([torch.full((len(r[1]),), r[4]) for r in mb]).to(dev)
            ratio = torch.exp(new_lp - old_lp)
            clipped = ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps)
            pg = -torch.minimum(ratio * adv_t, clipped * adv_t)
            per_tok = pg
            kl = torch.zeros_like(pg)
            if ref_model is not None and cfg.kl_coef > 0:
                with torch.no_grad():
                    ref = torch.cat(sequence_logprobs(ref_model, prompts, resps, temperature=cfg.temperature))
                d = ref - new_lp
                kl = torch.exp(d) - d - 1
                per_tok = pg + cfg.kl_coef * kl
            # Divide by the global token count so micro-batching leaves the gradient unchanged.
            loss = (w_t * per_tok).sum() / n_tok
            loss.backward()
            tot["loss"] += float(loss.detach())
            tot["pg"] += float((w_t * pg).sum().detach()) / n_tok
            tot["kl"] += float(kl.sum().detach()) / n_tok
            tot["clip"] += float(((ratio - clipped).abs() > 0).float().sum()) / n_tok
            tot["ratio"] += float(ratio.detach().sum()) / n_tok
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return {
        **metrics,
        "loss": tot["loss"],
        "pg_loss": tot["pg"],
        "kl": tot["kl"],
        "clip_frac": tot["clip"],
        "ratio_mean": tot["ratio"],
        "grad_norm": float(grad_norm),
        "skipped": 0.0,
    }

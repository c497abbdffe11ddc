"""`rollstream eval`: held-out success of any policy version, from the run's lineage and weight store.

Held-out tasks use seeds >= EVAL_SEED_BASE, which the scheduler never launches for training. All
episodes step in lockstep so each turn is one batched forward pass; actions are greedy by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from rollstream.config import Config
from rollstream.schemas.codec import make_codec
from rollstream.topics.specs import RunTopics
from rollstream.workers.envs import make_env
from rollstream.workers.policy import CharTokenizer, build_policy, generate
from rollstream.workers.scheduler import EVAL_SEED_BASE
from rollstream.workers.trainer.service import read_lineage
from rollstream.workers.trainer.weight_store import BucketRef, open_weight_store


@dataclass
class EvalResult:
    version: int
    domain: str
    episodes: int
    success: float
    mean_return: float


def load_version(cfg: Config, bootstrap: str, run_id: str, version: int) -> PreTrainedModel:
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    lineage = read_lineage(cfg, bootstrap, topics, make_codec(cfg.kafka.schema_registry_url or None), run_id)
    match = [v for v in lineage.versions if v.version == version]
    if not match:
        known = [v.version for v in lineage.versions]
        raise SystemExit(f"run {run_id} has no version {version} (versions: {known[:3]}..{known[-3:]})")
    wv = match[-1]
    model = build_policy(cfg.trainer.seed)
    state = open_weight_store(wv.store_uri).fetch(
        run_id, version, [BucketRef(b.key, b.size, b.sha256) for b in wv.buckets]
    )
    model.load_state_dict(state)
    return model


def evaluate(
    model: PreTrainedModel, cfg: Config, domain: str = "frozenlake", episodes: int = 200, greedy: bool = True
) -> tuple[float, float]:
    """(success rate, mean return) over `episodes` held-out tasks of `domain`."""
    tok = CharTokenizer()
    options = cfg.rollout.env_options.get(domain, {})
    envs = [make_env(domain, **options) for _ in range(episodes)]
    prompts = [env.reset(EVAL_SEED_BASE + i)[0] for i, env in enumerate(envs)]
    live = list(range(episodes))
    success = [False] * episodes
    returns = [0.0] * episodes
    max_new = cfg.rollout.max_new_tokens.get(domain, 32)
    with torch.inference_mode():
        while live:
            gens = generate(
                model,
                [tok.encode(prompts[i], add_bos=True) for i in live],
                max_new_tokens=max_new,
                greedy=greedy,
                temperature=max(cfg.generation.temperature, 1e-3),
            )
            still = []
            for i, g in zip(live, gens, strict=True):
                obs, reward, terminated, truncated, info = envs[i].step(tok.decode(g.token_ids))
                returns[i] += reward
                prompts[i] = obs
                if terminated or truncated:
                    success[i] = bool(info.get("success", reward >= 1.0))
                    envs[i].close()
                else:
                    still.append(i)
            live = still
    return sum(success) / episodes, sum(returns) / episodes

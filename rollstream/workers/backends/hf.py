"""`hf` backend: the tiny transformers policy of `rollstream.workers.policy`, on CPU.

Version 0 is `build_policy(trainer.seed)`, bit-identical to the trainer's initial weights, so rollout
can start before the trainer publishes anything; later versions are swapped in from the weight store.
"""

from __future__ import annotations

from typing import Any

import torch

from rollstream.config import Config
from rollstream.workers.backends.base import GenInput, GenOutput
from rollstream.workers.policy import CharTokenizer, build_policy, generate


class HFBackend:
    needs_weights = True

    def __init__(self, cfg: Config, pool: str) -> None:
        torch.set_num_threads(1)  # one core per worker process; the box has two
        self.tokenizer = CharTokenizer()
        self.model = build_policy(cfg.trainer.seed)
        self.temperature = cfg.generation.temperature
        self.version = 0
        self._step = 0

    def generate(self, batch: list[GenInput]) -> list[GenOutput]:
        prompts = [self.tokenizer.encode(item.prompt_text, add_bos=True) for item in batch]
        max_new = max(item.max_new_tokens for item in batch)
        self._step += 1
        with torch.inference_mode():
            gens = generate(
                self.model,
                prompts,
                max_new_tokens=max_new,
                temperature=max(self.temperature, 1e-3),
                greedy=self.temperature == 0,
            )
        out = []
        for item, prompt, g in zip(batch, prompts, gens, strict=True):
            ids, lps = g.token_ids[: item.max_new_tokens], g.logprobs[: item.max_new_tokens]
            finish = g.finish_reason if len(g.token_ids) <= item.max_new_tokens else "length"
            out.append(GenOutput(self.tokenizer.decode(ids), prompt, ids, lps, finish))
        return out

    def load_state_dict(self, version: int, state_dict: dict[str, Any]) -> None:
        self.model.load_state_dict(state_dict)
        self.version = version

    def close(self) -> None:
        pass

"""`vllm` backend: vLLM on GPUs (optional extra `rollstream[gpu]`).

Written against vLLM's offline `LLM` API; it needs a GPU and was not run on the CPU box. Weights of
new versions are loaded in place between engine steps via the model runner's `load_weights`.
"""

from __future__ import annotations

from typing import Any

from rollstream.config import Config
from rollstream.workers.backends.base import GenInput, GenOutput


class VLLMBackend:
    needs_weights = True

    def __init__(self, cfg: Config, pool: str) -> None:
        try:
            from vllm import LLM, SamplingParams
        except ImportError as exc:
            raise RuntimeError(
                "generation.backend = 'vllm' needs `pip install rollstream[gpu]` and a GPU"
            ) from exc
        if not cfg.generation.model_path:
            raise ValueError("generation.model_path: required for the vllm backend")
        self._sampling = SamplingParams
        self.llm = LLM(model=cfg.generation.model_path, enable_prefix_caching=True)
        self.tokenizer = self.llm.get_tokenizer()
        self.temperature = cfg.generation.temperature
        self.version = 0

    def generate(self, batch: list[GenInput]) -> list[GenOutput]:
        params = [
            self._sampling(temperature=self.temperature, max_tokens=item.max_new_tokens, logprobs=0)
            for item in batch
        ]
        results = self.llm.generate([item.prompt_text for item in batch], params, use_tqdm=False)
        out = []
        for res in results:
            comp = res.outputs[0]
            ids = list(comp.token_ids)
            lps = [float(step[tok].logprob) for step, tok in zip(comp.logprobs or [], ids, strict=False)]
            out.append(
                GenOutput(comp.text, list(res.prompt_token_ids or []), ids, lps, comp.finish_reason or "")
            )
        return out

    def load_state_dict(self, version: int, state_dict: dict[str, Any]) -> None:
        engine = self.llm.llm_engine
        engine.collective_rpc("load_weights", kwargs={"weights": list(state_dict.items())})
        engine.reset_prefix_cache()  # KV of in-flight prefixes is recomputed under the new weights
        self.version = version

    def close(self) -> None:
        del self.llm

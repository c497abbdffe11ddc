"""Generation backends behind one interface: `scripted` (tests, benchmarks, cost model), `hf`
(a tiny transformers policy on CPU that the trainer trains) and `vllm` (GPUs, optional extra)."""

from __future__ import annotations

from rollstream.config import Config
from rollstream.workers.backends.base import GenerationBackend, GenInput, GenOutput


def make_backend(cfg: Config, pool: str) -> GenerationBackend:
    name = cfg.generation.backend
    if name == "scripted":
        from rollstream.workers.backends.scripted import ScriptedBackend

        return ScriptedBackend(cfg, pool)
    if name == "hf":
        from rollstream.workers.backends.hf import HFBackend

        return HFBackend(cfg, pool)
    if name == "vllm":
        from rollstream.workers.backends.vllm import VLLMBackend

        return VLLMBackend(cfg, pool)
    raise ValueError(f"generation.backend: unknown backend {name!r}")


__all__ = ["GenInput", "GenOutput", "GenerationBackend", "make_backend"]

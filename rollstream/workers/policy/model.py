"""Tiny causal LM policy: build, batched sampling with behaviour logprobs, and teacher-forced logprobs.

The generation loop is hand-written (not ``model.generate``) so we control exactly which distribution the
behaviour logprobs come from: ``log_softmax(logits / temperature)`` at the sampled token, the same
quantity ``sequence_logprobs`` recomputes for the trainer's importance ratio.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from rollstream.workers.policy.tokenizer import EOS_ID, PAD_ID, CharTokenizer

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]  # sampled tokens, including the final EOS when finish_reason == "stop"
    logprobs: list[float]  # behaviour logprob of each sampled token (temperature applied)
    finish_reason: str  # "stop" (EOS sampled) or "length" (max_new_tokens reached)


def load_policy_config(overrides: dict[str, Any] | None = None) -> PretrainedConfig:
    raw = json.loads(resources.files(__package__).joinpath("policy_config.json").read_text())
    raw.update(overrides or {})
    vocab = CharTokenizer().vocab_size
    if raw["vocab_size"] != vocab:
        raise ValueError(f"policy_config.json vocab_size={raw['vocab_size']} != tokenizer vocab {vocab}")
    model_type = raw.pop("model_type")
    return AutoConfig.for_model(model_type, **raw)


def build_policy(seed: int, overrides: dict[str, Any] | None = None) -> PreTrainedModel:
    """Deterministic init: same seed -> same weights (checksum-identical), independent of global RNG."""
    cfg = load_policy_config(overrides)
    # sdpa is deterministic on CPU and faster than eager at these sizes.
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.eval()
    return model


def _cache_kw(model: PreTrainedModel) -> str:
    # transformers 5.x renamed the forward kwarg ``past_key_values`` -> ``cache``; support both.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _device(model: PreTrainedModel) -> torch.device:
    return next(model.parameters()).device


def _check_lengths(model: PreTrainedModel, n: int) -> None:
    limit = int(model.config.max_position_embeddings)
    if n > limit:
        raise ValueError(f"sequence length {n} exceeds max_position_embeddings={limit}")


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int | None = None,
    greedy: bool = False,
) -> list[Generation]:
    """Batched sampling with left padding + KV cache; each row stops at its first EOS.

    With ``greedy`` the argmax is taken and the reported logprob is still that of the chosen token under
    ``softmax(logits / temperature)``. ``seed`` makes sampling reproducible for a fixed batch composition.
    """
    if not prompts:
        return []
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if not greedy and temperature <= 0:
        raise ValueError("temperature must be > 0 (use greedy=True for argmax)")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt (prepend BOS)")
    dev = _device(model)
    bsz, plen = len(prompts), max(len(p) for p in prompts)
    _check_lengths(model, plen + max_new_tokens)
    gen = None
    if seed is not None:
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)

    input_ids = torch.full((bsz, plen), PAD_ID, dtype=torch.long, device=dev)
    mask = torch.zeros((bsz, plen), dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        input_ids[i, plen - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, plen - len(p) :] = 1
    # Left padding shifts absolute positions; explicit position_ids keep RoPE identical to unpadded runs.
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    out_tok = torch.zeros((bsz, max_new_tokens), dtype=torch.long, device=dev)
    out_lp = torch.zeros((bsz, max_new_tokens), dtype=torch.float32, device=dev)
    done = torch.zeros(bsz, dtype=torch.bool, device=dev)
    lengths = torch.full((bsz,), max_new_tokens, dtype=torch.long, device=dev)
    temp = 1.0 if greedy and temperature <= 0 else temperature

    cache_kw = _cache_kw(model)
    past: Any = None
    step_ids, step_pos = input_ids, pos
    for t in range(max_new_tokens):
        out = model(
            input_ids=step_ids,
            attention_mask=mask,
            position_ids=step_pos,
            use_cache=True,
            logits_to_keep=1,
            **{cache_kw: past},
        )
        past = out["cache"] if "cache" in out else out["past_key_values"]
        logp = torch.log_softmax(out.logits[:, -1, :].float() / temp, dim=-1)
        tok = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, PAD_ID), tok)
        out_tok[:, t] = tok
        out_lp[:, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
        newly = (~done) & (tok == EOS_ID)
        lengths = torch.where(newly, torch.full_like(lengths, t + 1), lengths)
        done |= newly
        if bool(done.all()):
            break
        step_ids = tok[:, None]
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones((bsz, 1), dtype=mask.dtype, device=dev)], dim=1)

    toks, lps, lens, fin = out_tok.tolist(), out_lp.tolist(), lengths.tolist(), done.tolist()
    return [
        Generation(
            token_ids=toks[i][: lens[i]],
            logprobs=lps[i][: lens[i]],
            finish_reason="stop" if fin[i] else "length",
        )
        for i in range(bsz)
    ]


def sequence_logprobs(
    model: PreTrainedModel,
    prompt_ids_batch: list[list[int]],
    response_ids_batch: list[list[int]],
    *,
    temperature: float = 1.0,
) -> list[torch.Tensor]:
    """Per-token logprobs (1-D tensor per row) of each response given its prompt; differentiable.

    Right padding: a causal model's earlier positions never see the trailing pads, and positions stay 0..n-1.
    """
    if len(prompt_ids_batch) != len(response_ids_batch):
        raise ValueError("prompt and response batches differ in length")
    if not prompt_ids_batch:
        return []
    dev = _device(model)
    seqs = [list(p) + list(r) for p, r in zip(prompt_ids_batch, response_ids_batch, strict=True)]
    if any(len(p) == 0 for p in prompt_ids_batch):
        raise ValueError("empty prompt (prepend BOS)")
    n = max(len(s) for s in seqs)
    _check_lengths(model, n)
    ids = torch.full((len(seqs), n), PAD_ID, dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    result: list[torch.Tensor] = []
    for i, (p, r) in enumerate(zip(prompt_ids_batch, response_ids_batch, strict=True)):
        if not r:
            result.append(logits.new_zeros(0))
            continue
        # logits at position j predict token j+1.
        lg = logits[i, len(p) - 1 : len(p) + len(r) - 1] / temperature
        tgt = ids[i, len(p) : len(p) + len(r)]
        result.append(torch.log_softmax(lg, dim=-1).gather(-1, tgt[:, None]).squeeze(-1))
    return result


def state_dict_checksum(model: PreTrainedModel | dict[str, torch.Tensor]) -> str:
    """sha256 over sorted (name, dtype, shape, raw bytes) - identical weights <=> identical digest."""
    sd = model if isinstance(model, dict) else model.state_dict()
    h = hashlib.sha256()
    for name in sorted(sd):
        t = sd[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()

"""Policy model side: character tokenizer, tiny causal LM, batched generation with behaviour logprobs.

The model half (torch, transformers) loads on first use, so tokenizer-only users (the scripted backend)
start in a fraction of a second.
"""

from typing import Any

from rollstream.workers.policy.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    CharTokenizer,
    pack_logprobs,
    pack_tokens,
    unpack_logprobs,
    unpack_tokens,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "CharTokenizer",
    "Generation",
    "build_policy",
    "generate",
    "load_policy_config",
    "pack_logprobs",
    "pack_tokens",
    "sequence_logprobs",
    "state_dict_checksum",
    "unpack_logprobs",
    "unpack_tokens",
]

_MODEL_NAMES = {
    "Generation",
    "build_policy",
    "generate",
    "load_policy_config",
    "sequence_logprobs",
    "state_dict_checksum",
}


def __getattr__(name: str) -> Any:
    if name in _MODEL_NAMES:
        from rollstream.workers.policy import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Policy model side: character tokenizer, tiny causal LM, batched generation with behaviour logprobs."""

from rollstream.workers.policy.model import (
    Generation,
    build_policy,
    generate,
    load_policy_config,
    sequence_logprobs,
    state_dict_checksum,
)
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

"""Character-level tokenizer (the packed wire format for token ids / logprobs is re-exported from events).

Deterministic and download-free so every worker (generation, trainer, replay) agrees on ids bit-for-bit.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollstream.schemas.events import pack_logprobs, pack_tokens, unpack_logprobs, unpack_tokens

__all__ = ["CharTokenizer", "pack_logprobs", "pack_tokens", "unpack_logprobs", "unpack_tokens"]

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
NUM_SPECIAL = 4

# Printable ASCII (space..tilde) plus newline; fixed order => fixed ids across processes and versions.
_CHARS: tuple[str, ...] = (*(chr(c) for c in range(32, 127)), "\n")


class CharTokenizer:
    """Maps each character to one id; ids 0-3 are PAD, BOS, EOS, UNK."""

    pad_id = PAD_ID
    bos_id = BOS_ID
    eos_id = EOS_ID
    unk_id = UNK_ID

    def __init__(self) -> None:
        self._stoi: dict[str, int] = {ch: i + NUM_SPECIAL for i, ch in enumerate(_CHARS)}
        self._itos: dict[int, str] = {i: ch for ch, i in self._stoi.items()}

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + len(_CHARS)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = [self._stoi.get(ch, UNK_ID) for ch in text]
        if add_bos:
            ids.insert(0, BOS_ID)
        if add_eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        out: list[str] = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            ch = self._itos.get(i)
            if ch is not None:  # specials (PAD/BOS/UNK) and out-of-range ids are skipped
                out.append(ch)
        return "".join(out)

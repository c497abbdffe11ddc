from __future__ import annotations

import numpy as np
import pytest

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


def test_roundtrip_printable_and_newline() -> None:
    tok = CharTokenizer()
    text = "".join(chr(c) for c in range(32, 127)) + "\nFrozenLake: L R U D"
    ids = tok.encode(text)
    assert min(ids) >= 4 and max(ids) < tok.vocab_size
    assert tok.decode(ids) == text
    assert tok.vocab_size == 4 + 95 + 1


def test_specials_and_unknown() -> None:
    tok = CharTokenizer()
    assert (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert tok.encode("é\t") == [UNK_ID, UNK_ID]
    ids = tok.encode("ab", add_bos=True, add_eos=True)
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    # decode skips specials and stops at the first EOS
    assert tok.decode([BOS_ID, *tok.encode("hi"), PAD_ID, UNK_ID, EOS_ID, *tok.encode("x")]) == "hi"


def test_deterministic_across_instances() -> None:
    assert CharTokenizer().encode("a=3\n") == CharTokenizer().encode("a=3\n")


def test_pack_tokens_little_endian() -> None:
    b = pack_tokens([1, 2, 258])
    assert b == b"\x01\x00\x00\x00\x02\x00\x00\x00\x02\x01\x00\x00"
    out = unpack_tokens(b)
    assert out.dtype == np.int32 and out.tolist() == [1, 2, 258]
    assert unpack_tokens(pack_tokens([])).size == 0
    with pytest.raises(ValueError):
        unpack_tokens(b"\x00\x01\x02")


def test_pack_logprobs_float32() -> None:
    lp = [-0.5, -1.25, -3.0]
    b = pack_logprobs(np.array(lp, dtype=np.float64))
    assert len(b) == 12 and b[:4] == np.float32(-0.5).tobytes()  # host is little-endian in CI
    out = unpack_logprobs(b)
    assert out.dtype == np.float32 and out.tolist() == lp
    with pytest.raises(ValueError):
        unpack_logprobs(b[:5])

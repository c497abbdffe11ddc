from __future__ import annotations

import pytest
import torch

from rollstream.workers.policy.model import (
    build_policy,
    generate,
    load_policy_config,
    sequence_logprobs,
    state_dict_checksum,
)
from rollstream.workers.policy.tokenizer import EOS_ID, CharTokenizer

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_policy(0)


def _prompts(n: int) -> list[list[int]]:
    tok = CharTokenizer()
    return [tok.encode(f"state {i}: " + "x" * (i % 5), add_bos=True) for i in range(n)]


def test_config_matches_tokenizer() -> None:
    cfg = load_policy_config()
    assert cfg.vocab_size == CharTokenizer().vocab_size
    assert cfg.num_hidden_layers == 2 and cfg.max_position_embeddings == 256


def test_build_is_deterministic() -> None:
    a, b, c = build_policy(7), build_policy(7), build_policy(8)
    assert state_dict_checksum(a) == state_dict_checksum(b) != state_dict_checksum(c)


def test_checksum_sees_a_single_changed_value() -> None:
    m = build_policy(0)
    before = state_dict_checksum(m)
    with torch.no_grad():
        next(m.parameters()).view(-1)[0] += 1e-6
    assert state_dict_checksum(m) != before


def test_generate_shapes_and_seed(model: torch.nn.Module) -> None:
    prompts = _prompts(5)
    g1 = generate(model, prompts, max_new_tokens=12, seed=3)
    g2 = generate(model, prompts, max_new_tokens=12, seed=3)
    assert g1 == g2
    for g in g1:
        assert len(g.token_ids) == len(g.logprobs) <= 12
        assert g.finish_reason in ("stop", "length")
        assert all(lp <= 0 for lp in g.logprobs)
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == EOS_ID and EOS_ID not in g.token_ids[:-1]
        else:
            assert len(g.token_ids) == 12


def test_logprobs_match_sequence_logprobs(model: torch.nn.Module) -> None:
    prompts = _prompts(6)  # different lengths -> exercises left padding
    gens = generate(model, prompts, max_new_tokens=20, seed=0)
    with torch.no_grad():
        lps = sequence_logprobs(model, prompts, [g.token_ids for g in gens])
    for g, lp in zip(gens, lps, strict=True):
        assert lp.shape == (len(g.token_ids),)
        assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-4)


def test_temperature_logprobs(model: torch.nn.Module) -> None:
    prompts = _prompts(3)
    gens = generate(model, prompts, max_new_tokens=8, seed=1, temperature=0.7)
    with torch.no_grad():
        lps = sequence_logprobs(model, prompts, [g.token_ids for g in gens], temperature=0.7)
    for g, lp in zip(gens, lps, strict=True):
        assert torch.allclose(lp, torch.tensor(g.logprobs), atol=1e-4)


def test_batching_does_not_change_greedy(model: torch.nn.Module) -> None:
    prompts = _prompts(4)
    batched = generate(model, prompts, max_new_tokens=10, greedy=True)
    single = [generate(model, [p], max_new_tokens=10, greedy=True)[0] for p in prompts]
    for a, b in zip(batched, single, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_stops_at_eos() -> None:
    m = build_policy(0)
    lm_bias = torch.zeros(m.config.vocab_size)
    lm_bias[EOS_ID] = 1e4
    # Make EOS overwhelmingly likely so sampling stops after one token.
    m.get_output_embeddings().register_forward_hook(lambda _m, _i, out: out + lm_bias)
    g = generate(m, _prompts(3), max_new_tokens=5, seed=0)
    assert all(x.token_ids == [EOS_ID] and x.finish_reason == "stop" for x in g)


def test_rejects_bad_inputs(model: torch.nn.Module) -> None:
    assert generate(model, [], max_new_tokens=3) == []
    with pytest.raises(ValueError):
        generate(model, [[]], max_new_tokens=3)
    with pytest.raises(ValueError):
        generate(model, [[1] * 250], max_new_tokens=10)
    with pytest.raises(ValueError):
        generate(model, [[1]], max_new_tokens=3, temperature=0.0)
    with pytest.raises(ValueError):
        sequence_logprobs(model, [[1]], [])

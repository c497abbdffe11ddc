"""--where is parsed, never eval'd; event views show bytes as counts."""

from __future__ import annotations

import pytest

from rollstream.schemas.events import EnvAction, ScoredTrajectory, pack_logprobs, pack_tokens
from rollstream.streams.tap import (
    WhereError,
    compile_where,
    event_view,
    fields_of,
    parse_since,
    resolve_topics,
)
from rollstream.topics.specs import RunTopics


def test_where_filters() -> None:
    f = compile_where('domain=="math" and reward>0.5', fields_of(ScoredTrajectory))
    assert f({"domain": "math", "reward": 0.7})
    assert not f({"domain": "math", "reward": 0.2})
    assert not f({"domain": "code", "reward": 0.9})
    g = compile_where("domain in ('math', 'code') and not (0 <= staleness < 1) or reward == -1")
    assert g({"domain": "code", "staleness": 2, "reward": 0})
    assert not g({"domain": "code", "staleness": 0, "reward": 0})
    assert g({"domain": "x", "staleness": 0, "reward": -1})
    assert not compile_where("reward > 0.5")({})  # missing field: no match, no crash


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "reward.__class__",
        "[x for x in ()]",
        "reward + 1 > 2",
        "lambda: 1",
        "domain == b'x'",
        "domain = 1",
    ],
)
def test_where_rejects_anything_else(expr: str) -> None:
    with pytest.raises(WhereError):
        compile_where(expr)


def test_where_rejects_unknown_fields() -> None:
    with pytest.raises(WhereError, match="unknown field"):
        compile_where("rewrad > 1", fields_of(ScoredTrajectory))


def test_event_view_counts_bytes() -> None:
    a = EnvAction(
        run_id="r",
        kind="ACTION",
        domain="math",
        action_token_ids=pack_tokens([1, 2, 3]),
        prompt_token_ids=pack_tokens([1] * 10),
        behaviour_logprobs=pack_logprobs([0.1, 0.2, 0.3]),
    )
    v = event_view(a)
    assert v["action_tokens"] == 3 and v["prompt_tokens"] == 10 and v["logprobs_n"] == 3
    assert v["kind"] == "ACTION" and v["tokens"] == 3
    assert not any(isinstance(x, bytes) for x in v.values())


def test_parse_since_and_topics() -> None:
    assert parse_since("5m") == 300 and parse_since("90s") == 90 and parse_since("2h") == 7200
    with pytest.raises(ValueError):
        parse_since("five minutes")
    t = RunTopics("r1")
    existing = {
        "rollstream.r1.gen-requests.h20",
        "rollstream.r1.gen-requests.h800",
        "rollstream.r1.observations",
    }
    assert resolve_topics("gen-requests", t, existing) == sorted(existing - {"rollstream.r1.observations"})
    assert resolve_topics("gen-requests.h20", t, existing) == ["rollstream.r1.gen-requests.h20"]
    assert resolve_topics("observations", t, existing) == ["rollstream.r1.observations"]
    with pytest.raises(ValueError):
        resolve_topics("bogus", t, existing)

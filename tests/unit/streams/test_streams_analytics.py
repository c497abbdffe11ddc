"""The windowed aggregation against an independent computation from the same events."""

from __future__ import annotations

import random
import statistics

import pytest

from rollstream.schemas.events import (
    DeadLetter,
    Event,
    GenRequest,
    ScoredTrajectory,
    Turn,
    WeightVersion,
    pack_tokens,
)
from rollstream.streams.analytics import Agg, WindowedAggregator, hist_quantile

T0 = 1_700_000_000_000  # window-aligned for 10 s windows


def _turn(rng: random.Random, pool: str, version: int) -> Turn:
    n = rng.randint(1, 20)
    return Turn(
        turn=0,
        prompt_text="p",
        prompt_token_ids=pack_tokens([1, 2]),
        action_text="a",
        action_token_ids=pack_tokens(list(range(n))),
        behaviour_logprobs=b"",
        policy_version=version,
        gen_ms=rng.uniform(0.1, 400),
        env_ms=rng.uniform(0.1, 50),
        pool=pool,
    )


def make_events(seed: int = 0, n: int = 300) -> list[Event]:
    rng = random.Random(seed)
    events: list[Event] = []
    for i in range(n):
        domain = rng.choice(["math", "code", "frozenlake"])
        pool = "h800" if domain == "frozenlake" else "h20"
        first = rng.randint(0, 3)
        turns = [_turn(rng, pool, first + rng.randint(0, 1)) for _ in range(rng.randint(1, 4))]
        state = rng.choices(["completed", "aborted", "failed"], [8, 1, 1])[0]
        ts = T0 + rng.randint(0, 59_999)
        events.append(
            ScoredTrajectory(
                run_id="r",
                trajectory_id=f"t{i}",
                domain=domain,
                reward=rng.random(),
                terminal_state=state,
                reason="" if state == "completed" else "stale:K-v>1",
                first_version=first,
                last_version=max(t.policy_version for t in turns),
                num_turns=len(turns),
                turns=turns,
                created_at_ms=ts,
            )
        )
        events.append(
            GenRequest(
                run_id="r",
                domain=domain,
                pool=pool,
                turn=0,
                prompt_text="",
                max_new_tokens=4,
                first_version=first,
                fallback_from="h20" if rng.random() < 0.2 else "",
                created_at_ms=ts,
            )
        )
    events += [
        DeadLetter(
            run_id="r",
            original_topic="x",
            original_partition=0,
            original_offset=i,
            original_key=None,
            original_value=b"junk",
            original_size=4,
            reason="undecodable",
            error="",
            created_at_ms=T0 + i,
        )
        for i in range(3)
    ]
    events.append(WeightVersion(run_id="r", version=7, parent_version=6, store_uri="dir://x"))
    rng.shuffle(events)
    return events


def test_rollup_by_domain_matches_independent_computation() -> None:
    events = make_events()
    agg = WindowedAggregator(window_s=10)
    for e in events:
        agg.add(e)
    got = agg.rollup(("domain",))
    scored = [e for e in events if isinstance(e, ScoredTrajectory)]
    for domain in ("math", "code", "frozenlake"):
        mine = [s for s in scored if s.domain == domain]
        done = [s for s in mine if s.terminal_state == "completed"]
        rewards = [s.reward for s in done]
        row = got[(domain,)]
        assert row["trajectories"] == len(mine)
        assert row["completed"] == len(done)
        assert row["reward_mean"] == pytest.approx(statistics.fmean(rewards))
        assert row["reward_std"] == pytest.approx(statistics.pstdev(rewards), abs=1e-9)
        assert row["reward_min"] == min(rewards) and row["reward_max"] == max(rewards)
        assert row["turns_mean"] == pytest.approx(statistics.fmean(len(s.turns) for s in done))
        tokens = [sum(len(t.action_token_ids) // 4 for t in s.turns) for s in done]
        assert row["tokens_mean"] == pytest.approx(statistics.fmean(tokens))
        turns = [t for s in done for t in s.turns]
        assert row["turns"] == len(turns)
        assert row["gen_ms_mean"] == pytest.approx(statistics.fmean(t.gen_ms for t in turns))
        assert row["env_ms_mean"] == pytest.approx(statistics.fmean(t.env_ms for t in turns))
        stale: dict[str, int] = {}
        for s in done:
            k = str(s.last_version - s.first_version)
            stale[k] = stale.get(k, 0) + 1
        assert row["staleness"] == dict(sorted(stale.items()))
        aborted = sum(s.terminal_state == "aborted" for s in mine)
        assert row["abort_rate"] == pytest.approx(aborted / len(mine))
        reqs = [e for e in events if isinstance(e, GenRequest) and e.domain == domain]
        assert row["fallback_rate"] == pytest.approx(sum(bool(r.fallback_from) for r in reqs) / len(reqs))
    assert agg.version == 7
    assert sum(r["dead_letters"] for r in got.values()) == 3


def test_tokens_per_second_per_pool_and_windows() -> None:
    events = make_events(seed=1)
    agg = WindowedAggregator(window_s=10)
    for e in events:
        agg.add(e)
    scored = [e for e in events if isinstance(e, ScoredTrajectory) and e.terminal_state == "completed"]
    assert len(agg.windows) == 6  # 60 s of event time in 10 s windows
    for start in agg.windows:
        by_pool = agg.rollup(("pool",), windows=[start])
        for pool in ("h20", "h800"):
            tokens = sum(
                len(t.action_token_ids) // 4
                for s in scored
                if start <= s.created_at_ms < start + 10_000
                for t in s.turns
                if t.pool == pool
            )
            assert by_pool.get((pool,), {"tokens_per_s": 0.0})["tokens_per_s"] == pytest.approx(tokens / 10)


def test_rows_carry_mergeable_state() -> None:
    agg = WindowedAggregator(window_s=10)
    for e in make_events(seed=2):
        agg.add(e)
    total = Agg()
    for row in agg.rows():
        total.merge(Agg.from_state(row["state"]))  # what a reader of the analytics topic does

    merged, direct = total.summary(60), agg.rollup(())[()]
    for k, v in direct.items():
        assert merged[k] == (pytest.approx(v) if isinstance(v, float) else v), k
    assert agg.take_dirty() == sorted(agg.windows) and agg.take_dirty() == []


def test_hist_quantile() -> None:
    hist = [0] * 16
    hist[3] = 50  # <= 5 ms
    hist[6] = 50  # <= 50 ms
    assert hist_quantile(hist, 0.5) == 5
    assert hist_quantile(hist, 0.95) == 50
    assert hist_quantile([0] * 16, 0.5) == 0.0
    hist = [0] * 15 + [3]
    assert hist_quantile(hist, 0.5) == 30000  # the open bucket reports its lower bound (JSON-safe)

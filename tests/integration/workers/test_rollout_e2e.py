"""Rollout end to end on a real broker: scheduler -> env -> gen -> env -> reward, per domain and pool.

Workers run as threads of this process (``run_worker``) unless a test needs a separate process (a
second generation worker whose producer id must differ). Every test reads the run's topics back by
assignment and checks the accounting: each launched trajectory ends exactly once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from rollout_harness import (
    FaultyEnv,
    actions_of,
    check_run,
    wrap_make_env,
)

from rollstream.schemas.events import (
    EnvAction,
    EnvActionKind,
    GenRequest,
    TerminalState,
    WeightVersion,
    unpack_logprobs,
    unpack_tokens,
)

COMPLETED = TerminalState.COMPLETED.value


@pytest.mark.parametrize("domain", ["frozenlake", "math", "code"])
def test_rollout_end_to_end_per_domain(rollout_factory: Any, domain: str) -> None:
    n = 8
    r = rollout_factory(f'rollout.domains=["{domain}"]', "rollout.group_size=2")
    r.start("env", "cpu")
    r.start("gen", "h800")
    r.start("gen", "h20")
    r.start("reward")
    sched = r.start("scheduler", trajectories=n)
    r.wait_thread(sched, 90)
    assert sched.stats is not None
    acc = check_run(r, n)

    for tid, (obs,) in acc.terminals.items():
        assert obs.terminal_state == COMPLETED, (tid, obs.terminal_state, obs.reason)
        assert obs.domain == domain
        assert obs.turns, "the terminal observation carries the whole trajectory"
        for turn in obs.turns:
            assert turn.policy_version == 0
            assert len(unpack_tokens(turn.action_token_ids)) == len(unpack_logprobs(turn.behaviour_logprobs))
            assert turn.pool == r.cfg.rollout.domain_pools[domain]
        (scored,) = acc.scored[tid]
        assert scored.terminal_state == COMPLETED
        assert scored.num_turns == len(obs.turns)
        if domain in ("frozenlake", "math"):
            assert scored.reward == 1.0, (tid, scored.reward, scored.reward_source)
        else:
            assert 0.0 <= scored.reward <= 1.0
    # Groups: G members each, all resolved.
    groups = Counter(s[0].group_id for s in acc.scored.values())
    assert sorted(groups.values()) == [2] * (n // 2)


def test_second_gen_worker_joins_mid_run(rollout_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gen worker started mid-run (its own process) takes partitions and produces ACTIONs."""
    n = 24
    r = rollout_factory('rollout.domains=["frozenlake"]', "rollout.group_size=2", "env.step_timeout_s=90")
    # Hold every trajectory at its first step until the second worker is in the group: the join is
    # mid-run by construction, and the later turns are what the new worker serves.
    joined = threading.Event()

    def hold(env: FaultyEnv) -> None:
        joined.wait(60)

    wrap_make_env(monkeypatch, on_step=hold)
    r.start("env", "cpu")
    first = r.start("gen", "h800")
    r.start("reward")
    r.wait_members("gen", "h800", 1)
    sched = r.start("scheduler", trajectories=n)
    reader = r.reader(r.topics.env_actions, r.topics.observations, r.topics.scored)
    reader.wait_until(
        lambda: len(actions_of(reader, r.topics, EnvActionKind.ACTION)) >= 4, 30, "first ACTIONs"
    )
    first_ids = {a.producer_id for a in actions_of(reader, r.topics, EnvActionKind.ACTION)}
    assert len(first_ids) == 1 and first_ids.pop().startswith("gen.h800@")
    assert first.alive()

    proc = r.spawn("gen", "h800")
    try:
        members = r.wait_members("gen", "h800", 2, timeout=60)
    finally:
        joined.set()
    assert len(members) == 2
    owned = [len(m.assignment.topic_partitions) for m in members]
    assert all(k > 0 for k in owned) and sum(owned) == 8, owned

    second_id_part = f":{proc.pid}-"  # producer ids are role@host:pid-<random>
    reader.wait_until(
        lambda: any(
            second_id_part in a.producer_id for a in actions_of(reader, r.topics, EnvActionKind.ACTION)
        ),
        60,
        "an ACTION from the second generation worker",
    )
    r.wait_thread(sched, 90)
    check_run(r, n)
    producers = {a.producer_id for a in actions_of(reader, r.topics, EnvActionKind.ACTION)}
    assert len(producers) == 2, producers
    assert proc.poll() is None, r.log_of(proc)[-3000:]


def test_fallback_when_preferred_pool_has_no_consumer(rollout_factory: Any) -> None:
    """frozenlake prefers h800; with only h20 workers its requests go to h20, marked fallback_from=h800."""
    n = 6
    r = rollout_factory('rollout.domains=["frozenlake"]', "rollout.group_size=2")
    r.start("gen", "h20")
    r.wait_members("gen", "h20", 1)
    r.start("env", "cpu")
    r.start("reward")
    time.sleep(1.0)  # the env worker's pool router has seen h20 live (refresh every 0.2 s)
    sched = r.start("scheduler", trajectories=n)
    r.wait_thread(sched, 60)
    acc = check_run(r, n)
    assert all(o[0].terminal_state == COMPLETED for o in acc.terminals.values())
    assert all(s[0].reward == 1.0 for s in acc.scored.values())
    assert all(t.pool == "h20" for o in acc.terminals.values() for t in o[0].turns)

    reqs = r.reader(r.topics.gen_requests("h800"), r.topics.gen_requests("h20"))
    reqs.poll(1.0)
    on_h800 = reqs.events(GenRequest, r.topics.gen_requests("h800"))
    on_h20 = reqs.events(GenRequest, r.topics.gen_requests("h20"))
    assert not on_h800, f"{len(on_h800)} requests waited in the pool nobody serves"
    assert len({q.trajectory_id for q in on_h20}) == n
    assert all(q.pool == "h20" and q.fallback_from == "h800" for q in on_h20)


def _weight_version(run_id: str, version: int) -> WeightVersion:
    return WeightVersion(
        run_id=run_id, trajectory_id="", version=version, parent_version=version - 1, store_uri="none"
    )


def test_per_turn_staleness_gate_on_hand_made_requests(rollout_factory: Any) -> None:
    """K=5, alpha=1: requests with v(t) in {0, 3} abort `stale`; v(t) in {4, -1 (first turn)} generate."""
    r = rollout_factory("trainer.alpha=1")
    r.produce(r.topics.weight_versions, r.run_id, _weight_version(r.run_id, 5))
    r.start("gen", "h800")
    r.wait_members("gen", "h800", 1)
    time.sleep(0.5)  # the weight follower reads weight-versions from the start, by assignment
    cases = {"t-v0": 0, "t-v3": 3, "t-v4": 4, "t-first": -1}
    for tid, v in cases.items():
        r.produce(
            r.topics.gen_requests("h800"),
            tid,
            GenRequest(
                run_id=r.run_id,
                trajectory_id=tid,
                group_id="g",
                policy_version=v,
                domain="math",
                pool="h800",
                turn=0 if v < 0 else 2,
                prompt_text="What is 2 + 3?",
                max_new_tokens=8,
                first_version=v,
            ),
        )
    reader = r.reader(r.topics.env_actions)
    reader.wait_until(lambda: len(reader.records) >= len(cases), 30, "one answer per request")
    reader.poll(0.5)
    answers = {a.trajectory_id: a for a in reader.events(EnvAction)}
    assert len(reader.events(EnvAction)) == len(cases), "one answer per request, no more"
    for tid in ("t-v0", "t-v3"):
        assert answers[tid].kind is EnvActionKind.ABORT, answers[tid]
        assert answers[tid].reason.startswith("stale"), answers[tid].reason
        assert "K=5" in answers[tid].reason
    for tid in ("t-v4", "t-first"):
        assert answers[tid].kind is EnvActionKind.ACTION, answers[tid]
        assert answers[tid].action_text == "5"
        assert answers[tid].policy_version == 5  # the scripted engine swapped to K between batches
    assert answers["t-first"].first_version == 5
    assert answers["t-v4"].first_version == 4


def test_per_turn_staleness_gate_mid_trajectory(
    rollout_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trajectories began at v=0; version 2 lands mid-trajectory (alpha=1): the next turn aborts `stale`."""
    n = 6
    r = rollout_factory('rollout.domains=["frozenlake"]', "rollout.group_size=2", "trainer.alpha=1")
    release = threading.Event()
    wrap_make_env(monkeypatch, on_step=lambda env: release.wait(30))
    r.start("env", "cpu")
    r.start("gen", "h800")
    r.start("reward")
    r.wait_members("gen", "h800", 1)
    sched = r.start("scheduler", trajectories=n)
    reader = r.reader(r.topics.env_actions, r.topics.observations, r.topics.scored)
    reader.wait_until(
        lambda: len(actions_of(reader, r.topics, EnvActionKind.ACTION)) >= n, 30, "every first turn generated"
    )
    r.produce(r.topics.weight_versions, r.run_id, _weight_version(r.run_id, 2))
    time.sleep(0.5)
    release.set()
    r.wait_thread(sched, 60)
    acc = check_run(r, n)
    for tid, (obs,) in acc.terminals.items():
        if obs.terminal_state == COMPLETED:
            assert len(obs.turns) == 1, "only a one-step episode may finish before the gate"
            continue
        assert obs.terminal_state == TerminalState.ABORTED.value, (tid, obs.terminal_state, obs.reason)
        assert obs.reason.startswith("stale"), obs.reason
        assert obs.first_version == 0
        assert acc.scored[tid][0].terminal_state == TerminalState.ABORTED.value
    assert sum(o[0].terminal_state == TerminalState.ABORTED.value for o in acc.terminals.values()) >= n - 1

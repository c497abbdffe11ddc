"""Rollout under faults on a real broker: a hung env, a crashing env, redundant rollouts cancelled,
a generation worker SIGKILLed. Each affected trajectory ends once with the right state and reason;
the others are untouched."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from rollout_harness import FaultyEnv, Rollout, actions_of, check_run, wrap_make_env

from rollstream.schemas.events import EnvActionKind, TerminalState
from rollstream.workers.scheduler import task_stream

COMPLETED = TerminalState.COMPLETED.value
FAILED = TerminalState.FAILED.value
CANCELLED = TerminalState.CANCELLED.value


def _start_pipeline(r: Rollout) -> None:
    r.start("env", "cpu")
    r.start("gen", "h800")
    r.start("gen", "h20")
    r.start("reward")


def _first_seed(r: Rollout) -> int:
    """The scheduler's first task seed (its task stream is seeded by rollout.seed)."""
    return next(task_stream(r.cfg))[1]


def test_hung_env_fails_only_its_trajectory(rollout_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 8
    r = rollout_factory(
        'rollout.domains=["frozenlake"]',
        "rollout.group_size=1",
        "trainer.min_group_size=1",
        "env.step_timeout_s=3",
    )
    stuck_seed = _first_seed(r)
    release = threading.Event()
    stuck_calls: list[float] = []

    def step(env: FaultyEnv) -> None:
        if env.seed == stuck_seed:
            stuck_calls.append(time.monotonic())
            release.wait(30)  # hangs far past env.step_timeout_s

    wrap_make_env(monkeypatch, on_step=step)
    _start_pipeline(r)
    sched = r.start("scheduler", trajectories=n)
    try:
        r.wait_thread(sched, 60)
    finally:
        release.set()  # let the stuck thread return: its late result must be discarded
    time.sleep(0.5)
    acc = check_run(r, n)
    assert len(stuck_calls) == 1
    states = acc.states()
    stuck = [tid for tid, o in acc.terminals.items() if o[0].task_seed == stuck_seed]
    assert len(stuck) == 1
    (obs,) = acc.terminals[stuck[0]]
    assert obs.terminal_state == FAILED
    assert obs.reason.startswith("step-timeout"), obs.reason
    assert acc.scored[stuck[0]][0].terminal_state == FAILED
    others = [tid for tid in states if tid != stuck[0]]
    assert all(states[t] == COMPLETED for t in others), states
    assert all(acc.scored[t][0].reward == 1.0 for t in others)
    # The others were not held up by the hung one: they all ended before it was given up on.
    assert max(acc.terminals[t][0].created_at_ms for t in others) <= obs.created_at_ms


def test_crashing_env_aborts_only_its_trajectory(
    rollout_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 8
    r = rollout_factory('rollout.domains=["frozenlake"]', "rollout.group_size=1", "trainer.min_group_size=1")
    bad_seed = _first_seed(r)

    def step(env: FaultyEnv) -> None:
        if env.seed == bad_seed:
            raise RuntimeError("simulated env crash")

    wrap_make_env(monkeypatch, on_step=step)
    _start_pipeline(r)
    sched = r.start("scheduler", trajectories=n)
    r.wait_thread(sched, 60)
    acc = check_run(r, n)
    bad = [tid for tid, o in acc.terminals.items() if o[0].task_seed == bad_seed]
    assert len(bad) == 1
    (obs,) = acc.terminals[bad[0]]
    assert obs.terminal_state == FAILED
    assert obs.reason == "env-error: RuntimeError: simulated env crash", obs.reason
    for tid, (o,) in acc.terminals.items():
        if tid != bad[0]:
            assert o.terminal_state == COMPLETED, (tid, o.terminal_state, o.reason)
            assert acc.scored[tid][0].reward == 1.0


def test_redundant_members_are_cancelled(rollout_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """G=2, r=2: in each group two members are fast, two slow; the slow ones get CANCEL and end
    `cancelled` (reason redundant...), and each group has exactly G completed scored members."""
    groups, g, extra = 4, 2, 2
    n = groups * (g + extra)
    r = rollout_factory(
        'rollout.domains=["frozenlake"]', f"rollout.group_size={g}", f"rollout.redundant={extra}"
    )
    lock = threading.Lock()
    resets: dict[int, int] = defaultdict(int)

    def reset(env: FaultyEnv) -> None:
        with lock:
            resets[env.seed] += 1
            env.mark = "slow" if resets[env.seed] > g else "fast"

    def step(env: FaultyEnv) -> None:
        if env.mark == "slow":
            time.sleep(2.0)

    wrap_make_env(monkeypatch, on_step=step, on_reset=reset)
    _start_pipeline(r)
    sched = r.start("scheduler", trajectories=n)
    r.wait_thread(sched, 60)
    acc = check_run(r, n)
    by_group: dict[str, list[str]] = defaultdict(list)
    for tid, (obs,) in acc.terminals.items():
        by_group[obs.group_id].append(tid)
    assert len(by_group) == groups and all(len(m) == g + extra for m in by_group.values())
    for gid, members in by_group.items():
        states = sorted(acc.terminals[t][0].terminal_state for t in members)
        assert states == [CANCELLED] * extra + [COMPLETED] * g, (gid, states)
        completed_scored = [
            s for t in members for s in acc.scored[t] if s.terminal_state == COMPLETED and s.reward == 1.0
        ]
        assert len(completed_scored) == g
        for t in members:
            obs = acc.terminals[t][0]
            if obs.terminal_state == CANCELLED:
                assert obs.reason.startswith("redundant"), obs.reason
                assert acc.scored[t][0].terminal_state == CANCELLED
    assert resets and all(v == g + extra for v in resets.values())


@pytest.mark.slow
def test_sigkill_gen_worker_mid_run(rollout_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two h800 generation processes; one is SIGKILLed mid-run. After the group's session timeout the
    survivor takes its partitions and re-serves what was not committed; nothing is lost or doubled."""
    n = 24
    r = rollout_factory('rollout.domains=["frozenlake"]', "rollout.group_size=2", "env.step_timeout_s=90")
    gate = threading.Event()
    wrap_make_env(monkeypatch, on_step=lambda env: gate.wait(60))
    victim = r.spawn("gen", "h800")
    survivor = r.spawn("gen", "h800")
    r.start("env", "cpu")
    r.start("reward")
    r.wait_members("gen", "h800", 2, timeout=60)
    sched = r.start("scheduler", trajectories=n)
    reader = r.reader(r.topics.env_actions)
    try:
        reader.wait_until(
            lambda: (
                {
                    a.producer_id.rsplit(":", 1)[1].split("-")[0]
                    for a in actions_of(reader, r.topics, EnvActionKind.ACTION)
                }
                >= {str(victim.pid), str(survivor.pid)}
            ),
            30,
            "ACTIONs from both generation workers",
        )
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
    finally:
        gate.set()
    r.wait_thread(sched, 120)
    acc = check_run(r, n)
    states = acc.states()
    assert all(s == COMPLETED for s in states.values()), {
        t: (o[0].terminal_state, o[0].reason)
        for t, o in acc.terminals.items()
        if o[0].terminal_state != COMPLETED
    }
    reader.poll(0.5)
    after = [
        a
        for a in actions_of(reader, r.topics, EnvActionKind.ACTION)
        if f":{survivor.pid}-" in a.producer_id and a.turn > 0
    ]
    assert after, "the survivor served the later turns"
    assert survivor.poll() is None, r.log_of(survivor)[-3000:]

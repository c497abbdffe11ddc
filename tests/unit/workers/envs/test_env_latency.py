from __future__ import annotations

import time

import pytest

from rollstream.workers.envs import LatencyEnv, StepLatency, make_env


@pytest.mark.parametrize(
    "spec", ["constant", "lognormal:10", "pareto:1:0", "gamma:1:2", "constant:x", "constant:-1"]
)
def test_bad_spec_names_it(spec: str) -> None:
    with pytest.raises(ValueError, match=spec):
        StepLatency(spec)


def test_distributions_are_seeded_and_shaped() -> None:
    assert StepLatency("none").sample_ms() == 0.0
    assert StepLatency("constant:12.5").sample_ms() == 12.5
    a = [StepLatency("lognormal:20:0.5", seed=1).sample_ms() for _ in range(3)]
    assert a[0] == a[1] == a[2]
    ln = StepLatency("lognormal:20:0.5", seed=3)
    xs = sorted(ln.sample_ms() for _ in range(2001))
    assert 17 < xs[1000] < 23  # median
    pa = StepLatency("pareto:5:1.5", seed=4, max_ms=1000)
    ys = [pa.sample_ms() for _ in range(2000)]
    assert min(ys) >= 5 and max(ys) <= 1000 and max(ys) > 50  # heavy tail, capped


def test_wrapper_sleeps_inside_step() -> None:
    env = make_env("frozenlake", latency="constant:30", latency_seed=0)
    assert isinstance(env, LatencyEnv) and env.domain == "frozenlake" and env.max_turns == 8
    env.reset(seed=0)
    t0 = time.monotonic()
    _, _, _, _, info = env.step("R")
    assert time.monotonic() - t0 >= 0.03 and info["injected_latency_ms"] == 30.0
    assert not isinstance(make_env("frozenlake", latency="none"), LatencyEnv)

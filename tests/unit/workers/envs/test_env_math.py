from __future__ import annotations

import pytest

from rollstream.workers.envs import EpisodeOverError, make_env
from rollstream.workers.envs.math_env import MathEnv


def test_question_and_ground_truth_are_seeded() -> None:
    env = make_env("math")
    q1, info1 = env.reset(seed=11)
    q2, info2 = MathEnv().reset(seed=11)
    assert q1 == q2 and info1["ground_truth"] == info2["ground_truth"]
    assert len(q1) < 120 and len(info1["ground_truth"]) <= 4
    assert env.max_turns == 2 and env.domain == "math"
    assert len({MathEnv().reset(seed=s)[0] for s in range(20)}) > 15


def test_correct_answer_terminates_with_reward_one() -> None:
    env = MathEnv()
    _, info = env.reset(seed=5)
    _, r, term, trunc, step_info = env.step(f"The answer is {info['ground_truth']}")
    assert (r, term, trunc) == (1.0, True, False)
    assert step_info["ground_truth"] == info["ground_truth"] and step_info["correct"]
    with pytest.raises(EpisodeOverError):
        env.step("1")


def test_wrong_then_right_and_wrong_twice() -> None:
    env = MathEnv()
    q, info = env.reset(seed=6)
    wrong = str(int(info["ground_truth"]) + 1)
    obs, r, term, trunc, _ = env.step(wrong)
    assert (r, term, trunc) == (0.0, False, False)
    assert obs.startswith("Incorrect") and q in obs
    _, r, term, trunc, _ = env.step(info["ground_truth"])
    assert (r, term, trunc) == (1.0, True, False)

    env.reset(seed=6)
    env.step(wrong)
    _, r, term, trunc, step_info = env.step(wrong)
    assert (r, term, trunc) == (0.0, False, True) and step_info["ground_truth"] == info["ground_truth"]


def test_basic_arithmetic_dataset_and_bad_dataset() -> None:
    env = MathEnv(dataset="basic_arithmetic")
    _, info = env.reset(seed=1)
    assert env.step(info["ground_truth"])[1] == 1.0
    with pytest.raises(ValueError, match="nope"):
        MathEnv(dataset="nope")

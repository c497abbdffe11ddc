from __future__ import annotations

from rollstream.workers.envs import make_env
from rollstream.workers.envs.code_env import FAMILIES, CodeEnv, extract_code, make_task

SOLUTIONS = {
    "reverse": "def f(s): return s[::-1]",
    "sum_list": "def f(xs): return sum(xs)",
    "max_list": "def f(xs): return max(xs)",
}


def test_tasks_are_seeded_and_varied() -> None:
    assert make_task(3) == make_task(3)
    assert len({make_task(s)[0] for s in range(60)}) == len(FAMILIES)
    _, prompt, tests = make_task(4)
    assert prompt.startswith("Write a Python function") and tests.count("assert f(") == 4


def test_correct_solution_terminates_with_full_reward() -> None:
    env = CodeEnv(families=("reverse",))
    obs, info = env.reset(seed=1)
    assert "reversed" in obs and info["tests"]
    _, r, term, trunc, step_info = env.step("```python\n" + SOLUTIONS["reverse"] + "\n```")
    assert (r, term, trunc) == (1.0, True, False) and step_info["passed"] == 4


def test_partial_then_feedback_then_truncated() -> None:
    env = make_env("code", families=["sum_list"])
    prompt, _ = env.reset(seed=2)
    obs, r, term, trunc, info = env.step("def f(xs): return 0 if not xs else xs[0]")
    assert 0.0 <= r < 1.0 and not term and not trunc
    assert obs.startswith(f"Passed {info['passed']}/4 tests. Failed: assert f(") and prompt in obs
    _, r, term, trunc, info = env.step("this is not python")
    assert (r, term, trunc) == (0.0, False, True) and "tests" in info


def test_extract_code() -> None:
    assert extract_code("x\n```py\ndef f(): pass\n```\ntext") == "def f(): pass\n"
    assert extract_code("def f(): pass") == "def f(): pass"

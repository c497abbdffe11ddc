from __future__ import annotations

import threading
import time

import pytest

from rollstream.workers.rewards import score, score_code, score_game, score_math


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("38", "38", 1.0),
        (" 38.0 ", "38", 1.0),
        ("-4", "-4", 1.0),
        ("37", "38", 0.0),
        ("The answer is 38", "38", 1.0),
        ("62 - 24 = 38", "38", 1.0),
        ("\\boxed{38}", "38", 1.0),
        ("$\\frac{1}{2}$", "0.5", 1.0),
        ("", "38", 0.0),
        ("no idea", "38", 0.0),
    ],
)
def test_score_math(response: str, truth: str, expected: float) -> None:
    assert score_math(response, truth) == expected


def test_score_math_off_main_thread_and_power_bombs() -> None:
    out: list[float] = []
    t0 = time.monotonic()
    th = threading.Thread(
        target=lambda: out.extend([score_math("so x = 38", "38"), score_math("9**9**9**9", "38")])
    )
    th.start()
    th.join(30)
    assert out == [1.0, 0.0] and time.monotonic() - t0 < 30


def test_score_code_and_game() -> None:
    tests = "assert f(1) == 2\nassert f(2) == 4"
    assert score_code("```python\ndef f(x): return 2*x\n```", tests) == 1.0
    assert score_code("def f(x): return 2", tests) == 0.5
    assert score_game(1.0) == 1.0 and score_game(float("nan")) == 0.0


def test_dispatcher() -> None:
    assert score("math", "38", {"ground_truth": "38"}, 0.0) == (1.0, "math-verify")
    assert score("code", "def f(x): return x", {"tests": "assert f(1) == 1"}, 0.0) == (1.0, "sandbox")
    assert score("frozenlake", "R", {}, 1.0) == (1.0, "env")
    with pytest.raises(ValueError, match="chess"):
        score("chess", "", {}, 0.0)

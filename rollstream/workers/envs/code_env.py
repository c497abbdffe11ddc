"""Write-a-small-Python-function tasks (procedural, seeded) graded by unit tests in the sandbox.

The prompt names the function ``f`` and shows one example assert; ``info["tests"]`` holds every assert
(one per line). Reward = fraction of tests passed. A failing answer on a non-final turn gets the number of
passed tests and the first failing assert, then the task again; all passing terminates, the last turn
truncates. The action may be bare code or contain a fenced block (the first ```python block wins).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from typing import Any

from rollstream.workers.envs.base import EpisodeOverError
from rollstream.workers.envs.sandbox import run_python, split_tests

__all__ = ["FAMILIES", "CodeEnv", "extract_code", "make_task"]

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
    """Code inside the first fenced block if there is one, else the text itself."""
    m = _FENCE.search(text)
    return m.group(1) if m else text


def _word(rng: random.Random, lo: int = 3, hi: int = 7) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(lo, hi)))


def _linear(rng: random.Random) -> tuple[str, list[tuple[str, object]]]:
    k, m = rng.randint(2, 9), rng.randint(-9, 9)
    xs = rng.sample(range(-20, 21), 4)
    return f"f(x) returns x * {k} + {m}.", [(repr(x), x * k + m) for x in xs]


def _reverse(rng: random.Random) -> tuple[str, list[tuple[str, object]]]:
    ws = [_word(rng) for _ in range(4)]
    return "f(s) returns the string s reversed.", [(repr(w), w[::-1]) for w in ws]


def _sum_list(rng: random.Random) -> tuple[str, list[tuple[str, object]]]:
    ls = [[rng.randint(-9, 9) for _ in range(rng.randint(0, 5))] for _ in range(4)]
    return "f(xs) returns the sum of the list xs.", [(repr(x), sum(x)) for x in ls]


def _max_list(rng: random.Random) -> tuple[str, list[tuple[str, object]]]:
    ls = [[rng.randint(-30, 30) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    return "f(xs) returns the largest element of the non-empty list xs.", [(repr(x), max(x)) for x in ls]


def _count_char(rng: random.Random) -> tuple[str, list[tuple[str, object]]]:
    c = rng.choice("abcde")
    ws = ["".join(rng.choice("abcde") for _ in range(rng.randint(2, 8))) for _ in range(4)]
    return f"f(s) returns how many times {c!r} occurs in s.", [(repr(w), w.count(c)) for w in ws]


def _divisible(rng: random.Random) -> tuple[str, list[tuple[str, object]]]:
    k = rng.randint(2, 7)
    xs = [k * rng.randint(-5, 5), *rng.sample(range(-40, 41), 3)]
    return f"f(x) returns True if x is divisible by {k}, else False.", [(repr(x), x % k == 0) for x in xs]


def _clamp(rng: random.Random) -> tuple[str, list[tuple[str, object]]]:
    lo = rng.randint(-10, 0)
    hi = lo + rng.randint(3, 15)
    xs = [lo - rng.randint(1, 5), hi + rng.randint(1, 5), rng.randint(lo, hi), rng.randint(lo, hi)]
    return (
        f"f(x) returns x limited to the range [{lo}, {hi}].",
        [(repr(x), min(max(x, lo), hi)) for x in xs],
    )


FAMILIES: dict[str, Callable[[random.Random], tuple[str, list[tuple[str, object]]]]] = {
    "linear": _linear,
    "reverse": _reverse,
    "sum_list": _sum_list,
    "max_list": _max_list,
    "count_char": _count_char,
    "divisible": _divisible,
    "clamp": _clamp,
}


def make_task(seed: int, families: tuple[str, ...] | None = None) -> tuple[str, str, str]:
    """(family, prompt, tests) for ``seed``; tests are asserts, one per line."""
    rng = random.Random(seed)  # own RNG: no global state across threads
    names = families or tuple(FAMILIES)
    family = rng.choice(names)
    spec, cases = FAMILIES[family](rng)
    asserts = [f"assert f({arg}) == {expected!r}" for arg, expected in cases]
    prompt = f"Write a Python function: {spec}\nExample: {asserts[0]}"
    return family, prompt, "\n".join(asserts)


class CodeEnv:
    domain = "code"

    def __init__(
        self,
        *,
        max_turns: int = 2,
        families: tuple[str, ...] | list[str] | None = None,
        cpu_seconds: int = 2,
        wall_seconds: float = 5,
        memory_mb: int = 256,
    ) -> None:
        if families is not None:
            unknown = sorted(set(families) - set(FAMILIES))
            if unknown:
                raise ValueError(f"code: unknown task families {unknown}; known: {sorted(FAMILIES)}")
        self.families = tuple(families) if families else None
        self.max_turns = max_turns
        self.cpu_seconds, self.wall_seconds, self.memory_mb = cpu_seconds, wall_seconds, memory_mb
        self._family = ""
        self._prompt = ""
        self._tests = ""
        self._seed = 0
        self._turn = 0
        self._done = True

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._family, self._prompt, self._tests = make_task(seed, self.families)
        self._seed, self._turn, self._done = seed, 0, False
        return self._prompt, self._info()

    def _info(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "seed": self._seed,
            "turn": self._turn,
            "family": self._family,
            "tests": self._tests,
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise EpisodeOverError("code: step after the episode ended")
        self._turn += 1
        result = run_python(
            extract_code(action),
            self._tests,
            cpu_seconds=self.cpu_seconds,
            wall_seconds=self.wall_seconds,
            memory_mb=self.memory_mb,
        )
        reward = result.fraction
        terminated = result.passed == result.total
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        info = self._info()
        info.update(passed=result.passed, total=result.total, killed_reason=result.killed_reason)
        obs = ""
        if not self._done:
            failing = self._first_failing(result.stderr)
            obs = f"Passed {result.passed}/{result.total} tests." + (f" Failed: {failing}" if failing else "")
            obs += "\n" + self._prompt
        return obs, reward, terminated, truncated, info

    def _first_failing(self, stderr: str) -> str:
        m = re.search(r"^test (\d+) failed", stderr, re.MULTILINE)
        if not m:
            return ""
        stmts = split_tests(self._tests)
        i = int(m.group(1))
        return stmts[i][0] if i < len(stmts) else ""

    def close(self) -> None:
        self._done = True

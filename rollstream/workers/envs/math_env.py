"""Procedural arithmetic from reasoning-gym, answered in up to ``max_turns`` tries.

Default dataset ``chain_sum`` with 2-3 terms of 1-2 digits: the question is one short line and the answer a
small integer, so even a tiny policy gets a learning signal. ``basic_arithmetic`` (same size knobs, may
include * and /) is the other supported family; extra keyword options go to the reasoning-gym config.
A wrong answer on a non-final turn gets ``Incorrect. Try again.`` plus the question; correct terminates;
wrong on the last turn truncates. Correctness is :func:`rollstream.workers.rewards.verifiers.score_math`,
the same check the reward worker uses.
"""

from __future__ import annotations

from typing import Any

import reasoning_gym

from rollstream.workers.envs.base import EpisodeOverError

__all__ = ["DATASETS", "MathEnv"]

# Small-number configs: short questions, short answers.
DATASETS: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
}
RETRY_PREFIX = "Incorrect. Try again.\n"


class MathEnv:
    domain = "math"

    def __init__(self, *, dataset: str = "chain_sum", max_turns: int = 2, **config: Any) -> None:
        if dataset not in DATASETS:
            raise ValueError(f"math: unknown dataset {dataset!r}; supported: {sorted(DATASETS)}")
        if max_turns < 1:
            raise ValueError(f"math: max_turns must be >= 1, got {max_turns}")
        self.dataset = dataset
        self.max_turns = max_turns
        self.config = {**DATASETS[dataset], **config}
        self._question = ""
        self._answer = ""
        self._seed = 0
        self._turn = 0
        self._done = True

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        # One-item dataset seeded by the reset seed: deterministic per seed, ~10 us, and no shared state
        # between instances (a shared dataset object would be read from many threads).
        item = reasoning_gym.create_dataset(self.dataset, size=1, seed=seed, **self.config)[0]
        self._question, self._answer = str(item["question"]), str(item["answer"])
        self._seed, self._turn, self._done = seed, 0, False
        return self._question, self._info()

    def _info(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "dataset": self.dataset,
            "seed": self._seed,
            "turn": self._turn,
            "question": self._question,
            "ground_truth": self._answer,
        }

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        from rollstream.workers.rewards.verifiers import score_math  # lazy: math-verify imports sympy

        if self._done:
            raise EpisodeOverError("math: step after the episode ended")
        self._turn += 1
        reward = score_math(action, self._answer)
        terminated = reward >= 1.0
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        info = self._info()
        info["correct"] = terminated
        obs = "" if self._done else RETRY_PREFIX + self._question
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._done = True

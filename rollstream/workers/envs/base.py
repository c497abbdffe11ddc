"""The text-environment contract the env workers drive (one instance = one trajectory, synchronous)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["EpisodeOverError", "TextEnv"]


class EpisodeOverError(RuntimeError):
    """``step`` after the episode ended (terminated or truncated); call ``reset`` first."""


@runtime_checkable
class TextEnv(Protocol):
    """Observation text returned by ``reset``/``step`` is the next prompt for the policy.

    The terminal step's ``info`` carries what reward scoring needs (``ground_truth``, ``tests``, ...).
    Instances share no mutable state, so different instances may run in different threads.
    """

    domain: str
    max_turns: int

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...

    def close(self) -> None: ...

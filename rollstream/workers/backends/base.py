"""The interface a generation engine implements for the generation worker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class GenInput:
    trajectory_id: str
    domain: str
    prompt_text: str
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class GenOutput:
    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # behaviour logprob per generated token
    finish_reason: str


class GenerationBackend(Protocol):
    """Called from the worker's single engine thread only: no locking needed inside."""

    version: int  # the policy version whose weights generate right now
    needs_weights: bool  # False: the backend has no weights to pull (scripted)

    def generate(self, batch: list[GenInput]) -> list[GenOutput]: ...

    def load_state_dict(self, version: int, state_dict: dict[str, Any]) -> None:
        """Swap in a version's weights between engine steps (the worker has paused generation)."""
        ...

    def close(self) -> None: ...

"""FrozenLake as a multi-turn text game, small enough for a character-level policy to learn by RL.

Observation (constant length: ``size`` lines of ``size`` chars, then ``>``), e.g. for seed-generated maps::

    @FFF
    FHFH
    FFFH
    HFFG
    >

``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal; ``@`` replaces whatever cell the agent is on. No
instructions: the prompt is the board and the policy answers with one move.

Action: the first non-blank character, case-insensitive, among ``L D R U`` (so the words left/down/right/up
also work). Anything else is an invalid move: the agent stays, the turn still counts,
``info["invalid"] = True`` and the step reward is ``invalid_penalty`` (default 0.0, set e.g. -0.1 to shape).
Reward 1.0 on reaching G (terminated), 0.0 on falling into a hole (terminated); ``max_turns`` (default 8)
moves without either -> truncated.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from rollstream.workers.envs.base import EpisodeOverError

__all__ = ["ACTIONS", "FrozenLakeTextEnv", "parse_move"]

# gymnasium's FrozenLake action ids: 0 left, 1 down, 2 right, 3 up.
ACTIONS = {"L": 0, "D": 1, "R": 2, "U": 3}


def parse_move(action: str) -> int | None:
    """gymnasium action id for the first non-blank letter of ``action``, or None when it is not a move."""
    text = action.lstrip()
    return ACTIONS.get(text[:1].upper()) if text else None


class FrozenLakeTextEnv:
    domain = "frozenlake"

    def __init__(
        self,
        *,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        max_turns: int = 8,
        invalid_penalty: float = 0.0,
        progress_bonus: float = 0.0,
        local_view: bool = False,
    ) -> None:
        if size < 2 or max_turns < 1:
            raise ValueError(f"frozenlake: bad size={size} or max_turns={max_turns}")
        self.size = size
        self.p = p
        self.is_slippery = is_slippery
        self.max_turns = max_turns
        self.invalid_penalty = float(invalid_penalty)
        # Shaping for learning from scratch: at the end of an unsuccessful episode, up to
        # `progress_bonus` for how close (Manhattan) the agent got to the goal. 0 = sparse reward.
        self.progress_bonus = float(progress_bonus)
        # Adds a line naming the cell behind each move ("L# DF RH UF", '#' = wall): the partially
        # observed view agentic tasks usually give, and far easier for a tiny policy than locating '@'.
        self.local_view = bool(local_view)
        self._env: Any = None
        self._desc: list[str] = []
        self._pos = 0
        self._turn = 0
        self._return = 0.0
        self._done = True
        self._seed = 0

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        # Map from the seed: held-out seeds are held-out maps. Built per reset (cheap, ~100 us).
        self._desc = generate_random_map(size=self.size, p=self.p, seed=seed)
        self.close()
        self._env = gym.make(
            "FrozenLake-v1",
            desc=self._desc,
            is_slippery=self.is_slippery,
            max_episode_steps=None,  # our turn budget truncates, not gymnasium's TimeLimit
            disable_env_checker=True,
        )
        pos, _ = self._env.reset(seed=seed)  # seeds the slip dynamics too
        self._pos, self._turn, self._return, self._done, self._seed = int(pos), 0, 0.0, False, seed
        return self.render(), {"domain": self.domain, "seed": seed, "map": list(self._desc), "turn": 0}

    def render(self) -> str:
        rows = [list(r) for r in self._desc]
        r, c = divmod(self._pos, self.size)
        rows[r][c] = "@"
        grid = "\n".join("".join(row) for row in rows)
        if self.local_view:
            around = []
            for move, (dr, dc) in zip("LDRU", ((0, -1), (1, 0), (0, 1), (-1, 0)), strict=True):
                nr, nc = r + dr, c + dc
                inside = 0 <= nr < self.size and 0 <= nc < self.size
                around.append(move + (self._desc[nr][nc] if inside else "#"))
            grid += "\n" + " ".join(around)
        return grid + "\n>"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done or self._env is None:
            raise EpisodeOverError("frozenlake: step after the episode ended")
        self._turn += 1
        move = parse_move(action)
        info: dict[str, Any] = {"domain": self.domain, "seed": self._seed, "turn": self._turn}
        if move is None:
            reward, terminated = self.invalid_penalty, False
            info["invalid"] = True
        else:
            pos, r, terminated, _, _ = self._env.step(move)
            self._pos, reward = int(pos), float(r)
            info["invalid"] = False
            info["move"] = "LDRU"[move]
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        cell = self._desc[self._pos // self.size][self._pos % self.size]
        if self._done and cell not in "GH" and self.progress_bonus:
            row, col = divmod(self._pos, self.size)
            distance = (self.size - 1 - row) + (self.size - 1 - col)  # G is the bottom-right corner
            reward += self.progress_bonus * (1 - distance / (2 * (self.size - 1)))
        self._return += reward
        info["cell"] = cell
        if self._done:
            info["success"] = cell == "G"
            info["env_return"] = self._return
            info["map"] = list(self._desc)
        return self.render(), reward, bool(terminated), truncated, info

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

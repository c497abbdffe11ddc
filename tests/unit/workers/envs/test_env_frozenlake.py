from __future__ import annotations

import pytest

from rollstream.workers.envs import EpisodeOverError, make_env
from rollstream.workers.envs.frozenlake import FrozenLakeTextEnv, parse_move


def _solve(desc: list[str]) -> str:
    """Shortest L/D/R/U path from S to G avoiding holes (BFS)."""
    n = len(desc)
    start = next((r, c) for r in range(n) for c in range(n) if desc[r][c] == "S")
    prev: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = [start]
    for cell in queue:
        r, c = cell
        if desc[r][c] == "G":
            path = ""
            while prev[cell] is not None:
                cell, m = prev[cell]  # type: ignore[misc]
                path = m + path
            return path
        for m, (dr, dc) in {"L": (0, -1), "D": (1, 0), "R": (0, 1), "U": (-1, 0)}.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < n and (nr, nc) not in prev and desc[nr][nc] != "H":
                prev[(nr, nc)] = ((r, c), m)
                queue.append((nr, nc))
    raise AssertionError("unsolvable map")


def test_observation_is_compact_grid_with_agent() -> None:
    env = make_env("frozenlake")
    obs, info = env.reset(seed=3)
    lines = obs.split("\n")
    assert len(lines) == 5 and lines[-1] == ">"
    assert all(len(line) == 4 for line in lines[:4])
    assert obs.count("@") == 1 and obs.startswith("@")  # agent on S, which is (0, 0)
    assert "".join(lines[:4]).replace("@", "S") == "".join(info["map"])
    assert env.max_turns == 8 and env.domain == "frozenlake"


def test_maps_depend_on_seed_and_are_reproducible() -> None:
    env = FrozenLakeTextEnv()
    maps = {tuple(env.reset(seed=s)[1]["map"]) for s in range(20)}
    assert len(maps) > 10
    assert env.reset(seed=7)[0] == FrozenLakeTextEnv().reset(seed=7)[0]


@pytest.mark.parametrize("seed", range(10))
def test_optimal_path_reaches_goal_with_reward_one(seed: int) -> None:
    env = FrozenLakeTextEnv(max_turns=16)
    _, info = env.reset(seed=seed)
    path = _solve(info["map"])
    total = 0.0
    for i, move in enumerate(path):
        obs, r, term, trunc, step_info = env.step(["left", "Down", "r", "UP"]["LDRU".index(move)])
        total += r
        assert not trunc
        assert term == (i == len(path) - 1)
        assert len(obs) == 21
    assert total == 1.0 and step_info["success"] and step_info["env_return"] == 1.0
    with pytest.raises(EpisodeOverError):
        env.step("R")


def test_hole_terminates_with_zero() -> None:
    for seed in range(50):
        env = FrozenLakeTextEnv()
        _, info = env.reset(seed=seed)
        desc = info["map"]
        if desc[0][1] == "H":
            _, r, term, trunc, step_info = env.step("R")
            assert (r, term, trunc, step_info["cell"], step_info["success"]) == (0.0, True, False, "H", False)
            return
        if desc[1][0] == "H":
            _, r, term, _, step_info = env.step("D")
            assert (r, term, step_info["success"]) == (0.0, True, False)
            return
    pytest.skip("no seed with a hole next to start")


def test_invalid_moves_stay_and_truncate_at_max_turns() -> None:
    env = FrozenLakeTextEnv(max_turns=3, invalid_penalty=-0.1)
    obs0, _ = env.reset(seed=1)
    for i in range(3):
        obs, r, term, trunc, info = env.step("xyz" if i != 1 else "")
        assert obs == obs0 and info["invalid"] and r == -0.1 and not term
    assert trunc and info["success"] is False


def test_parse_move() -> None:
    assert [parse_move(a) for a in ["L", " d", "Right\n", "up", "u", "q", "", "  "]] == [
        0,
        1,
        2,
        3,
        3,
        None,
        None,
        None,
    ]


def test_bumping_the_wall_stays_but_is_valid() -> None:
    env = FrozenLakeTextEnv()
    obs0, _ = env.reset(seed=0)
    obs, r, term, trunc, info = env.step("U")
    assert obs == obs0 and not info["invalid"] and r == 0.0 and not term and not trunc


def test_slippery_option_and_size() -> None:
    env = make_env("frozenlake", is_slippery=True, size=5, max_turns=4)
    obs, _ = env.reset(seed=2)
    assert len(obs.split("\n")) == 6 and env.max_turns == 4
    for _ in range(4):
        _, _, term, trunc, _ = env.step("R")
        if term or trunc:
            break
    env.close()

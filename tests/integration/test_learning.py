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
    steps = 240
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
    trained, _ = evaluate(load_version(cfg, kafka_bootstrap, run_id, steps), cfg, episodes=200)
    assert untrained <= 0.3, untrained
    assert trained >= 0.8, f"held-out success {trained:.3f} after {steps} versions"

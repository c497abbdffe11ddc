"""The `rollstream` CLI against a real broker: topics apply/describe/delete, and config errors exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rollstream.topics.specs import family_specs


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLSTREAM__")}
    return subprocess.run(
        [sys.executable, "-m", "rollstream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_topics_apply_describe_delete(kafka_bootstrap: str, run_id: str) -> None:
    common = [
        "--run",
        run_id,
        "--bootstrap",
        kafka_bootstrap,
        "--set",
        'topics.partitions={"env-actions": 2}',
    ]
    try:
        applied = _cli("topics", "apply", *common, "--json")
        assert applied.returncode == 0, applied.stderr
        states = json.loads(applied.stdout)
        assert {s["action"] for s in states} == {"created"}

        # Metadata reaches every cache a moment after CreateTopics returns: describe until all are seen.
        deadline = time.monotonic() + 15
        while True:
            described = _cli("topics", "describe", *common, "--json")
            assert described.returncode == 0, described.stderr
            states = json.loads(described.stdout)
            if all(s["exists"] for s in states) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert all(s["exists"] is True for s in states), states
        assert {s["family"] for s in states} == set(family_specs())
        by_family = {s["family"]: s for s in states}
        assert by_family["env-actions"]["partitions"] == 2
        assert by_family["weight-versions"]["partitions"] == 1
        for s in states:
            assert s["name"].startswith(f"rollstream.{run_id}.{s['family']}")
            assert s["action"] == "unchanged"
        pools = sorted(s["name"].rsplit(".", 1)[1] for s in states if s["family"] == "gen-requests")
        assert pools == ["h20", "h800"]

        again = _cli("topics", "apply", *common)
        assert again.returncode == 0, again.stderr
        assert "unchanged" in again.stdout and "created" not in again.stdout
    finally:
        deleted = _cli("topics", "delete", *common, "--json")
    assert deleted.returncode == 0, deleted.stderr
    assert len(json.loads(deleted.stdout)) == len(states)


def test_apply_with_drift_exits_3(kafka_bootstrap: str, run_id: str) -> None:
    base = ["--run", run_id, "--bootstrap", kafka_bootstrap]
    try:
        first = _cli("topics", "apply", *base, "--set", 'topics.partitions={"dead-letters": 1}')
        assert first.returncode == 0, first.stderr
        drift = _cli("topics", "apply", *base, "--set", 'topics.partitions={"dead-letters": 3}')
        assert drift.returncode == 3, drift.stdout + drift.stderr
        assert "drift: partitions: want 3, have 1" in drift.stdout
        assert "differ from their spec" in drift.stderr
    finally:
        _cli("topics", "delete", *base)


def test_config_file_with_a_bad_key_exits_2_naming_it(tmp_path: Path, run_id: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[trainer]\nalpha = 1\nalpah = 2\n")
    # No broker needed: the config is validated before anything connects.
    result = _cli(
        "topics", "describe", "--run", run_id, "--config", str(config), "--bootstrap", "127.0.0.1:1"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "trainer.alpah" in result.stderr
    assert "config error" in result.stderr

    result = _cli(
        "worker", "reward", "--run", run_id, "--set", "trainer.alpha=-1", "--bootstrap", "127.0.0.1:1"
    )
    assert result.returncode == 2
    assert "trainer.alpha" in result.stderr


def test_bad_run_id_exits_2() -> None:
    result = _cli("topics", "describe", "--run", "no/slashes", "--bootstrap", "127.0.0.1:1")
    assert result.returncode == 2
    assert "run id" in result.stderr

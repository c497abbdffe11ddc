"""A short real run with the trainer, then replay, fork, audit and export on its topics."""

from __future__ import annotations

import copy
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollstream.audit import audit, read_run_log
from rollstream.config import Config, load_config
from rollstream.export import export_run
from rollstream.replay import Replayer, fork, replay
from rollstream.runner import run_local

pytestmark = pytest.mark.slow

STEPS = 3


@dataclass
class Run:
    cfg: Config
    bootstrap: str
    run_id: str
    wall_s: float
    store: Path


@pytest.fixture(scope="module")
def trained_run(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("replay")
    cfg = load_config(
        "examples/learn-frozenlake.toml",
        [
            "rollout.group_size=4",
            "rollout.max_in_flight=32",
            "trainer.groups_per_step=2",
            "trainer.min_group_size=2",
            f"trainer.weight_store={tmp / 'weights'}",
        ],
    )
    run_id = f"t-replay-{int(time.time())}"
    t0 = time.monotonic()
    run_local(
        cfg,
        kafka_bootstrap,
        run_id,
        tmp / "run",
        gen={"h800": 1},
        env={"cpu": 1},
        reward=1,
        trajectories=None,
        steps=STEPS,
        out=io.StringIO(),
    )
    return Run(cfg, kafka_bootstrap, run_id, time.monotonic() - t0, tmp / "weights")


def test_replay_reproduces_every_version(trained_run: Run) -> None:
    r = trained_run
    result = replay(r.cfg, r.bootstrap, r.run_id, out=io.StringIO())
    assert result.ok, result.divergence and result.divergence.describe()
    assert [v.version for v in result.versions] == list(range(STEPS + 1))
    assert all(v.samples > 0 for v in result.versions[1:])
    assert result.wall_s < r.wall_s


def test_replay_reports_the_first_divergence(trained_run: Run) -> None:
    r = trained_run
    rep = Replayer(r.cfg, r.bootstrap, r.run_id, out=io.StringIO())
    tampered = copy.deepcopy(rep.lineage)
    tampered.versions[2].samples = tampered.versions[2].samples[1:]  # one sample fewer than was trained
    result = Replayer(r.cfg, r.bootstrap, r.run_id, out=io.StringIO(), lineage=tampered).replay()
    assert not result.ok and result.divergence is not None
    div = result.divergence
    assert div.version == 2 and div.what == "weights"
    assert div.buckets and set(div.buckets) <= {b.key for b in tampered.versions[2].buckets}
    assert div.expected_sha256 == tampered.versions[2].weights_sha256 != div.actual_sha256
    assert div.tensors  # names of the tensors that differ, read from the store
    assert "num_samples" in div.metrics
    assert "DIVERGENCE at version 2" in div.describe()


def test_fork_differs_and_is_deterministic(trained_run: Run, run_id: str) -> None:
    r = trained_run
    a = fork(r.cfg, r.bootstrap, r.run_id, 1, f"{run_id}-a", ["trainer.lr=0.02"], out=io.StringIO())
    b = fork(r.cfg, r.bootstrap, r.run_id, 1, f"{run_id}-b", ["trainer.lr=0.02"], out=io.StringIO())
    c = fork(
        r.cfg, r.bootstrap, r.run_id, 1, f"{run_id}-c", [], from_store=True, out=io.StringIO()
    )  # same hyper-parameters, from the stored state: must retrace the original
    original = {v.version: v.weights_sha256 for v in Replayer(r.cfg, r.bootstrap, r.run_id).lineage.versions}
    assert a.versions == list(range(1, STEPS + 1))
    assert a.weights_sha256 == b.weights_sha256
    assert a.weights_sha256[1] == original[1]
    assert all(a.weights_sha256[v] != original[v] for v in range(2, STEPS + 1))
    assert c.weights_sha256 == {v: original[v] for v in range(1, STEPS + 1)}
    # the fork is a run of its own: it replays bit for bit and passes the audit
    assert replay(r.cfg, r.bootstrap, f"{run_id}-a", out=io.StringIO()).ok
    assert audit(read_run_log(r.cfg, r.bootstrap, f"{run_id}-a")).ok


def test_audit_passes(trained_run: Run) -> None:
    report = audit(read_run_log(trained_run.cfg, trained_run.bootstrap, trained_run.run_id))
    assert report.ok, report.violations[:5]
    assert report.states["trained"] == report.counts["trained_samples"] > 0
    assert report.counts["versions"] == STEPS + 1


def test_export_opens_in_duckdb(trained_run: Run, tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    r = trained_run
    paths = export_run(read_run_log(r.cfg, r.bootstrap, r.run_id), tmp_path)
    assert set(paths) >= {"trajectories", "turns", "rewards", "versions"}
    con = duckdb.connect()
    n_versions = con.sql(f"select count(*) from '{paths['versions']}'").fetchall()[0][0]
    assert n_versions == STEPS + 1
    trained = con.sql(f"select count(*) from '{paths['trajectories']}' where status = 'trained'").fetchall()[
        0
    ][0]
    assert trained > 0
    ids, lps = con.sql(
        f"select action_token_ids, behaviour_logprobs from '{paths['turns']}' limit 1"
    ).fetchall()[0]
    assert isinstance(ids, list) and len(ids) == len(lps) > 0


def test_cli_replay_and_audit_json(trained_run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    from rollstream.cli import main

    r = trained_run
    assert main(["replay", "--run", r.run_id, "--bootstrap", r.bootstrap, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ok"] and out["last_version"] == STEPS
    assert main(["audit", "--run", r.run_id, "--bootstrap", r.bootstrap, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]

"""Topic families and the per-run topic names."""

from __future__ import annotations

import pytest

from rollstream.config import Config, ConfigError, load_config
from rollstream.topics.specs import (
    DEAD_LETTERS,
    ENV_ACTIONS,
    GEN_REQUESTS,
    OBSERVATIONS,
    SCORED,
    WEIGHT_VERSIONS,
    RunTopics,
    family_specs,
    run_pools,
    run_topic_specs,
)

FAMILIES = {ENV_ACTIONS, OBSERVATIONS, GEN_REQUESTS, SCORED, WEIGHT_VERSIONS, DEAD_LETTERS}


def test_every_family_is_specified() -> None:
    specs = family_specs()
    assert set(specs) == FAMILIES
    assert specs[GEN_REQUESTS].per_pool
    assert not any(s.per_pool for name, s in specs.items() if name != GEN_REQUESTS)
    assert specs[WEIGHT_VERSIONS].partitions == 1  # one ordered version lineage
    for spec in specs.values():
        assert spec.partitions >= 1
        assert spec.config["cleanup.policy"] == "delete"  # nothing compacted: every event is history
        assert all(isinstance(v, str) for v in spec.config.values())
    assert specs[SCORED].config["retention.ms"] == "-1"
    assert specs[WEIGHT_VERSIONS].config["retention.ms"] == "-1"


def test_names() -> None:
    topics = RunTopics("run-7")
    assert topics.env_actions == "rollstream.run-7.env-actions"
    assert topics.observations == "rollstream.run-7.observations"
    assert topics.gen_requests("h800") == "rollstream.run-7.gen-requests.h800"
    assert topics.scored == "rollstream.run-7.scored-trajectories"
    assert topics.weight_versions == "rollstream.run-7.weight-versions"
    assert topics.dead_letters == "rollstream.run-7.dead-letters"
    assert RunTopics("r", prefix="team").name(OBSERVATIONS) == "team.r.observations"


def test_family_of() -> None:
    topics = RunTopics("run-7")
    assert topics.family_of(topics.gen_requests("h20")) == GEN_REQUESTS
    assert topics.family_of(topics.scored) == SCORED


@pytest.mark.parametrize("run_id", ["", "a.b", "a b", "x/y", "x" * 65, "run.7"])
def test_bad_run_ids_are_rejected(run_id: str) -> None:
    with pytest.raises(ConfigError):
        RunTopics(run_id)
    with pytest.raises(ConfigError):
        run_topic_specs(run_id, Config())


def test_run_topic_specs_default() -> None:
    cfg = Config()
    specs = run_topic_specs("r1", cfg)
    names = [s.name for s in specs]
    assert len(names) == len(set(names))
    pools = run_pools(cfg)
    assert pools == ["h20", "h800"]
    expected = {f"rollstream.r1.{f}" for f in FAMILIES - {GEN_REQUESTS}}
    expected |= {f"rollstream.r1.gen-requests.{p}" for p in pools}
    assert set(names) == expected
    for spec in specs:
        family = family_specs()[spec.family]
        assert spec.partitions == family.partitions
        assert spec.config == family.config
        assert spec.name.startswith(f"rollstream.r1.{spec.family}")


def test_one_gen_requests_topic_per_pool_including_fallbacks() -> None:
    cfg = load_config(
        overrides=[
            'rollout.domain_pools={"frozenlake": "a100", "math": "h20", "code": "h20"}',
            'rollout.pool_fallbacks={"h20": ["cpu-fallback"]}',
        ],
        environ={},
    )
    gen = sorted(s.name for s in run_topic_specs("r", cfg) if s.family == GEN_REQUESTS)
    assert gen == [
        "rollstream.r.gen-requests.a100",
        "rollstream.r.gen-requests.cpu-fallback",
        "rollstream.r.gen-requests.h20",
    ]


def test_partitions_override_and_prefix() -> None:
    cfg = load_config(
        overrides=['topics.partitions={"observations": 3, "gen-requests": 2}', "kafka.topic_prefix=rs"],
        environ={},
    )
    specs = {s.name: s for s in run_topic_specs("r", cfg)}
    assert specs["rs.r.observations"].partitions == 3
    assert specs["rs.r.gen-requests.h20"].partitions == 2
    assert specs["rs.r.gen-requests.h800"].partitions == 2
    assert specs["rs.r.env-actions"].partitions == family_specs()[ENV_ACTIONS].partitions


def test_specs_do_not_share_config_dicts() -> None:
    specs = run_topic_specs("r", Config())
    specs[0].config["retention.ms"] = "1"
    assert family_specs()[specs[0].family].config["retention.ms"] != "1"

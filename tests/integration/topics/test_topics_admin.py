"""TopicAdmin against a real broker: apply is idempotent, drift is reported and left alone, delete."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from rollstream.clients import base_conf
from rollstream.config import Config, load_config
from rollstream.topics.admin import TopicAdmin
from rollstream.topics.specs import family_specs, run_topic_specs


@pytest.fixture
def cfg() -> Config:
    # Few partitions keep the test quick; the override itself is under test too.
    parts = {family: 2 for family in family_specs()} | {"weight-versions": 1}
    return load_config(overrides=[f"topics.partitions={_json(parts)}"], environ={})


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj)


@pytest.fixture
def admin(kafka_bootstrap: str, cfg: Config) -> TopicAdmin:
    return TopicAdmin(base_conf(cfg, kafka_bootstrap))


@pytest.fixture
def cleanup(admin: TopicAdmin, run_id: str, cfg: Config) -> Iterator[None]:
    yield
    admin.delete([s.name for s in run_topic_specs(run_id, cfg)])


def _wait_visible(admin: TopicAdmin, names: list[str], timeout_s: float = 10.0) -> None:
    """CreateTopics returns before every broker's metadata cache has the topic."""
    deadline = time.monotonic() + timeout_s
    while not set(names) <= set(admin.existing()):
        assert time.monotonic() < deadline, f"{names} not visible after {timeout_s}s"
        time.sleep(0.05)


def _topic_config(kafka_admin: Any, name: str) -> dict[str, str]:
    futures = kafka_admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
    return {k: v.value for k, v in next(iter(futures.values())).result(timeout=30).items()}


@pytest.mark.usefixtures("cleanup")
def test_apply_creates_every_family_then_is_unchanged(
    admin: TopicAdmin, run_id: str, cfg: Config, kafka_admin: Any
) -> None:
    specs = run_topic_specs(run_id, cfg)
    assert {s.family for s in specs} == set(family_specs())

    first = admin.apply(specs)
    assert [s.name for s in first] == [s.name for s in specs]
    assert all(s.action == "created" and s.exists and not s.drift for s in first), first
    existing = admin.existing()
    for spec in specs:
        assert existing[spec.name] == spec.partitions
        actual = _topic_config(kafka_admin, spec.name)
        for key, want in spec.config.items():
            assert actual[key] == want, (spec.name, key)

    second = admin.apply(specs)
    assert all(s.action == "unchanged" and s.exists and not s.drift for s in second), second
    assert [s.partitions for s in second] == [s.partitions for s in specs]

    described = admin.describe(specs)
    assert [s.action for s in described] == ["unchanged"] * len(specs)
    assert described[0].config == specs[0].config
    assert admin.partitions_of(specs[0].name) == specs[0].partitions


@pytest.mark.usefixtures("cleanup")
def test_existing_topic_with_other_partitions_or_config_is_drift_and_left_alone(
    admin: TopicAdmin, run_id: str, cfg: Config, kafka_admin: Any
) -> None:
    specs = {s.family: s for s in run_topic_specs(run_id, cfg)}
    obs, scored = specs["observations"], specs["scored-trajectories"]
    created = kafka_admin.create_topics(
        [
            NewTopic(obs.name, num_partitions=obs.partitions + 1, replication_factor=1, config=obs.config),
            NewTopic(
                scored.name,
                num_partitions=scored.partitions,
                replication_factor=1,
                config={**scored.config, "retention.ms": "3600000"},
            ),
        ]
    )
    for fut in created.values():
        fut.result(timeout=30)
    _wait_visible(admin, [obs.name, scored.name])

    states = {s.family: s for s in admin.apply(list(specs.values()))}
    assert states["observations"].action == "drift"
    assert states["observations"].drift == [f"partitions: want {obs.partitions}, have {obs.partitions + 1}"]
    assert states["scored-trajectories"].action == "drift"
    assert states["scored-trajectories"].drift == ["retention.ms: want -1, have 3600000"]
    others = [s for f, s in states.items() if f not in ("observations", "scored-trajectories")]
    assert all(s.action == "created" for s in others)

    # Left as they are.
    assert admin.existing()[obs.name] == obs.partitions + 1
    assert _topic_config(kafka_admin, scored.name)["retention.ms"] == "3600000"
    again = {s.family: s for s in admin.apply(list(specs.values()))}
    assert again["observations"].action == "drift"
    assert again["env-actions"].action == "unchanged"


def test_describe_missing_and_delete(admin: TopicAdmin, run_id: str, cfg: Config) -> None:
    specs = run_topic_specs(run_id, cfg)
    states = admin.describe(specs)
    assert all(not s.exists and s.action == "missing" and s.partitions is None for s in states)
    assert admin.delete([s.name for s in specs]) == []

    admin.apply(specs)
    # `delete` only deletes what the (eventually consistent) metadata lists: wait until it lists them.
    _wait_visible(admin, [s.name for s in specs])
    deleted = admin.delete([s.name for s in specs])
    assert sorted(deleted) == sorted(s.name for s in specs)
    # Deletion reaches the metadata caches a moment after DeleteTopics returns.
    deadline = time.monotonic() + 10
    while set(deleted) & set(admin.existing()):
        assert time.monotonic() < deadline, "deleted topics still listed after 10 s"
        time.sleep(0.05)
    after = admin.describe(specs)
    assert all(not s.exists for s in after), [s.name for s in after if s.exists]
    with pytest.raises(KeyError):
        admin.partitions_of(specs[0].name)

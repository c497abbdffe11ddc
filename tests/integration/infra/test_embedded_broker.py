"""A private EmbeddedBroker (not the session one): start, reuse, stop, restart with data kept."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from rollstream.infra.kafka.broker import EmbeddedBroker, free_port


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    port = free_port()
    controller_port = free_port()
    while controller_port == port:
        controller_port = free_port()
    b = EmbeddedBroker(tmp_path / "broker", port=port, controller_port=controller_port)
    try:
        yield b
    finally:
        b.down()


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_lifecycle_and_data_survive_restart(broker: EmbeddedBroker) -> None:
    first = broker.up(timeout=180)
    assert not first.already_running
    assert first.bootstrap == broker.bootstrap
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert admin.describe_cluster().result(timeout=10).controller is not None

    again = broker.up()
    assert again.already_running and again.pid == first.pid
    status = broker.status()
    assert status is not None and status.pid == first.pid
    assert broker.logs(20).strip()

    topic = "restart-keeps-me"
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(timeout=30)

    assert broker.down() is True
    assert not _pid_exists(first.pid)
    assert broker.status() is None
    assert not broker.pid_file.exists()

    second = broker.up(timeout=180)
    assert not second.already_running and second.pid != first.pid
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topics = admin.list_topics(timeout=10).topics
    assert topic in topics and len(topics[topic].partitions) == 2


def test_session_fixtures_make_unique_topics(
    kafka_bootstrap: str, make_topic: Callable[..., str], run_id: str
) -> None:
    name = make_topic("events", partitions=3, config={"retention.ms": "60000"})
    assert name.startswith(run_id)
    meta = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10)
    assert len(meta.topics[name].partitions) == 3


def test_cluster_id_starting_with_a_dash_formats(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # URL-safe base64 ids start with '-' one time in 64: passed as a separate argument it parsed as an option.
    import rollstream.infra.kafka.broker as broker_module

    monkeypatch.setattr(broker_module, "_random_cluster_id", lambda: "-AbCdEfGhIjKlMnOpQrStU")
    info = broker.up(timeout=180)
    assert not info.already_running
    assert broker.down() is True

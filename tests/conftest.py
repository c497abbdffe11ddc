"""Shared fixtures. Only tests that request the broker fixtures start (or find) a Kafka broker.

Broker choice, first that works: ``$ROLLSTREAM_TEST_BOOTSTRAP``; a testcontainers Kafka when testcontainers
is installed and a Docker engine answers; otherwise one ``EmbeddedBroker`` per test session in a temp folder.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

_BROKER_FIXTURES = {"kafka_bootstrap", "kafka_admin", "make_topic"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # By path, so nobody has to remember the marker; a test elsewhere that asks for a broker is integration
    # too, which keeps `-m "not integration"` free of brokers.
    for item in items:
        in_integration = "integration" in Path(str(item.path)).parts
        if in_integration or _BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _testcontainers_kafka() -> Generator[str, None, None] | None:
    """A generator yielding a container's bootstrap, or None when Docker/testcontainers is unavailable."""
    try:
        from testcontainers.kafka import KafkaContainer
    except Exception:
        return None
    if not _docker_answers():
        return None

    def run() -> Generator[str, None, None]:
        container = KafkaContainer()
        with contextlib.suppress(Exception):
            container = container.with_kraft()
        container.start()
        try:
            yield container.get_bootstrap_server()
        finally:
            container.stop()

    return run()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = os.environ.get("ROLLSTREAM_TEST_BOOTSTRAP")
    if env:
        yield env
        return
    container = _testcontainers_kafka()
    if container is not None:
        try:
            bootstrap = next(container)
        except Exception:
            container = None  # Docker answered but the container did not start: fall back
        else:
            yield bootstrap
            container.close()
            return

    from rollstream.infra.kafka.broker import EmbeddedBroker, free_port

    port = free_port()
    controller_port = free_port()
    while controller_port == port:
        controller_port = free_port()
    broker = EmbeddedBroker(tmp_path_factory.mktemp("kafka"), port=port, controller_port=controller_port)
    # The broker runs in its own session, so an aborted pytest would leave it behind without this.
    atexit.register(broker.down)
    info = broker.up(timeout=180)
    try:
        yield info.bootstrap
    finally:
        broker.down()
        atexit.unregister(broker.down)


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def run_id(request: pytest.FixtureRequest) -> str:
    """Unique per test; valid as a Kafka topic / group id fragment."""
    short = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name).strip("-").lower()[:32]
    return f"t-{short}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_topic(kafka_admin: Any, run_id: str) -> Iterator[Callable[..., str]]:
    """``make_topic(suffix, partitions=1, config=None)`` creates ``<run_id>-<suffix>``, deleted after."""
    from confluent_kafka.admin import NewTopic

    created: list[str] = []

    def make(name_suffix: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"{run_id}-{re.sub(r'[^a-zA-Z0-9._-]+', '-', name_suffix)}"[:249]
        topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        kafka_admin.create_topics([topic], operation_timeout=30)[name].result(timeout=60)
        created.append(name)
        return name

    yield make
    if created:
        for fut in kafka_admin.delete_topics(created, operation_timeout=30).values():
            with contextlib.suppress(Exception):  # cleanup must not mask the test's own result
                fut.result(timeout=30)

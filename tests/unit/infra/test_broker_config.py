"""Embedded broker configuration and prerequisite checks (no broker is started)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from rollstream.infra.kafka import broker as broker_mod
from rollstream.infra.kafka.broker import BrokerError, EmbeddedBroker, default_home, free_port, resolve_jars


def _props(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def test_properties_bind_only_loopback_with_given_ports_and_dirs(tmp_path: Path) -> None:
    props = _props(EmbeddedBroker(tmp_path, port=19092, controller_port=19093).render_properties())
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == props["listeners"]
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    # No listener may bind a wildcard or another interface.
    hosts = {m for v in props.values() for m in re.findall(r"//([^:/,]*):\d+", v)}
    assert hosts == {"127.0.0.1"}
    assert props["log.dirs"] == str(tmp_path.resolve() / "data")
    assert props["process.roles"] == "broker,controller"


def test_properties_suit_a_single_node(tmp_path: Path) -> None:
    props = _props(EmbeddedBroker(tmp_path).render_properties())
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert props[key] == "1", key
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["message.max.bytes"] == props["replica.fetch.max.bytes"] == "16777216"
    assert "$" not in "".join(props.values())  # every placeholder substituted


def test_bootstrap_and_default_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert EmbeddedBroker(tmp_path, port=1234).bootstrap == "127.0.0.1:1234"
    monkeypatch.setenv("ROLLSTREAM_CACHE", str(tmp_path))
    assert default_home() == tmp_path / "broker"


def test_missing_java_gives_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda cmd, *a, **k: None if cmd == "java" else real_which(cmd))
    with pytest.raises(BrokerError, match=r"apt-get install -y openjdk-17-jre-headless maven"):
        resolve_jars(tmp_path)
    with pytest.raises(BrokerError, match="java"):
        EmbeddedBroker(tmp_path / "home", port=free_port(), controller_port=free_port()).up(timeout=1)


def test_missing_maven_gives_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_mod, "_java", lambda: "/usr/bin/java")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(BrokerError, match=r"`mvn` not found.*apt-get install"):
        resolve_jars(tmp_path)


def test_old_java_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerError, match=r"Java 11 .*>= 17"):
        resolve_jars(tmp_path / "cache")


def test_resolved_cache_is_reused_without_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libs = tmp_path / f"kafka-{broker_mod.kafka_version()}" / "libs"
    libs.mkdir(parents=True)
    (libs / ".complete").write_text("done\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # neither java nor mvn needed
    assert resolve_jars(tmp_path) == libs


def test_status_without_broker(tmp_path: Path) -> None:
    b = EmbeddedBroker(tmp_path, port=free_port(), controller_port=free_port())
    assert b.status() is None
    assert b.down() is False
    assert b.logs() == ""

"""Create, describe and delete one run's topics; `apply` is idempotent and reports drift."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from rollstream.topics.specs import TopicSpec

TIMEOUT_S = 30.0


@dataclass
class TopicState:
    name: str
    family: str
    exists: bool
    partitions: int | None = None
    config: dict[str, str] = field(default_factory=dict)
    action: str = ""  # created | unchanged | drift | missing | deleted
    drift: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TopicAdmin:
    def __init__(self, client_conf: dict[str, Any]) -> None:
        self._admin = AdminClient(client_conf)

    def existing(self) -> dict[str, int]:
        meta = self._admin.list_topics(timeout=TIMEOUT_S)
        return {name: len(t.partitions) for name, t in meta.topics.items()}

    def _configs(self, names: list[str]) -> dict[str, dict[str, str]]:
        if not names:
            return {}
        futures = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names])
        return {
            res.name: {k: v.value for k, v in fut.result(timeout=TIMEOUT_S).items()}
            for res, fut in futures.items()
        }

    def describe(self, specs: list[TopicSpec]) -> list[TopicState]:
        existing = self.existing()
        configs = self._configs([s.name for s in specs if s.name in existing])
        states = []
        for spec in specs:
            if spec.name not in existing:
                states.append(TopicState(spec.name, spec.family, exists=False, action="missing"))
                continue
            actual = configs.get(spec.name, {})
            drift = [
                f"{key}: want {want}, have {actual.get(key)}"
                for key, want in spec.config.items()
                if actual.get(key) != want
            ]
            if existing[spec.name] != spec.partitions:
                drift.insert(0, f"partitions: want {spec.partitions}, have {existing[spec.name]}")
            states.append(
                TopicState(
                    spec.name,
                    spec.family,
                    exists=True,
                    partitions=existing[spec.name],
                    config={k: actual.get(k, "") for k in spec.config},
                    action="drift" if drift else "unchanged",
                    drift=drift,
                )
            )
        return states

    def apply(self, specs: list[TopicSpec]) -> list[TopicState]:
        """Create what is missing; leave existing topics alone but report any drift from the spec."""
        states = self.describe(specs)
        missing = [spec for spec, state in zip(specs, states, strict=True) if not state.exists]
        if missing:
            new = [
                NewTopic(s.name, num_partitions=s.partitions, replication_factor=-1, config=s.config)
                for s in missing
            ]
            for fut in self._admin.create_topics(new, request_timeout=TIMEOUT_S).values():
                try:
                    fut.result(timeout=TIMEOUT_S)
                except KafkaException as exc:
                    # Another process created it between describe and create: fine, idempotent.
                    if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                        raise
        created = {s.name for s in missing}
        result = self.describe(specs)
        for state in result:
            if state.name in created and not state.drift:  # a racing creator made it: drift wins
                state.action = "created"
        return result

    def delete(self, names: list[str]) -> list[str]:
        existing = self.existing()
        targets = [n for n in names if n in existing]
        if targets:
            for fut in self._admin.delete_topics(targets, operation_timeout=TIMEOUT_S).values():
                fut.result(timeout=TIMEOUT_S)
        return targets

    def partitions_of(self, topic: str) -> int:
        meta = self._admin.list_topics(topic, timeout=TIMEOUT_S)
        t = meta.topics.get(topic)
        if t is None or t.error is not None:
            raise KeyError(f"topic {topic} does not exist")
        return len(t.partitions)

    def live_groups(self) -> set[str]:
        """Consumer groups that have at least one member right now (for pool routing)."""
        listed = self._admin.list_consumer_groups(request_timeout=10).result()
        ids = [g.group_id for g in listed.valid]
        if not ids:
            return set()
        live = set()
        for gid, fut in self._admin.describe_consumer_groups(ids, request_timeout=10).items():
            try:
                if fut.result().members:
                    live.add(gid)
            except KafkaException:
                continue
        return live

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
        """Configs per topic; a topic deleted since it was listed is left out (reported missing)."""
        if not names:
            return {}
        futures = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names])
        out = {}
        for res, fut in futures.items():
            try:
                out[res.name] = {k: v.value for k, v in fut.result(timeout=TIMEOUT_S).items()}
            except KafkaException as exc:
                if exc.args[0].name() != "UNKNOWN_TOPIC_OR_PART":
                    raise
        return out

    def describe(self, specs: list[TopicSpec]) -> list[TopicState]:
        existing = self.existing()
        configs = self._configs([s.name for s in specs if s.name in existing])
        states = []
        for spec in specs:
            if spec.name not in existing or spec.name not in configs:
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
        """Delete every named topic; one that is already gone is not an error. Returns those deleted."""
        if not names:
            return []
        deleted = []
        for name, fut in self._admin.delete_topics(names, operation_timeout=TIMEOUT_S).items():
            try:
                fut.result(timeout=TIMEOUT_S)
                deleted.append(name)
            except KafkaException as exc:
                # Metadata may not list a just-created topic yet, or it was deleted meanwhile.
                if exc.args[0].name() != "UNKNOWN_TOPIC_OR_PART":
                    raise
        return deleted

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

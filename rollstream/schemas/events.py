"""Typed events: one dataclass per Avro record in this folder.

Field names and order match the `.avsc` files exactly (a unit test checks it), so converting to the
dict fastavro writes is a flat attribute copy. Token ids and logprobs stay packed `bytes`; use
`pack_tokens` / `unpack_tokens` at the edges.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from enum import Enum, StrEnum
from operator import attrgetter
from typing import Any, ClassVar

import numpy as np


def now_ms() -> int:
    return int(time.time() * 1000)


def new_id() -> str:
    return uuid.uuid4().hex


def default_producer_id(role: str) -> str:
    # The random suffix keeps two workers of one process (tests, notebooks) apart.
    return f"{role}@{socket.gethostname()}:{os.getpid()}-{uuid.uuid4().hex[:4]}"


def pack_tokens(ids: Any) -> bytes:
    """Token ids as packed little-endian int32 (the wire format: never Avro arrays)."""
    return np.asarray(ids, dtype="<i4").tobytes()


def unpack_tokens(data: bytes) -> np.ndarray:
    if len(data) % 4:
        raise ValueError(f"token payload length {len(data)} is not a multiple of 4")
    return np.frombuffer(data, dtype="<i4").astype(np.int32)


def pack_logprobs(values: Any) -> bytes:
    """Logprobs as packed little-endian float32."""
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_logprobs(data: bytes) -> np.ndarray:
    if len(data) % 4:
        raise ValueError(f"logprob payload length {len(data)} is not a multiple of 4")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


class EnvActionKind(StrEnum):
    RESET = "RESET"
    ACTION = "ACTION"
    ABORT = "ABORT"
    CANCEL = "CANCEL"


_KIND_BY_VALUE: dict[Any, EnvActionKind] = {k.value: k for k in EnvActionKind}


class TerminalState(StrEnum):
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(slots=True, kw_only=True)
class Event:
    """The envelope every event carries."""

    SCHEMA_NAME: ClassVar[str] = ""
    _nested: ClassVar[dict[str, type]] = {}

    run_id: str
    trajectory_id: str = ""
    group_id: str = ""
    policy_version: int = -1
    producer_id: str = ""
    event_id: str = field(default_factory=new_id)
    created_at_ms: int = field(default_factory=now_ms)

    def to_record(self) -> dict[str, Any]:
        names, getter = _accessors(type(self))
        record = dict(zip(names, getter(self), strict=True))
        for name in self._nested:
            record[name] = [_to_plain(item) for item in record[name]]
        kind = record.get("kind")
        if isinstance(kind, Enum):
            record["kind"] = kind.value
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Event:
        names = cls._field_names()
        # fastavro hands a fresh dict per record; with the writer's schema == the reader's (the hot path)
        # its keys are exactly our fields, so it is used as is.
        values = record if record.keys() <= names else {k: v for k, v in record.items() if k in names}
        for name, kind in cls._nested.items():
            if name in values:
                values[name] = [_from_plain(kind, item) for item in values[name]]
        created = values.get("created_at_ms")
        if created is not None and not isinstance(created, int):
            values["created_at_ms"] = _datetime_to_ms(created)
        return cls(**values)

    @classmethod
    def _field_names(cls) -> frozenset[str]:
        return _accessors_set(cls)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def _datetime_to_ms(value: datetime) -> int:
    """Exact ms since the epoch (a timestamp-millis read as datetime); float `timestamp()` loses 1 ms."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _ONE_MS


_ACCESSORS: dict[type, tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], frozenset[str]]] = {}


def _accessor_entry(kind: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], frozenset[str]]:
    entry = _ACCESSORS.get(kind)
    if entry is None:
        names = tuple(f.name for f in fields(kind))
        getter: Callable[[Any], tuple[Any, ...]] = attrgetter(*names)
        if len(names) == 1:  # attrgetter of one name returns the value, not a 1-tuple
            one: Callable[[Any], Any] = attrgetter(names[0])
            getter = lambda obj: (one(obj),)  # noqa: E731
        entry = (names, getter, frozenset(names))
        _ACCESSORS[kind] = entry
    return entry


def _accessors(kind: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]:
    names, getter, _ = _accessor_entry(kind)
    return names, getter


def _accessors_set(kind: type) -> frozenset[str]:
    return _accessor_entry(kind)[2]


def _to_plain(item: Any) -> dict[str, Any]:
    names, getter = _accessors(type(item))
    return dict(zip(names, getter(item), strict=True))


def _from_plain(kind: type, item: dict[str, Any]) -> Any:
    names = _accessors_set(kind)
    return kind(**(item if item.keys() <= names else {k: v for k, v in item.items() if k in names}))


def _known(kind: type, item: dict[str, Any]) -> dict[str, Any]:
    names = _accessors_set(kind)
    return {k: v for k, v in item.items() if k in names}


@dataclass(slots=True, kw_only=True)
class Turn:
    turn: int
    prompt_text: str
    prompt_token_ids: bytes
    action_text: str
    action_token_ids: bytes
    behaviour_logprobs: bytes
    policy_version: int
    reward: float = 0.0
    gen_ms: float = 0.0
    env_ms: float = 0.0
    pool: str = ""


@dataclass(slots=True, kw_only=True)
class WeightBucket:
    key: str
    size: int
    sha256: str


@dataclass(slots=True, kw_only=True)
class SampleRef:
    topic: str
    partition: int
    offset: int
    trajectory_id: str
    group_id: str
    first_version: int
    weight: float = 1.0
    reason: str = ""


@dataclass(slots=True, kw_only=True)
class GenRequest(Event):
    SCHEMA_NAME: ClassVar[str] = "rollstream.events.GenRequest"

    domain: str
    pool: str
    turn: int
    prompt_text: str
    max_new_tokens: int
    first_version: int = -1
    fallback_from: str = ""


@dataclass(slots=True, kw_only=True)
class EnvAction(Event):
    SCHEMA_NAME: ClassVar[str] = "rollstream.events.EnvAction"

    kind: EnvActionKind
    domain: str
    pool: str = ""
    turn: int = 0
    task_seed: int = 0
    action_text: str = ""
    prompt_token_ids: bytes = b""
    action_token_ids: bytes = b""
    behaviour_logprobs: bytes = b""
    first_version: int = -1
    gen_ms: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, EnvActionKind):
            # A dict lookup first: Enum's constructor is a third of a small event's decode time.
            self.kind = _KIND_BY_VALUE.get(self.kind) or EnvActionKind(self.kind)


@dataclass(slots=True, kw_only=True)
class Observation(Event):
    SCHEMA_NAME: ClassVar[str] = "rollstream.events.Observation"
    _nested: ClassVar[dict[str, type]] = {"turns": Turn}

    domain: str
    pool: str = ""
    turn: int = 0
    task_seed: int = 0
    text: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    terminal_state: str = ""
    reason: str = ""
    env_return: float = 0.0
    env_ms: float = 0.0
    first_version: int = -1
    info_json: str = "{}"
    turns: list[Turn] = field(default_factory=list)

    @property
    def is_terminal(self) -> bool:
        return bool(self.terminal_state)


@dataclass(slots=True, kw_only=True)
class ScoredTrajectory(Event):
    SCHEMA_NAME: ClassVar[str] = "rollstream.events.ScoredTrajectory"
    _nested: ClassVar[dict[str, type]] = {"turns": Turn}

    domain: str
    task_seed: int = 0
    reward: float = 0.0
    reward_source: str = ""
    terminal_state: str = TerminalState.COMPLETED.value
    reason: str = ""
    first_version: int = -1
    last_version: int = -1
    num_turns: int = 0
    turns: list[Turn] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class WeightVersion(Event):
    SCHEMA_NAME: ClassVar[str] = "rollstream.events.WeightVersion"
    _nested: ClassVar[dict[str, type]] = {
        "buckets": WeightBucket,
        "samples": SampleRef,
        "dropped": SampleRef,
        "trainer_state": WeightBucket,
    }

    version: int
    parent_version: int
    store_uri: str
    buckets: list[WeightBucket] = field(default_factory=list)
    weights_sha256: str = ""
    samples: list[SampleRef] = field(default_factory=list)
    dropped: list[SampleRef] = field(default_factory=list)
    hyperparams_json: str = "{}"
    seed: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    trainer_state: list[WeightBucket] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class DeadLetter(Event):
    SCHEMA_NAME: ClassVar[str] = "rollstream.events.DeadLetter"

    original_topic: str
    original_partition: int
    original_offset: int
    original_key: bytes | None
    original_value: bytes | None
    original_size: int
    reason: str
    error: str


EVENT_TYPES: tuple[type[Event], ...] = (
    GenRequest,
    EnvAction,
    Observation,
    ScoredTrajectory,
    WeightVersion,
    DeadLetter,
)
EVENT_BY_SCHEMA: dict[str, type[Event]] = {t.SCHEMA_NAME: t for t in EVENT_TYPES}

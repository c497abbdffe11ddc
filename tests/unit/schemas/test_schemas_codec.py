"""The Avro codec: both wire formats, exact header bytes, interop with the Apache `avro` package, errors."""

from __future__ import annotations

import io
import json
import struct
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

import avro.io
import avro.schema
import numpy as np
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from rollstream.schemas.codec import Codec, DecodeError, load_schema_json, make_codec
from rollstream.schemas.events import (
    EVENT_TYPES,
    DeadLetter,
    EnvAction,
    EnvActionKind,
    Event,
    GenRequest,
    Observation,
    SampleRef,
    ScoredTrajectory,
    Turn,
    WeightBucket,
    WeightVersion,
    pack_logprobs,
    pack_tokens,
    unpack_logprobs,
    unpack_tokens,
)

# -- an independent CRC-64-AVRO and parsing canonical form, straight from the Avro spec ----------------

_EMPTY = 0xC15D213AA4D7A795


def _table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _table()


def crc64_avro(data: bytes) -> int:
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_KEEP = ("name", "type", "fields", "symbols", "items", "values", "size")  # [ORDER]


def canonical(node: Any, namespace: str = "") -> str:
    """Parsing canonical form: [PRIMITIVES] [FULLNAMES] [STRIP] [ORDER] [STRINGS] [INTEGERS] [WHITESPACE]."""
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return json.dumps(node)
        return json.dumps(node if "." in node else f"{namespace}.{node}" if namespace else node)
    if isinstance(node, list):
        return "[" + ",".join(canonical(n, namespace) for n in node) + "]"
    kind = node["type"]
    if kind in _PRIMITIVES:  # {"type": "long", "logicalType": ...} strips down to "long"
        return json.dumps(kind)
    parts = []
    if kind in ("record", "enum", "fixed"):
        name = node["name"]
        ns = node.get("namespace", namespace)
        if "." not in name and ns:
            name = f"{ns}.{name}"
        namespace = name.rsplit(".", 1)[0] if "." in name else ""
        parts.append(f'"name":{json.dumps(name)}')
    parts.append(f'"type":{canonical(kind, namespace) if not isinstance(kind, str) else json.dumps(kind)}')
    if kind == "record":
        inner = [
            "{" + f'"name":{json.dumps(f["name"])},"type":{canonical(f["type"], namespace)}' + "}"
            for f in node["fields"]
        ]
        parts.append('"fields":[' + ",".join(inner) + "]")
    if kind == "enum":
        parts.append('"symbols":' + json.dumps(node["symbols"], separators=(",", ":")))
    if kind == "array":
        parts.append(f'"items":{canonical(node["items"], namespace)}')
    if kind == "map":
        parts.append(f'"values":{canonical(node["values"], namespace)}')
    if kind == "fixed":
        parts.append(f'"size":{int(node["size"])}')
    return "{" + ",".join(parts) + "}"


def test_crc64_avro_matches_the_spec_test_vectors() -> None:
    # share/test/data/schema-tests.txt of the Avro project (as signed 64-bit longs).
    assert crc64_avro(b'"int"') == 8247732601305521295
    assert crc64_avro(b'"null"') == 7195948357588979594


# -- sample events ------------------------------------------------------------------------------------

TOKENS = [1, 2, 300, 70_000, -5, 2**31 - 1, 0, 42]
LOGPROBS = [-0.5, -1.25, 0.0, -3.0, -0.125, -7.5, -0.0625, -2.0]


def _turn(i: int) -> Turn:
    return Turn(
        turn=i,
        prompt_text=f"prompt {i} ✓",
        prompt_token_ids=pack_tokens([i, i + 1, i + 2]),
        action_text=f"action {i}",
        action_token_ids=pack_tokens(TOKENS),
        behaviour_logprobs=pack_logprobs(LOGPROBS),
        policy_version=i,
        reward=0.5 * i,
        gen_ms=1.5,
        env_ms=2.5,
        pool="h20",
    )


def _envelope() -> dict[str, Any]:
    return {
        "run_id": "run-1",
        "trajectory_id": "traj-1",
        "group_id": "group-1",
        "policy_version": 3,
        "producer_id": "test@host:1",
        "created_at_ms": 1_780_000_000_123,
    }


def sample_events() -> list[Event]:
    ref = SampleRef(
        topic="t", partition=1, offset=7, trajectory_id="x", group_id="g", first_version=2, weight=0.25
    )
    return [
        GenRequest(
            **_envelope(),
            domain="math",
            pool="h20",
            turn=2,
            prompt_text="2+2?",
            max_new_tokens=12,
            first_version=1,
            fallback_from="h800",
        ),
        EnvAction(
            **_envelope(),
            kind=EnvActionKind.ACTION,
            domain="math",
            pool="h20",
            turn=2,
            task_seed=99,
            action_text="4",
            prompt_token_ids=pack_tokens([5, 6, 7]),
            action_token_ids=pack_tokens(TOKENS),
            behaviour_logprobs=pack_logprobs(LOGPROBS),
            first_version=1,
            gen_ms=3.25,
            reason="",
        ),
        Observation(
            **_envelope(),
            domain="code",
            pool="h20",
            turn=3,
            task_seed=5,
            text="done",
            reward=1.0,
            terminated=True,
            truncated=False,
            terminal_state="completed",
            env_return=1.0,
            env_ms=4.5,
            first_version=1,
            info_json='{"answer": "4"}',
            turns=[_turn(0), _turn(1), _turn(2)],
        ),
        ScoredTrajectory(
            **_envelope(),
            domain="code",
            task_seed=5,
            reward=0.75,
            reward_source="sandbox",
            first_version=1,
            last_version=2,
            num_turns=2,
            turns=[_turn(0), _turn(1)],
        ),
        WeightVersion(
            **_envelope(),
            version=4,
            parent_version=3,
            store_uri="file:///tmp/w",
            buckets=[WeightBucket(key="b0", size=10, sha256="ab" * 32)],
            weights_sha256="cd" * 32,
            samples=[ref],
            dropped=[SampleRef(**{**_plain(ref), "reason": "stale"})],
            hyperparams_json='{"lr": 0.003}',
            seed=11,
            timings={"step": 1.5},
            metrics={"loss": -0.25},
        ),
        DeadLetter(
            **_envelope(),
            original_topic="rollstream.r.observations",
            original_partition=2,
            original_offset=17,
            original_key=b"traj-1",
            original_value=b"\x00\xffgarbage",
            original_size=9,
            reason="undecodable",
            error="boom",
        ),
        DeadLetter(
            **_envelope(),
            original_topic="t",
            original_partition=0,
            original_offset=0,
            original_key=None,
            original_value=None,
            original_size=0,
            reason="oversized",
            error="",
        ),
    ]


def _plain(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


EVENTS = sample_events()
IDS = [f"{type(e).__name__}-{i}" for i, e in enumerate(EVENTS)]


def test_samples_cover_every_event_type() -> None:
    assert {type(e) for e in EVENTS} == set(EVENT_TYPES)


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=lambda t: t.__name__)
def test_dataclass_fields_match_the_avsc_in_order(event_type: type[Event]) -> None:
    raw = load_schema_json(event_type.__name__)
    schema_fields = [f["name"] for f in raw["fields"]]
    # The dataclass puts the envelope first in its own order; compare as sets and the non-envelope order.
    names = [f.name for f in fields(event_type)]
    assert set(names) == set(schema_fields), (event_type.__name__, set(names) ^ set(schema_fields))
    envelope = {f.name for f in fields(Event)}
    assert [n for n in names if n not in envelope] == [n for n in schema_fields if n not in envelope]


# -- round trips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("event", EVENTS, ids=IDS)
def test_single_object_round_trip(event: Event) -> None:
    codec = Codec()
    data = codec.encode(event)
    assert data[:2] == b"\xc3\x01"
    decoded = codec.decode(data)
    assert type(decoded) is type(event)
    assert decoded == event
    # Another codec instance (another process) decodes it too: the fingerprint is all it needs.
    assert Codec().decode(data) == event


@pytest.mark.parametrize("event", EVENTS, ids=IDS)
def test_confluent_round_trip_and_reader_accepts_both_formats(event: Event) -> None:
    codec = make_codec("mock://codec-roundtrip")
    topic = f"rollstream.r.{type(event).__name__}"
    framed = codec.encode(event, topic)
    magic, schema_id = struct.unpack(">bI", framed[:5])
    assert magic == 0 and schema_id > 0
    assert codec.decode(framed) == event
    # A reader with a registry also decodes the single-object format.
    assert codec.decode(Codec().encode(event)) == event
    # The bodies after the headers are the same Avro binary.
    assert framed[5:] == Codec().encode(event)[10:]


def test_confluent_reader_resolves_an_unknown_id_from_the_registry() -> None:
    # Two processes, one registry: the reader has never seen the id and fetches the schema.
    registry = SchemaRegistryClient.new_client({"url": "mock://codec-shared-registry"})
    event = EVENTS[2]
    framed = Codec(registry=registry).encode(event, "rollstream.r.observations")
    assert Codec(registry=registry).decode(framed) == event


def test_registry_record_that_is_not_an_event_is_a_decode_error() -> None:
    registry = SchemaRegistryClient.new_client({"url": "mock://codec-foreign"})
    foreign = {"type": "record", "name": "Other", "namespace": "x", "fields": [{"name": "a", "type": "int"}]}
    schema_id = registry.register_schema("x-value", Schema(json.dumps(foreign), "AVRO"))
    with pytest.raises(DecodeError, match="not a rollstream event"):
        Codec(registry=registry).decode(struct.pack(">bI", 0, schema_id) + b"\x02")


def test_confluent_message_without_registry_is_a_decode_error() -> None:
    framed = make_codec("mock://codec-no-reg").encode(EVENTS[0], "t")
    with pytest.raises(DecodeError, match="no schema registry"):
        Codec().decode(framed)


def test_confluent_unknown_schema_id_is_a_decode_error() -> None:
    codec = make_codec("mock://codec-empty-registry")
    with pytest.raises(DecodeError, match="schema id 4242"):
        codec.decode(struct.pack(">bI", 0, 4242) + b"\x02")


def test_confluent_encode_needs_the_topic() -> None:
    with pytest.raises(ValueError, match="topic"):
        make_codec("mock://codec-topic").encode(EVENTS[0])


def test_created_at_ms_is_exact() -> None:
    # timestamp-millis must survive to the millisecond (a float detour loses 1 ms now and then).
    codec = Codec()
    rng = np.random.default_rng(0)
    for ms in [0, 1, 999, 1_078_018_820_169, 2_179_003_882_779, *rng.integers(0, 4 * 10**12, 2000)]:
        event = GenRequest(
            run_id="r", domain="m", pool="p", turn=0, prompt_text="", max_new_tokens=1, created_at_ms=int(ms)
        )
        assert codec.decode(codec.encode(event)).created_at_ms == int(ms)


# -- header bytes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=lambda t: t.__name__)
def test_fingerprint_is_crc64_avro_of_the_canonical_form_little_endian(event_type: type[Event]) -> None:
    raw = load_schema_json(event_type.__name__)
    event = next(e for e in EVENTS if type(e) is event_type)
    data = Codec().encode(event)
    expected = crc64_avro(canonical(raw).encode()).to_bytes(8, "little")
    assert data[:10] == b"\xc3\x01" + expected


def test_independent_canonical_form_is_sane() -> None:
    form = canonical(load_schema_json("EnvAction"))
    assert form.startswith('{"name":"rollstream.events.EnvAction","type":"record","fields":[')
    assert '{"name":"created_at_ms","type":"long"}' in form
    assert '"type":{"name":"rollstream.events.EnvActionKind","type":"enum","symbols":["RESET",' in form
    assert "doc" not in form and " " not in form


# -- interop with the Apache avro package --------------------------------------------------------------


def _apache_read(event_type: type[Event], body: bytes) -> dict[str, Any]:
    schema = avro.schema.parse(json.dumps(load_schema_json(event_type.__name__)))
    stream = io.BytesIO(body)
    record: dict[str, Any] = avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(stream))
    assert stream.tell() == len(body), "the Apache reader left bytes over"
    return record


@pytest.mark.parametrize("event", EVENTS, ids=IDS)
def test_apache_avro_reads_what_we_write(event: Event) -> None:
    data = Codec().encode(event)
    record = _apache_read(type(event), data[10:])
    expected = event.to_record()
    created = record.pop("created_at_ms")
    expected_ms = expected.pop("created_at_ms")
    if isinstance(created, datetime):
        created = int((created - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1000 + 0.5)
    assert created == expected_ms
    assert record == expected


def test_apache_avro_sees_packed_tokens_and_nested_turns() -> None:
    obs = next(e for e in EVENTS if isinstance(e, Observation))
    record = _apache_read(Observation, Codec().encode(obs)[10:])
    assert len(record["turns"]) == 3
    for i, turn in enumerate(record["turns"]):
        assert turn["turn"] == i
        assert turn["prompt_token_ids"] == struct.pack("<3i", i, i + 1, i + 2)
        assert turn["action_token_ids"] == struct.pack(f"<{len(TOKENS)}i", *TOKENS)
        assert turn["behaviour_logprobs"] == struct.pack(f"<{len(LOGPROBS)}f", *LOGPROBS)
        assert unpack_tokens(turn["action_token_ids"]).tolist() == TOKENS
        assert unpack_logprobs(turn["behaviour_logprobs"]).tolist() == LOGPROBS
    action = next(e for e in EVENTS if isinstance(e, EnvAction))
    record = _apache_read(EnvAction, Codec().encode(action)[10:])
    assert record["kind"] == "ACTION"
    assert record["action_token_ids"] == struct.pack(f"<{len(TOKENS)}i", *TOKENS)


# -- packed token bytes --------------------------------------------------------------------------------


def test_tokens_are_packed_little_endian_int32() -> None:
    assert pack_tokens([1, 256, -1]) == b"\x01\x00\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff"
    assert pack_tokens(np.array([1, 2], dtype=">i8")) == b"\x01\x00\x00\x00\x02\x00\x00\x00"
    assert pack_tokens([]) == b""
    assert unpack_tokens(b"\x01\x00\x00\x00\x00\x01\x00\x00").tolist() == [1, 256]


def test_logprobs_are_packed_little_endian_float32() -> None:
    assert pack_logprobs([1.0, -2.0]) == b"\x00\x00\x80\x3f\x00\x00\x00\xc0"
    assert pack_logprobs([-0.5]) == struct.pack("<f", -0.5)
    assert unpack_logprobs(b"\x00\x00\x80\x3f").tolist() == [1.0]


def test_token_bytes_sit_verbatim_in_the_avro_body() -> None:
    tokens = pack_tokens(TOKENS)
    event = EnvAction(run_id="r", kind="ACTION", domain="d", action_token_ids=tokens)
    data = Codec().encode(event)
    # Avro bytes = zigzag varint length + the raw bytes: 32 bytes -> 0x40.
    assert b"\x40" + tokens in data
    decoded = Codec().decode(data)
    assert isinstance(decoded, EnvAction)
    assert decoded.kind is EnvActionKind.ACTION
    assert unpack_tokens(decoded.action_token_ids).tolist() == TOKENS


# -- errors --------------------------------------------------------------------------------------------


def test_garbage_and_empty_raise_decode_error() -> None:
    codec = Codec()
    with pytest.raises(DecodeError, match="empty"):
        codec.decode(b"")
    with pytest.raises(DecodeError, match="empty"):
        codec.decode(None)
    with pytest.raises(DecodeError, match="not an Avro event: first bytes 68656c6c"):
        codec.decode(b"hello world")
    with pytest.raises(DecodeError, match="not an Avro event"):
        codec.decode(b'{"json": true}')


def test_truncated_headers_raise_decode_error() -> None:
    codec = Codec()
    with pytest.raises(DecodeError, match="truncated single-object header"):
        codec.decode(b"\xc3\x01\x01\x02")
    with pytest.raises(DecodeError, match="truncated Confluent header"):
        codec.decode(b"\x00\x00\x01")


@pytest.mark.parametrize("event", EVENTS[:5], ids=IDS[:5])
def test_truncated_body_raises_decode_error_naming_the_type(event: Event) -> None:
    codec = Codec()
    data = codec.encode(event)
    for cut in (11, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError, match=f"corrupt {type(event).__name__} body"):
            codec.decode(data[:cut])


def test_unknown_fingerprint_raises_decode_error() -> None:
    data = Codec().encode(EVENTS[0])
    forged = data[:2] + bytes(8) + data[10:]
    with pytest.raises(DecodeError, match="unknown schema fingerprint 0000000000000000"):
        Codec().decode(forged)


def test_trailing_bytes_raise_decode_error() -> None:
    data = Codec().encode(EVENTS[1])
    with pytest.raises(DecodeError, match="3 trailing bytes"):
        Codec().decode(data + b"abc")
    codec = make_codec("mock://codec-trailing")
    framed = codec.encode(EVENTS[1], "t")
    with pytest.raises(DecodeError, match="1 trailing bytes"):
        codec.decode(framed + b"\x00")


def test_corrupt_enum_is_a_decode_error() -> None:
    event = EnvAction(run_id="r", kind="RESET", domain="d")
    data = bytearray(Codec().encode(event))
    # The enum index follows the envelope; find it by re-encoding with another kind and diffing.
    other = Codec().encode(EnvAction(**{**_plain(event), "kind": EnvActionKind.CANCEL}))
    diff = [i for i, (a, b) in enumerate(zip(data, other, strict=True)) if a != b]
    assert len(diff) == 1
    data[diff[0]] = 0x7E  # index 63: no such symbol
    with pytest.raises(DecodeError, match="corrupt EnvAction body"):
        Codec().decode(bytes(data))


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)

"""Schema evolution: old writer / new reader and new writer / old reader, single-object and registry."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from rollstream.schemas.codec import Codec, DecodeError, load_schema_json
from rollstream.schemas.events import GenRequest, Observation, Turn, pack_logprobs, pack_tokens

ENVELOPE: dict[str, Any] = {
    "event_id": "e1",
    "run_id": "run-1",
    "trajectory_id": "traj-1",
    "group_id": "g-1",
    "policy_version": 2,
    "producer_id": "old@host:1",
    "created_at_ms": 1_780_000_000_000,
}


def _without(raw: dict[str, Any], name: str) -> dict[str, Any]:
    old = copy.deepcopy(raw)
    old["fields"] = [f for f in old["fields"] if f["name"] != name]
    return old


def _with_extra(raw: dict[str, Any], field: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(raw)
    new["fields"].append(field)
    return new


def _single_object(raw: dict[str, Any], record: dict[str, Any]) -> bytes:
    """Encode like a foreign writer would: fastavro directly, then the single-object header."""
    parsed = parse_schema(copy.deepcopy(raw))
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    return b"\xc3\x01" + fp + buf.getvalue()


def _old_gen_request_record() -> dict[str, Any]:
    return {
        **ENVELOPE,
        "domain": "math",
        "pool": "h20",
        "turn": 1,
        "prompt_text": "2+2?",
        "max_new_tokens": 8,
        "first_version": 1,
    }


def test_current_schema_gives_the_field_a_default() -> None:
    # The evolution below relies on it; if someone drops the default, old writers break.
    field = next(f for f in load_schema_json("GenRequest")["fields"] if f["name"] == "fallback_from")
    assert field["default"] == ""


def test_new_reader_decodes_old_writer_with_the_default() -> None:
    old = _without(load_schema_json("GenRequest"), "fallback_from")
    data = _single_object(old, _old_gen_request_record())
    codec = Codec()
    with pytest.raises(DecodeError, match="unknown schema fingerprint"):
        codec.decode(data)  # not taught yet
    fp = codec.add_writer_schema(old)
    assert data[2:10] == fp
    event = codec.decode(data)
    assert isinstance(event, GenRequest)
    assert event.fallback_from == ""  # the reader's default
    assert event.prompt_text == "2+2?" and event.max_new_tokens == 8 and event.first_version == 1
    assert event.created_at_ms == ENVELOPE["created_at_ms"]
    assert event.event_id == "e1"
    # The codec still writes the current schema, and reads that as before.
    assert codec.decode(codec.encode(event)) == event


def test_new_reader_decodes_old_observation_without_turns() -> None:
    # Observation.turns has a default ([]): a writer from before multi-turn trajectories.
    old = _without(load_schema_json("Observation"), "turns")
    record = {
        **ENVELOPE,
        "domain": "frozenlake",
        "pool": "",
        "turn": 0,
        "task_seed": 3,
        "text": "S...",
        "reward": 0.0,
        "terminated": False,
        "truncated": False,
        "terminal_state": "",
        "reason": "",
        "env_return": 0.0,
        "env_ms": 1.0,
        "first_version": -1,
        "info_json": "{}",
    }
    codec = Codec()
    codec.add_writer_schema(old)
    event = codec.decode(_single_object(old, record))
    assert isinstance(event, Observation)
    assert event.turns == []
    assert event.task_seed == 3


def test_old_reader_drops_the_field_of_a_newer_writer() -> None:
    new = _with_extra(
        load_schema_json("GenRequest"), {"name": "priority", "type": "int", "default": 0, "doc": "new"}
    )
    record = {**_old_gen_request_record(), "fallback_from": "h800", "priority": 7}
    data = _single_object(new, record)
    codec = Codec()
    codec.add_writer_schema(new)
    event = codec.decode(data)
    assert isinstance(event, GenRequest)
    assert event.fallback_from == "h800"
    assert not hasattr(event, "priority")
    assert event.to_record().keys() == {f["name"] for f in load_schema_json("GenRequest")["fields"]}


def test_newer_writer_with_a_nested_turn_field() -> None:
    raw = load_schema_json("Observation")
    new = copy.deepcopy(raw)
    turn_fields = next(f for f in new["fields"] if f["name"] == "turns")["type"]["items"]["fields"]
    turn_fields.append({"name": "ttft_ms", "type": "double", "default": 0.0})
    turn = Turn(
        turn=0,
        prompt_text="p",
        prompt_token_ids=pack_tokens([1, 2]),
        action_text="a",
        action_token_ids=pack_tokens([3]),
        behaviour_logprobs=pack_logprobs([-0.5]),
        policy_version=1,
    )
    current = Observation(run_id="run-1", domain="math", terminal_state="completed", turns=[turn])
    record = current.to_record()
    record["turns"] = [{**record["turns"][0], "ttft_ms": 12.0}]
    codec = Codec()
    codec.add_writer_schema(new)
    decoded = codec.decode(_single_object(new, record))
    assert decoded == current


def test_add_writer_schema_rejects_unknown_records() -> None:
    with pytest.raises(DecodeError, match="unknown record"):
        Codec().add_writer_schema(
            {"type": "record", "name": "Nope", "namespace": "x", "fields": [{"name": "a", "type": "int"}]}
        )


def test_incompatible_writer_schema_is_a_decode_error() -> None:
    # A field without a default that the writer lacks cannot be resolved: a decode error, not a crash.
    old = _without(load_schema_json("GenRequest"), "max_new_tokens")
    record = _old_gen_request_record()
    del record["max_new_tokens"]
    codec = Codec()
    codec.add_writer_schema(old)
    with pytest.raises(DecodeError, match="GenRequest"):
        codec.decode(_single_object(old, record))


# -- through a schema registry -------------------------------------------------------------------------


def _registered(registry: Any, subject: str, raw: dict[str, Any]) -> int:
    return int(registry.register_schema(subject, Schema(json.dumps(raw), "AVRO")))


def _confluent(schema_id: int, raw: dict[str, Any], record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parse_schema(copy.deepcopy(raw)), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + buf.getvalue()


def test_registry_old_writer_new_reader() -> None:
    registry = SchemaRegistryClient.new_client({"url": "mock://evolution-old"})
    old = _without(load_schema_json("GenRequest"), "fallback_from")
    schema_id = _registered(registry, "rollstream.r.gen-requests.h20-value", old)
    event = Codec(registry=registry).decode(_confluent(schema_id, old, _old_gen_request_record()))
    assert isinstance(event, GenRequest)
    assert event.fallback_from == ""
    assert event.max_new_tokens == 8


def test_registry_new_writer_old_reader() -> None:
    registry = SchemaRegistryClient.new_client({"url": "mock://evolution-new"})
    new = _with_extra(load_schema_json("GenRequest"), {"name": "priority", "type": "long", "default": 0})
    schema_id = _registered(registry, "rollstream.r.gen-requests.h20-value", new)
    record = {**_old_gen_request_record(), "fallback_from": "h800", "priority": 1 << 40}
    event = Codec(registry=registry).decode(_confluent(schema_id, new, record))
    assert isinstance(event, GenRequest)
    assert event.fallback_from == "h800"
    assert event.turn == 1


def test_registry_and_single_object_mixed_on_one_reader() -> None:
    registry = SchemaRegistryClient.new_client({"url": "mock://evolution-mixed"})
    old = _without(load_schema_json("GenRequest"), "fallback_from")
    schema_id = _registered(registry, "s-value", old)
    codec = Codec(registry=registry)
    codec.add_writer_schema(old)
    a = codec.decode(_confluent(schema_id, old, _old_gen_request_record()))
    b = codec.decode(_single_object(old, _old_gen_request_record()))
    assert a == b

"""Avro codec for every rollstream event, in both wire formats.

* Avro single-object encoding (``C3 01`` + 8-byte little-endian CRC-64-AVRO fingerprint + body),
  resolved from the `.avsc` files shipped in this package: the default, needs nothing else.
* Confluent Schema Registry framing (``00`` + 4-byte big-endian schema id + body), used when a
  registry client is configured, as production clusters do.

`decode` detects the format from the first byte, so a reader accepts both whatever it writes.
Writer schemas seen by fingerprint or registry id are resolved against the current reader schema,
which is what makes old-writer/new-reader evolution work.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from rollstream.schemas.events import EVENT_BY_SCHEMA, Event

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = 0
_CONFLUENT_HEADER = struct.Struct(">bI")


class DecodeError(ValueError):
    """A message that is not a rollstream event this reader can decode (goes to dead-letters)."""


@dataclass(frozen=True, slots=True)
class _Writer:
    event_type: type[Event]
    schema: Any  # parsed writer schema
    resolve: bool  # False when writer == reader: fastavro's fast path


def load_schema_json(name: str) -> dict[str, Any]:
    """The raw JSON of a shipped schema, by record name (e.g. ``"GenRequest"``)."""
    text = resources.files("rollstream.schemas").joinpath(f"{name}.avsc").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def schema_fingerprint(parsed: Any) -> bytes:
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


def _plain_timestamps(node: Any) -> Any:
    """A copy of a schema with ``timestamp-millis`` read and written as the plain long it is.

    The parsing canonical form (hence the fingerprint) ignores logical types, and our events hold
    ``created_at_ms`` as an int: converting to ``datetime`` and back costs time and, through a float, a
    millisecond now and then.
    """
    if isinstance(node, dict):
        if node.get("logicalType") == "timestamp-millis" and node.get("type") == "long":
            return "long"
        return {k: _plain_timestamps(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain_timestamps(v) for v in node]
    return node


def _parse(raw: dict[str, Any]) -> Any:
    # Keep fastavro's parsed marker: without it fastavro re-parses the schema on every read and
    # write, which is two thirds of the cost of a small event.
    return parse_schema(_plain_timestamps(raw))


class Codec:
    """Encodes and decodes events. Thread-safe for encode/decode after construction."""

    def __init__(self, registry: Any | None = None, subject_suffix: str = "-value") -> None:
        self._registry = registry
        self._subject_suffix = subject_suffix
        self._reader: dict[type[Event], Any] = {}
        self._reader_json: dict[type[Event], str] = {}
        self._header: dict[type[Event], bytes] = {}
        self._by_fingerprint: dict[bytes, _Writer] = {}
        self._by_registry_id: dict[int, _Writer] = {}
        self._registered: dict[tuple[type[Event], str], int] = {}
        for schema_name, event_type in EVENT_BY_SCHEMA.items():
            raw = load_schema_json(schema_name.rsplit(".", 1)[1])
            parsed = _parse(raw)
            fp = schema_fingerprint(parsed)
            self._reader[event_type] = parsed
            self._reader_json[event_type] = json.dumps(raw)
            self._by_fingerprint[fp] = _Writer(event_type, parsed, resolve=False)
            self._header[event_type] = SINGLE_OBJECT_MAGIC + fp

    # -- schema versions -------------------------------------------------------------------------
    def add_writer_schema(self, raw: dict[str, Any]) -> bytes:
        """Teach the reader an older or newer writer schema of a known record; returns its fingerprint."""
        parsed = _parse(raw)
        event_type = EVENT_BY_SCHEMA.get(parsed["name"])
        if event_type is None:
            raise DecodeError(f"unknown record {parsed['name']!r}")
        fp = schema_fingerprint(parsed)
        self._by_fingerprint.setdefault(fp, _Writer(event_type, parsed, resolve=True))
        return fp

    def reader_schema(self, event_type: type[Event]) -> Any:
        return self._reader[event_type]

    # -- encode ----------------------------------------------------------------------------------
    def encode(self, event: Event, topic: str | None = None) -> bytes:
        event_type = type(event)
        if self._registry is not None:
            if topic is None:
                raise ValueError("Confluent framing needs the topic (subject name strategy)")
            header = _CONFLUENT_HEADER.pack(CONFLUENT_MAGIC, self._registry_id(event_type, topic))
        else:
            header = self._header[event_type]
        buf = io.BytesIO(header)
        buf.seek(len(header))
        fastavro.schemaless_writer(buf, self._reader[event_type], event.to_record())
        return buf.getvalue()

    def _registry_id(self, event_type: type[Event], topic: str) -> int:
        from confluent_kafka.schema_registry import Schema

        assert self._registry is not None  # only called when a registry is configured

        key = (event_type, topic)
        schema_id = self._registered.get(key)
        if schema_id is None:
            schema = Schema(self._reader_json[event_type], "AVRO")
            schema_id = int(self._registry.register_schema(topic + self._subject_suffix, schema))
            self._registered[key] = schema_id
            self._by_registry_id[schema_id] = _Writer(event_type, self._reader[event_type], resolve=False)
        return schema_id

    # -- decode ----------------------------------------------------------------------------------
    def decode(self, data: bytes | None) -> Event:
        if not data:
            raise DecodeError("empty message")
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < 10:
                raise DecodeError("truncated single-object header")
            writer = self._by_fingerprint.get(data[2:10])
            if writer is None:
                raise DecodeError(f"unknown schema fingerprint {data[2:10].hex()}")
            body = 10
        elif data[0] == CONFLUENT_MAGIC:
            if len(data) < 5:
                raise DecodeError("truncated Confluent header")
            writer = self._writer_from_registry(_CONFLUENT_HEADER.unpack_from(data)[1])
            body = 5
        else:
            raise DecodeError(f"not an Avro event: first bytes {data[:4].hex()}")
        try:
            stream = io.BytesIO(data)
            stream.seek(body)
            if writer.resolve:
                record = fastavro.schemaless_reader(stream, writer.schema, self._reader[writer.event_type])
            else:
                record = fastavro.schemaless_reader(stream, writer.schema, None)
            if stream.tell() != len(data):
                raise DecodeError(f"{len(data) - stream.tell()} trailing bytes after the record")
            return writer.event_type.from_record(record)  # type: ignore[arg-type]
        except DecodeError:
            raise
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise DecodeError(
                f"corrupt {writer.event_type.__name__} body: {type(exc).__name__}: {exc}"
            ) from exc

    def _writer_from_registry(self, schema_id: int) -> _Writer:
        writer = self._by_registry_id.get(schema_id)
        if writer is not None:
            return writer
        if self._registry is None:
            raise DecodeError(
                f"Confluent-framed message (schema id {schema_id}) but no schema registry configured"
            )
        try:
            schema = self._registry.get_schema(schema_id)
        except Exception as exc:
            raise DecodeError(f"schema id {schema_id} not in the registry: {exc}") from exc
        raw = json.loads(schema.schema_str)
        parsed = _parse(raw)
        event_type = EVENT_BY_SCHEMA.get(parsed["name"])
        if event_type is None:
            raise DecodeError(f"schema id {schema_id} is {parsed['name']!r}, not a rollstream event")
        same = schema_fingerprint(parsed) == schema_fingerprint(self._reader[event_type])
        writer = _Writer(event_type, parsed, resolve=not same)
        self._by_registry_id[schema_id] = writer
        return writer


def make_codec(schema_registry_url: str | None = None, registry_conf: dict[str, str] | None = None) -> Codec:
    """A codec with Confluent framing when a registry URL is given (``mock://`` works for tests)."""
    if not schema_registry_url:
        return Codec()
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conf = {"url": schema_registry_url, **(registry_conf or {})}
    return Codec(registry=SchemaRegistryClient.new_client(conf))

"""`rollstream tap`: read a run's topics live without touching training.

A tap *assigns* partitions (no group membership, so no rebalance of any training group) under a throwaway
group id with auto-commit off, and never commits: every group's committed offsets stay as they were.
`TopicReader` is the shared reader of `tap`, `top`, `report` and the analytics fallback.
"""

from __future__ import annotations

import ast
import json
import operator
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TextIO

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from rollstream.clients import base_conf
from rollstream.config import Config
from rollstream.schemas.codec import Codec, DecodeError, make_codec
from rollstream.schemas.events import (
    DeadLetter,
    EnvAction,
    Event,
    GenRequest,
    Observation,
    ScoredTrajectory,
    WeightVersion,
)
from rollstream.topics.specs import (
    DEAD_LETTERS,
    ENV_ACTIONS,
    GEN_REQUESTS,
    OBSERVATIONS,
    SCORED,
    WEIGHT_VERSIONS,
    RunTopics,
)

FAMILY_EVENT: dict[str, type[Event]] = {
    OBSERVATIONS: Observation,
    SCORED: ScoredTrajectory,
    ENV_ACTIONS: EnvAction,
    GEN_REQUESTS: GenRequest,
    WEIGHT_VERSIONS: WeightVersion,
    DEAD_LETTERS: DeadLetter,
}
_ENVELOPE_NOISE = ("run_id", "event_id", "producer_id")
_TOKEN_FIELDS = ("prompt_token_ids", "action_token_ids")
_LOGPROB_FIELDS = ("behaviour_logprobs",)
_COUNT_NAME = {
    "prompt_token_ids": "prompt_tokens",
    "action_token_ids": "action_tokens",
    "behaviour_logprobs": "logprobs_n",
}


# -- topics ---------------------------------------------------------------------------------------------
def resolve_topics(family: str, topics: RunTopics, existing: set[str]) -> list[str]:
    """A family name (``gen-requests`` means every pool, ``gen-requests.h20`` one) -> topic names."""
    base = family.split(".", 1)[0]
    if base not in FAMILY_EVENT:
        raise ValueError(f"unknown topic family {family!r} (known: {', '.join(FAMILY_EVENT)})")
    if family == GEN_REQUESTS:
        prefix = topics.name(GEN_REQUESTS) + "."
        names = sorted(t for t in existing if t.startswith(prefix))
    else:
        name = topics.name(base, family.split(".", 1)[1] if "." in family else None)
        names = [name] if name in existing else []
    if not names:
        raise ValueError(f"no topic for {family!r} in run {topics.run_id!r}")
    return names


def parse_since(text: str) -> float:
    """``90s``, ``5m``, ``2h``, ``1d`` (or plain seconds) -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise ValueError(f"--since: expected e.g. 30s, 5m, 2h; got {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


class TopicReader:
    """Reads topics by assignment from a start point; commits nothing, joins no group.

    ``start``: ``"end"`` (only new events), ``"beginning"``, or a wall-clock time in ms (offsets_for_times).
    """

    def __init__(
        self,
        cfg: Config,
        bootstrap: str,
        topic_names: list[str],
        start: str | int = "end",
        codec: Codec | None = None,
    ) -> None:
        conf = base_conf(cfg, bootstrap)
        self.admin = AdminClient(conf)
        conf.update(
            {
                # A group id nobody else uses: assign() needs one, and nothing is ever committed under it.
                "group.id": f"rollstream-tap-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "fetch.message.max.bytes": cfg.kafka.max_message_bytes,
                # small fetch waits: a tap competes for nothing, but should not sit on data either
                "fetch.wait.max.ms": 100,
            }
        )
        self.consumer = Consumer(conf)
        self.codec = codec or make_codec(cfg.kafka.schema_registry_url or None)
        parts: list[TopicPartition] = []
        for name in topic_names:
            t = self._wait_for_topic(name)
            parts += [TopicPartition(name, p) for p in sorted(t.partitions)]
        if isinstance(start, int):
            parts = self.consumer.offsets_for_times(
                [TopicPartition(p.topic, p.partition, start) for p in parts], timeout=10
            )
            # past the newest message: offsets_for_times says -1 (end)
            parts = [
                TopicPartition(p.topic, p.partition, p.offset if p.offset >= 0 else OFFSET_END) for p in parts
            ]
        else:
            offset = OFFSET_BEGINNING if start == "beginning" else OFFSET_END
            parts = [TopicPartition(p.topic, p.partition, offset) for p in parts]
        self.partitions = [(p.topic, p.partition) for p in parts]
        self._eof: set[tuple[str, int]] = set()
        self.consumer.assign(parts)

    def _wait_for_topic(self, name: str, timeout_s: float = 10.0) -> Any:
        """Topic metadata; a topic created a moment ago may take a little while to be listed."""
        deadline = time.monotonic() + timeout_s
        while True:
            t = self.admin.list_topics(name, timeout=10).topics.get(name)
            if t is not None and t.error is None:
                return t
            if time.monotonic() >= deadline:
                raise ValueError(f"topic {name} does not exist")
            time.sleep(0.2)

    @property
    def caught_up(self) -> bool:
        """Every partition reached its end at least once since the last message on it."""
        return len(self._eof) == len(self.partitions)

    def poll(self, max_messages: int = 500, timeout: float = 0.2) -> Iterator[tuple[Message, Event | None]]:
        """(message, event) pairs; event is None when the message does not decode."""
        for msg in self.consumer.consume(max_messages, timeout):
            err = msg.error()
            tp = (str(msg.topic()), int(msg.partition() or 0))
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._eof.add(tp)
                continue
            self._eof.discard(tp)
            try:
                event: Event | None = self.codec.decode(msg.value())
            except DecodeError:
                event = None
            yield msg, event

    def drain(self, timeout_s: float = 30.0) -> Iterator[tuple[Message, Event | None]]:
        """Everything up to the current end of every partition (or until timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while not self.caught_up and time.monotonic() < deadline:
            yield from self.poll()

    def close(self) -> None:
        self.consumer.close()  # no commit: enable.auto.commit is off and we never call commit()


# -- --where -------------------------------------------------------------------------------------------
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


class WhereError(ValueError):
    pass


def compile_where(expr: str, allowed: set[str] | None = None) -> Callable[[dict[str, Any]], bool]:
    """A filter over an event's fields, from a Python-like expression, without eval.

    Allowed: comparisons (== != < <= > >= in, not in), and/or/not, unary minus, field names, and literals
    (numbers, strings, True/False/None, tuples/lists of literals). Anything else is rejected at parse time,
    so a --where can never call, import or reach attributes.
    """
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise WhereError(f"--where: {exc.msg}: {expr!r}") from None

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Expression):
            check(node.body)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                check(v)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
            check(node.operand)
        elif isinstance(node, ast.Compare):
            if not all(type(op) in _COMPARE for op in node.ops):
                raise WhereError("--where: unsupported comparison")
            for n in (node.left, *node.comparators):
                check(n)
        elif isinstance(node, ast.Name):
            if allowed is not None and node.id not in allowed:
                raise WhereError(f"--where: unknown field {node.id!r} (fields: {', '.join(sorted(allowed))})")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, str | int | float | bool | type(None)):
                raise WhereError("--where: unsupported literal")
        elif isinstance(node, ast.Tuple | ast.List):
            for e in node.elts:
                if not isinstance(e, ast.Constant):
                    raise WhereError("--where: only literals inside a list")
                check(e)
        else:
            raise WhereError(
                f"--where: {type(node).__name__} is not allowed (only comparisons and and/or/not)"
            )

    check(tree)

    def ev(node: ast.AST, row: dict[str, Any]) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body, row)
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(ev(v, row) for v in node.values)
            return any(ev(v, row) for v in node.values)
        if isinstance(node, ast.UnaryOp):
            value = ev(node.operand, row)
            return (not value) if isinstance(node.op, ast.Not) else -value
        if isinstance(node, ast.Compare):
            left = ev(node.left, row)
            for op, comp in zip(node.ops, node.comparators, strict=True):
                right = ev(comp, row)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Name):
            return row.get(node.id)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Tuple | ast.List):
            return tuple(ev(e, row) for e in node.elts)
        raise WhereError(type(node).__name__)  # unreachable: check() rejected it

    def predicate(row: dict[str, Any]) -> bool:
        try:
            return bool(ev(tree, row))
        except TypeError:  # e.g. None > 0.5 on an event without that field: not a match
            return False

    return predicate


def fields_of(event_type: type[Event]) -> set[str]:
    from dataclasses import fields

    names = {f.name for f in fields(event_type)} - set(_COUNT_NAME) - {"turns"}
    return (
        names
        | set(_COUNT_NAME.values())
        | {"type", "tokens", "gen_ms", "env_ms", "staleness", "num_turns", "pool"}
    )


# -- rendering -------------------------------------------------------------------------------------------
def event_view(event: Event) -> dict[str, Any]:
    """A flat, JSON-able view: bytes as token / value counts, turns summarised, a few derived fields."""
    out: dict[str, Any] = {"type": type(event).__name__}
    record = event.to_record()
    for name, value in record.items():
        if name in _TOKEN_FIELDS or name in _LOGPROB_FIELDS:
            # packed little-endian int32 / float32: 4 bytes per token
            out[_COUNT_NAME[name]] = len(value or b"") // 4
        elif isinstance(value, bytes):
            out[name + "_bytes"] = len(value)
        elif name == "turns":
            out["num_turns"] = len(value)
        elif name in ("buckets", "samples", "dropped", "trainer_state"):
            out[name + "_n"] = len(value)
        elif value is None and name.startswith("original_"):
            out[name + "_bytes"] = 0
        else:
            out[name] = value
    turns = getattr(event, "turns", None)
    if turns:
        out["tokens"] = sum(len(t.action_token_ids) // 4 for t in turns)
        out["gen_ms"] = round(sum(t.gen_ms for t in turns), 3)
        out["env_ms"] = round(sum(t.env_ms for t in turns), 3)
        out.setdefault("pool", turns[-1].pool)
    elif isinstance(event, EnvAction):
        out["tokens"] = len(event.action_token_ids) // 4
    if isinstance(event, ScoredTrajectory):
        out["staleness"] = event.last_version - event.first_version
    return out


def _short(value: Any, width: int = 48) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = value if isinstance(value, str) else json.dumps(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def format_line(view: dict[str, Any], msg: Message) -> str:
    ts = datetime.fromtimestamp(msg.timestamp()[1] / 1000).strftime("%H:%M:%S.%f")[:-3]
    head = f"{ts} {str(msg.topic()).rsplit('.', 1)[-1]}[{msg.partition()}]@{msg.offset()} {view['type']}"
    skip = {"type", "created_at_ms", *_ENVELOPE_NOISE}
    body = " ".join(
        f"{k}={_short(v)}" for k, v in view.items() if k not in skip and v not in ("", None, "{}", {}, [])
    )
    return f"{head} {body}"


def run_tap(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    family: str,
    *,
    where: str | None = None,
    start: str | int = "end",
    limit: int | None = None,
    as_json: bool = False,
    out: TextIO = sys.stdout,
    idle_exit_s: float | None = None,
) -> int:
    """Print matching events until `limit` of them, Ctrl-C, or (tests) `idle_exit_s` without news."""
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    admin = AdminClient(base_conf(cfg, bootstrap))
    names = resolve_topics(family, topics, set(admin.list_topics(timeout=10).topics))
    event_type = FAMILY_EVENT[family.split(".", 1)[0]]
    predicate = compile_where(where, fields_of(event_type)) if where else None
    reader = TopicReader(cfg, bootstrap, names, start)
    shown = 0
    last_news = time.monotonic()
    try:
        while limit is None or shown < limit:
            got = False
            for msg, event in reader.poll(timeout=0.2):
                got = True
                if event is None:
                    view: dict[str, Any] = {"type": "undecodable", "bytes": len(msg.value() or b"")}
                else:
                    view = event_view(event)
                if predicate is not None and not predicate(view):
                    continue
                if as_json:
                    out.write(
                        json.dumps(
                            {
                                **view,
                                "_topic": msg.topic(),
                                "_partition": msg.partition(),
                                "_offset": msg.offset(),
                                "_timestamp_ms": msg.timestamp()[1],
                            }
                        )
                        + "\n"
                    )
                else:
                    out.write(format_line(view, msg) + "\n")
                out.flush()
                shown += 1
                if limit is not None and shown >= limit:
                    break
            if got:
                last_news = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - last_news > idle_exit_s:
                break
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
    return shown

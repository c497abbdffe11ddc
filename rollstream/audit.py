"""`rollstream audit`: check a run's topics against ARCHITECTURE section 5 (nothing lost, nothing twice).

The rules are pure functions over decoded events (a `RunLog`), so they are unit-tested without a broker;
`read_run_log` fills a `RunLog` from the run's topics by assignment (read_committed, commits nothing).

Terminal state of a trajectory, from the latest stage that speaks about it:
  terminal observation (aborted / failed / cancelled / completed) -> scored (a reward error turns completed
  into failed) -> weight-versions (completed -> trained at version n, or dropped with a reason).
A completed trajectory the trainer has not consumed yet is ``pending``; a launched one without a terminal
observation is ``open``. Both are normal in a run that was stopped mid-flight (the log cannot tell a paused
run from a lost trajectory), so they are violations only with ``require_closed``.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from rollstream.clients import make_consumer
from rollstream.config import Config
from rollstream.schemas.codec import DecodeError, make_codec
from rollstream.schemas.events import (
    DeadLetter,
    EnvAction,
    EnvActionKind,
    Event,
    Observation,
    SampleRef,
    ScoredTrajectory,
    TerminalState,
    WeightVersion,
)
from rollstream.topics.specs import (
    DEAD_LETTERS,
    ENV_ACTIONS,
    OBSERVATIONS,
    SCORED,
    WEIGHT_VERSIONS,
    RunTopics,
)

RefKey = tuple[str, int, int]  # topic, partition, offset
WEIGHT_TOLERANCE = 1e-9  # recorded weights are float64 from the same formula; allow only rounding


@dataclass(frozen=True)
class Violation:
    rule: str
    subject: str  # trajectory id, version, or topic[partition]@offset
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "subject": self.subject, "detail": self.detail}


@dataclass
class RunLog:
    """Everything the audit needs, decoded. Fill it with `add` (the reader) or directly (tests)."""

    run_id: str
    prefix: str = "rollstream"
    resets: dict[str, EnvAction] = field(default_factory=dict)  # first RESET per trajectory id
    duplicate_resets: Counter[str] = field(default_factory=Counter)
    terminals: dict[str, list[Observation]] = field(default_factory=lambda: defaultdict(list))
    scored: dict[RefKey, ScoredTrajectory] = field(default_factory=dict)
    versions: list[WeightVersion] = field(default_factory=list)  # in log order
    dead_letters: list[DeadLetter] = field(default_factory=list)
    undecodable: list[tuple[str, int, int, str]] = field(default_factory=list)  # topic, part, offset, why
    messages: Counter[str] = field(default_factory=Counter)  # per topic family

    @property
    def scored_topic(self) -> str:
        return RunTopics(self.run_id, self.prefix).scored

    def add(
        self, family: str, topic: str, partition: int, offset: int, event: Event | None, why: str = ""
    ) -> None:
        self.messages[family] += 1
        if event is None:
            if family != DEAD_LETTERS:
                self.undecodable.append((topic, partition, offset, why))
            return
        if event.run_id != self.run_id and family != WEIGHT_VERSIONS:
            self.undecodable.append((topic, partition, offset, f"wrong-run {event.run_id!r}"))
            return
        if family == ENV_ACTIONS and isinstance(event, EnvAction) and event.kind is EnvActionKind.RESET:
            if event.trajectory_id in self.resets:
                self.duplicate_resets[event.trajectory_id] += 1
            else:
                self.resets[event.trajectory_id] = event
        elif family == OBSERVATIONS and isinstance(event, Observation) and event.is_terminal:
            self.terminals[event.trajectory_id].append(event)
        elif family == SCORED and isinstance(event, ScoredTrajectory):
            self.scored[(topic, partition, offset)] = event
        elif family == WEIGHT_VERSIONS and isinstance(event, WeightVersion) and event.run_id == self.run_id:
            self.versions.append(event)
        elif family == DEAD_LETTERS and isinstance(event, DeadLetter):
            self.dead_letters.append(event)


@dataclass
class AuditReport:
    run_id: str
    violations: list[Violation]
    states: Counter[str]  # final terminal state -> trajectories
    counts: dict[str, int]
    dead_letters: Counter[str]  # "<family>:<reason>" -> count

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        by_rule = Counter(v.rule for v in self.violations)
        return {
            "run": self.run_id,
            "ok": self.ok,
            "states": dict(sorted(self.states.items())),
            "counts": self.counts,
            "dead_letters": dict(sorted(self.dead_letters.items())),
            "violations_by_rule": dict(sorted(by_rule.items())),
            "violations": [v.as_dict() for v in self.violations],
        }


# -- helpers --------------------------------------------------------------------------------------------
def _ref_key(ref: SampleRef) -> RefKey:
    return (ref.topic, ref.partition, ref.offset)


def version_hyperparams(wv: WeightVersion) -> dict[str, Any]:
    try:
        data = json.loads(wv.hyperparams_json or "{}")
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def staleness_rule(wv: WeightVersion) -> tuple[int, str, float] | None:
    """(alpha, policy, gamma) the version was trained under, from its recorded hyper-parameters."""
    trainer = version_hyperparams(wv).get("trainer", {})
    if not isinstance(trainer, dict) or "alpha" not in trainer:
        return None
    return int(trainer["alpha"]), str(trainer.get("staleness_policy", "drop")), float(trainer.get("gamma", 0))


def fork_origin(wv: WeightVersion) -> dict[str, Any] | None:
    fork = version_hyperparams(wv).get("fork")
    return fork if isinstance(fork, dict) else None


# -- rules ----------------------------------------------------------------------------------------------
def rule_versions(log: RunLog) -> list[Violation]:
    """Versions 0, 1, 2, ... in log order, each naming its predecessor (a fork starts at its root)."""
    out: list[Violation] = []
    prev: WeightVersion | None = None
    seen: set[int] = set()
    for wv in log.versions:
        subject = f"v{wv.version}"
        if wv.version in seen:
            out.append(Violation("versions", subject, "version published twice"))
            continue
        seen.add(wv.version)
        if prev is None:
            fork = fork_origin(wv)
            if wv.version != 0 and not (fork and int(fork.get("from_version", -1)) == wv.version):
                out.append(Violation("versions", subject, "lineage does not start at version 0"))
            if wv.version == 0 and wv.parent_version != -1:
                out.append(Violation("versions", subject, f"version 0 has parent {wv.parent_version}"))
        else:
            if wv.version != prev.version + 1:
                out.append(
                    Violation("versions", subject, f"gap: follows v{prev.version} (missing or out of order)")
                )
            if wv.parent_version != prev.version:
                out.append(
                    Violation(
                        "versions",
                        subject,
                        f"parent is v{wv.parent_version}, previous version is v{prev.version}",
                    )
                )
        prev = wv
    return out


def rule_no_double_training(log: RunLog) -> list[Violation]:
    """No message consumed twice (trained or dropped) and no trajectory trained twice, across all versions."""
    out: list[Violation] = []
    first_use: dict[RefKey, str] = {}
    trained_at: dict[str, int] = {}
    for wv in log.versions:
        for kind, refs in (("trained", wv.samples), ("dropped", wv.dropped)):
            for ref in refs:
                key = _ref_key(ref)
                here = f"{kind} in v{wv.version}"
                if key in first_use:
                    out.append(
                        Violation(
                            "no-twice",
                            ref.trajectory_id,
                            f"{key[0]}[{key[1]}]@{key[2]} {here}, already {first_use[key]}",
                        )
                    )
                else:
                    first_use[key] = here
                if kind == "trained":
                    if ref.trajectory_id in trained_at:
                        out.append(
                            Violation(
                                "no-twice",
                                ref.trajectory_id,
                                f"trained in v{trained_at[ref.trajectory_id]} and again in v{wv.version}",
                            )
                        )
                    else:
                        trained_at[ref.trajectory_id] = wv.version
    return out


def rule_staleness(log: RunLog) -> list[Violation]:
    """Trained at version n (parent K): K - v(t) <= alpha under `drop`; weight = exp(-gamma*max(0, K-v-alpha))
    under `downweight`. A `stale` drop must have had K - v(t) > alpha."""
    out: list[Violation] = []
    for wv in log.versions:
        rule = staleness_rule(wv)
        if rule is None:
            if wv.samples:
                out.append(Violation("staleness", f"v{wv.version}", "no recorded alpha: cannot check"))
            continue
        alpha, policy, gamma = rule
        k = wv.parent_version
        for ref in wv.samples:
            lag = k - ref.first_version
            if policy == "downweight":
                want = math.exp(-gamma * max(0, lag - alpha))
                if abs(ref.weight - want) > WEIGHT_TOLERANCE:
                    out.append(
                        Violation(
                            "staleness",
                            ref.trajectory_id,
                            f"v{wv.version}: weight {ref.weight!r} != "
                            f"exp(-{gamma}*max(0,{lag}-{alpha})) = {want!r}",
                        )
                    )
            elif lag > alpha:
                out.append(
                    Violation(
                        "staleness",
                        ref.trajectory_id,
                        f"trained in v{wv.version} at K={k} with v(t)={ref.first_version}: "
                        f"K - v = {lag} > alpha = {alpha}",
                    )
                )
        for ref in wv.dropped:
            if ref.reason == "stale" and policy == "drop" and k - ref.first_version <= alpha:
                out.append(
                    Violation(
                        "staleness",
                        ref.trajectory_id,
                        f"dropped stale in v{wv.version} but K - v = "
                        f"{k - ref.first_version} <= alpha = {alpha}",
                    )
                )
    return out


def rule_sample_refs(log: RunLog) -> list[Violation]:
    """Every sample a version names is a completed scored trajectory at that exact topic/partition/offset."""
    out: list[Violation] = []
    for wv in log.versions:
        for kind, refs in (("trained", wv.samples), ("dropped", wv.dropped)):
            for ref in refs:
                key = _ref_key(ref)
                if key[0] != log.scored_topic:
                    continue  # a fork names its parent run's messages: auditing that run checks them
                event = log.scored.get(key)
                if event is None:
                    out.append(
                        Violation(
                            "sample-refs",
                            ref.trajectory_id,
                            f"v{wv.version} {kind} {key[0]}[{key[1]}]@{key[2]}: no scored message there",
                        )
                    )
                    continue
                if event.trajectory_id != ref.trajectory_id:
                    out.append(
                        Violation(
                            "sample-refs",
                            ref.trajectory_id,
                            f"v{wv.version}: offset {key[2]} holds trajectory {event.trajectory_id}",
                        )
                    )
                elif kind == "trained" and event.terminal_state != TerminalState.COMPLETED.value:
                    out.append(
                        Violation(
                            "sample-refs",
                            ref.trajectory_id,
                            f"trained in v{wv.version} but scored as {event.terminal_state}",
                        )
                    )
    return out


def terminal_states(log: RunLog, require_closed: bool = False) -> tuple[Counter[str], list[Violation]]:
    """Final state of every launched trajectory, and the violations of 'exactly one terminal state'."""
    out: list[Violation] = []
    trained: dict[str, list[int]] = defaultdict(list)
    dropped: dict[str, list[str]] = defaultdict(list)
    for wv in log.versions:
        for ref in wv.samples:
            if ref.topic == log.scored_topic:  # a fork's samples belong to its parent run
                trained[ref.trajectory_id].append(wv.version)
        for ref in wv.dropped:
            if ref.topic == log.scored_topic:
                dropped[ref.trajectory_id].append(ref.reason or "dropped")
    scored_state: dict[str, str] = {}
    for event in log.scored.values():
        prev = scored_state.get(event.trajectory_id)
        # A reward error turns "completed" into "failed"; keep the non-completed verdict when both appear.
        if prev is None or prev == TerminalState.COMPLETED.value:
            scored_state[event.trajectory_id] = event.terminal_state
    states: Counter[str] = Counter()
    for tid in sorted(log.resets.keys() | log.terminals.keys()):
        obs = log.terminals.get(tid, [])
        if tid not in log.resets:
            out.append(
                Violation("terminal", tid, "terminal state for a trajectory never launched (no RESET)")
            )
        distinct = sorted({o.terminal_state for o in obs})
        if len(distinct) > 1:
            out.append(Violation("terminal", tid, f"{len(distinct)} terminal states: {', '.join(distinct)}"))
        if not obs:
            states["open"] += 1
            if require_closed:
                out.append(Violation("terminal", tid, "launched, never reached a terminal state"))
            if tid in trained or tid in dropped:
                out.append(Violation("terminal", tid, "trained/dropped without a terminal observation"))
            continue
        state = scored_state.get(tid, distinct[-1] if len(distinct) == 1 else "conflict")
        if tid in trained and tid in dropped:
            out.append(
                Violation(
                    "terminal", tid, f"both trained (v{trained[tid][0]}) and dropped ({dropped[tid][0]})"
                )
            )
        if tid in trained:
            if state != TerminalState.COMPLETED.value:
                out.append(Violation("terminal", tid, f"trained but its terminal state is {state}"))
            states["trained"] += 1
        elif tid in dropped:
            states[f"dropped-{dropped[tid][0]}"] += 1
        elif state == TerminalState.COMPLETED.value:
            states["pending"] += 1  # scored, not yet consumed by the trainer (or not yet scored)
            if require_closed:
                out.append(Violation("terminal", tid, "completed but neither trained nor dropped"))
        else:
            states[state] += 1
    for tid in trained.keys() | dropped.keys():
        if tid not in log.resets and tid not in log.terminals:
            out.append(Violation("terminal", tid, "trained/dropped but never launched on this run"))
    return states, out


def rule_dead_letters(log: RunLog) -> tuple[Counter[str], list[Violation]]:
    """Every message no reader could decode has a dead-letter; dead-letters counted by cause."""
    counts: Counter[str] = Counter()
    lettered: set[tuple[str, int, int]] = set()
    for dl in log.dead_letters:
        family = dl.original_topic.split(f".{log.run_id}.", 1)[-1].split(".", 1)[0]
        counts[f"{family}:{dl.reason}"] += 1
        lettered.add((dl.original_topic, dl.original_partition, dl.original_offset))
    out = [
        Violation(
            "dead-letters", f"{topic}[{part}]@{offset}", f"undecodable ({why[:120]}) and not dead-lettered"
        )
        for topic, part, offset, why in log.undecodable
        if (topic, part, offset) not in lettered and not topic.endswith(f".{WEIGHT_VERSIONS}")
    ]
    # weight-versions has no consumer that dead-letters: an undecodable version is a lineage break.
    out += [
        Violation("versions", f"{topic}[{part}]@{offset}", f"undecodable weight-version event ({why[:120]})")
        for topic, part, offset, why in log.undecodable
        if topic.endswith(f".{WEIGHT_VERSIONS}")
    ]
    return counts, out


def audit(log: RunLog, *, require_closed: bool = False) -> AuditReport:
    states, terminal_violations = terminal_states(log, require_closed)
    dead, dead_violations = rule_dead_letters(log)
    violations = [
        *rule_versions(log),
        *rule_no_double_training(log),
        *rule_staleness(log),
        *rule_sample_refs(log),
        *terminal_violations,
        *dead_violations,
    ]
    counts = {
        "launched": len(log.resets),
        "duplicate_resets": sum(log.duplicate_resets.values()),
        "terminal_events": sum(len(v) for v in log.terminals.values()),
        "scored": len(log.scored),
        "versions": len(log.versions),
        "last_version": log.versions[-1].version if log.versions else -1,
        "trained_samples": sum(len(v.samples) for v in log.versions),
        "dropped_samples": sum(len(v.dropped) for v in log.versions),
        "dead_letters": len(log.dead_letters),
        "undecodable": len(log.undecodable),
        **{f"messages.{k}": v for k, v in sorted(log.messages.items())},
    }
    return AuditReport(log.run_id, violations, states, counts, dead)


# -- reading topics -------------------------------------------------------------------------------------
def run_topic_names(cfg: Config, bootstrap: str, run_id: str) -> list[str]:
    """Every existing topic of the run (gen-requests per pool included), from broker metadata."""
    from confluent_kafka.admin import AdminClient

    from rollstream.clients import base_conf

    prefix = f"{cfg.kafka.topic_prefix}.{run_id}."
    md = AdminClient(base_conf(cfg, bootstrap)).list_topics(timeout=15)
    return sorted(t for t in md.topics if t.startswith(prefix))


def read_topics(
    cfg: Config, bootstrap: str, topics: list[str], *, timeout_s: float = 300.0
) -> Iterator[tuple[str, int, int, bytes | None]]:
    """(topic, partition, offset, value) of every committed message, by assignment, committing nothing."""
    consumer = make_consumer(
        cfg,
        bootstrap,
        f"{cfg.kafka.topic_prefix}.reader-{uuid.uuid4().hex[:8]}",
        "reader",
        **{"enable.partition.eof": True, "isolation.level": "read_committed"},
    )
    try:
        md = consumer.list_topics(timeout=15)
        parts: list[TopicPartition] = []
        for topic in topics:
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None:
                continue
            for p in sorted(meta.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high > low:
                    parts.append(TopicPartition(topic, p, OFFSET_BEGINNING))
        if not parts:
            return
        pending = {(tp.topic, tp.partition) for tp in parts}
        consumer.assign(parts)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard((msg.topic(), msg.partition()))
                    continue
                yield str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0), msg.value()
        if pending:
            raise TimeoutError(f"did not reach the end of {sorted(pending)[:3]} in {timeout_s:.0f}s")
    finally:
        consumer.close()


def read_run_log(cfg: Config, bootstrap: str, run_id: str, *, families: set[str] | None = None) -> RunLog:
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    codec = make_codec(cfg.kafka.schema_registry_url or None)
    names = [
        t
        for t in run_topic_names(cfg, bootstrap, run_id)
        if families is None or topics.family_of(t) in families
    ]
    log = RunLog(run_id, cfg.kafka.topic_prefix)
    for topic, partition, offset, value in read_topics(cfg, bootstrap, names):
        family = topics.family_of(topic)
        try:
            event: Event | None = codec.decode(value) if value is not None else None
            why = "" if value is not None else "null value"
        except DecodeError as exc:
            event, why = None, str(exc)
        log.add(family, topic, partition, offset, event, why)
    return log


# -- output ---------------------------------------------------------------------------------------------
def format_report(report: AuditReport, limit: int = 20) -> str:
    lines = [
        f"audit of run {report.run_id}: {'OK' if report.ok else f'{len(report.violations)} VIOLATION(S)'}"
    ]
    lines.append("")
    lines.append(f"{'terminal state':32} {'trajectories':>12}")
    for state, n in sorted(report.states.items()):
        lines.append(f"{state:32} {n:>12}")
    lines.append("")
    lines.append(f"{'count':32} {'value':>12}")
    for key, n in report.counts.items():
        lines.append(f"{key:32} {n:>12}")
    if report.dead_letters:
        lines.append("")
        lines.append(f"{'dead-letters (topic:reason)':32} {'count':>12}")
        for key, n in sorted(report.dead_letters.items()):
            lines.append(f"{key:32} {n:>12}")
    if report.violations:
        lines.append("")
        lines.append(f"{'rule':14} {'subject':40} detail")
        for v in report.violations[:limit]:
            lines.append(f"{v.rule:14} {v.subject[:40]:40} {v.detail}")
        if len(report.violations) > limit:
            lines.append(f"... and {len(report.violations) - limit} more (use --json for all)")
    return "\n".join(lines)

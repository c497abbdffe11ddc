"""`rollstream replay` and `rollstream fork`: re-run a run's training from its log (ARCHITECTURE section 7).

Replay: ``weight-versions`` names, for every version, the exact scored messages it trained on (topic,
partition, offset), their per-sample weights and the hyper-parameters. Replay fetches those messages by
assignment (read_committed, commits nothing), rebuilds the GRPO groups by group id, and applies the trainer's
own update (`build_policy(seed)`, `make_optimizer`, `train_step`) version after version, checking each
version's ``weights_sha256`` and bucket checksums (and the optimizer-state buckets) against the record.
No generation, environment or reward worker is involved.

Fork: replay to version K (or load K's weights and optimizer state from the weight store), then train on the
same log with changed trainer hyper-parameters as a new run R2: R2's version n is trained on the samples the
original version n named, with the staleness rule re-applied under the new alpha/policy/gamma and
min_group_size. R2's lineage starts with a root event for version K (hyper-parameters carry
``{"fork": {"from_run", "from_version"}}``), so R2 can itself be replayed, audited, evaluated or trained on.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import safetensors.torch
import torch
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from transformers import PreTrainedModel

from rollstream.clients import make_consumer, make_producer
from rollstream.config import Config, load_config
from rollstream.schemas.codec import DecodeError, make_codec
from rollstream.schemas.events import (
    SampleRef,
    ScoredTrajectory,
    TerminalState,
    WeightBucket,
    WeightVersion,
    default_producer_id,
)
from rollstream.topics.specs import RunTopics
from rollstream.workers.policy import build_policy, state_dict_checksum
from rollstream.workers.trainer.grpo import GrpoConfig, Sample, make_optimizer, train_step
from rollstream.workers.trainer.service import (
    Lineage,
    flatten_optimizer,
    read_lineage,
    restore_optimizer,
    to_sample,
)
from rollstream.workers.trainer.weight_store import (
    BucketRef,
    WeightStoreError,
    open_weight_store,
    split_buckets,
)

RefKey = tuple[str, int, int]
DEFAULT_BUCKET_MB = 4.0  # TrainerConfig.bucket_mb's default, for records that predate it


class ReplayError(RuntimeError):
    pass


# -- recorded hyper-parameters ----------------------------------------------------------------------------
def recorded_hyperparams(wv: WeightVersion) -> dict[str, Any]:
    data = json.loads(wv.hyperparams_json or "{}")
    return data if isinstance(data, dict) else {}


def grpo_from_record(grpo: dict[str, Any]) -> GrpoConfig:
    known = set(GrpoConfig.__dataclass_fields__)
    values = {k: v for k, v in grpo.items() if k in known}
    if "betas" in values:
        values["betas"] = tuple(values["betas"])  # JSON turns the tuple into a list
    return GrpoConfig(**values)


def version_grpo(wv: WeightVersion) -> GrpoConfig:
    hp = recorded_hyperparams(wv)
    if "grpo" not in hp:
        raise ReplayError(f"version {wv.version} records no GRPO hyper-parameters")
    return grpo_from_record(hp["grpo"])


def version_trainer(wv: WeightVersion) -> dict[str, Any]:
    trainer = recorded_hyperparams(wv).get("trainer", {})
    return trainer if isinstance(trainer, dict) else {}


def set_optimizer_hparams(optimizer: torch.optim.Optimizer, grpo: GrpoConfig) -> None:
    # A trainer restarted with another config builds its optimizer from that config; mirror it per version.
    for group in optimizer.param_groups:
        group["lr"] = grpo.lr
        group["betas"] = grpo.betas
        group["weight_decay"] = grpo.weight_decay


# -- checksums --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BucketSum:
    index: int
    sha256: str
    size: int
    names: tuple[str, ...]


def bucket_checksums(state: dict[str, torch.Tensor], bucket_mb: float) -> list[BucketSum]:
    """What `WeightStore.publish` would write, hashed in memory (same split, same safetensors bytes)."""
    out = []
    for i, bucket in enumerate(split_buckets(state, max(1, int(bucket_mb * 1024 * 1024)))):
        data = safetensors.torch.save(bucket)
        out.append(BucketSum(i, hashlib.sha256(data).hexdigest(), len(data), tuple(sorted(bucket))))
    return out


def _buckets(refs: list[BucketRef]) -> list[WeightBucket]:
    return [WeightBucket(key=r.key, size=r.size, sha256=r.sha256) for r in refs]


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


# -- fetching samples by exact offset ---------------------------------------------------------------------
class SampleFetcher:
    """Reads exactly the scored messages the lineage names: per partition, assign at the smallest needed
    offset and read forward to the largest (the trainer consumes in order, so needed offsets are dense)."""

    def __init__(self, cfg: Config, bootstrap: str) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.codec = make_codec(cfg.kafka.schema_registry_url or None)
        self.read_messages = 0

    def fetch(self, refs: Iterable[SampleRef], timeout_s: float = 120.0) -> dict[RefKey, ScoredTrajectory]:
        wanted: dict[tuple[str, int], set[int]] = defaultdict(set)
        for ref in refs:
            wanted[(ref.topic, ref.partition)].add(ref.offset)
        if not wanted:
            return {}
        consumer = make_consumer(
            self.cfg,
            self.bootstrap,
            f"{self.cfg.kafka.topic_prefix}.replay-reader",  # assignment only: nothing is ever committed
            "replay",
            **{"enable.partition.eof": True, "isolation.level": "read_committed"},
        )
        out: dict[RefKey, ScoredTrajectory] = {}
        try:
            consumer.assign([TopicPartition(t, p, min(offs)) for (t, p), offs in sorted(wanted.items())])
            last = {tp: max(offs) for tp, offs in wanted.items()}
            pending = set(wanted)
            deadline = time.monotonic() + timeout_s
            while pending and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 0.5):
                    tp = (str(msg.topic()), int(msg.partition() or 0))
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            pending.discard(tp)
                        continue
                    self.read_messages += 1
                    off = int(msg.offset() or 0)
                    if off in wanted[tp]:
                        try:
                            event = self.codec.decode(msg.value())
                        except DecodeError as exc:
                            raise ReplayError(f"{tp[0]}[{tp[1]}]@{off} named by the lineage: {exc}") from exc
                        if isinstance(event, ScoredTrajectory):
                            out[(tp[0], tp[1], off)] = event
                    if off >= last[tp]:
                        pending.discard(tp)
                        consumer.pause([TopicPartition(tp[0], tp[1])])
        finally:
            consumer.close()
        return out


def build_groups(refs: list[SampleRef], events: dict[RefKey, ScoredTrajectory]) -> list[list[Sample]]:
    """The trainer's groups for one version: by group id, with the recorded per-sample weights."""
    groups: dict[str, list[Sample]] = defaultdict(list)
    for ref in refs:
        event = events[(ref.topic, ref.partition, ref.offset)]
        sample = to_sample(event)
        sample.weight = float(ref.weight)
        groups[ref.group_id].append(sample)
    return [groups[g] for g in sorted(groups)]


def check_inputs(wv: WeightVersion, events: dict[RefKey, ScoredTrajectory]) -> list[str]:
    problems = []
    for ref in wv.samples:
        event = events.get((ref.topic, ref.partition, ref.offset))
        where = f"{ref.topic}[{ref.partition}]@{ref.offset}"
        if event is None:
            problems.append(f"{where} ({ref.trajectory_id}): not readable (deleted, aborted, or wrong topic)")
        elif event.trajectory_id != ref.trajectory_id or event.group_id != ref.group_id:
            problems.append(
                f"{where}: holds {event.trajectory_id}/{event.group_id}, lineage says {ref.trajectory_id}"
            )
        elif event.terminal_state != TerminalState.COMPLETED.value:
            problems.append(f"{where} ({ref.trajectory_id}): scored as {event.terminal_state}")
    return problems


# -- divergence -------------------------------------------------------------------------------------------
@dataclass
class Divergence:
    version: int
    what: str  # "weights", "optimizer", "inputs", "initial"
    expected_sha256: str = ""
    actual_sha256: str = ""
    buckets: list[str] = field(default_factory=list)  # bucket keys whose checksum differs
    tensors: list[tuple[str, float]] = field(default_factory=list)  # (name, max |diff|) where known
    tensors_in_buckets: list[str] = field(default_factory=list)  # names in differing buckets (no store)
    metrics: dict[str, tuple[float, float]] = field(default_factory=dict)  # recorded vs replayed
    num_samples: int = 0
    num_groups: int = 0
    trajectory_ids: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def describe(self) -> str:
        lines = [f"DIVERGENCE at version {self.version} ({self.what})"]
        if self.expected_sha256:
            lines.append(f"  weights_sha256 recorded {self.expected_sha256}")
            lines.append(f"  weights_sha256 replayed {self.actual_sha256}")
        if self.buckets:
            lines.append(f"  buckets differing: {', '.join(self.buckets)}")
        if self.tensors:
            shown = ", ".join(f"{n} (max|diff| {d:.3g})" for n, d in self.tensors[:12])
            lines.append(f"  tensors differing ({len(self.tensors)}): {shown}")
        elif self.tensors_in_buckets:
            lines.append(f"  tensors in those buckets: {', '.join(self.tensors_in_buckets[:12])}")
        for k, (rec, rep) in sorted(self.metrics.items()):
            lines.append(f"  metric {k}: recorded {rec!r} replayed {rep!r}")
        lines.append(
            f"  inputs: {self.num_samples} samples in {self.num_groups} groups; "
            f"trajectories {', '.join(self.trajectory_ids[:6])}"
            f"{' ...' if len(self.trajectory_ids) > 6 else ''}"
        )
        lines += [f"  input problem: {p}" for p in self.problems[:10]]
        return "\n".join(lines)


# metrics that depend only on the inputs (not on float summation order): a mismatch points at the inputs
_INPUT_METRICS = ("num_samples", "num_tokens", "reward_mean", "lr")
_COMPARED_METRICS = (*_INPUT_METRICS, "loss", "grad_norm", "ratio_mean", "clip_frac")


def _metric_diffs(recorded: dict[str, float], replayed: dict[str, float]) -> dict[str, tuple[float, float]]:
    return {
        k: (recorded[k], replayed[k])
        for k in _COMPARED_METRICS
        if k in recorded and k in replayed and not math.isclose(recorded[k], replayed[k], rel_tol=1e-6)
    }


def _tensor_diffs(
    expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]
) -> list[tuple[str, float]]:
    out = []
    for name in sorted(expected.keys() | actual.keys()):
        a, b = expected.get(name), actual.get(name)
        if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
            out.append((name, math.inf))
        elif not torch.equal(a, b):
            out.append((name, float((a.double() - b.double()).abs().max())))
    return sorted(out, key=lambda x: -x[1])


# -- replay -----------------------------------------------------------------------------------------------
@dataclass
class VersionCheck:
    version: int
    samples: int
    ok: bool
    train_s: float
    recorded_train_s: float


@dataclass
class ReplayResult:
    run_id: str
    versions: list[VersionCheck]
    divergence: Divergence | None
    wall_s: float
    fetch_s: float
    recorded_span_s: float  # v0 -> last replayed version, from the events' timestamps
    messages_read: int

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_id,
            "ok": self.ok,
            "versions_checked": len(self.versions),
            "last_version": self.versions[-1].version if self.versions else None,
            "wall_s": round(self.wall_s, 3),
            "fetch_s": round(self.fetch_s, 3),
            "train_s": round(sum(v.train_s for v in self.versions), 3),
            "recorded_span_s": round(self.recorded_span_s, 3),
            "recorded_train_s": round(sum(v.recorded_train_s for v in self.versions), 3),
            "messages_read": self.messages_read,
            "divergence": self.divergence.as_dict() if self.divergence else None,
        }


class Replayer:
    """Holds the model and optimizer while walking a lineage; `fork` continues from where it stops."""

    def __init__(
        self,
        cfg: Config,
        bootstrap: str,
        run_id: str,
        *,
        store_uri: str | None = None,
        out: TextIO | None = None,
        lineage: Lineage | None = None,
    ) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.run_id = run_id
        self.store_uri = store_uri
        self.out = out if out is not None else sys.stderr
        self.codec = make_codec(cfg.kafka.schema_registry_url or None)
        self.topics = RunTopics(run_id, cfg.kafka.topic_prefix)
        self.lineage = lineage or read_lineage(cfg, bootstrap, self.topics, self.codec, run_id)
        self.fetcher = SampleFetcher(cfg, bootstrap)
        torch.set_num_threads(1)  # as the trainer: intra-op threads may change float summation order
        self.model: PreTrainedModel | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.version = -1
        self._anchors: dict[int, Any] = {}

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _store(self, wv: WeightVersion) -> Any:
        return open_weight_store(self.store_uri or wv.store_uri, bucket_mb=self._bucket_mb(wv))

    @staticmethod
    def _bucket_mb(wv: WeightVersion) -> float:
        return float(version_trainer(wv).get("bucket_mb", DEFAULT_BUCKET_MB))

    def _fetch_state(self, run_id: str, wv: WeightVersion, optim: bool) -> dict[str, torch.Tensor]:
        buckets = wv.trainer_state if optim else wv.buckets
        refs = [BucketRef(b.key, b.size, b.sha256) for b in buckets]
        return self._store(wv).fetch(f"{run_id}.optim" if optim else run_id, wv.version, refs)

    def load_from_store(self, wv: WeightVersion) -> None:
        """Start from a recorded version's weights and optimizer state (fork roots, `fork --from-store`)."""
        self.model = build_policy(wv.seed)
        self.model.load_state_dict(self._fetch_state(self.run_id, wv, optim=False))
        self.optimizer = make_optimizer(self.model, version_grpo(wv))
        if wv.trainer_state:
            restore_optimizer(self.optimizer, self._fetch_state(self.run_id, wv, optim=True))
        self.version = wv.version

    def _versions(self, to_version: int | None) -> list[WeightVersion]:
        versions = [v for v in self.lineage.versions if to_version is None or v.version <= to_version]
        if not versions:
            raise ReplayError(f"run {self.run_id} has no versions on {self.topics.weight_versions}")
        if to_version is not None and versions[-1].version != to_version:
            raise ReplayError(f"run {self.run_id} has no version {to_version} (last {versions[-1].version})")
        for prev, cur in itertools.pairwise(versions):
            if cur.version != prev.version + 1 or cur.parent_version != prev.version:
                raise ReplayError(
                    f"lineage not contiguous: v{prev.version} then v{cur.version} "
                    f"(parent {cur.parent_version})"
                )
        return versions

    def _check(self, wv: WeightVersion, metrics: dict[str, float], refs_ok: list[str]) -> Divergence | None:
        assert self.model is not None and self.optimizer is not None
        state = model_state(self.model)
        actual = state_dict_checksum(state)
        bucket_mb = self._bucket_mb(wv)
        div = Divergence(
            wv.version,
            "weights",
            num_samples=len(wv.samples),
            num_groups=len({r.group_id for r in wv.samples}),
            trajectory_ids=[r.trajectory_id for r in wv.samples],
            problems=refs_ok,
            metrics=_metric_diffs(wv.metrics, metrics) if metrics else {},
        )
        sums = bucket_checksums(state, bucket_mb)
        # Re-bucketing is identical when the recorded bucket count matches; then bucket shas must match too.
        bad = [
            (rec.key, s)
            for rec, s in zip(wv.buckets, sums, strict=False)
            if len(wv.buckets) == len(sums) and rec.sha256 != s.sha256
        ]
        if actual == wv.weights_sha256 and not bad:
            if wv.trainer_state and self.optimizer.state:
                opt_sums = bucket_checksums(flatten_optimizer(self.optimizer), bucket_mb)
                if [b.sha256 for b in opt_sums] != [b.sha256 for b in wv.trainer_state]:
                    div.what = "optimizer"
                    div.buckets = [
                        b.key
                        for b, s in zip(wv.trainer_state, opt_sums, strict=False)
                        if b.sha256 != s.sha256
                    ]
                    return div
            return None
        div.expected_sha256, div.actual_sha256 = wv.weights_sha256, actual
        div.buckets = [key for key, _ in bad]
        div.tensors_in_buckets = [n for _, s in bad for n in s.names]
        try:
            div.tensors = _tensor_diffs(self._fetch_state(self.run_id, wv, optim=False), state)
        except (WeightStoreError, ValueError, OSError) as exc:
            div.problems.append(
                f"recorded weights not readable from the store ({exc}); tensor names from buckets"
            )
        return div

    def replay(self, to_version: int | None = None, *, verify: bool = True) -> ReplayResult:
        t_start = time.perf_counter()
        versions = self._versions(to_version)
        root = versions[0]
        fetch_s = 0.0
        checks: list[VersionCheck] = []
        if root.version == 0 and not root.samples:
            self.model = build_policy(root.seed)
            self.optimizer = None
            self.version = 0
            div = None
            if verify and state_dict_checksum(model_state(self.model)) != root.weights_sha256:
                div = Divergence(
                    0, "initial", root.weights_sha256, state_dict_checksum(model_state(self.model))
                )
                div.problems.append(
                    "build_policy(seed) does not give the recorded version 0 (torch/transformers?)"
                )
        else:  # a fork's root (or a lineage whose beginning is gone): start from the stored state
            self.load_from_store(root)
            div = None
        checks.append(VersionCheck(root.version, 0, div is None, 0.0, 0.0))
        self._say(f"replay {self.run_id}: v{root.version} {'ok' if div is None else 'DIVERGED'} (root)")
        t_fetch = time.perf_counter()
        events = self.fetcher.fetch(r for wv in versions[1:] for r in wv.samples)
        fetch_s += time.perf_counter() - t_fetch
        self._say(
            f"replay {self.run_id}: fetched {len(events)} samples "
            f"({self.fetcher.read_messages} messages read) in {fetch_s:.2f}s"
        )
        for wv in versions[1:]:
            if div is not None:
                break
            problems = check_inputs(wv, events)
            if problems:
                div = Divergence(
                    wv.version,
                    "inputs",
                    num_samples=len(wv.samples),
                    num_groups=len({r.group_id for r in wv.samples}),
                    trajectory_ids=[r.trajectory_id for r in wv.samples],
                    problems=problems,
                )
                break
            metrics, train_s = self._train(wv.samples, events, version_grpo(wv))
            self.version = wv.version
            if verify:
                div = self._check(wv, metrics, [])
            checks.append(
                VersionCheck(
                    wv.version, len(wv.samples), div is None, train_s, wv.timings.get("train_s", 0.0)
                )
            )
            self._say(
                f"replay {self.run_id}: v{wv.version}/{versions[-1].version} "
                f"{'ok' if div is None else 'DIVERGED'} ({len(wv.samples)} samples, train {train_s:.2f}s)"
            )
        last = versions[len(checks) - 1] if checks else root
        span = max(0.0, (last.created_at_ms - versions[0].created_at_ms) / 1000)
        return ReplayResult(
            self.run_id, checks, div, time.perf_counter() - t_start, fetch_s, span, self.fetcher.read_messages
        )

    def _kl_anchor(self, grpo: GrpoConfig) -> Any:
        # As the trainer: the KL reference is the initial policy build_policy(seed), only when kl_coef > 0.
        if grpo.kl_coef <= 0:
            return None
        if grpo.seed not in self._anchors:
            self._anchors[grpo.seed] = build_policy(grpo.seed)
        return self._anchors[grpo.seed]

    def _train(
        self, refs: list[SampleRef], events: dict[RefKey, ScoredTrajectory], grpo: GrpoConfig
    ) -> tuple[dict[str, float], float]:
        assert self.model is not None
        if self.optimizer is None:
            self.optimizer = make_optimizer(self.model, grpo)
        set_optimizer_hparams(self.optimizer, grpo)
        t0 = time.perf_counter()
        metrics = train_step(
            self.model,
            self.optimizer,
            build_groups(refs, events),
            grpo,
            self._kl_anchor(grpo),
        )
        return metrics, time.perf_counter() - t0


def replay(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    to_version: int | None = None,
    *,
    store_uri: str | None = None,
    out: TextIO | None = None,
) -> ReplayResult:
    return Replayer(cfg, bootstrap, run_id, store_uri=store_uri, out=out).replay(to_version)


# -- fork -------------------------------------------------------------------------------------------------
FORKABLE_TRAINER_KEYS = (
    "lr",
    "alpha",
    "staleness_policy",
    "gamma",
    "clip_eps",
    "kl_coef",
    "max_grad_norm",
    "min_group_size",
    "seed",
)


@dataclass
class ForkResult:
    run_id: str
    from_run: str
    from_version: int
    versions: list[int]
    trained: int
    dropped: int
    weights_sha256: dict[int, str]
    wall_s: float
    store_uri: str

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def fork_trainer_config(
    recorded: dict[str, Any], overrides: list[str], config_path: str | None = None
) -> Config:
    """The recorded trainer section with the user's ``--set`` on top, validated like any config."""
    sets = [f"trainer.{k}={json.dumps(v)}" for k, v in sorted(recorded.items()) if k in _trainer_keys()]
    return load_config(config_path, [*sets, *overrides])


def _trainer_keys() -> set[str]:
    from rollstream.config import TrainerConfig

    return set(TrainerConfig.__dataclass_fields__)


def _read_lineage_retrying(cfg: Config, bootstrap: str, topics: RunTopics, run_id: str) -> Lineage:
    # A topic just created has no partition leader for a moment.
    for attempt in range(20):
        try:
            return read_lineage(
                cfg, bootstrap, topics, make_codec(cfg.kafka.schema_registry_url or None), run_id
            )
        except KafkaException:
            if attempt == 19:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def restage(
    refs: list[SampleRef], k: int, alpha: int, policy: str, gamma: float, min_group_size: int
) -> tuple[list[SampleRef], list[SampleRef]]:
    """The buffer's staleness rule at trainer version K, re-applied to one version's samples.

    Returns (kept, dropped) refs with weights set; a group left with fewer than ``min_group_size`` members is
    dropped whole (``partial_group``), as the buffer does with a timed-out partial group.
    """
    kept: dict[str, list[SampleRef]] = defaultdict(list)
    dropped: list[SampleRef] = []
    for ref in refs:
        lag = k - ref.first_version
        new = SampleRef(**{f: getattr(ref, f) for f in SampleRef.__dataclass_fields__})
        new.reason = ""
        if policy == "downweight":
            new.weight = math.exp(-gamma * max(0, lag - alpha))
        elif lag > alpha:
            new.weight, new.reason = 1.0, "stale"
            dropped.append(new)
            continue
        else:
            new.weight = 1.0
        kept[ref.group_id].append(new)
    out: list[SampleRef] = []
    for gid in sorted(kept):
        members = kept[gid]
        if len(members) < min_group_size:
            for m in members:
                m.reason = "partial_group"
            dropped += members
        else:
            out += members
    return out, dropped


def fork(
    cfg: Config,
    bootstrap: str,
    run_id: str,
    from_version: int,
    new_run: str,
    overrides: list[str],
    *,
    config_path: str | None = None,
    to_version: int | None = None,
    from_store: bool = False,
    store_uri: str | None = None,
    out: TextIO | None = None,
) -> ForkResult:
    from rollstream.runner import ensure_topics

    t0 = time.perf_counter()
    stream = out if out is not None else sys.stderr
    rep = Replayer(cfg, bootstrap, run_id, store_uri=store_uri, out=stream)
    by_version = {v.version: v for v in rep.lineage.versions}
    if from_version not in by_version:
        raise ReplayError(f"run {run_id} has no version {from_version}")
    root = by_version[from_version]
    if from_store:
        rep.load_from_store(root)
        if state_dict_checksum(model_state(rep.model)) != root.weights_sha256:  # type: ignore[arg-type]
            raise ReplayError(f"stored weights of v{from_version} do not match the recorded checksum")
    else:
        result = rep.replay(from_version)
        if not result.ok:
            assert result.divergence is not None
            raise ReplayError("replay to the fork point diverged:\n" + result.divergence.describe())
    assert rep.model is not None
    if rep.optimizer is None:
        rep.optimizer = make_optimizer(rep.model, version_grpo(root))
    topics2 = RunTopics(new_run, cfg.kafka.topic_prefix)
    ensure_topics(cfg, bootstrap, new_run)
    if _read_lineage_retrying(cfg, bootstrap, topics2, new_run).versions:
        raise ReplayError(f"run {new_run} already has versions; fork into a new run id")
    store_uri2 = store_uri or cfg.trainer.weight_store or root.store_uri
    store = open_weight_store(store_uri2, bucket_mb=Replayer._bucket_mb(root))
    producer = make_producer(cfg, bootstrap, default_producer_id("fork"))
    fork_info = {"from_run": run_id, "from_version": from_version, "overrides": overrides}
    last = max(by_version) if to_version is None else to_version
    originals = [by_version[n] for n in range(from_version + 1, last + 1) if n in by_version]
    shas: dict[int, str] = {}
    trained = dropped_n = 0

    def publish(
        version: int,
        parent: int,
        samples: list[SampleRef],
        dropped: list[SampleRef],
        hp: dict[str, Any],
        seed: int,
        metrics: dict[str, float],
        timings: dict[str, float],
    ) -> None:
        assert rep.model is not None and rep.optimizer is not None
        state = model_state(rep.model)
        buckets = store.publish(new_run, version, state)
        opt = (
            store.publish(f"{new_run}.optim", version, flatten_optimizer(rep.optimizer))
            if rep.optimizer.state
            else []
        )
        shas[version] = state_dict_checksum(state)
        event = WeightVersion(
            run_id=new_run,
            policy_version=version,
            producer_id=default_producer_id("fork"),
            version=version,
            parent_version=parent,
            store_uri=store_uri2,
            buckets=_buckets(buckets),
            weights_sha256=shas[version],
            samples=samples,
            dropped=dropped,
            hyperparams_json=json.dumps({**hp, "fork": fork_info}, sort_keys=True, default=str),
            seed=seed,
            timings=timings,
            metrics={k: float(v) for k, v in metrics.items() if math.isfinite(v)},
            trainer_state=_buckets(opt),
        )
        producer.produce(
            topics2.weight_versions, key=new_run, value=rep.codec.encode(event, topics2.weight_versions)
        )
        producer.flush(30)

    # The root: R2's version K is R's version K (same bytes), so R2's lineage stands on its own.
    publish(from_version, from_version - 1, [], [], recorded_hyperparams(root), root.seed, {}, {})
    events = rep.fetcher.fetch(r for wv in originals for r in wv.samples)
    for wv in originals:
        cfg2 = fork_trainer_config(version_trainer(wv), overrides, config_path)
        t2 = cfg2.trainer
        base = recorded_hyperparams(wv)
        grpo_rec = dict(base.get("grpo", {}))
        grpo_rec.update(
            lr=t2.lr, seed=t2.seed, clip_eps=t2.clip_eps, kl_coef=t2.kl_coef, max_grad_norm=t2.max_grad_norm
        )
        if any(o.strip().startswith("generation.temperature") for o in overrides):
            grpo_rec["temperature"] = max(cfg2.generation.temperature, 1e-3)
        grpo = grpo_from_record(grpo_rec)
        problems = check_inputs(wv, events)
        if problems:
            raise ReplayError(f"v{wv.version} inputs: " + "; ".join(problems[:5]))
        k = wv.version - 1
        kept, dropped = restage(wv.samples, k, t2.alpha, t2.staleness_policy, t2.gamma, t2.min_group_size)
        metrics, train_s = rep._train(kept, events, grpo)
        hp = {
            "grpo": grpo.to_dict(),
            "trainer": cfg2.to_dict()["trainer"],
            "group_size": base.get("group_size"),
        }
        publish(wv.version, k, kept, dropped, hp, t2.seed, metrics, {"train_s": train_s})
        trained += len(kept)
        dropped_n += len(dropped)
        print(
            f"fork {new_run}: v{wv.version} trained {len(kept)} dropped {len(dropped)} "
            f"(original {len(wv.samples)}) sha {shas[wv.version][:12]} train {train_s:.2f}s",
            file=stream,
            flush=True,
        )
    return ForkResult(
        new_run,
        run_id,
        from_version,
        sorted(shas),
        trained,
        dropped_n,
        shas,
        time.perf_counter() - t0,
        store_uri2,
    )

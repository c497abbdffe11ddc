"""One configuration for a run: defaults <- TOML file <- ROLLSTREAM__SECTION__KEY env vars <- --set.

Everything is validated at start: an unknown section or key, a value of the wrong type or out of
range fails with `ConfigError` naming the dotted key, before any process is started.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

ENV_PREFIX = "ROLLSTREAM__"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ConfigError(ValueError):
    """A configuration problem, always naming the offending key."""


@dataclass
class KafkaConfig:
    bootstrap_servers: str = ""  # empty: start/use the embedded broker
    schema_registry_url: str = ""  # empty: Avro single-object encoding
    topic_prefix: str = "rollstream"
    client: dict[str, Any] = field(
        default_factory=dict
    )  # shared librdkafka settings (security.protocol, sasl.*)
    producer: dict[str, Any] = field(default_factory=dict)
    consumer: dict[str, Any] = field(default_factory=dict)
    group_protocol: str = "classic"  # classic (cooperative-sticky) | consumer (KIP-848)
    max_message_bytes: int = 16 * 1024 * 1024


@dataclass
class BrokerConfig:
    home: str = ""  # empty: ~/.cache/rollstream/broker
    port: int = 9092
    controller_port: int = 9093
    heap: str = "1g"


@dataclass
class TopicsConfig:
    partitions: dict[str, int] = field(default_factory=dict)  # family -> partitions override


@dataclass
class RolloutConfig:
    domains: list[str] = field(default_factory=lambda: ["frozenlake", "math", "code"])
    domain_pools: dict[str, str] = field(
        default_factory=lambda: {"frozenlake": "h800", "math": "h20", "code": "h20"}
    )
    pool_fallbacks: dict[str, list[str]] = field(default_factory=lambda: {"h800": ["h20"], "h20": ["h800"]})
    group_size: int = 4  # G trajectories per prompt (GRPO group)
    redundant: int = 0  # r extra trajectories per group, cancelled once G are scored
    max_in_flight: int = 64  # trajectories in flight (backpressure)
    max_new_tokens: dict[str, int] = field(default_factory=lambda: {"frozenlake": 2, "math": 12, "code": 96})
    env_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    pool_check_interval_s: float = 2.0


@dataclass
class GenerationConfig:
    backend: str = "scripted"  # scripted | hf | vllm
    scripted_policy: str = "oracle"  # oracle | random
    max_batch: int = 64
    batch_wait_ms: float = 2.0
    temperature: float = 1.0
    simulate_cost: bool = False  # scripted backend: sleep per the pool's cost model
    model_path: str = ""  # vllm: HF model id or path


@dataclass
class EnvConfig:
    max_concurrency: int = 256  # trajectories stepping at once per env worker
    step_threads: int = 16
    step_timeout_s: float = 30.0
    latency: str = "none"  # none | constant:<ms> | lognormal:<median_ms>:<sigma> | pareto:<ms>:<shape>


@dataclass
class RewardConfig:
    http_url: str = ""  # set to score through an HTTP reward endpoint
    http_domains: list[str] = field(default_factory=list)
    timeout_s: float = 5.0
    retries: int = 3


@dataclass
class TrainerConfig:
    alpha: int = 1
    staleness_policy: str = "drop"  # drop | downweight
    gamma: float = 0.5
    lr: float = 3e-3
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    groups_per_step: int = 8
    min_group_size: int = 2
    group_timeout_s: float = 30.0
    seed: int = 0
    weight_store: str = ""  # empty: directory under the run's data dir; mooncake://host:port for Mooncake
    bucket_mb: float = 4.0


@dataclass
class Config:
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)


def _as_dict(obj: Any) -> Any:
    if is_dataclass(obj):
        return {f.name: _as_dict(getattr(obj, f.name)) for f in fields(obj)}
    return obj


_CHOICES: dict[str, tuple[str, ...]] = {
    "kafka.group_protocol": ("classic", "consumer"),
    "generation.backend": ("scripted", "hf", "vllm"),
    "generation.scripted_policy": ("oracle", "random"),
    "trainer.staleness_policy": ("drop", "downweight"),
}
_MINIMUM: dict[str, float] = {
    "rollout.group_size": 1,
    "rollout.redundant": 0,
    "rollout.max_in_flight": 1,
    "generation.max_batch": 1,
    "generation.batch_wait_ms": 0,
    "generation.temperature": 0,
    "env.max_concurrency": 1,
    "env.step_threads": 1,
    "env.step_timeout_s": 0.001,
    "reward.retries": 0,
    "trainer.alpha": 0,
    "trainer.gamma": 0,
    "trainer.lr": 0,
    "trainer.groups_per_step": 1,
    "trainer.min_group_size": 1,
    "trainer.bucket_mb": 0.001,
    "broker.port": 1,
    "broker.controller_port": 1,
}


def _coerce(key: str, value: Any, hint: Any) -> Any:
    origin = get_origin(hint)
    if hint is bool:
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "0", "false", "no"):
            return value.lower() in ("1", "true", "yes")
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            pass
    elif hint is float:
        if not isinstance(value, bool):
            try:
                return float(value)
            except (TypeError, ValueError):
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin in (dict, list):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{key}: expected JSON for a {origin.__name__}, got {value!r}") from exc
        if isinstance(value, origin):
            args = get_args(hint)
            if origin is list:
                return [_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
            return {k: _coerce(f"{key}.{k}", v, args[1]) for k, v in value.items()}
    elif hint is Any:
        return value
    raise ConfigError(f"{key}: expected {getattr(hint, '__name__', hint)}, got {value!r}")


def _apply(section_obj: Any, section: str, values: dict[str, Any], source: str) -> None:
    hints = get_type_hints(type(section_obj))
    for name, value in values.items():
        key = f"{section}.{name}"
        if name not in hints:
            known = ", ".join(sorted(hints))
            raise ConfigError(f"unknown key {key!r} in {source} (known keys of [{section}]: {known})")
        setattr(section_obj, name, _coerce(key, value, hints[name]))


def _validate(cfg: Config) -> None:
    flat = {
        f"{section}.{name}": value
        for section, values in cfg.to_dict().items()
        for name, value in values.items()
    }
    for key, choices in _CHOICES.items():
        if flat[key] not in choices:
            raise ConfigError(f"{key}: must be one of {', '.join(choices)}; got {flat[key]!r}")
    for key, minimum in _MINIMUM.items():
        if not flat[key] >= minimum:  # also rejects NaN
            raise ConfigError(f"{key}: must be >= {minimum}; got {flat[key]!r}")
    from rollstream.workers.envs import DOMAINS

    for domain in cfg.rollout.domains:
        if domain not in DOMAINS:
            raise ConfigError(f"rollout.domains: unknown domain {domain!r} (known: {', '.join(DOMAINS)})")
        if domain not in cfg.rollout.domain_pools:
            raise ConfigError(f"rollout.domain_pools: no pool for domain {domain!r}")
    for pool in cfg.rollout.domain_pools.values():
        if not RUN_ID_PATTERN.match(pool):
            raise ConfigError(f"rollout.domain_pools: bad pool name {pool!r} (letters, digits, _ and -)")
    from rollstream.workers.envs.latency import StepLatency

    try:
        StepLatency.parse(cfg.env.latency)
    except ValueError as exc:
        raise ConfigError(f"env.latency: {exc}") from exc
    from rollstream.topics.specs import family_specs

    for family in cfg.topics.partitions:
        if family not in family_specs():
            raise ConfigError(f"topics.partitions: unknown topic family {family!r}")
    if cfg.trainer.min_group_size > cfg.rollout.group_size:
        raise ConfigError("trainer.min_group_size: must be <= rollout.group_size")


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Build and validate the config. `overrides` are ``section.key=value`` strings (CLI --set)."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            text = path.read_text()
            data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
        for section, values in data.items():
            if not hasattr(cfg, section) or not isinstance(values, dict):
                raise ConfigError(
                    f"unknown section {section!r} in {path} (known: {', '.join(cfg.to_dict())})"
                )
            _apply(getattr(cfg, section), section, values, str(path))
    environ = dict(os.environ) if environ is None else environ
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        if len(parts) != 2 or not hasattr(cfg, parts[0]):
            raise ConfigError(f"environment variable {name}: expected {ENV_PREFIX}<SECTION>__<KEY>")
        _apply(getattr(cfg, parts[0]), parts[0], {parts[1]: value}, f"environment {name}")
    for item in overrides or []:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not hasattr(cfg, section):
            raise ConfigError(f"--set {item!r}: expected <section>.<key>=<value>")
        _apply(getattr(cfg, section), section, {name: _parse_scalar(value)}, "--set")
    _validate(cfg)
    return cfg


def _parse_scalar(text: str) -> Any:
    """--set values: JSON when it parses (numbers, lists, objects), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.match(run_id):
        raise ConfigError(f"run id {run_id!r}: use 1-64 letters, digits, '_' or '-'")
    return run_id

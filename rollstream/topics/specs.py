"""Topic families and the names of one run's topics."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from rollstream.config import Config, check_run_id

ENV_ACTIONS = "env-actions"
OBSERVATIONS = "observations"
GEN_REQUESTS = "gen-requests"
SCORED = "scored-trajectories"
WEIGHT_VERSIONS = "weight-versions"
DEAD_LETTERS = "dead-letters"


@dataclass(frozen=True)
class FamilySpec:
    family: str
    key: str
    partitions: int
    config: dict[str, str]
    per_pool: bool = False


@dataclass(frozen=True)
class TopicSpec:
    name: str
    family: str
    partitions: int
    config: dict[str, str]


@cache
def family_specs() -> dict[str, FamilySpec]:
    raw: dict[str, Any] = tomllib.loads(
        resources.files("rollstream.topics").joinpath("specs.toml").read_text()
    )["families"]
    return {
        name: FamilySpec(
            family=name,
            key=spec["key"],
            partitions=int(spec["partitions"]),
            config={k: str(v) for k, v in spec.get("config", {}).items()},
            per_pool=bool(spec.get("per_pool", False)),
        )
        for name, spec in raw.items()
    }


class RunTopics:
    """Names of one run's topics: ``<prefix>.<run>.<family>[.<pool>]``."""

    def __init__(self, run_id: str, prefix: str = "rollstream") -> None:
        self.run_id = check_run_id(run_id)
        self.prefix = prefix

    def name(self, family: str, pool: str | None = None) -> str:
        base = f"{self.prefix}.{self.run_id}.{family}"
        return f"{base}.{pool}" if pool else base

    @property
    def env_actions(self) -> str:
        return self.name(ENV_ACTIONS)

    @property
    def observations(self) -> str:
        return self.name(OBSERVATIONS)

    def gen_requests(self, pool: str) -> str:
        return self.name(GEN_REQUESTS, pool)

    @property
    def scored(self) -> str:
        return self.name(SCORED)

    @property
    def weight_versions(self) -> str:
        return self.name(WEIGHT_VERSIONS)

    @property
    def dead_letters(self) -> str:
        return self.name(DEAD_LETTERS)

    def family_of(self, topic: str) -> str:
        rest = topic.removeprefix(f"{self.prefix}.{self.run_id}.")
        return rest.split(".", 1)[0]


def run_pools(cfg: Config) -> list[str]:
    """Every generation pool the run routes to, preferred or fallback, in a stable order."""
    pools = set(cfg.rollout.domain_pools.values())
    for fallbacks in cfg.rollout.pool_fallbacks.values():
        pools.update(fallbacks)
    return sorted(pools)


def run_topic_specs(run_id: str, cfg: Config) -> list[TopicSpec]:
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    specs = []
    for family, spec in family_specs().items():
        partitions = cfg.topics.partitions.get(family, spec.partitions)
        pools: list[str | None] = list(run_pools(cfg)) if spec.per_pool else [None]
        for pool in pools:
            specs.append(TopicSpec(topics.name(family, pool), family, partitions, dict(spec.config)))
    return specs

"""Real text environments for the env workers, and their registry.

``make_env(domain, **options)`` builds a fresh instance (one per trajectory). Options are the env's
constructor keywords plus ``latency`` (a :class:`StepLatency` spec string), ``latency_seed`` and
``latency_max_ms`` which wrap it in :class:`LatencyEnv`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollstream.workers.envs.base import EpisodeOverError, TextEnv
from rollstream.workers.envs.latency import LatencyEnv, StepLatency

__all__ = ["DOMAINS", "EpisodeOverError", "LatencyEnv", "StepLatency", "TextEnv", "make_env"]


def _frozenlake(**o: Any) -> TextEnv:
    from rollstream.workers.envs.frozenlake import FrozenLakeTextEnv

    return FrozenLakeTextEnv(**o)


def _math(**o: Any) -> TextEnv:
    from rollstream.workers.envs.math_env import MathEnv

    return MathEnv(**o)


def _code(**o: Any) -> TextEnv:
    from rollstream.workers.envs.code_env import CodeEnv

    return CodeEnv(**o)


# Lazy imports: a worker serving only frozenlake need not import reasoning-gym.
_REGISTRY: dict[str, Callable[..., TextEnv]] = {"frozenlake": _frozenlake, "math": _math, "code": _code}
DOMAINS: tuple[str, ...] = tuple(_REGISTRY)


def make_env(domain: str, **options: Any) -> TextEnv:
    """A new environment for ``domain``; ValueError naming an unknown domain."""
    factory = _REGISTRY.get(domain)
    if factory is None:
        raise ValueError(f"unknown env domain {domain!r}; known: {', '.join(DOMAINS)}")
    latency = options.pop("latency", None)
    latency_seed = options.pop("latency_seed", None)
    latency_max_ms = options.pop("latency_max_ms", 60_000.0)
    env = factory(**options)
    if latency and latency != "none":
        return LatencyEnv(env, StepLatency(latency, seed=latency_seed, max_ms=latency_max_ms))
    return env

"""Injected per-step environment latency (models slow tools / containers: the long tail RollArt targets).

Spec strings: ``none`` | ``constant:<ms>`` | ``lognormal:<median_ms>:<sigma>`` | ``pareto:<scale_ms>:<shape>``
(classic Pareto: minimum ``scale_ms``, tail index ``shape``). Samples are capped at ``max_ms`` so a heavy
tail cannot hang a worker for hours. Each :class:`StepLatency` owns its seeded RNG (no shared state).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from rollstream.workers.envs.base import TextEnv

__all__ = ["LatencyEnv", "StepLatency"]


class StepLatency:
    def __init__(self, spec: str = "none", *, seed: int | None = None, max_ms: float = 60_000.0) -> None:
        self.spec = spec
        self.kind, self.params = self.parse(spec)
        self.max_ms = max_ms
        self._rng = np.random.default_rng(seed)

    @staticmethod
    def parse(spec: str) -> tuple[str, tuple[float, ...]]:
        """(kind, params) of a spec string; ValueError naming the spec when it is malformed."""
        parts = spec.strip().lower().split(":")
        arity = {"none": 0, "constant": 1, "lognormal": 2, "pareto": 2}
        kind = parts[0]
        if kind not in arity or len(parts) - 1 != arity[kind]:
            raise ValueError(
                f"bad latency spec {spec!r}: expected none | constant:<ms> | lognormal:<median_ms>:<sigma> "
                "| pareto:<scale_ms>:<shape>"
            )
        try:
            params = tuple(float(x) for x in parts[1:])
        except ValueError:
            raise ValueError(f"bad latency spec {spec!r}: parameters must be numbers") from None
        if any(not math.isfinite(x) or x < 0 for x in params) or (kind == "pareto" and params[1] <= 0):
            raise ValueError(f"bad latency spec {spec!r}: parameters must be finite, >= 0 (pareto shape > 0)")
        return kind, params

    def sample_ms(self) -> float:
        if self.kind == "none":
            return 0.0
        if self.kind == "constant":
            ms = self.params[0]
        elif self.kind == "lognormal":
            median, sigma = self.params
            ms = median * math.exp(sigma * float(self._rng.standard_normal()))
        else:
            scale, shape = self.params
            ms = scale * (1.0 + float(self._rng.pareto(shape)))  # numpy's pareto is Lomax; +1 -> classic
        return min(ms, self.max_ms)

    def sleep(self) -> float:
        """Sleep one sampled delay; returns the milliseconds slept."""
        ms = self.sample_ms()
        if ms > 0:
            time.sleep(ms / 1000.0)
        return ms

    def __repr__(self) -> str:
        return f"StepLatency({self.spec!r})"


class LatencyEnv:
    """Wraps a TextEnv; every ``step`` first sleeps a sampled delay (``info["injected_latency_ms"]``)."""

    def __init__(self, env: TextEnv, latency: StepLatency) -> None:
        self.env = env
        self.latency = latency
        self.domain = env.domain
        self.max_turns = env.max_turns

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return self.env.reset(seed)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        ms = self.latency.sleep()
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["injected_latency_ms"] = ms
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name: str) -> Any:  # render(), etc. of the wrapped env
        return getattr(self.env, name)

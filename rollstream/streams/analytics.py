"""Windowed trajectory analytics: pure aggregation, shared by the faust app, the in-process fallback,
`rollstream top` and `rollstream report`.

Events are bucketed by event time (``created_at_ms``) into tumbling windows and by a key of
(domain, pool, policy version):

* `ScoredTrajectory` (every terminal trajectory passes the reward worker, aborted ones with reward 0):
  terminal state counts; for completed ones reward, length in turns and tokens, staleness
  (``last_version - first_version``). Key: (domain, pool of its last turn, ``first_version``).
* each `Turn` of a completed trajectory: gen / env latency and tokens, under (domain, the turn's pool, the
  turn's policy version) - a trajectory can move between pools and versions.
* `GenRequest`: requests and fallbacks (``fallback_from`` set) per pool.
* `DeadLetter`: counted under the empty key.

`Agg` holds only sums, counts and fixed histograms, so aggregates merge exactly (across keys for a roll-up,
or across emissions of the same window after a restart). Rates are derived at read time.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rollstream.schemas.events import (
    DeadLetter,
    Event,
    GenRequest,
    ScoredTrajectory,
    TerminalState,
    WeightVersion,
)

# latency histogram upper bounds in ms (last bucket: +inf)
LATENCY_BUCKETS_MS: tuple[float, ...] = (
    0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, math.inf,
)  # fmt: skip

Key = tuple[str, str, int]  # (domain, pool, version)


def _hist_add(hist: list[int], value_ms: float) -> None:
    hist[bisect_left(LATENCY_BUCKETS_MS, value_ms)] += 1


def hist_quantile(hist: list[int], q: float) -> float:
    """Upper bound of the bucket holding quantile q (0 when empty)."""
    total = sum(hist)
    if not total:
        return 0.0
    rank = q * total
    seen = 0
    i = 0
    for i, n in enumerate(hist):  # noqa: B007 - i is the answer
        seen += n
        if seen >= rank:
            break
    # the open last bucket reports its lower bound: JSON has no infinity
    return LATENCY_BUCKETS_MS[min(i, len(LATENCY_BUCKETS_MS) - 2)]


@dataclass
class Agg:
    trajectories: int = 0  # terminal trajectories
    states: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    reward_sum: float = 0.0
    reward_sq: float = 0.0
    reward_min: float = math.inf
    reward_max: float = -math.inf
    turns_sum: int = 0
    tokens_sum: int = 0  # per completed trajectory (its action tokens)
    staleness: Counter[int] = field(default_factory=Counter)
    turns: int = 0  # individual turns (latency samples)
    turn_tokens: int = 0
    gen_ms_sum: float = 0.0
    env_ms_sum: float = 0.0
    gen_hist: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_MS))
    env_hist: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_MS))
    requests: int = 0
    fallbacks: int = 0
    dead_letters: int = 0

    def merge(self, other: Agg) -> Agg:
        self.trajectories += other.trajectories
        self.states.update(other.states)
        self.reasons.update(other.reasons)
        self.completed += other.completed
        self.reward_sum += other.reward_sum
        self.reward_sq += other.reward_sq
        self.reward_min = min(self.reward_min, other.reward_min)
        self.reward_max = max(self.reward_max, other.reward_max)
        self.turns_sum += other.turns_sum
        self.tokens_sum += other.tokens_sum
        self.staleness.update(other.staleness)
        self.turns += other.turns
        self.turn_tokens += other.turn_tokens
        self.gen_ms_sum += other.gen_ms_sum
        self.env_ms_sum += other.env_ms_sum
        self.gen_hist = [a + b for a, b in zip(self.gen_hist, other.gen_hist, strict=True)]
        self.env_hist = [a + b for a, b in zip(self.env_hist, other.env_hist, strict=True)]
        self.requests += other.requests
        self.fallbacks += other.fallbacks
        self.dead_letters += other.dead_letters
        return self

    # -- derived ------------------------------------------------------------------------------------------
    def summary(self, window_s: float) -> dict[str, Any]:
        n = self.completed
        mean = self.reward_sum / n if n else 0.0
        var = max(0.0, self.reward_sq / n - mean * mean) if n else 0.0
        aborted = self.states.get(TerminalState.ABORTED.value, 0)
        return {
            "trajectories": self.trajectories,
            "completed": n,
            "states": dict(self.states),
            "reasons": dict(self.reasons),
            "reward_mean": mean,
            "reward_std": math.sqrt(var),
            "reward_min": self.reward_min if n else 0.0,
            "reward_max": self.reward_max if n else 0.0,
            "turns_mean": self.turns_sum / n if n else 0.0,
            "tokens_mean": self.tokens_sum / n if n else 0.0,
            "staleness": {str(k): v for k, v in sorted(self.staleness.items())},
            "staleness_mean": (sum(k * v for k, v in self.staleness.items()) / n) if n else 0.0,
            "turns": self.turns,
            "gen_ms_mean": self.gen_ms_sum / self.turns if self.turns else 0.0,
            "env_ms_mean": self.env_ms_sum / self.turns if self.turns else 0.0,
            "gen_ms_p50": hist_quantile(self.gen_hist, 0.5),
            "gen_ms_p95": hist_quantile(self.gen_hist, 0.95),
            "env_ms_p50": hist_quantile(self.env_hist, 0.5),
            "env_ms_p95": hist_quantile(self.env_hist, 0.95),
            "abort_rate": aborted / self.trajectories if self.trajectories else 0.0,
            "failure_rate": (self.trajectories - n - aborted) / self.trajectories
            if self.trajectories
            else 0.0,
            "requests": self.requests,
            "fallbacks": self.fallbacks,
            "fallback_rate": self.fallbacks / self.requests if self.requests else 0.0,
            "dead_letters": self.dead_letters,
            # dead letters per turn of the same window (the unit of work that can be dead-lettered)
            "dead_letter_rate": self.dead_letters / self.turns
            if self.turns
            else float(self.dead_letters > 0),
            "tokens": self.turn_tokens,
            "tokens_per_s": self.turn_tokens / window_s if window_s else 0.0,
            "turns_per_s": self.turns / window_s if window_s else 0.0,
            # decode speed while generating (tokens over the generation time of the same turns)
            "gen_tokens_per_s": self.turn_tokens / (self.gen_ms_sum / 1000) if self.gen_ms_sum else 0.0,
        }

    # -- wire (analytics topic / faust) --------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()}
        for k in ("states", "reasons"):
            d[k] = dict(d[k])
        d["staleness"] = {str(k): v for k, v in self.staleness.items()}
        d["reward_min"] = None if math.isinf(self.reward_min) else self.reward_min
        d["reward_max"] = None if math.isinf(self.reward_max) else self.reward_max
        return d

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> Agg:
        agg = cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})
        agg.states = Counter(agg.states)
        agg.reasons = Counter(agg.reasons)
        agg.staleness = Counter({int(k): v for k, v in dict(agg.staleness).items()})
        agg.reward_min = math.inf if agg.reward_min is None else agg.reward_min
        agg.reward_max = -math.inf if agg.reward_max is None else agg.reward_max
        return agg


class WindowedAggregator:
    """Tumbling event-time windows of `window_s` seconds, each a dict of Key -> Agg."""

    def __init__(self, window_s: float = 10.0, retain_windows: int = 360) -> None:
        self.window_s = window_s
        self.window_ms = int(window_s * 1000)
        self.retain_windows = retain_windows
        self.windows: dict[int, dict[Key, Agg]] = {}
        self.dirty: set[int] = set()  # windows changed since the last `take_dirty`
        self.version = -1  # newest weight version seen
        self.events = 0

    def _agg(self, ts_ms: int, key: Key) -> Agg:
        start = ts_ms - ts_ms % self.window_ms
        self.dirty.add(start)
        window = self.windows.get(start)
        if window is None:
            window = self.windows[start] = {}
            if len(self.windows) > self.retain_windows:  # bounded memory on long runs
                for old in sorted(self.windows)[: len(self.windows) - self.retain_windows]:
                    del self.windows[old]
                    self.dirty.discard(old)
        agg = window.get(key)
        if agg is None:
            agg = window[key] = Agg()
        return agg

    def add(self, event: Event) -> None:
        self.events += 1
        ts = event.created_at_ms
        if isinstance(event, ScoredTrajectory):
            self._add_scored(event, ts)
        elif isinstance(event, GenRequest):
            agg = self._agg(ts, (event.domain, event.pool, event.first_version))
            agg.requests += 1
            agg.fallbacks += bool(event.fallback_from)
        elif isinstance(event, DeadLetter):
            self._agg(ts, ("", "", -1)).dead_letters += 1
        elif isinstance(event, WeightVersion):
            self.version = max(self.version, event.version)

    def _add_scored(self, s: ScoredTrajectory, ts: int) -> None:
        pool = s.turns[-1].pool if s.turns else ""
        agg = self._agg(ts, (s.domain, pool, s.first_version))
        agg.trajectories += 1
        agg.states[s.terminal_state] += 1
        if s.terminal_state != TerminalState.COMPLETED.value:
            agg.reasons[s.reason.split(":", 1)[0]] += 1
            return
        agg.completed += 1
        agg.reward_sum += s.reward
        agg.reward_sq += s.reward * s.reward
        agg.reward_min = min(agg.reward_min, s.reward)
        agg.reward_max = max(agg.reward_max, s.reward)
        agg.turns_sum += len(s.turns)
        agg.staleness[s.last_version - s.first_version] += 1
        for t in s.turns:
            tokens = len(t.action_token_ids) // 4
            agg.tokens_sum += tokens
            tagg = (
                agg
                if (t.pool, t.policy_version) == (pool, s.first_version)
                else self._agg(ts, (s.domain, t.pool, t.policy_version))
            )
            tagg.turns += 1
            tagg.turn_tokens += tokens
            tagg.gen_ms_sum += t.gen_ms
            tagg.env_ms_sum += t.env_ms
            _hist_add(tagg.gen_hist, t.gen_ms)
            _hist_add(tagg.env_hist, t.env_ms)

    def take_dirty(self) -> list[int]:
        out = sorted(self.dirty)
        self.dirty.clear()
        return out

    # -- reading ------------------------------------------------------------------------------------------
    def rows(self, windows: list[int] | None = None) -> list[dict[str, Any]]:
        """One mergeable row per (window, key): what goes to the analytics topic."""
        out = []
        for start in sorted(self.windows) if windows is None else windows:
            for (domain, pool, version), agg in sorted(self.windows.get(start, {}).items()):
                out.append(
                    {
                        "window_start_ms": start,
                        "window_s": self.window_s,
                        "domain": domain,
                        "pool": pool,
                        "version": version,
                        "state": agg.to_state(),
                        **agg.summary(self.window_s),
                    }
                )
        return out

    def rollup(
        self, by: tuple[str, ...], since_ms: int | None = None, windows: list[int] | None = None
    ) -> dict[tuple[Any, ...], dict[str, Any]]:
        """Merge keys (and windows) down to the dimensions in `by` (subset of domain, pool, version)."""
        idx = {"domain": 0, "pool": 1, "version": 2}
        merged: dict[tuple[Any, ...], Agg] = {}
        span = set()
        for start in sorted(self.windows) if windows is None else windows:
            if since_ms is not None and start + self.window_ms <= since_ms:
                continue
            span.add(start)
            for key, agg in self.windows.get(start, {}).items():
                k = tuple(key[idx[d]] for d in by)
                merged.setdefault(k, Agg()).merge(agg)
        seconds = max(1, len(span)) * self.window_s
        return {k: agg.summary(seconds) for k, agg in sorted(merged.items(), key=lambda kv: str(kv[0]))}

    def timeline(self, by: str = "pool") -> dict[Any, list[tuple[int, dict[str, Any]]]]:
        """Per value of one dimension: [(window start, summary)] in time order (report plots)."""
        out: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
        for start in sorted(self.windows):
            for k, summary in self.rollup((by,), windows=[start]).items():
                out.setdefault(k[0], []).append((start, summary))
        return out

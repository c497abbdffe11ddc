"""Scored-sample buffer: staleness control (ARCHITECTURE.md section 4) and GRPO group assembly.

Staleness of a sample at trainer version K is ``K - v(t)`` with ``v(t) = sample.first_version``.

Group lifecycle (every sample leaves through exactly one exit, so accounting balances):
  * ``ready_groups`` releases a group once it has ``group_size`` members. If more arrived (redundant rollouts
    that were not cancelled in time) the first ``group_size`` by trajectory id train; the rest are evicted
    with reason ``redundant``.
  * Partial groups: once ``group_timeout_s`` has passed since a group's first member arrived, a group with
    ``>= min_group_size`` members is released as-is (advantages are normalised over the members present);
    one with fewer is evicted whole with reason ``partial_group``. With ``group_timeout_s=None`` partial
    groups wait indefinitely (until complete or until their members go stale under ``drop``).
  * A group id is closed once released or evicted; later arrivals for it are evicted as ``group_closed``.
  * ``drop`` policy: members with ``K - v > alpha`` are evicted with reason ``stale``, at ``add`` and before
    every batch. ``downweight`` keeps them with ``weight = exp(-gamma * max(0, K - v - alpha))``.
Evicted samples are handed out by ``evict`` (the caller records their terminal state).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from rollstream.workers.trainer.grpo import Sample

StalenessPolicy = Literal["drop", "downweight"]
EvictReason = Literal["stale", "redundant", "partial_group", "group_closed"]


@dataclass
class _Group:
    created_at: float
    members: dict[str, Sample] = field(default_factory=dict)


class SampleBuffer:
    def __init__(
        self,
        alpha: int,
        policy: StalenessPolicy,
        gamma: float,
        group_size: int,
        min_group_size: int,
        *,
        group_timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if alpha < 0:
            raise ValueError(f"alpha={alpha!r}: must be >= 0")
        if policy not in ("drop", "downweight"):
            raise ValueError(f"policy={policy!r}: must be 'drop' or 'downweight'")
        if not math.isfinite(gamma) or gamma < 0:
            raise ValueError(f"gamma={gamma!r}: must be a finite number >= 0")
        if group_size < 1:
            raise ValueError(f"group_size={group_size!r}: must be >= 1")
        if not 1 <= min_group_size <= group_size:
            raise ValueError(f"min_group_size={min_group_size!r}: must be in [1, group_size]")
        if group_timeout_s is not None and group_timeout_s < 0:
            raise ValueError(f"group_timeout_s={group_timeout_s!r}: must be >= 0 or None")
        self.alpha, self.policy, self.gamma = alpha, policy, gamma
        self.group_size, self.min_group_size = group_size, min_group_size
        self.group_timeout_s = group_timeout_s
        self._clock = clock
        self._groups: dict[str, _Group] = {}
        self._closed: set[str] = set()
        self._seen: set[str] = set()  # trajectory ids ever accepted: redelivery must not train twice
        self._evicted: list[tuple[Sample, EvictReason]] = []

    # -- staleness ---------------------------------------------------------------------------------
    def staleness(self, sample: Sample, current_version: int) -> int:
        return current_version - sample.first_version

    def is_stale(self, sample: Sample, current_version: int) -> bool:
        return self.staleness(sample, current_version) > self.alpha

    def weight_for(self, sample: Sample, current_version: int) -> float:
        excess = max(0, self.staleness(sample, current_version) - self.alpha)
        return math.exp(-self.gamma * excess)

    def _apply_staleness(self, current_version: int) -> None:
        for gid in sorted(self._groups):
            grp = self._groups[gid]
            for tid in sorted(grp.members):
                s = grp.members[tid]
                if self.policy == "downweight":
                    s.weight = self.weight_for(s, current_version)
                elif self.is_stale(s, current_version):
                    self._evicted.append((grp.members.pop(tid), "stale"))
            if not grp.members:
                del self._groups[gid]  # emptied by staleness: not closed, fresh members may still come

    # -- public API --------------------------------------------------------------------------------
    def add(self, sample: Sample, current_version: int) -> bool:
        """Buffer a scored sample. Returns False for a duplicate trajectory id (ignored, e.g. redelivery)."""
        if sample.trajectory_id in self._seen:
            return False
        self._seen.add(sample.trajectory_id)
        if sample.group_id in self._closed:
            self._evicted.append((sample, "group_closed"))
            return True
        if self.policy == "drop" and self.is_stale(sample, current_version):
            self._evicted.append((sample, "stale"))
            return True
        if self.policy == "downweight":
            sample.weight = self.weight_for(sample, current_version)
        grp = self._groups.setdefault(sample.group_id, _Group(created_at=self._clock()))
        grp.members[sample.trajectory_id] = sample
        return True

    def evict(self, current_version: int) -> list[tuple[Sample, EvictReason]]:
        """Apply the staleness policy at version K and return (and forget) everything evicted so far."""
        self._apply_staleness(current_version)
        out, self._evicted = self._evicted, []
        return out

    def ready_groups(self, current_version: int, max_groups: int) -> list[list[Sample]]:
        """Up to ``max_groups`` trainable groups, ordered by group id, members by trajectory id.

        Staleness is applied first, so a returned batch never holds a sample that ``drop`` would evict.
        """
        self._apply_staleness(current_version)
        now = self._clock()
        out: list[list[Sample]] = []
        for gid in sorted(self._groups):
            if len(out) >= max_groups:
                break
            grp = self._groups[gid]
            members = [grp.members[t] for t in sorted(grp.members)]
            timed_out = self.group_timeout_s is not None and now - grp.created_at >= self.group_timeout_s
            if len(members) >= self.group_size:
                out.append(members[: self.group_size])
                self._evicted.extend((s, "redundant") for s in members[self.group_size :])
            elif timed_out and len(members) >= self.min_group_size:
                out.append(members)
            elif timed_out:
                self._evicted.extend((s, "partial_group") for s in members)
            else:
                continue
            del self._groups[gid]
            self._closed.add(gid)
        return out

    def num_ready(self, current_version: int) -> int:
        """How many groups `ready_groups` would return now (without taking them)."""
        self._apply_staleness(current_version)
        now = self._clock()
        timeout = self.group_timeout_s
        return sum(
            1
            for grp in self._groups.values()
            if len(grp.members) >= self.group_size
            or (
                timeout is not None
                and now - grp.created_at >= timeout
                and len(grp.members) >= self.min_group_size
            )
        )

    def __len__(self) -> int:
        return sum(len(g.members) for g in self._groups.values())

    @property
    def pending_group_ids(self) -> list[str]:
        return sorted(self._groups)

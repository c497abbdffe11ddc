"""Scheduler: launches GRPO groups and keeps a target number of trajectories in flight.

Each group is one task (domain + seed) rolled out G + r times (redundant rollouts); as soon as G of
its members are scored the rest get a CANCEL. It reads ``scored-trajectories`` (where every
trajectory's end shows up, scored or not) to know what finished, and stops launching after
`--trajectories N`; the worker exits once all N ended (`done`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from rollstream.config import Config
from rollstream.schemas.events import EnvAction, EnvActionKind, Event, ScoredTrajectory, TerminalState, new_id
from rollstream.workers.loop import Handler, MessageRef, WorkerContext

log = logging.getLogger(__name__)

EVAL_SEED_BASE = 1_000_000_000  # task seeds >= this are held out for `rollstream eval`


@dataclass
class GroupState:
    group_id: str
    domain: str
    task_seed: int
    members: list[str]
    ended: set[str] = field(default_factory=set)
    scored: set[str] = field(default_factory=set)
    cancelled: bool = False


def task_stream(cfg: Config) -> Iterator[tuple[str, int]]:
    """(domain, seed) for successive groups: domains in turn, training seeds below EVAL_SEED_BASE."""
    rng = random.Random(cfg.rollout.seed)
    while True:
        for domain in cfg.rollout.domains:
            yield domain, rng.randrange(EVAL_SEED_BASE)


class Scheduler(Handler):
    role = "scheduler"

    def __init__(self, cfg: Config, max_trajectories: int | None = None) -> None:
        self.cfg = cfg
        self.max_trajectories = max_trajectories
        self.group_size = cfg.rollout.group_size
        self.per_group = cfg.rollout.group_size + cfg.rollout.redundant
        self.launched = 0
        self.ended = 0
        self.groups: dict[str, GroupState] = {}
        self.member_group: dict[str, str] = {}
        self._tasks = task_stream(cfg)
        self.counts: dict[str, int] = {}

    def topics(self, ctx: WorkerContext) -> list[str]:
        return [ctx.topics.scored]

    def in_flight(self) -> int:
        return 0

    def _budget_left(self) -> int:
        return (self.max_trajectories - self.launched) if self.max_trajectories is not None else 1 << 62

    def tick(self, ctx: WorkerContext) -> None:
        while self.launched - self.ended + self.per_group <= self.cfg.rollout.max_in_flight or (
            self.launched == self.ended and self._budget_left() > 0
        ):
            size = min(self.per_group, self._budget_left())
            if size <= 0:
                return
            self._launch(ctx, size)

    def _launch(self, ctx: WorkerContext, size: int) -> None:
        domain, seed = next(self._tasks)
        gid = f"g-{new_id()[:12]}"
        members = [f"{gid}-t{i}" for i in range(size)]
        self.groups[gid] = GroupState(gid, domain, seed, members)
        for tid in members:
            self.member_group[tid] = gid
            ctx.produce(
                ctx.topics.env_actions,
                tid,
                EnvAction(
                    run_id=ctx.topics.run_id,
                    trajectory_id=tid,
                    group_id=gid,
                    kind=EnvActionKind.RESET,
                    domain=domain,
                    task_seed=seed,
                ),
            )
        self.launched += size

    def on_event(self, event: Event, ref: MessageRef, ctx: WorkerContext) -> bool:
        if not isinstance(event, ScoredTrajectory):
            raise TypeError(f"scheduler got {type(event).__name__}, expected ScoredTrajectory")
        group = self.groups.get(event.group_id)
        if group is None or event.trajectory_id in group.ended:
            return True  # another scheduler's group, or a duplicate
        group.ended.add(event.trajectory_id)
        self.ended += 1
        self.counts[event.terminal_state] = self.counts.get(event.terminal_state, 0) + 1
        if event.terminal_state == TerminalState.COMPLETED.value:
            group.scored.add(event.trajectory_id)
        if not group.cancelled and len(group.scored) >= self.group_size:
            group.cancelled = True
            self._cancel_open(group, ctx, f"redundant: group has {len(group.scored)} scored")
        if len(group.ended) == len(group.members):
            del self.groups[group.group_id]
        return True

    def close(self, ctx: WorkerContext) -> None:
        """The run is stopping: cancel what is still in flight, so every launched trajectory ends once."""
        for group in self.groups.values():
            self._cancel_open(group, ctx, "run-stopped")

    def _cancel_open(self, group: GroupState, ctx: WorkerContext, reason: str) -> None:
        for tid in group.members:
            if tid not in group.ended:
                ctx.produce(
                    ctx.topics.env_actions,
                    tid,
                    EnvAction(
                        run_id=ctx.topics.run_id,
                        trajectory_id=tid,
                        group_id=group.group_id,
                        kind=EnvActionKind.CANCEL,
                        domain=group.domain,
                        task_seed=group.task_seed,
                        reason=reason,
                    ),
                )

    def done(self) -> bool:
        return self.max_trajectories is not None and self.ended >= self.max_trajectories

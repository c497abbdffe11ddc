"""Reward worker (group ``reward`` on ``observations``): score each trajectory the moment it ends.

Only terminal observations matter here. A completed trajectory is scored (math-verify, the code
sandbox, the game's return, or the HTTP reward endpoint) in a thread pool, overlapped with rollout;
an aborted/failed/cancelled one is forwarded unscored, so the trainer and scheduler learn that the
group member resolved. Either way exactly one `ScoredTrajectory` goes to ``scored-trajectories``
(keyed by group id) per trajectory id this worker sees.
"""

from __future__ import annotations

import json
import logging
import queue
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from rollstream.config import Config
from rollstream.schemas.events import Event, Observation, ScoredTrajectory, TerminalState
from rollstream.workers.loop import Handler, MessageRef, WorkerContext
from rollstream.workers.metrics import METRICS
from rollstream.workers.rewards import score
from rollstream.workers.rewards.http import HttpRewardClient

log = logging.getLogger(__name__)
SEEN_LIMIT = 200_000


class RewardWorker(Handler):
    role = "reward"

    def __init__(self, cfg: Config, threads: int = 4) -> None:
        self.cfg = cfg
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="reward")
        self._done: queue.SimpleQueue[tuple[Observation, MessageRef, float, str, str]] = queue.SimpleQueue()
        self._running = 0
        self._seen: OrderedDict[str, None] = OrderedDict()  # terminal trajectories already scored
        self._http = (
            HttpRewardClient(cfg.reward.http_url, timeout_s=cfg.reward.timeout_s, retries=cfg.reward.retries)
            if cfg.reward.http_url
            else None
        )

    def topics(self, ctx: WorkerContext) -> list[str]:
        return [ctx.topics.observations]

    def in_flight(self) -> int:
        return self._running

    def on_event(self, event: Event, ref: MessageRef, ctx: WorkerContext) -> bool:
        if not isinstance(event, Observation):
            raise TypeError(f"reward worker got {type(event).__name__}, expected Observation")
        if not event.terminal_state:
            return True
        if event.trajectory_id in self._seen:
            return True  # a second terminal for the same trajectory (re-delivery): first one wins
        self._seen[event.trajectory_id] = None
        if len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)
        if event.terminal_state != TerminalState.COMPLETED.value:
            self._emit(event, ctx, 0.0, "none", "")
            return True
        self._running += 1
        self._executor.submit(self._score, event, ref)
        return False

    def _score(self, obs: Observation, ref: MessageRef) -> None:
        response = obs.turns[-1].action_text if obs.turns else ""
        try:
            info = json.loads(obs.info_json or "{}")
            if self._http is not None and obs.domain in self.cfg.reward.http_domains:
                reward, source = self._http.score(obs.trajectory_id, obs.domain, response, info), "http"
            else:
                reward, source = score(obs.domain, response, info, obs.env_return)
            self._done.put((obs, ref, float(reward), source, ""))
        except Exception as exc:  # a verifier crash fails only this trajectory's score
            self._done.put((obs, ref, 0.0, "error", f"reward-error: {type(exc).__name__}: {exc}"))

    def tick(self, ctx: WorkerContext) -> None:
        while True:
            try:
                obs, ref, reward, source, error = self._done.get_nowait()
            except queue.Empty:
                return
            self._running -= 1
            if error:
                obs.terminal_state, obs.reason = TerminalState.FAILED.value, error
                METRICS.failures.labels(role="reward", reason="reward-error").inc()
            self._emit(obs, ctx, reward, source, error)
            ctx.finish(ref)

    def _emit(self, obs: Observation, ctx: WorkerContext, reward: float, source: str, error: str) -> None:
        versions = [t.policy_version for t in obs.turns]
        ctx.produce(
            ctx.topics.scored,
            obs.group_id,
            ScoredTrajectory(
                run_id=obs.run_id,
                trajectory_id=obs.trajectory_id,
                group_id=obs.group_id,
                policy_version=max(versions) if versions else obs.policy_version,
                domain=obs.domain,
                task_seed=obs.task_seed,
                reward=reward,
                reward_source=source,
                terminal_state=obs.terminal_state,
                reason=obs.reason,
                first_version=obs.first_version,
                last_version=max(versions) if versions else -1,
                num_turns=len(obs.turns),
                turns=obs.turns,
            ),
        )
        METRICS.scored.labels(domain=obs.domain, source=source).inc()

    def close(self, ctx: WorkerContext) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

"""Environment worker (group ``env.<pool>`` on ``env-actions``): one EnvManager per trajectory.

RESET -> env.reset -> first GenRequest; ACTION -> env.step -> Observation, then the next GenRequest or
the terminal Observation carrying the whole trajectory; ABORT/CANCEL -> close with that terminal state.

`reset`/`step` run in a thread pool; their results come back through a queue that the poll loop
drains in `tick`, so all trajectory state is touched by the loop thread only, and one slow or hung
environment never blocks the others. A step past its timeout, or an exception in the environment,
ends only that trajectory (terminal state ``failed`` with the reason).
"""

from __future__ import annotations

import json
import logging
import queue
import time
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rollstream.config import Config
from rollstream.schemas.events import (
    EnvAction,
    EnvActionKind,
    Event,
    GenRequest,
    Observation,
    TerminalState,
    Turn,
)
from rollstream.workers.envs import TextEnv, make_env
from rollstream.workers.envs.latency import LatencyEnv, StepLatency
from rollstream.workers.loop import Handler, MessageRef, WorkerContext
from rollstream.workers.metrics import METRICS
from rollstream.workers.routing import PoolRouter

log = logging.getLogger(__name__)

ENDED_MEMORY = 100_000  # ids of ended trajectories kept to ignore their late ACTIONs


@dataclass
class EnvManager:
    """One trajectory's environment and history, owned by the env worker that holds its partition."""

    trajectory_id: str
    group_id: str
    domain: str
    task_seed: int
    partition: int
    env: TextEnv
    turn: int = 0
    prompt: str = ""
    first_version: int = -1
    turns: list[Turn] = field(default_factory=list)
    env_return: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    busy_since: float | None = None  # a reset/step is running since (monotonic)
    end_reason: tuple[str, str] | None = None  # CANCEL/ABORT that arrived during a step
    pending: MessageRef | None = None  # the message whose work is running
    dead: bool = False


@dataclass
class _Result:
    manager: EnvManager
    kind: str  # reset | step
    ref: MessageRef
    action: EnvAction | None
    value: Any = None
    error: BaseException | None = None
    elapsed_ms: float = 0.0


class EnvWorker(Handler):
    role = "env"

    def __init__(self, cfg: Config, pool: str, router: PoolRouter) -> None:
        self.cfg = cfg
        self.pool = pool
        self.router = router
        self.managers: dict[str, EnvManager] = {}
        # Trajectories this worker ended: a late ACTION/ABORT for one (e.g. generated while its CANCEL was
        # on the way) must not produce a second terminal state.
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._results: queue.SimpleQueue[_Result] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(cfg.env.step_threads, thread_name_prefix="env-step")
        self._latency_spec = cfg.env.latency
        self._busy = 0

    def topics(self, ctx: WorkerContext) -> list[str]:
        return [ctx.topics.env_actions]

    def in_flight(self) -> int:
        # Backpressure on running steps, not on trajectories waiting for generation.
        return self._busy * max(1, 10_000 // self.cfg.env.max_concurrency)

    # -- events -------------------------------------------------------------------------------------
    def on_event(self, event: Event, ref: MessageRef, ctx: WorkerContext) -> bool:
        if not isinstance(event, EnvAction):
            raise TypeError(f"env worker got {type(event).__name__}, expected EnvAction")
        manager = self.managers.get(event.trajectory_id)
        if event.kind is EnvActionKind.RESET:
            if manager is not None:
                return True  # re-delivered RESET of a trajectory already running here
            return self._reset(event, ref, ctx)
        if manager is None and event.trajectory_id in self._ended:
            return True  # already ended here, with its one terminal state
        if event.kind is EnvActionKind.ACTION:
            if manager is None:
                # Its state lived on a worker that died or lost the partition: end it, with why.
                self._emit_orphan(event, ctx, TerminalState.ABORTED, "env-state-lost")
                return True
            if event.turn != manager.turn or manager.busy_since is not None:
                return True  # duplicate ACTION (a generation worker re-delivered the request)
            return self._step(manager, event, ref)
        # ABORT / CANCEL
        state = TerminalState.CANCELLED if event.kind is EnvActionKind.CANCEL else TerminalState.ABORTED
        if manager is None:
            if event.kind is EnvActionKind.ABORT:
                self._emit_orphan(event, ctx, state, event.reason or "aborted")
            return True  # a CANCEL for a trajectory that already ended: nothing to do
        if manager.busy_since is not None:
            manager.end_reason = (state.value, event.reason)  # applied when the running step returns
            return True
        self._finish(manager, ctx, state.value, event.reason)
        return True

    def _reset(self, event: EnvAction, ref: MessageRef, ctx: WorkerContext) -> bool:
        try:
            env = make_env(event.domain, **self.cfg.rollout.env_options.get(event.domain, {}))
            if self._latency_spec != "none":
                # Seeded per trajectory: members of one group must not share a delay sequence.
                seed = zlib.crc32(event.trajectory_id.encode())
                env = LatencyEnv(env, StepLatency(self._latency_spec, seed=seed))
        except Exception as exc:
            self._emit_orphan(event, ctx, TerminalState.FAILED, f"env-create: {type(exc).__name__}: {exc}")
            return True
        manager = EnvManager(
            trajectory_id=event.trajectory_id,
            group_id=event.group_id,
            domain=event.domain,
            task_seed=event.task_seed,
            partition=ref.partition,
            env=env,
        )
        self.managers[event.trajectory_id] = manager
        METRICS.trajectories_in_flight.labels(role="env", pool=self.pool).set(len(self.managers))
        self._submit(manager, "reset", ref, None, lambda: env.reset(event.task_seed))
        return False

    def _step(self, manager: EnvManager, action: EnvAction, ref: MessageRef) -> bool:
        manager.first_version = action.first_version if manager.first_version < 0 else manager.first_version
        self._submit(manager, "step", ref, action, lambda: manager.env.step(action.action_text))
        return False

    def _submit(
        self, manager: EnvManager, kind: str, ref: MessageRef, action: EnvAction | None, fn: Any
    ) -> None:
        manager.busy_since = time.monotonic()
        manager.pending = ref
        self._busy += 1

        def run() -> None:
            start = time.perf_counter()
            try:
                value, error = fn(), None
            except BaseException as exc:  # the environment's fault ends only its trajectory
                value, error = None, exc
            self._results.put(
                _Result(manager, kind, ref, action, value, error, (time.perf_counter() - start) * 1000)
            )

        self._executor.submit(run)

    # -- completions (loop thread) ------------------------------------------------------------------
    def tick(self, ctx: WorkerContext) -> None:
        while True:
            try:
                result = self._results.get_nowait()
            except queue.Empty:
                break
            self._complete(result, ctx)
            # After its outputs were produced: the message commits once they are delivered.
            ctx.finish(result.ref)
        self._check_timeouts(ctx)

    def _complete(self, r: _Result, ctx: WorkerContext) -> None:
        m = r.manager
        self._busy -= 1
        m.busy_since = None
        if m.dead:
            return  # timed out or revoked meanwhile; its terminal state was already decided
        if r.error is not None:
            self._finish(
                m, ctx, TerminalState.FAILED.value, f"env-error: {type(r.error).__name__}: {r.error}"
            )
            return
        if m.end_reason is not None:
            self._finish(m, ctx, *m.end_reason)
            return
        METRICS.env_step_seconds.labels(domain=m.domain).observe(r.elapsed_ms / 1000)
        if r.kind == "reset":
            m.prompt, m.info = r.value[0], dict(r.value[1] or {})
            self._request_generation(m, ctx)
            return
        assert r.action is not None
        obs_text, reward, terminated, truncated, info = r.value
        a = r.action
        m.turns.append(
            Turn(
                turn=m.turn,
                prompt_text=m.prompt,
                prompt_token_ids=a.prompt_token_ids,
                action_text=a.action_text,
                action_token_ids=a.action_token_ids,
                behaviour_logprobs=a.behaviour_logprobs,
                policy_version=a.policy_version,
                reward=float(reward),
                gen_ms=a.gen_ms,
                env_ms=r.elapsed_ms,
                pool=a.pool,
            )
        )
        m.env_return += float(reward)
        m.info.update(info or {})
        m.turn += 1
        m.prompt = obs_text
        if terminated or truncated or m.turn >= m.env.max_turns:
            reason = "terminated" if terminated else "truncated"
            self._finish(m, ctx, TerminalState.COMPLETED.value, reason, terminated, truncated, r.elapsed_ms)
            return
        ctx.produce(ctx.topics.observations, m.trajectory_id, self._observation(m, ctx, reward, r.elapsed_ms))
        self._request_generation(m, ctx)

    def _observation(self, m: EnvManager, ctx: WorkerContext, reward: float, env_ms: float) -> Observation:
        return Observation(
            run_id=ctx.topics.run_id,
            trajectory_id=m.trajectory_id,
            group_id=m.group_id,
            policy_version=m.turns[-1].policy_version if m.turns else -1,
            domain=m.domain,
            pool=self.pool,
            turn=m.turn,
            task_seed=m.task_seed,
            text=m.prompt,
            reward=float(reward),
            env_return=m.env_return,
            env_ms=env_ms,
            first_version=m.first_version,
        )

    def _request_generation(self, m: EnvManager, ctx: WorkerContext) -> None:
        pool, fallback_from = self.router.route(m.domain)
        if fallback_from:
            METRICS.fallbacks.labels(preferred=fallback_from, used=pool).inc()
        ctx.produce(
            ctx.topics.gen_requests(pool),
            m.trajectory_id,
            GenRequest(
                run_id=ctx.topics.run_id,
                trajectory_id=m.trajectory_id,
                group_id=m.group_id,
                policy_version=m.first_version,
                domain=m.domain,
                pool=pool,
                turn=m.turn,
                prompt_text=m.prompt,
                max_new_tokens=self.cfg.rollout.max_new_tokens.get(m.domain, 32),
                first_version=m.first_version,
                fallback_from=fallback_from,
            ),
        )

    def _finish(
        self,
        m: EnvManager,
        ctx: WorkerContext,
        state: str,
        reason: str,
        terminated: bool = False,
        truncated: bool = False,
        env_ms: float = 0.0,
    ) -> None:
        """Emit the one terminal observation of this trajectory and forget it."""
        m.dead = True
        self.managers.pop(m.trajectory_id, None)
        self._remember_ended(m.trajectory_id)
        obs = self._observation(m, ctx, m.turns[-1].reward if m.turns else 0.0, env_ms)
        obs.terminal_state, obs.reason = state, reason
        obs.terminated, obs.truncated = terminated, truncated
        obs.turns = m.turns
        obs.info_json = json.dumps(m.info, default=str)
        ctx.produce(ctx.topics.observations, m.trajectory_id, obs)
        METRICS.terminal_states.labels(role="env", state=state).inc()
        METRICS.trajectories_in_flight.labels(role="env", pool=self.pool).set(len(self.managers))
        try:
            m.env.close()
        except Exception as exc:
            log.debug("env close failed: %s", exc)

    def _remember_ended(self, trajectory_id: str) -> None:
        self._ended[trajectory_id] = None
        if len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _emit_orphan(self, e: EnvAction, ctx: WorkerContext, state: TerminalState, reason: str) -> None:
        self._remember_ended(e.trajectory_id)
        ctx.produce(
            ctx.topics.observations,
            e.trajectory_id,
            Observation(
                run_id=ctx.topics.run_id,
                trajectory_id=e.trajectory_id,
                group_id=e.group_id,
                policy_version=e.policy_version,
                domain=e.domain,
                pool=self.pool,
                turn=e.turn,
                task_seed=e.task_seed,
                terminal_state=state.value,
                reason=reason,
                first_version=e.first_version,
            ),
        )
        METRICS.terminal_states.labels(role="env", state=state.value).inc()

    def _check_timeouts(self, ctx: WorkerContext) -> None:
        limit = self.cfg.env.step_timeout_s
        now = time.monotonic()
        for m in list(self.managers.values()):
            if m.busy_since is not None and now - m.busy_since > limit:
                # The thread stays stuck in the environment; its late result is discarded (m.dead).
                self._finish(m, ctx, TerminalState.FAILED.value, f"step-timeout: no answer in {limit:g}s")
                if m.pending is not None:
                    ctx.finish(m.pending)

    # -- rebalance / stop ---------------------------------------------------------------------------
    def on_revoked(self, ctx: WorkerContext, partitions: list[tuple[str, int]]) -> None:
        """The partition's next owner aborts these trajectories on their next ACTION (env-state-lost)."""
        lost = {p for _, p in partitions}
        for m in list(self.managers.values()):
            if m.partition in lost:
                m.dead = True
                self.managers.pop(m.trajectory_id, None)
                m.env.close()

    def close(self, ctx: WorkerContext) -> None:
        for m in list(self.managers.values()):
            m.dead = True
            m.env.close()
        self.managers.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.router.stop()

"""Per-turn latency the rollout pipeline adds, and the most turns/s it sustains.

One turn = env worker -> ``gen-requests.<pool>`` -> generation worker -> ``env-actions`` -> env worker.
The environment is a no-op (``noop``: returns at once, ``--turns`` turns per trajectory) and the
generation backend is the scripted one, so what is measured is the pipeline: Kafka hops, polling,
batching, (de)serialisation and the workers' own loops.

Each worker is its own process (``python bench/bench_turn_latency.py _worker ...``, which registers
the no-op env and then runs the ordinary ``run_worker``), as ``rollstream run`` would start it. After
a phase ends, the run's topics are read back and, per trajectory and turn ``t``:

* ``turn_ms``   = GenRequest(t+1).created_at - GenRequest(t).created_at (a whole turn, env step ~0);
* ``added_ms``  = turn_ms - gen_ms(t) - env_ms(t): what the pipeline adds over generation and the env;
* ``to_gen_ms`` = ACTION(t).created_at - GenRequest(t).created_at - gen_ms (hop 1 + queueing/batching);
* ``to_env_ms`` = GenRequest(t+1).created_at - ACTION(t).created_at - env_ms (hop 2 + step dispatch).

Timestamps are wall-clock milliseconds of one machine. Phases: ``latency`` (few trajectories in
flight: the per-turn cost) and ``throughput`` (many in flight: turns/s).

    rollstream broker up --home /tmp/bench-broker2 --port 19192 --controller-port 19193
    python bench/bench_turn_latency.py --bootstrap 127.0.0.1:19192
    rollstream broker down --home /tmp/bench-broker2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

NOOP = "noop"


class NoopEnv:
    """Returns at once; ends after ``turns`` steps with return 1.0."""

    domain = NOOP

    def __init__(self, turns: int = 20) -> None:
        self.max_turns = turns
        self._turn = 0

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self._turn = 0
        return f"noop seed {seed} turn 0", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._turn += 1
        done = self._turn >= self.max_turns
        return f"turn {self._turn}", 1.0 if done else 0.0, done, False, {}

    def close(self) -> None:
        pass


def register_noop() -> None:
    """Add the ``noop`` domain to the env registry and give it a reward (its return)."""
    import rollstream.workers.envs as envs
    import rollstream.workers.reward_worker as reward_worker

    envs._REGISTRY[NOOP] = lambda **o: NoopEnv(**o)
    if NOOP not in envs.DOMAINS:
        envs.DOMAINS = (*envs.DOMAINS, NOOP)
    real_score = reward_worker.score

    def score(domain: str, response_text: str, info: dict[str, Any], env_return: float) -> tuple[float, str]:
        return (env_return, "env") if domain == NOOP else real_score(domain, response_text, info, env_return)

    reward_worker.score = score


def worker_main(argv: list[str]) -> int:
    """``_worker <role> <pool|-> <run> <config.json> <bootstrap> [trajectories] [profile.out]``."""
    register_noop()
    from rollstream.config import load_config
    from rollstream.workers.runtime import run_worker

    role, pool, run_id, config, bootstrap = argv[:5]
    options: dict[str, Any] = {}
    if len(argv) > 5 and argv[5] != "-":
        options["trajectories"] = int(argv[5])
    cfg = load_config(config, environ={})
    profile = argv[6] if len(argv) > 6 else ""
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    try:
        run_worker(role, cfg, bootstrap, run_id, None if pool == "-" else pool, **options)
    finally:
        if profile:
            prof.disable()
            prof.dump_stats(profile)
    return 0


@dataclass
class PhaseResult:
    name: str
    trajectories: int
    in_flight: int
    turns: int
    wall_s: float
    turns_per_s: float
    turn_ms: np.ndarray
    added_ms: np.ndarray
    to_gen_ms: np.ndarray
    to_env_ms: np.ndarray
    gen_ms: np.ndarray
    completed: int

    def summary(self) -> dict[str, Any]:
        def pct(a: np.ndarray) -> dict[str, float]:
            if not len(a):
                return {}
            return {
                q: round(float(np.percentile(a, p)), 2) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))
            }

        return {
            "phase": self.name,
            "trajectories": self.trajectories,
            "completed": self.completed,
            "in_flight": self.in_flight,
            "turns": self.turns,
            "wall_s": round(self.wall_s, 2),
            "turns_per_s": round(self.turns_per_s, 1),
            "turn_ms": pct(self.turn_ms),
            "added_ms": pct(self.added_ms),
            "to_gen_ms": pct(self.to_gen_ms),
            "to_env_ms": pct(self.to_env_ms),
            "gen_ms": pct(self.gen_ms),
        }


def _read_all(cfg: Any, bootstrap: str, topics: list[str]) -> list[tuple[str, Any]]:
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from rollstream.clients import base_conf, make_consumer
    from rollstream.schemas.codec import make_codec
    from rollstream.topics.admin import TopicAdmin

    admin = TopicAdmin(base_conf(cfg, bootstrap))
    consumer = make_consumer(cfg, bootstrap, f"bench-reader-{uuid.uuid4().hex[:6]}", "bench-reader")
    parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(admin.partitions_of(t))]
    consumer.assign(parts)
    codec = make_codec(None)
    out: list[tuple[str, Any]] = []
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 2.0:
        msgs = consumer.consume(5000, 0.2)
        if msgs:
            idle_since = time.monotonic()
        for m in msgs:
            if not m.error():
                out.append((str(m.topic()), codec.decode(m.value())))
    consumer.close()
    return out


def run_phase(
    name: str,
    bootstrap: str,
    *,
    trajectories: int,
    in_flight: int,
    turns: int,
    overrides: list[str],
    workdir: Path,
    profile: str = "",
) -> PhaseResult:
    register_noop()
    from rollstream.config import load_config
    from rollstream.runner import ensure_topics
    from rollstream.schemas.events import EnvAction, EnvActionKind, GenRequest, Observation
    from rollstream.topics.specs import RunTopics

    run_id = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    cfg = load_config(
        None,
        [
            f'rollout.domains=["{NOOP}"]',
            f'rollout.domain_pools={{"{NOOP}": "h800"}}',
            f'rollout.env_options={{"{NOOP}": {{"turns": {turns}}}}}',
            f'rollout.max_new_tokens={{"{NOOP}": 4}}',
            "rollout.group_size=1",
            "trainer.min_group_size=1",
            f"rollout.max_in_flight={in_flight}",
            *overrides,
        ],
        environ={},
    )
    ensure_topics(cfg, bootstrap, run_id)
    topics = RunTopics(run_id, cfg.kafka.topic_prefix)
    config_file = workdir / f"{run_id}.json"
    config_file.write_text(json.dumps(cfg.to_dict()))
    procs: list[subprocess.Popen[bytes]] = []
    logs = []

    def spawn(
        role: str, pool: str = "-", trajectories_arg: str = "-", prof: str = ""
    ) -> subprocess.Popen[bytes]:
        log = open(workdir / f"{run_id}-{role}.log", "w")  # noqa: SIM115 - closed below
        logs.append(log)
        args = [role, pool, run_id, str(config_file), bootstrap, trajectories_arg]
        if prof:
            args.append(prof)
        p = subprocess.Popen(
            [sys.executable, __file__, "_worker", *args], stdout=log, stderr=subprocess.STDOUT
        )
        procs.append(p)
        return p

    try:
        env_prof = f"{workdir}/{run_id}-env.prof" if profile == "env" else ""
        gen_prof = f"{workdir}/{run_id}-gen.prof" if profile == "gen" else ""
        spawn("env", "cpu", prof=env_prof)
        spawn("gen", "h800", prof=gen_prof)
        spawn("reward")
        time.sleep(8.0)  # imports (the scripted backend pulls in torch) and group joins
        sched = spawn("scheduler", trajectories_arg=str(trajectories))
        sched.wait(timeout=600)
        if sched.returncode != 0:
            raise RuntimeError(f"scheduler exited {sched.returncode}; logs in {workdir}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in logs:
            log.close()

    events = _read_all(cfg, bootstrap, [topics.gen_requests("h800"), topics.env_actions, topics.observations])
    req_at: dict[tuple[str, int], int] = {}
    act: dict[tuple[str, int], EnvAction] = {}
    resets: list[int] = []
    terminal_at: list[int] = []
    env_ms: dict[tuple[str, int], float] = {}
    completed = 0
    total_turns = 0
    for _, e in events:
        if isinstance(e, GenRequest):
            req_at.setdefault((e.trajectory_id, e.turn), e.created_at_ms)
        elif isinstance(e, EnvAction):
            if e.kind is EnvActionKind.ACTION:
                act.setdefault((e.trajectory_id, e.turn), e)
            elif e.kind is EnvActionKind.RESET:
                resets.append(e.created_at_ms)
        elif isinstance(e, Observation) and e.terminal_state:
            terminal_at.append(e.created_at_ms)
            completed += e.terminal_state == "completed"
            total_turns += len(e.turns)
            for done_turn in e.turns:
                env_ms[(e.trajectory_id, done_turn.turn)] = done_turn.env_ms
    turn, added, to_gen, to_env, gen = [], [], [], [], []
    for (tid, t), at in req_at.items():
        nxt = req_at.get((tid, t + 1))
        a = act.get((tid, t))
        if nxt is None or a is None:
            continue
        e_ms = env_ms.get((tid, t), 0.0)
        turn.append(nxt - at)
        added.append(nxt - at - a.gen_ms - e_ms)
        to_gen.append(a.created_at_ms - at - a.gen_ms)
        to_env.append(nxt - a.created_at_ms - e_ms)
        gen.append(a.gen_ms)
    wall_s = (max(terminal_at) - min(resets)) / 1000 if resets and terminal_at else float("nan")
    return PhaseResult(
        name,
        trajectories,
        in_flight,
        total_turns,
        wall_s,
        total_turns / wall_s if wall_s else 0.0,
        np.array(turn, dtype=float),
        np.array(added, dtype=float),
        np.array(to_gen, dtype=float),
        np.array(to_env, dtype=float),
        np.array(gen, dtype=float),
        completed,
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_worker":
        return worker_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default="127.0.0.1:19192")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--latency-trajectories", type=int, default=40)
    p.add_argument("--latency-in-flight", type=int, default=4)
    p.add_argument("--throughput-trajectories", type=int, default=600)
    p.add_argument("--throughput-in-flight", type=int, default=256)
    p.add_argument("--phases", default="latency,throughput")
    p.add_argument("--set", action="append", default=[], help="config override for every worker")
    p.add_argument("--profile", choices=["", "env", "gen"], default="", help="cProfile one worker")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-turn-latency-"))
    results = []
    for phase in args.phases.split(","):
        n, c = (
            (args.latency_trajectories, args.latency_in_flight)
            if phase == "latency"
            else (args.throughput_trajectories, args.throughput_in_flight)
        )
        r = run_phase(
            phase,
            args.bootstrap,
            trajectories=n,
            in_flight=c,
            turns=args.turns,
            overrides=args.set,
            workdir=workdir,
            profile=args.profile,
        )
        results.append(r.summary())
        print(json.dumps(r.summary()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"logs and profiles in {workdir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

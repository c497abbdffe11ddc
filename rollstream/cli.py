"""The `rollstream` command line."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rollstream.config import Config, ConfigError, check_run_id, load_config


def _config(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None), getattr(args, "set", None) or [])


def _broker(cfg: Config, args: argparse.Namespace) -> Any:
    from rollstream.infra.kafka.broker import EmbeddedBroker, default_home

    home = Path(getattr(args, "home", None) or cfg.broker.home or default_home())
    port = getattr(args, "port", None) or cfg.broker.port
    cport = getattr(args, "controller_port", None) or cfg.broker.controller_port
    return EmbeddedBroker(home, port=port, controller_port=cport, heap=cfg.broker.heap)


def _bootstrap(cfg: Config, args: argparse.Namespace, start: bool = False) -> str:
    """--bootstrap, else kafka.bootstrap_servers, else the embedded broker (started if `start`)."""
    explicit = getattr(args, "bootstrap", None) or cfg.kafka.bootstrap_servers
    if explicit:
        return str(explicit)
    broker = _broker(cfg, args)
    info = broker.status()
    if info is None:
        if not start:
            raise SystemExit(
                "no Kafka broker: run `rollstream broker up`, or set kafka.bootstrap_servers / --bootstrap"
            )
        print(f"starting the embedded Kafka broker in {broker.home} ...", flush=True)
        info = broker.up()
        print(f"broker up at {info.bootstrap} in {info.started_in_s:.1f}s (pid {info.pid})", flush=True)
    return str(info.bootstrap)


# -- broker -------------------------------------------------------------------------------------------
def cmd_broker(args: argparse.Namespace) -> int:
    cfg = _config(args)
    broker = _broker(cfg, args)
    if args.action == "fetch":
        from rollstream.infra.kafka.broker import resolve_jars

        print(f"broker jars in {resolve_jars()}")
    elif args.action == "up":
        info = broker.up()
        state = "already running" if info.already_running else f"started in {info.started_in_s:.1f}s"
        print(f"broker {state}: {info.bootstrap} pid {info.pid} home {info.home}")
    elif args.action == "down":
        print("broker stopped" if broker.down() else "broker was not running")
    elif args.action == "status":
        info = broker.status()
        if info is None:
            print("broker not running")
            return 1
        print(f"broker running: {info.bootstrap} pid {info.pid} home {info.home}")
    elif args.action == "logs":
        print(broker.logs(args.lines))
    return 0


# -- topics -------------------------------------------------------------------------------------------
def cmd_topics(args: argparse.Namespace) -> int:
    from rollstream.clients import base_conf
    from rollstream.topics.admin import TopicAdmin
    from rollstream.topics.specs import run_topic_specs

    cfg = _config(args)
    run_id = check_run_id(args.run)
    admin = TopicAdmin(base_conf(cfg, _bootstrap(cfg, args)))
    specs = run_topic_specs(run_id, cfg)
    if args.action == "delete":
        deleted = admin.delete([s.name for s in specs])
        print(json.dumps(deleted) if args.json else f"deleted {len(deleted)} topics of run {run_id}")
        return 0
    states = admin.apply(specs) if args.action == "apply" else admin.describe(specs)
    if args.json:
        print(json.dumps([s.as_dict() for s in states], indent=2))
    else:
        for s in states:
            detail = f"{s.partitions} partitions" if s.exists else ""
            print(f"{s.action:10} {s.name:60} {detail}")
            for d in s.drift:
                print(f"{'':10}   drift: {d}")
    drift = [s for s in states if s.drift]
    if drift and args.action == "apply":
        print(f"{len(drift)} topic(s) differ from their spec; left as they are", file=sys.stderr)
        return 3
    return 0


# -- worker / run -------------------------------------------------------------------------------------
def cmd_worker(args: argparse.Namespace) -> int:
    from rollstream.workers.runtime import run_worker

    cfg = _config(args)
    run_id = check_run_id(args.run)
    options: dict[str, Any] = {}
    if args.trajectories is not None:
        options["trajectories"] = args.trajectories
    if args.steps is not None:
        options["steps"] = args.steps
    stats = run_worker(
        args.role, cfg, _bootstrap(cfg, args), run_id, args.pool, metrics_port=args.metrics_port, **options
    )
    logging.getLogger(__name__).info("worker %s stopped: %s", args.role, stats)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from rollstream.runner import parse_counts, run_local

    cfg = _config(args)
    run_id = check_run_id(args.run or f"run-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.trajectories is None and args.steps is None:
        args.trajectories = 300
    bootstrap = _bootstrap(cfg, args, start=True)

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the run like Ctrl-C: workers are stopped by PID

    signal.signal(signal.SIGTERM, terminate)
    run_dir = Path(args.run_dir or Path.cwd() / "runs") / run_id
    run_local(
        cfg,
        bootstrap,
        run_id,
        run_dir,
        gen=parse_counts(args.gen, "gen"),
        env=parse_counts(args.env, "env"),
        reward=args.reward,
        trajectories=args.trajectories,
        steps=args.steps,
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from rollstream.evaluate import evaluate, load_version

    cfg = _config(args)
    model = load_version(cfg, _bootstrap(cfg, args), check_run_id(args.run), args.version)
    success, mean_return = evaluate(model, cfg, args.domain, args.episodes, greedy=not args.sample)
    result = {
        "run": args.run,
        "version": args.version,
        "domain": args.domain,
        "episodes": args.episodes,
        "success": success,
        "mean_return": mean_return,
    }
    print(
        json.dumps(result)
        if args.json
        else f"run {args.run} version {args.version}: held-out {args.domain} success {success:.3f} "
        f"(mean return {mean_return:.3f}, {args.episodes} episodes)"
    )
    return 0


# -- replay / fork / audit / export ------------------------------------------------------------------------
def cmd_replay(args: argparse.Namespace) -> int:
    from rollstream.replay import ReplayError, replay

    cfg = _config(args)
    try:
        result = replay(
            cfg, _bootstrap(cfg, args), check_run_id(args.run), args.to_version, store_uri=args.store
        )
    except ReplayError as exc:
        print(f"replay failed: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.as_dict()))
    elif result.divergence is not None:
        print(result.divergence.describe())
    else:
        d = result.as_dict()
        print(
            f"replay of run {args.run}: {d['versions_checked']} versions (to v{d['last_version']}) identical "
            f"to the record in {d['wall_s']:.2f}s (train {d['train_s']:.2f}s, fetch {d['fetch_s']:.2f}s; "
            f"the run took {d['recorded_span_s']:.1f}s from v0 to that version)"
        )
    return 0 if result.ok else 1


def cmd_fork(args: argparse.Namespace) -> int:
    from rollstream.replay import ReplayError, fork

    cfg = load_config(args.config, [])
    bootstrap = _bootstrap(cfg, args)
    new_run = check_run_id(args.as_run)
    try:
        result = fork(
            cfg,
            bootstrap,
            check_run_id(args.run),
            args.from_version,
            new_run,
            args.set or [],
            config_path=args.config,
            to_version=args.to_version,
            from_store=args.from_store,
            store_uri=args.store,
        )
    except ReplayError as exc:
        print(f"fork failed: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(
            f"fork {new_run} of {args.run}@v{args.from_version}: "
            f"versions {result.versions[0]}..{result.versions[-1]}"
            f" ({result.trained} samples trained, {result.dropped} dropped) in {result.wall_s:.2f}s"
        )
    if args.live:
        from rollstream.runner import parse_counts, run_local

        live_cfg = load_config(
            args.config, [f"trainer.weight_store={json.dumps(result.store_uri)}", *(args.set or [])]
        )
        run_local(
            live_cfg,
            bootstrap,
            new_run,
            Path(args.run_dir or Path.cwd() / "runs") / new_run,
            gen=parse_counts(args.gen, "gen"),
            env=parse_counts(args.env, "env"),
            reward=1,
            trajectories=None,
            steps=result.versions[-1] + args.live,
        )
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from rollstream.audit import audit, format_report, read_run_log

    cfg = _config(args)
    report = audit(
        read_run_log(cfg, _bootstrap(cfg, args), check_run_id(args.run)), require_closed=args.require_closed
    )
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1


def cmd_export(args: argparse.Namespace) -> int:
    from rollstream.audit import read_run_log
    from rollstream.export import export_run

    cfg = _config(args)
    paths = export_run(
        read_run_log(cfg, _bootstrap(cfg, args), check_run_id(args.run)), args.to, packed=args.packed
    )
    for name, path in paths.items():
        print(f"{name:14} {path}")
    return 0


# -- taps, analytics, top, report ---------------------------------------------------------------------------
def cmd_tap(args: argparse.Namespace) -> int:
    from rollstream.streams.tap import WhereError, parse_since, run_tap

    cfg = _config(args)
    start: str | int = "end"
    if args.from_beginning:
        start = "beginning"
    elif args.since:
        start = int((time.time() - parse_since(args.since)) * 1000)
    try:
        run_tap(
            cfg,
            _bootstrap(cfg, args),
            check_run_id(args.run),
            args.topic,
            where=args.where,
            start=start,
            limit=args.limit,
            as_json=args.json,
        )
    except (WhereError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0


def cmd_analytics(args: argparse.Namespace) -> int:
    from rollstream.streams.faust_app import faust_available, run_faust, run_inprocess

    cfg = _config(args)
    run_id = check_run_id(args.run)
    bootstrap = _bootstrap(cfg, args)
    engine = args.engine
    if engine == "auto":
        engine = "faust" if faust_available() else "inprocess"
    print(f"analytics of run {run_id} ({engine}): http://127.0.0.1:{args.web_port}/analytics/", flush=True)
    common = {"window_s": args.window, "emit_s": args.emit, "duration_s": args.duration}
    if engine == "faust":
        run_faust(cfg, bootstrap, run_id, web_port=args.web_port, **common)
    else:
        run_inprocess(cfg, bootstrap, run_id, web_port=args.web_port, **common)
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from rollstream.streams.top import run_top

    cfg = _config(args)
    run_top(cfg, _bootstrap(cfg, args), check_run_id(args.run), once=args.once, refresh_s=args.refresh)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from rollstream.streams.report import build_report

    cfg = _config(args)
    index = build_report(cfg, _bootstrap(cfg, args), check_run_id(args.run), Path(args.out))
    print(f"report: {index}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollstream", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="TOML (or JSON) config file")
        sp.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config key")
        sp.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the embedded broker)")

    b = sub.add_parser("broker", help="the embedded single-node KRaft Kafka broker")
    b.add_argument("action", choices=["fetch", "up", "down", "status", "logs"])
    b.add_argument("--home", help="data/log folder (default ~/.cache/rollstream/broker)")
    b.add_argument("--port", type=int)
    b.add_argument("--controller-port", type=int)
    b.add_argument("--lines", type=int, default=100)
    common(b)
    b.set_defaults(func=cmd_broker)

    t = sub.add_parser("topics", help="a run's topics")
    t.add_argument("action", choices=["apply", "describe", "delete"])
    t.add_argument("--run", required=True)
    t.add_argument("--json", action="store_true")
    common(t)
    t.set_defaults(func=cmd_topics)

    w = sub.add_parser("worker", help="one worker of a role, against any cluster")
    w.add_argument("role", choices=["env", "gen", "reward", "scheduler", "trainer"])
    w.add_argument("--run", required=True)
    w.add_argument("--pool", help="hardware pool (gen: h800, h20, ...; env: cpu)")
    w.add_argument("--trajectories", type=int, help="scheduler: launch this many, exit when all ended")
    w.add_argument("--steps", type=int, help="trainer: stop after this version")
    w.add_argument("--metrics-port", type=int, help="serve Prometheus metrics (0 = any free port)")
    common(w)
    w.set_defaults(func=cmd_worker)

    r = sub.add_parser("run", help="run every role on this machine, with progress")
    r.add_argument("--run", help="run name (default run-<timestamp>)")
    r.add_argument("--gen", default="h800=1,h20=1", help="generation workers per pool")
    r.add_argument("--env", default="cpu=1", help="environment workers per pool")
    r.add_argument("--reward", type=int, default=1)
    r.add_argument("--trajectories", type=int, help="rollout only: stop after N trajectories (default 300)")
    r.add_argument("--steps", type=int, help="train: stop after version K")
    r.add_argument("--run-dir", help="where worker logs and the run's config go (default ./runs)")
    common(r)
    r.set_defaults(func=cmd_run)

    e = sub.add_parser("eval", help="held-out success of a policy version")
    e.add_argument("--run", required=True)
    e.add_argument("--version", type=int, required=True)
    e.add_argument("--domain", default="frozenlake")
    e.add_argument("--episodes", type=int, default=200)
    e.add_argument("--sample", action="store_true", help="sample instead of greedy actions")
    e.add_argument("--json", action="store_true")
    common(e)
    e.set_defaults(func=cmd_eval)

    tp = sub.add_parser("tap", help="print a run's events live, committing nothing")
    tp.add_argument(
        "topic",
        help="observations, scored-trajectories, env-actions, gen-requests[.<pool>], weight-versions, "
        "dead-letters",
    )
    tp.add_argument("--run", required=True)
    tp.add_argument("--where", help="filter, e.g. 'domain==\"math\" and reward>0.5'")
    start = tp.add_mutually_exclusive_group()
    start.add_argument("--since", help="start from this long ago (30s, 5m, 2h)")
    start.add_argument("--from-beginning", action="store_true")
    tp.add_argument("--limit", type=int, help="exit after N matching events")
    tp.add_argument("--json", action="store_true", help="JSON lines")
    common(tp)
    tp.set_defaults(func=cmd_tap)

    an = sub.add_parser("analytics", help="live windowed analytics of a run (faust-streaming app)")
    an.add_argument("--run", required=True)
    an.add_argument("--engine", choices=["auto", "faust", "inprocess"], default="auto")
    an.add_argument("--window", type=float, default=10.0, help="tumbling window (s)")
    an.add_argument("--emit", type=float, default=2.0, help="publish changed windows every N s")
    an.add_argument("--web-port", type=int, default=6066)
    an.add_argument("--duration", type=float, help="stop after N s (default: until Ctrl-C)")
    common(an)
    an.set_defaults(func=cmd_analytics)

    to = sub.add_parser("top", help="live terminal dashboard of a run")
    to.add_argument("--run", required=True)
    to.add_argument("--once", action="store_true", help="print one frame and exit")
    to.add_argument("--refresh", type=float, default=2.0)
    common(to)
    to.set_defaults(func=cmd_top)

    rp = sub.add_parser("report", help="HTML report with plots, from a run's topics")
    rp.add_argument("--run", required=True)
    rp.add_argument("--out", required=True, help="output folder")
    common(rp)
    rp.set_defaults(func=cmd_report)

    rp = sub.add_parser("replay", help="re-run a run's training from its log; check every version's checksum")
    rp.add_argument("--run", required=True)
    rp.add_argument("--to-version", type=int, help="stop after this version (default: the last)")
    rp.add_argument("--store", help="weight store URI, if the recorded one moved (used for diagnosis only)")
    rp.add_argument("--json", action="store_true")
    common(rp)
    rp.set_defaults(func=cmd_replay)

    fk = sub.add_parser(
        "fork", help="continue a run from version K on the same log with new hyper-parameters"
    )
    fk.add_argument("--run", required=True)
    fk.add_argument("--from-version", type=int, required=True)
    fk.add_argument("--as", dest="as_run", required=True, help="the new run id")
    fk.add_argument("--to-version", type=int, help="stop after this version (default: the original's last)")
    fk.add_argument("--from-store", action="store_true", help="load K's weights + optimizer, no replay to K")
    fk.add_argument("--store", help="weight store for the fork (default: where the original's are)")
    fk.add_argument("--live", type=int, metavar="N", help="then train N more versions on new rollouts")
    fk.add_argument("--gen", default="h800=1", help="--live: generation workers per pool")
    fk.add_argument("--env", default="cpu=1", help="--live: environment workers per pool")
    fk.add_argument("--run-dir", help="--live: where worker logs go (default ./runs)")
    fk.add_argument("--json", action="store_true")
    common(fk)
    fk.set_defaults(func=cmd_fork)

    au = sub.add_parser("audit", help="check a run's topics: nothing lost, nothing twice, staleness")
    au.add_argument("--run", required=True)
    au.add_argument("--require-closed", action="store_true", help="open/pending trajectories are violations")
    au.add_argument("--json", action="store_true")
    common(au)
    au.set_defaults(func=cmd_audit)

    ex = sub.add_parser("export", help="a run's topics as Parquet (DuckDB / pandas)")
    ex.add_argument("--run", required=True)
    ex.add_argument("--to", required=True, help="output folder")
    ex.add_argument("--packed", action="store_true", help="token ids/logprobs as packed bytes, not lists")
    common(ex)
    ex.set_defaults(func=cmd_export)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

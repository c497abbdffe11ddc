"""`rollstream export`: a run's topics as Parquet files that DuckDB, pandas or Spark read directly.

Files (one row per ...):
  trajectories.parquet  launched trajectory: terminal state, reason, reward, versions, trained/dropped at
  turns.parquet         turn of a trajectory that ended (from its terminal observation)
  rewards.parquet       scored trajectory (reward, source, where it lies on scored-trajectories)
  versions.parquet      weight version (parent, checksum, sample counts, metrics, hyper-parameters)
  samples.parquet       (version, sample) pair: what each version trained on or dropped, with weights
Token ids and logprobs are ``list<int32>`` / ``list<float32>`` columns, or the packed little-endian bytes
with ``packed=True`` (smaller; ``numpy.frombuffer(b, '<i4')`` decodes them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollstream.audit import RunLog
from rollstream.schemas.events import Observation, ScoredTrajectory, Turn


def _list_col(data: list[bytes], dtype: str, arrow_type: pa.DataType) -> pa.Array:
    # Build list arrays from one concatenated buffer: per-row Python lists would dominate export time.
    arrays = [np.frombuffer(b, dtype=dtype) for b in data]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(dtype[1:]), type=arrow_type))


def _final_terminal(obs: list[Observation]) -> Observation | None:
    return max(obs, key=lambda o: len(o.turns)) if obs else None


def tables(log: RunLog, *, packed: bool = False) -> dict[str, pa.Table]:
    v: Any  # row values of mixed types
    trained_at: dict[str, tuple[int, float]] = {}
    dropped_at: dict[str, tuple[int, str]] = {}
    sample_rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "version",
            "trajectory_id",
            "group_id",
            "first_version",
            "weight",
            "status",
            "reason",
            "topic",
            "partition",
            "offset",
        )
    }
    for wv in log.versions:
        for status, refs in (("trained", wv.samples), ("dropped", wv.dropped)):
            for r in refs:
                if status == "trained":
                    trained_at[r.trajectory_id] = (wv.version, r.weight)
                else:
                    dropped_at[r.trajectory_id] = (wv.version, r.reason)
                for k, v in (
                    ("version", wv.version),
                    ("trajectory_id", r.trajectory_id),
                    ("group_id", r.group_id),
                    ("first_version", r.first_version),
                    ("weight", r.weight),
                    ("status", status),
                    ("reason", r.reason),
                    ("topic", r.topic),
                    ("partition", r.partition),
                    ("offset", r.offset),
                ):
                    sample_rows[k].append(v)

    scored_by_tid: dict[str, tuple[tuple[str, int, int], ScoredTrajectory]] = {}
    reward_rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "trajectory_id",
            "group_id",
            "domain",
            "task_seed",
            "reward",
            "reward_source",
            "terminal_state",
            "reason",
            "first_version",
            "last_version",
            "num_turns",
            "partition",
            "offset",
            "created_at_ms",
        )
    }
    for key, ev in sorted(log.scored.items()):
        scored_by_tid.setdefault(ev.trajectory_id, (key, ev))
        for k, v in (
            ("trajectory_id", ev.trajectory_id),
            ("group_id", ev.group_id),
            ("domain", ev.domain),
            ("task_seed", ev.task_seed),
            ("reward", ev.reward),
            ("reward_source", ev.reward_source),
            ("terminal_state", ev.terminal_state),
            ("reason", ev.reason),
            ("first_version", ev.first_version),
            ("last_version", ev.last_version),
            ("num_turns", ev.num_turns),
            ("partition", key[1]),
            ("offset", key[2]),
            ("created_at_ms", ev.created_at_ms),
        ):
            reward_rows[k].append(v)

    traj_rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "trajectory_id",
            "group_id",
            "domain",
            "task_seed",
            "launched_at_ms",
            "ended_at_ms",
            "terminal_state",
            "reason",
            "num_turns",
            "env_return",
            "reward",
            "first_version",
            "trained_version",
            "sample_weight",
            "dropped_version",
            "dropped_reason",
            "status",
        )
    }
    turn_rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "trajectory_id",
            "group_id",
            "turn",
            "policy_version",
            "pool",
            "prompt_text",
            "action_text",
            "reward",
            "gen_ms",
            "env_ms",
        )
    }
    prompts: list[bytes] = []
    actions: list[bytes] = []
    logprobs: list[bytes] = []
    status_of = _status_map(log)
    for tid in sorted(log.resets.keys() | log.terminals.keys()):
        reset = log.resets.get(tid)
        obs = _final_terminal(log.terminals.get(tid, []))
        scored = scored_by_tid.get(tid)
        t_v, t_w = trained_at.get(tid, (None, None))
        d_v, d_r = dropped_at.get(tid, (None, None))
        row = {
            "trajectory_id": tid,
            "group_id": (reset or obs).group_id,  # type: ignore[union-attr]
            "domain": (reset or obs).domain,  # type: ignore[union-attr]
            "task_seed": (reset or obs).task_seed,  # type: ignore[union-attr]
            "launched_at_ms": reset.created_at_ms if reset else None,
            "ended_at_ms": obs.created_at_ms if obs else None,
            "terminal_state": (scored[1].terminal_state if scored else obs.terminal_state) if obs else None,
            "reason": (scored[1].reason if scored else obs.reason) if obs else None,
            "num_turns": len(obs.turns) if obs else 0,
            "env_return": obs.env_return if obs else None,
            "reward": scored[1].reward if scored else None,
            "first_version": obs.first_version if obs else None,
            "trained_version": t_v,
            "sample_weight": t_w,
            "dropped_version": d_v,
            "dropped_reason": d_r,
            "status": status_of.get(tid, "open"),
        }
        for k, value in row.items():
            traj_rows[k].append(value)
        turns: list[Turn] = obs.turns if obs else []
        for t in turns:
            for k, v in (
                ("trajectory_id", tid),
                ("group_id", row["group_id"]),
                ("turn", t.turn),
                ("policy_version", t.policy_version),
                ("pool", t.pool),
                ("prompt_text", t.prompt_text),
                ("action_text", t.action_text),
                ("reward", t.reward),
                ("gen_ms", t.gen_ms),
                ("env_ms", t.env_ms),
            ):
                turn_rows[k].append(v)
            prompts.append(t.prompt_token_ids)
            actions.append(t.action_token_ids)
            logprobs.append(t.behaviour_logprobs)
    turns_table = pa.table(turn_rows)
    if packed:
        turns_table = turns_table.append_column("prompt_token_ids", pa.array(prompts, type=pa.binary()))
        turns_table = turns_table.append_column("action_token_ids", pa.array(actions, type=pa.binary()))
        turns_table = turns_table.append_column("behaviour_logprobs", pa.array(logprobs, type=pa.binary()))
    else:
        turns_table = turns_table.append_column("prompt_token_ids", _list_col(prompts, "<i4", pa.int32()))
        turns_table = turns_table.append_column("action_token_ids", _list_col(actions, "<i4", pa.int32()))
        turns_table = turns_table.append_column(
            "behaviour_logprobs", _list_col(logprobs, "<f4", pa.float32())
        )

    version_rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "version",
            "parent_version",
            "weights_sha256",
            "num_samples",
            "num_dropped",
            "seed",
            "store_uri",
            "created_at_ms",
            "reward_mean",
            "loss",
            "grad_norm",
            "train_s",
            "metrics_json",
            "timings_json",
            "hyperparams_json",
        )
    }
    for wv in log.versions:
        for k, v in (
            ("version", wv.version),
            ("parent_version", wv.parent_version),
            ("weights_sha256", wv.weights_sha256),
            ("num_samples", len(wv.samples)),
            ("num_dropped", len(wv.dropped)),
            ("seed", wv.seed),
            ("store_uri", wv.store_uri),
            ("created_at_ms", wv.created_at_ms),
            ("reward_mean", wv.metrics.get("reward_mean")),
            ("loss", wv.metrics.get("loss")),
            ("grad_norm", wv.metrics.get("grad_norm")),
            ("train_s", wv.timings.get("train_s")),
            ("metrics_json", json.dumps(wv.metrics, sort_keys=True)),
            ("timings_json", json.dumps(wv.timings, sort_keys=True)),
            ("hyperparams_json", wv.hyperparams_json),
        ):
            version_rows[k].append(v)
    return {
        "trajectories": _table(
            traj_rows,
            {
                "trained_version": pa.int64(),
                "dropped_version": pa.int64(),
                "sample_weight": pa.float64(),
                "reward": pa.float64(),
                "env_return": pa.float64(),
                "first_version": pa.int64(),
                "launched_at_ms": pa.int64(),
                "ended_at_ms": pa.int64(),
                "dropped_reason": pa.string(),
                "terminal_state": pa.string(),
                "reason": pa.string(),
            },
        ),
        "turns": turns_table,
        "rewards": pa.table(reward_rows),
        "versions": _table(
            version_rows,
            {
                "reward_mean": pa.float64(),
                "loss": pa.float64(),
                "grad_norm": pa.float64(),
                "train_s": pa.float64(),
            },
        ),
        "samples": pa.table(sample_rows),
    }


def _table(rows: dict[str, list[Any]], types: dict[str, pa.DataType]) -> pa.Table:
    # Explicit types where a column may be all-null (an empty run, nothing trained yet).
    return pa.table({k: pa.array(v, type=types.get(k)) for k, v in rows.items()})


def _status_map(log: RunLog) -> dict[str, str]:
    """trained / dropped-<reason> / aborted / failed / cancelled / pending / open, per trajectory."""
    out: dict[str, str] = {}
    for wv in log.versions:
        for r in wv.dropped:
            out[r.trajectory_id] = f"dropped-{r.reason or 'dropped'}"
        for r in wv.samples:
            out[r.trajectory_id] = "trained"
    for tid, obs in log.terminals.items():
        if tid not in out and obs:
            out[tid] = obs[0].terminal_state
    for ev in log.scored.values():
        if out.get(ev.trajectory_id) == "completed" and ev.terminal_state != "completed":
            out[ev.trajectory_id] = ev.terminal_state
    return {tid: ("pending" if s == "completed" else s) for tid, s in out.items()}


def export_run(log: RunLog, to: Path | str, *, packed: bool = False) -> dict[str, Path]:
    """Write every table under ``to``; returns name -> path."""
    out_dir = Path(to)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, table in tables(log, packed=packed).items():
        path = out_dir / f"{name}.parquet"
        pq.write_table(table, path, compression="zstd")
        paths[name] = path
    return paths

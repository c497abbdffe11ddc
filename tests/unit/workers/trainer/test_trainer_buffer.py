from __future__ import annotations

import math

import numpy as np
import pytest

from rollstream.workers.trainer.buffer import SampleBuffer
from rollstream.workers.trainer.grpo import Sample


def _s(tid: str, gid: str, v: int, reward: float = 1.0) -> Sample:
    turn = (np.array([1, 5]), np.array([6]), np.array([-0.1], np.float32), v)
    return Sample(trajectory_id=tid, group_id=gid, turns=[turn], reward=reward, first_version=v)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_drop_alpha_boundary() -> None:
    buf = SampleBuffer(alpha=2, policy="drop", gamma=0.0, group_size=2, min_group_size=2)
    assert buf.add(_s("a", "g1", v=3), current_version=3)
    assert buf.add(_s("b", "g1", v=2), current_version=3)
    # K=5: a has K-v=2 == alpha (kept), b has 3 == alpha+1 (dropped)
    evicted = buf.evict(current_version=5)
    assert [(s.trajectory_id, r) for s, r in evicted] == [("b", "stale")]
    assert len(buf) == 1
    assert buf.ready_groups(5, 10) == []


def test_drop_at_add_time() -> None:
    buf = SampleBuffer(alpha=0, policy="drop", gamma=0.0, group_size=1, min_group_size=1)
    buf.add(_s("x", "g", v=4), current_version=4)  # K-v == 0 == alpha: kept
    buf.add(_s("y", "h", v=3), current_version=4)  # 1 > alpha: evicted immediately
    assert [g[0].trajectory_id for g in buf.ready_groups(4, 10)] == ["x"]
    assert [(s.trajectory_id, r) for s, r in buf.evict(4)] == [("y", "stale")]


def test_downweight() -> None:
    buf = SampleBuffer(alpha=1, policy="downweight", gamma=0.5, group_size=3, min_group_size=3)
    for tid, v in (("a", 10), ("b", 9), ("c", 6)):
        buf.add(_s(tid, "g", v), current_version=10)
    assert buf.evict(10) == []
    (grp,) = buf.ready_groups(10, 1)
    w = {s.trajectory_id: s.weight for s in grp}
    assert w["a"] == 1.0 and w["b"] == 1.0  # K-v == alpha -> full weight
    assert w["c"] == pytest.approx(math.exp(-0.5 * 3))


def test_ready_ordering_and_max_groups() -> None:
    buf = SampleBuffer(alpha=5, policy="drop", gamma=0.0, group_size=2, min_group_size=2)
    for tid, gid in (("t9", "g2"), ("t1", "g2"), ("t5", "g1"), ("t3", "g1"), ("t7", "g3")):
        buf.add(_s(tid, gid, 0), 0)
    assert buf.num_ready(0) == 2
    ready = buf.ready_groups(0, max_groups=1)
    assert [[s.trajectory_id for s in g] for g in ready] == [["t3", "t5"]]
    ready = buf.ready_groups(0, max_groups=5)
    assert [[s.trajectory_id for s in g] for g in ready] == [["t1", "t9"]]
    assert buf.pending_group_ids == ["g3"]


def test_redundant_extras_and_late_arrivals() -> None:
    buf = SampleBuffer(alpha=5, policy="drop", gamma=0.0, group_size=2, min_group_size=1)
    for tid in ("c", "a", "b"):
        buf.add(_s(tid, "g", 0), 0)
    assert [[s.trajectory_id for s in g] for g in buf.ready_groups(0, 5)] == [["a", "b"]]
    buf.add(_s("d", "g", 0), 0)
    assert [(s.trajectory_id, r) for s, r in buf.evict(0)] == [("c", "redundant"), ("d", "group_closed")]


def test_duplicate_trajectory_ignored() -> None:
    buf = SampleBuffer(alpha=5, policy="drop", gamma=0.0, group_size=2, min_group_size=2)
    assert buf.add(_s("a", "g", 0), 0)
    assert not buf.add(_s("a", "g", 0), 0)
    assert len(buf) == 1


def test_partial_groups_after_timeout() -> None:
    clock = Clock()
    buf = SampleBuffer(
        alpha=5, policy="drop", gamma=0.0, group_size=4, min_group_size=2, group_timeout_s=10.0, clock=clock
    )
    buf.add(_s("a", "big", 0), 0)
    buf.add(_s("b", "big", 0), 0)
    buf.add(_s("c", "small", 0), 0)
    clock.t = 9.9
    assert buf.num_ready(0) == 0
    assert buf.ready_groups(0, 5) == []
    clock.t = 10.0
    assert buf.num_ready(0) == 1  # "big" only: "small" is under min_group_size
    ready = buf.ready_groups(0, 5)
    assert [[s.trajectory_id for s in g] for g in ready] == [["a", "b"]]
    assert [(s.trajectory_id, r) for s, r in buf.evict(0)] == [("c", "partial_group")]
    assert len(buf) == 0


def test_every_sample_exits_once() -> None:
    buf = SampleBuffer(alpha=1, policy="drop", gamma=0.0, group_size=3, min_group_size=3)
    added = 0
    trained: list[str] = []
    evicted: list[str] = []
    for k in range(6):
        for j in range(4):
            added += buf.add(_s(f"t{k}-{j}", f"g{k % 3}-{k // 2}", v=max(0, k - j % 3)), k)
        trained += [s.trajectory_id for g in buf.ready_groups(k, 2) for s in g]
        evicted += [s.trajectory_id for s, _ in buf.evict(k)]
    remaining = len(buf)
    assert len(trained) + len(evicted) + remaining == added
    assert len(set(trained) | set(evicted)) == len(trained) + len(evicted)


def test_validation() -> None:
    with pytest.raises(ValueError, match="policy"):
        SampleBuffer(alpha=1, policy="keep", gamma=0.0, group_size=2, min_group_size=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_group_size"):
        SampleBuffer(alpha=1, policy="drop", gamma=0.0, group_size=2, min_group_size=3)
    with pytest.raises(ValueError, match="alpha"):
        SampleBuffer(alpha=-1, policy="drop", gamma=0.0, group_size=2, min_group_size=1)

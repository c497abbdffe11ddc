"""Audit rules over hand-built decoded events: a clean run passes; each injected violation is caught."""

from __future__ import annotations

import json
import math

from rollstream.audit import RunLog, audit
from rollstream.replay import restage
from rollstream.schemas.events import (
    DeadLetter,
    EnvAction,
    EnvActionKind,
    Observation,
    SampleRef,
    ScoredTrajectory,
    WeightVersion,
)

RUN = "r1"
SCORED = f"rollstream.{RUN}.scored-trajectories"


def _hp(alpha: int = 1, policy: str = "drop", gamma: float = 0.5) -> str:
    return json.dumps({"trainer": {"alpha": alpha, "staleness_policy": policy, "gamma": gamma}})


def _ref(tid: str, offset: int, first_version: int, weight: float = 1.0, reason: str = "") -> SampleRef:
    return SampleRef(
        topic=SCORED,
        partition=0,
        offset=offset,
        trajectory_id=tid,
        group_id=tid.split("-t")[0],
        first_version=first_version,
        weight=weight,
        reason=reason,
    )


def _version(v: int, samples: list[SampleRef], dropped: list[SampleRef] = (), hp: str = "") -> WeightVersion:  # type: ignore[assignment]
    return WeightVersion(
        run_id=RUN,
        version=v,
        parent_version=v - 1,
        store_uri="/x",
        samples=list(samples),
        dropped=list(dropped),
        hyperparams_json=hp or _hp(),
    )


def clean_log() -> RunLog:
    """Two groups of two: g-a trains in v1, g-b in v2 (one member stale under alpha=1 -> dropped)."""
    log = RunLog(RUN)
    tids = ["g-a-t0", "g-a-t1", "g-b-t0", "g-b-t1", "g-b-t2"]
    firsts = {"g-a-t0": 0, "g-a-t1": 0, "g-b-t0": 1, "g-b-t1": 1, "g-b-t2": -1}
    for off, tid in enumerate(tids):
        gid = tid.split("-t")[0]
        log.add(
            "env-actions",
            "e",
            0,
            off,
            EnvAction(
                run_id=RUN, trajectory_id=tid, group_id=gid, kind=EnvActionKind.RESET, domain="frozenlake"
            ),
        )
        log.add(
            "observations",
            "o",
            0,
            off,
            Observation(
                run_id=RUN,
                trajectory_id=tid,
                group_id=gid,
                domain="frozenlake",
                terminal_state="completed",
                first_version=firsts[tid],
            ),
        )
        log.add(
            "scored-trajectories",
            SCORED,
            0,
            off,
            ScoredTrajectory(
                run_id=RUN, trajectory_id=tid, group_id=gid, domain="frozenlake", first_version=firsts[tid]
            ),
        )
    log.versions = [
        WeightVersion(run_id=RUN, version=0, parent_version=-1, store_uri="/x", hyperparams_json=_hp()),
        _version(1, [_ref("g-a-t0", 0, 0), _ref("g-a-t1", 1, 0)]),
        _version(2, [_ref("g-b-t0", 2, 1), _ref("g-b-t1", 3, 1)], [_ref("g-b-t2", 4, -1, reason="stale")]),
    ]
    return log


def rules(log: RunLog, **kw: bool) -> set[str]:
    return {v.rule for v in audit(log, **kw).violations}


def test_clean_run_passes() -> None:
    report = audit(clean_log(), require_closed=True)
    assert report.ok, report.violations
    assert report.states == {"trained": 4, "dropped-stale": 1}


def test_duplicated_sample_is_caught() -> None:
    log = clean_log()
    log.versions.append(_version(3, [_ref("g-a-t0", 0, 2)]))  # same offset and trajectory again
    violations = audit(log).violations
    assert {v.rule for v in violations} == {"no-twice"}
    assert all(v.subject == "g-a-t0" for v in violations)
    assert len(violations) == 2  # the offset, and the trajectory trained twice


def test_same_trajectory_at_another_offset_is_caught() -> None:
    log = clean_log()
    log.add(
        "scored-trajectories",
        SCORED,
        0,
        9,
        ScoredTrajectory(run_id=RUN, trajectory_id="g-a-t1", group_id="g-a", domain="frozenlake"),
    )
    log.versions.append(_version(3, [_ref("g-a-t1", 9, 2)]))
    assert "no-twice" in rules(log)


def test_missing_terminal_state() -> None:
    log = clean_log()
    log.add(
        "env-actions",
        "e",
        0,
        99,
        EnvAction(
            run_id=RUN, trajectory_id="g-c-t0", group_id="g-c", kind=EnvActionKind.RESET, domain="frozenlake"
        ),
    )
    assert audit(log).ok  # an open trajectory is normal in a run stopped mid-flight...
    assert audit(log).states["open"] == 1
    assert rules(log, require_closed=True) == {"terminal"}  # ...and a violation of a finished one


def test_trained_without_terminal_and_two_terminal_states() -> None:
    log = clean_log()
    del log.terminals["g-a-t0"]
    assert "terminal" in rules(log)
    log = clean_log()
    log.add(
        "observations",
        "o",
        0,
        50,
        Observation(
            run_id=RUN, trajectory_id="g-a-t1", group_id="g-a", domain="frozenlake", terminal_state="aborted"
        ),
    )
    assert rules(log) == {"terminal"}


def test_trained_and_dropped_is_two_terminal_states() -> None:
    log = clean_log()
    log.versions[2].dropped.append(_ref("g-a-t0", 0, 0, reason="stale"))
    assert "terminal" in rules(log) and "no-twice" in rules(log)


def test_sample_beyond_alpha() -> None:
    log = clean_log()
    log.versions[2].samples.append(log.versions[2].dropped.pop())  # K=1, v=-1: lag 2 > alpha 1
    violations = [v for v in audit(log).violations if v.rule == "staleness"]
    assert len(violations) == 1 and "K - v = 2 > alpha = 1" in violations[0].detail


def test_stale_drop_without_cause() -> None:
    log = clean_log()
    log.versions[2].dropped[0].first_version = 1
    assert rules(log) == {"staleness"}


def test_downweight_weights_checked() -> None:
    log = clean_log()
    v2 = log.versions[2]
    v2.hyperparams_json = _hp(policy="downweight", gamma=0.5)
    stale = v2.dropped.pop()
    stale.reason = ""
    stale.weight = math.exp(-0.5 * 1)  # K=1, v=-1, alpha=1: excess 1
    v2.samples.append(stale)
    assert audit(log).ok
    stale.weight = 1.0
    assert rules(log) == {"staleness"}


def test_gap_in_versions() -> None:
    log = clean_log()
    log.versions[2].version = 3
    log.versions[2].parent_version = 1
    violations = audit(log).violations
    assert {v.rule for v in violations} == {"versions"}
    assert "gap" in violations[0].detail


def test_wrong_parent_and_repeated_version() -> None:
    log = clean_log()
    log.versions[2].parent_version = 0
    assert "versions" in rules(log)
    log = clean_log()
    log.versions.append(_version(2, []))
    assert rules(log) == {"versions"}


def test_fork_lineage_may_start_at_its_root() -> None:
    log = RunLog("r2")
    hp = json.dumps({"trainer": {"alpha": 1}, "fork": {"from_run": RUN, "from_version": 4}})
    log.versions = [
        WeightVersion(run_id="r2", version=4, parent_version=3, store_uri="/x", hyperparams_json=hp),
        WeightVersion(
            run_id="r2",
            version=5,
            parent_version=4,
            store_uri="/x",
            hyperparams_json=hp,
            samples=[_ref("g-z-t0", 7, 4)],
        ),
    ]
    assert audit(log).ok  # refs to the parent run's topic are that run's business
    log.versions[0].hyperparams_json = _hp()
    assert rules(log) == {"versions"}


def test_ref_to_wrong_message() -> None:
    log = clean_log()
    log.versions[1].samples[0].offset = 2  # offset 2 holds g-b-t0
    assert "sample-refs" in rules(log)


def test_dead_letters_counted_and_required() -> None:
    log = clean_log()
    log.add("observations", "rollstream.r1.observations", 3, 17, None, "bad magic")
    assert rules(log) == {"dead-letters"}
    dl = DeadLetter(
        run_id=RUN,
        original_topic="rollstream.r1.observations",
        original_partition=3,
        original_offset=17,
        original_key=None,
        original_value=b"x",
        original_size=1,
        reason="undecodable",
        error="bad magic",
    )
    log.add("dead-letters", "rollstream.r1.dead-letters", 0, 0, dl)
    report = audit(log)
    assert report.ok
    assert report.dead_letters == {"observations:undecodable": 1}


def test_restage_drops_and_downweights() -> None:
    refs = [_ref("g-a-t0", 0, 3), _ref("g-a-t1", 1, 1), _ref("g-b-t0", 2, 3)]
    kept, dropped = restage(refs, 4, alpha=1, policy="drop", gamma=0.5, min_group_size=1)
    assert [r.trajectory_id for r in kept] == ["g-a-t0", "g-b-t0"]
    assert [(r.trajectory_id, r.reason) for r in dropped] == [("g-a-t1", "stale")]
    kept, dropped = restage(refs, 4, alpha=1, policy="drop", gamma=0.5, min_group_size=2)
    assert kept == [] and {r.reason for r in dropped} == {"stale", "partial_group"}
    kept, _ = restage(refs, 4, alpha=1, policy="downweight", gamma=0.5, min_group_size=1)
    assert [round(r.weight, 6) for r in kept] == [1.0, round(math.exp(-1.0), 6), 1.0]
    assert refs[1].weight == 1.0  # the original refs are left alone

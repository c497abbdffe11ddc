"""An ACTION that arrives after its trajectory was cancelled (generated while the CANCEL was on its way)
must not give the trajectory a second terminal state."""

from __future__ import annotations

from typing import Any

from rollout_harness import Rollout

from rollstream.schemas.events import EnvAction, EnvActionKind, Observation


def _send(r: Rollout, event: EnvAction) -> None:
    r.produce(r.topics.env_actions, event.trajectory_id, event)


def test_late_action_after_cancel_is_ignored(rollout_factory: Any) -> None:
    r = rollout_factory('rollout.domains=["math"]')
    r.start("env", "cpu")  # no generation worker: the trajectory waits for its first ACTION
    tid, gid = "g-late-t0", "g-late"
    base = {"run_id": r.run_id, "trajectory_id": tid, "group_id": gid, "domain": "math"}
    _send(r, EnvAction(kind=EnvActionKind.RESET, task_seed=7, **base))
    reader = r.reader(r.topics.gen_requests("h20"), r.topics.observations)
    reader.wait_until(lambda: bool(reader.records), 30, "the first generation request")
    _send(r, EnvAction(kind=EnvActionKind.CANCEL, reason="redundant: test", **base))

    def terminals() -> list[Observation]:
        return [
            rec.event
            for rec in reader.records
            if isinstance(rec.event, Observation) and rec.event.terminal_state
        ]

    reader.wait_until(lambda: len(terminals()) >= 1, 30, "the cancelled terminal state")
    _send(r, EnvAction(kind=EnvActionKind.ACTION, turn=0, action_text="42", policy_version=0, **base))
    _send(r, EnvAction(kind=EnvActionKind.RESET, task_seed=7, **base))  # a re-delivered RESET, too
    reader.poll(3.0)
    states = [(o.terminal_state, o.reason) for o in terminals()]
    assert states == [("cancelled", "redundant: test")], states

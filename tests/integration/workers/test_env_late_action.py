"""An ACTION that arrives after its trajectory was cancelled (generated while the CANCEL was on its way)
must not give the trajectory a second terminal state."""

from __future__ import annotations

from typing import Any

from rollout_harness import Accounting, Rollout, actions_of

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


def test_stopping_the_scheduler_cancels_what_is_in_flight(rollout_factory: Any) -> None:
    """A run stopped mid-flight still gives every launched trajectory exactly one terminal state."""
    r = rollout_factory('rollout.domains=["frozenlake"]', "rollout.group_size=4", "env.latency=constant:20")
    r.start("env", "cpu")
    r.start("gen", "h800")
    r.start("reward")
    scheduler = r.start("scheduler")  # unbounded: it keeps max_in_flight trajectories going
    reader = r.reader(r.topics.env_actions, r.topics.observations)
    reader.wait_until(lambda: len(Accounting.of(reader, r.topics).terminals) >= 8, 60, "some ended")
    scheduler.stop.set()
    scheduler.thread.join(30)

    def launched() -> set[str]:
        return {a.trajectory_id for a in actions_of(reader, r.topics, EnvActionKind.RESET)}

    reader.wait_until(
        lambda: set(Accounting.of(reader, r.topics).terminals) >= launched(), 60, "every launched one ended"
    )
    reader.poll(1.0)
    acc = Accounting.of(reader, r.topics)
    assert set(acc.terminals) == launched()
    assert not acc.duplicates(), acc.duplicates()
    stopped = [o[0] for o in acc.terminals.values() if o[0].reason == "run-stopped"]
    assert stopped and all(o.terminal_state == "cancelled" for o in stopped)

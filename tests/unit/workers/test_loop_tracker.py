"""OffsetTracker: commits never pass an unfinished message."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from rollstream.workers.loop import MessageRef, OffsetTracker

T = "topic"


def _ref(offset: int, partition: int = 0, topic: str = T) -> MessageRef:
    return MessageRef(topic, partition, offset)


def _offsets(tracker: OffsetTracker) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): tp.offset for tp in tracker.committable()}


def test_nothing_to_commit_before_anything_started() -> None:
    assert OffsetTracker().committable() == []


def test_in_order_finishes_commit_the_next_offset() -> None:
    tracker = OffsetTracker()
    for off in range(5):
        tracker.started(_ref(off))
    for off in range(5):
        tracker.finished(_ref(off))
    assert _offsets(tracker) == {(T, 0): 5}  # Kafka commits the *next* offset to read


def test_out_of_order_finishes_never_pass_an_unfinished_message() -> None:
    tracker = OffsetTracker()
    for off in range(10, 16):
        tracker.started(_ref(off))
    assert _offsets(tracker) == {(T, 0): 10}
    for off in (15, 14, 12, 11):
        tracker.finished(_ref(off))
        assert _offsets(tracker) == {(T, 0): 10}  # 10 still pending
    tracker.finished(_ref(10))
    assert _offsets(tracker) == {(T, 0): 13}  # 13 still pending
    tracker.finished(_ref(13))
    assert _offsets(tracker) == {(T, 0): 16}
    assert tracker.pending_count() == 0


def test_random_finish_orders_against_a_model() -> None:
    import random

    rng = random.Random(7)
    for _ in range(50):
        tracker = OffsetTracker()
        offsets = list(range(100, 140))
        for off in offsets:
            tracker.started(_ref(off))
        order = offsets[:]
        rng.shuffle(order)
        done: set[int] = set()
        for off in order:
            tracker.finished(_ref(off))
            done.add(off)
            unfinished = [o for o in offsets if o not in done]
            want = min(unfinished) if unfinished else offsets[-1] + 1
            assert _offsets(tracker)[(T, 0)] == want


def test_partitions_are_independent() -> None:
    tracker = OffsetTracker()
    tracker.started(_ref(0, 0))
    tracker.started(_ref(1, 0))
    tracker.started(_ref(7, 1))
    tracker.started(_ref(3, 0, "other"))
    tracker.finished(_ref(1, 0))
    tracker.finished(_ref(7, 1))
    assert _offsets(tracker) == {(T, 0): 0, (T, 1): 8, ("other", 0): 3}
    assert {(tp.topic, tp.partition) for tp in tracker.committable([(T, 1)])} == {(T, 1)}
    assert tracker.committable([(T, 9)]) == []
    assert tracker.pending_count() == 2


def test_mark_committed_suppresses_repeats_until_progress() -> None:
    tracker = OffsetTracker()
    tracker.started(_ref(0))
    tracker.finished(_ref(0))
    offsets = tracker.committable()
    tracker.mark_committed(offsets)
    assert tracker.committable() == []
    tracker.started(_ref(1))
    assert tracker.committable() == []  # 1 is pending: the commit point has not moved
    tracker.finished(_ref(1))
    assert _offsets(tracker) == {(T, 0): 2}


def test_finishing_twice_or_unknown_is_harmless() -> None:
    tracker = OffsetTracker()
    tracker.started(_ref(0))
    tracker.started(_ref(1))
    tracker.finished(_ref(0))
    tracker.finished(_ref(0))
    tracker.finished(_ref(5, 3))  # never started
    assert _offsets(tracker) == {(T, 0): 1}


def test_forget_on_revoke() -> None:
    tracker = OffsetTracker()
    tracker.started(_ref(0, 0))
    tracker.started(_ref(4, 1))
    tracker.finished(_ref(0, 0))
    tracker.mark_committed([TopicPartition(T, 0, 1)])
    tracker.forget([(T, 1)])
    assert tracker.pending_count() == 0
    assert tracker.committable() == []
    # A late finish of a revoked message must not resurrect the partition.
    tracker.finished(_ref(4, 1))
    assert tracker.committable() == []
    # Re-assigned later: starts afresh, no stale committed marker.
    tracker.forget([(T, 0)])
    tracker.started(_ref(1, 0))
    tracker.finished(_ref(1, 0))
    assert _offsets(tracker) == {(T, 0): 2}

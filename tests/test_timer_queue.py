"""TimerQueue against a brute-force model: a key's next due timer (pop_next_for_key)
is its smallest due timestamp of an old enough epoch, however many it holds; an async
firing (due_keys, then each key's first timer) fires exactly those."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aec.runtime.timers import TimerQueue

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("register"), st.integers(0, 3), st.integers(0, 40), st.integers(0, 5)),
        st.tuples(st.just("delete"), st.integers(0, 3), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("pop"), st.integers(0, 3), st.integers(0, 40), st.integers(0, 5)),
        st.tuples(st.just("reload"), st.just(0), st.just(0), st.just(0)),
        st.tuples(st.just("fire"), st.just(0), st.integers(0, 40), st.integers(0, 5)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_pop_next_for_key_is_the_smallest_due_timer_of_the_key(ops):
    queue, model = TimerQueue(), {}  # model: key -> {timestamp: epoch}
    for op, key, t, epoch in ops:
        timers = model.setdefault(key, {})
        if op == "register":
            assert queue.register(key, float(t), epoch) == (t not in timers)
            timers.setdefault(t, epoch)
        elif op == "delete":
            assert queue.delete(key, float(t)) == (t in timers)
            timers.pop(t, None)
        elif op == "pop":
            due = [s for s, e in timers.items() if s <= t and e <= epoch]
            expected = min(due) if due else None
            assert queue.pop_next_for_key(key, float(t), epoch) == expected
            if expected is not None:
                del timers[expected]
        elif op == "fire":  # an async firing: each due key's first timer (t: limit)
            due = {
                k: min(s for s, e in ts.items() if s <= t and e <= epoch)
                for k, ts in model.items()
                if any(s <= t and e <= epoch for s, e in ts.items())
            }
            keys = queue.due_keys(float(t), epoch)
            assert sorted(keys) == sorted(due)
            assert [due[k] for k in keys] == sorted(due[k] for k in keys)  # earliest first
            for k in keys:
                assert queue.pop_next_for_key(k, float(t), epoch) == due[k]
                del model[k][due[k]]
        else:  # a checkpoint's round trip keeps the per-key order
            queue = TimerQueue.from_export(queue.export())
    assert sorted(queue.items()) == sorted(
        (k, float(t)) for k, timers in model.items() for t in timers
    )


def test_timestamps_are_the_keys_registered_timers_for_membership_tests():
    queue = TimerQueue()
    assert 5.0 not in queue.timestamps("a")  # no timers: empty
    queue.register("a", 5.0, 0)
    queue.register("a", 9.0, 0)
    queue.register("b", 7.0, 0)
    view = queue.timestamps("a")
    assert 5.0 in view and 9.0 in view and 7.0 not in view
    queue.delete("a", 5.0, 0)
    assert 5.0 not in view and 9.0 in view  # live while the key has timers
    queue.delete("a", 9.0, 0)
    assert 9.0 not in queue.timestamps("a")
    assert 7.0 in queue.timestamps("b")


def test_due_gives_a_keys_timers_up_to_a_time_in_order():
    queue = TimerQueue()
    for t in (30.0, 10.0, 20.0, 40.0):
        queue.register("a", t, 0)
    queue.register("b", 5.0, 0)
    assert queue.due("a", 30.0) == [10.0, 20.0, 30.0]  # inclusive, ascending
    assert queue.due("a", 9.0) == [] and queue.due("c", 100.0) == []
    queue.delete("a", 20.0)
    assert queue.due("a", 100.0) == [10.0, 30.0, 40.0]

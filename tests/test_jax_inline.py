"""``BatchIterator(..., prefetch=0)``: batches sampled in the learner's own thread, and
priority updates applied by its later calls once their TD errors are computed.

JAX is imported only in the ``test_jax*`` files.
"""

import threading
import time

import numpy as np
import pytest

import shmreplay
from shmreplay import _deferred_updates, errors
from shmreplay.jax import BatchIterator
from test_jax import fill, prioritized, serve


class _Pending:
    """TD errors whose step has not finished until ``done`` (``is_ready`` as a JAX
    array's); records which threads read them."""

    def __init__(self, values):
        self.values = np.asarray(values, np.float64)
        self.done = False
        self.read_by = []

    def is_ready(self):
        return self.done

    def __array__(self, dtype=None, copy=None):
        self.read_by.append(threading.get_ident())
        return self.values if dtype is None else self.values.astype(dtype)


def priorities(client, table="p"):
    sample = client.sample_batch(table, 300, timeout=1)
    return dict(zip(sample.info.key.tolist(), sample.info.priority.tolist()))


def test_batches_are_sampled_by_next_in_the_callers_thread_and_none_ahead():
    with serve(prioritized()) as client:
        fill(client, "p", 50)
        threads_before = threading.active_count()
        with BatchIterator(client, "p", 8, prefetch=0, max_batches=3,
                           importance_beta=0.5) as batches:
            assert client.server_info()["p"].num_sampled == 0  # nothing taken ahead
            batch = next(batches)
            assert client.server_info()["p"].num_sampled == 8
            assert threading.active_count() == threads_before and batches._threads == []
            x, i = np.asarray(batch.data["x"]), np.asarray(batch.data["i"])
            assert np.array_equal(x, np.repeat(i[:, None].astype(np.float32), 3, axis=1))
            assert np.allclose(np.asarray(batch.weights), batch.info.importance_weights(0.5))
            assert len(list(batches)) == 2  # max_batches: 3 in all
        with pytest.raises(StopIteration):
            next(batches)


def test_a_fifo_table_keeps_its_order_and_a_timeout_ends_the_iteration():
    table = shmreplay.Table.queue("q", 20)
    with serve(table) as client:
        client.insert_batch({"x": np.arange(10, dtype=np.float32)}, {"q": 1.0}, timeout=5)
        start = time.monotonic()
        with BatchIterator(client, "q", 4, prefetch=0, rate_limiter_timeout_ms=300) as batches:
            got = [np.asarray(b.data["x"]).tolist() for b in batches]
        # two full batches; the last 2 items never make a batch of 4 and are dropped
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert 0.25 < time.monotonic() - start < 3.0


def test_updates_wait_for_their_errors_and_apply_in_order_from_later_calls():
    with serve(prioritized()) as client:
        fill(client, "p", 4)
        with BatchIterator(client, "p", 4, prefetch=0) as batches:
            keys = next(batches).info.key
            first, second = _Pending(np.full(4, 5.0)), _Pending(np.full(4, 7.0))
            batches.update_priorities(keys, first, epsilon=0.0, wait=False)
            batches.update_priorities(keys, second, epsilon=0.0, wait=False)
            next(batches)
            assert set(priorities(client).values()) == {1.0}  # neither step finished
            second.done = True
            next(batches)  # the first is still computing: the second waits behind it
            assert set(priorities(client).values()) == {1.0}
            first.done = True
            next(batches)
            drawn = set(keys.tolist())
            assert all(p == (7.0 if k in drawn else 1.0) for k, p in priorities(client).items())
            assert first.read_by == [threading.get_ident()]  # no other thread read them
            assert batches.flush() == 8


def test_too_many_pending_updates_wait_for_the_oldest_and_flush_applies_the_rest():
    with serve(prioritized()) as client:
        fill(client, "p", 4)
        batches = BatchIterator(client, "p", 4, prefetch=0)
        keys = next(batches).info.key
        pending = [_Pending(np.full(4, float(v))) for v in range(1, 12)]
        for td in pending:
            batches.update_priorities(keys, td, epsilon=0.0, wait=False)
        limit = _deferred_updates.MAX_PENDING_UPDATES
        assert [bool(td.read_by) for td in pending] == [True] * (11 - limit) + [False] * limit
        assert batches.flush() == 4 * 11
        assert all(td.read_by for td in pending)
        batches.update_priorities(keys, _Pending(np.full(4, 99.0)), epsilon=0.0, wait=False)
        batches.close()  # applies what is queued
        drawn = set(keys.tolist())
        assert all(p == (99.0 if k in drawn else 1.0) for k, p in priorities(client).items())


def test_a_failed_update_raises_from_the_next_call_and_drops_the_ones_after_it():
    with serve(prioritized()) as client:
        fill(client, "p", 4)
        with BatchIterator(client, "p", 4, prefetch=0) as batches:
            keys = next(batches).info.key
            bad, after = _Pending(np.full(4, np.nan)), _Pending(np.full(4, 3.0))
            batches.update_priorities(keys, bad, wait=False)
            batches.update_priorities(keys, after, wait=False)
            bad.done = after.done = True
            with pytest.raises(errors.InvalidPriorityError):
                next(batches)
            assert after.read_by == [] and set(priorities(client).values()) == {1.0}
            assert next(batches) is not None  # raised once; the iterator goes on
            assert batches.flush() == 0

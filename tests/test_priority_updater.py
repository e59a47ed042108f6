"""``shmreplay.PriorityUpdater``: priority updates applied by a thread, in order, beside a
learner's step. No framework needed: TD errors are anything numpy reads (a TensorFlow
eager tensor in ``test_tf_priority_updater.py``)."""

import contextlib
import threading
import time

import numpy as np
import pytest

import shmreplay
from shmreplay import _deferred_updates, errors, rate_limiters, selectors
from shmreplay.priority_updater import PriorityUpdater

import _names


@contextlib.contextmanager
def serve(max_size=100):
    # (a uniform sampler: reading every item's priority back is then sure to see each)
    table = shmreplay.Table("p", selectors.Uniform(), selectors.Fifo(), max_size,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield client
        finally:
            client.close()


class _Held:
    """TD errors that the updater's thread cannot read until ``release`` (each read
    waits, with a timeout); records which threads read them."""

    def __init__(self, values):
        self.values = np.asarray(values, np.float64)
        self.released = threading.Event()
        self.read_by = []

    def release(self):
        self.released.set()

    def __array__(self, dtype=None, copy=None):
        assert self.released.wait(timeout=10), "never released"
        self.read_by.append(threading.get_ident())
        return self.values if dtype is None else self.values.astype(dtype)


def keys_of(client, n):
    """Inserts ``n`` items of priority 1; returns their keys (each once)."""
    client.insert_batch({"x": np.arange(n, dtype=np.float32)}, {"p": np.ones(n)})
    keys = np.unique(client.sample_batch("p", 300, timeout=1).info.key)
    assert len(keys) == n
    return keys


def priorities(client):
    sample = client.sample_batch("p", 300, timeout=1)
    return dict(zip(sample.info.key.tolist(), sample.info.priority.tolist()))


def test_an_update_returns_at_once_and_is_applied_by_the_thread():
    with serve() as client, PriorityUpdater(client, "p") as updates:
        keys = keys_of(client, 4)
        td = _Held([-2.0, 3.0, 0.5, 0.0])
        started = time.monotonic()
        assert updates.update_priorities(keys, td, epsilon=0.25) is None
        assert time.monotonic() - started < 1.0  # it did not wait for the errors
        assert set(priorities(client).values()) == {1.0}
        td.release()
        assert updates.flush() == 4
        assert td.read_by and td.read_by[0] != threading.get_ident()
        got = priorities(client)
        assert [got[k] for k in keys.tolist()] == [2.25, 3.25, 0.75, 0.25]


def test_updates_apply_in_order_with_the_exponent_and_count_only_live_keys():
    with serve(max_size=4) as client, PriorityUpdater(client.server_address, "p") as updates:
        keys = keys_of(client, 4)
        updates.update_priorities(keys, np.full(4, 5.0), epsilon=0.0)
        updates.update_priorities(keys, np.full(4, 3.0), exponent=2.0, epsilon=0.0)
        assert updates.flush() == 8
        assert set(priorities(client).values()) == {9.0}  # the last one wins
        client.insert_batch({"x": np.zeros(2, np.float32)}, {"p": np.ones(2)})  # evicts 2
        updates.update_priorities(keys, np.ones(4))
        assert updates.flush() == 2
        assert updates.update_priorities(keys, np.ones(4), wait=True) == 2


def test_a_caller_that_outruns_the_thread_waits_for_the_oldest_update():
    with serve() as client, PriorityUpdater(client, "p") as updates:
        keys = keys_of(client, 4)
        held = [_Held(np.full(4, float(v))) for v in range(1, 10)]
        limit = _deferred_updates.MAX_PENDING_UPDATES  # 8: the thread holds the first
        for td in held[:limit + 1]:
            updates.update_priorities(keys, td, epsilon=0.0)
        blocked = threading.Thread(
            target=updates.update_priorities, args=(keys, np.full(4, 42.0)),
            kwargs={"epsilon": 0.0}, daemon=True)
        blocked.start()
        blocked.join(timeout=0.5)
        assert blocked.is_alive()  # queue full: waits for the oldest to be applied
        for td in held:
            td.release()
        blocked.join(timeout=10)
        assert not blocked.is_alive()
        assert updates.flush() == 4 * (limit + 2)
        assert set(priorities(client).values()) == {42.0}


def test_a_failed_update_raises_once_from_the_next_call_and_drops_those_after_it():
    with serve() as client, PriorityUpdater(client, "p") as updates:
        keys = keys_of(client, 4)
        bad = _Held(np.full(4, np.nan))
        updates.update_priorities(keys, bad)
        updates.update_priorities(keys, np.full(4, 7.0), epsilon=0.0)
        bad.release()
        with pytest.raises(errors.InvalidPriorityError):
            updates.flush()
        assert set(priorities(client).values()) == {1.0}  # the one after it was dropped
        updates.update_priorities(keys, np.full(4, 2.0), epsilon=0.0)
        assert updates.flush() == 4  # raised once; the updater goes on
        assert set(priorities(client).values()) == {2.0}


def test_close_applies_what_is_queued_and_refuses_more():
    with serve() as client:
        keys = keys_of(client, 4)
        updates = PriorityUpdater(client, "p")
        td = _Held(np.full(4, 6.0))
        updates.update_priorities(keys, td, epsilon=0.0)
        td.release()
        updates.close()
        assert set(priorities(client).values()) == {6.0}
        with pytest.raises(RuntimeError, match="closed"):
            updates.update_priorities(keys, np.ones(4))
        updates.close()  # twice is fine
        assert client.sample_batch("p", 1, timeout=1) is not None  # the client stays open


def test_an_unknown_table_fails_at_once():
    with serve() as client:
        with pytest.raises(errors.TableNotFoundError):
            PriorityUpdater(client, "nope")


def test_it_is_shmreplay_priority_updater():
    assert shmreplay.PriorityUpdater is PriorityUpdater

"""``shmreplay.jax.BatchIterator``: device placement, prefetch bound, weights, updates, ends.

JAX is imported only in this file.
"""

import contextlib
import threading
import time

import jax
import numpy as np
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay.jax import BatchIterator
import _names
import _waiting


@contextlib.contextmanager
def serve(*tables):
    with shmreplay.Server(list(tables), name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield client
        finally:
            client.close()


def prioritized(name="p", max_size=1000, min_size=1):
    return shmreplay.Table(name, selectors.Prioritized(1.0), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(min_size))


def fill(client, table, n, priorities=None):
    client.insert_batch({"x": np.arange(n, dtype=np.float32)[:, None] * np.ones(3, np.float32),
                         "i": np.arange(n)},
                        {table: np.ones(n) if priorities is None else priorities})


def test_batches_are_jax_arrays_on_the_chosen_device_with_the_items_data():
    device = jax.devices("cpu")[0]
    with serve(prioritized()) as client:
        fill(client, "p", 50)
        with BatchIterator(client, "p", 8, device=device, max_batches=3) as batches:
            got = list(batches)
        assert len(got) == 3
        for batch in got:
            assert isinstance(batch.data["x"], jax.Array)
            assert batch.data["x"].shape == (8, 3) and batch.data["x"].dtype == np.float32
            assert batch.data["x"].devices() == {device}
            # each row is the item the key names: x == i (broadcast over 3)
            x, i = np.asarray(batch.data["x"]), np.asarray(batch.data["i"])
            assert np.array_equal(x, np.repeat(i[:, None].astype(np.float32), 3, axis=1))
            assert batch.info.key.dtype == np.uint64 and batch.weights is None


def test_importance_weights_match_sample_info():
    with serve(prioritized()) as client:
        fill(client, "p", 20, priorities=np.arange(1, 21, dtype=np.float64))
        with BatchIterator(client, "p", 16, importance_beta=0.5, max_batches=1) as batches:
            batch = next(batches)
        expected = batch.info.importance_weights(0.5)
        assert np.allclose(np.asarray(batch.weights), expected)
        assert float(np.max(np.asarray(batch.weights))) == pytest.approx(1.0)


def test_update_priorities_from_a_jax_array():
    with serve(prioritized()) as client:
        fill(client, "p", 10)
        with BatchIterator(client, "p", 10, max_batches=1) as batches:
            batch = next(batches)
            keys = batch.info.key
            td = np.where(np.arange(10) == 0, 9.0, -2.0)  # sign dropped: |td| + epsilon
            assert batches.update_priorities(keys, jax.numpy.asarray(td), epsilon=1.0) == 10
        expected = {}
        for key, error in zip(keys, td):  # a key drawn twice: the last update wins
            expected[int(key)] = abs(error) + 1.0
        later = client.sample_batch("p", 200, timeout=1)
        for key, priority in zip(later.info.key, later.info.priority):
            assert priority == expected.get(int(key), 1.0)


def test_prefetch_takes_at_most_prefetch_batches_ahead():
    with serve(prioritized()) as client:
        fill(client, "p", 100)
        with BatchIterator(client, "p", 4, prefetch=3) as batches:
            next(batches)
            sampled = _waiting.settled(lambda: client.server_info()["p"].num_sampled, 4 * (1 + 3))
            assert sampled == 4 * (1 + 3), sampled  # the delivered one plus 3 ahead
            next(batches)
            sampled = _waiting.settled(lambda: client.server_info()["p"].num_sampled, 4 * (2 + 3))
            assert sampled == 4 * (2 + 3), sampled


def test_several_workers_share_max_batches_and_prefetch():
    with serve(prioritized()) as client:
        fill(client, "p", 100)
        with BatchIterator(client, "p", 4, max_batches=5, num_workers=2) as batches:
            got = list(batches)
        assert len(got) == 5 and all(np.asarray(b.data["i"]).shape == (4,) for b in got)
        assert client.server_info()["p"].num_sampled == 5 * 4
        with BatchIterator(client, "p", 4, prefetch=3, num_workers=2) as batches:
            next(batches)
            sampled = _waiting.settled(
                lambda: client.server_info()["p"].num_sampled, 5 * 4 + 4 * (1 + 3))
            assert sampled == 5 * 4 + 4 * (1 + 3), sampled
            threads = batches._threads
        assert len(threads) == 2 and not any(thread.is_alive() for thread in threads)
        with pytest.raises(ValueError, match="num_workers"):
            BatchIterator(client, "p", 4, num_workers=0)


def test_large_batches_of_an_unordered_table_get_a_second_worker():
    big = shmreplay.Table("big", selectors.Uniform(), selectors.Fifo(), 64,
                          rate_limiters.MinSize(1))
    fifo = shmreplay.Table.queue("fifo", 64)
    with serve(big, fifo) as client:
        frames = np.zeros((32, 64, 1024), np.uint8)  # 64 KiB items: a batch of 16 is 1 MiB
        client.insert_batch({"obs": frames}, {"big": 1.0, "fifo": 1.0}, timeout=5)
        with BatchIterator(client, "big", 16, max_batches=4) as batches:
            assert len(list(batches)) == 4
            assert len(batches._threads) == 2
        with BatchIterator(client, "big", 2, max_batches=2) as batches:  # 128 KiB
            assert len(list(batches)) == 2
            assert len(batches._threads) == 1
        with BatchIterator(client, "fifo", 16, max_batches=2) as batches:  # keeps order
            keys = [np.asarray(b.info.key).tolist() for b in batches]
            assert len(batches._threads) == 1
        assert keys[0] + keys[1] == sorted(keys[0] + keys[1])


def test_rate_limiter_timeout_ends_the_iteration():
    with serve(prioritized(min_size=5)) as client:
        fill(client, "p", 3)  # below min_size: nothing can be sampled
        start = time.monotonic()
        with BatchIterator(client, "p", 2, rate_limiter_timeout_ms=300) as batches:
            assert list(batches) == []
        assert 0.25 < time.monotonic() - start < 3.0


def test_a_batch_waits_for_credit_until_full():
    # Queue-like table: each insert allows one sample; the batch of 4 fills as items come.
    table = shmreplay.Table.queue("q", 10)
    with serve(table) as client:
        with BatchIterator(client, "q", 4, max_batches=1) as batches:
            for value in range(4):
                time.sleep(0.15)  # longer than the thread's wait slice
                client.insert({"x": np.float32(value)}, {"q": 1.0}, timeout=1)
            batch = next(batches)
        assert np.asarray(batch.data["x"]).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_close_stops_a_thread_blocked_on_an_empty_table():
    with serve(prioritized()) as client:
        batches = BatchIterator(client, "p", 2)
        start = time.monotonic()
        batches.close()
        assert time.monotonic() - start < 2.0
        assert not any(thread.is_alive() for thread in batches._threads)
        with pytest.raises(StopIteration):
            next(batches)


def test_errors_reach_the_consumer():
    with serve(prioritized()) as client:
        with pytest.raises(errors.TableNotFoundError):
            BatchIterator(client, "nope", 2)
        for bad in (dict(batch_size=0), dict(batch_size=2, prefetch=-1),
                    dict(batch_size=2, prefetch=0, num_workers=2)):
            with pytest.raises(ValueError):
                BatchIterator(client, "p", **bad)


def test_attach_by_name():
    with serve(prioritized()) as client:
        fill(client, "p", 5)
        with BatchIterator(client.server_address, "p", 5, max_batches=1) as batches:
            rows = np.asarray(next(batches).data["i"]).tolist()
        assert len(rows) == 5 and set(rows) <= set(range(5))


@pytest.mark.parametrize("prefetch", [3, 0])
def test_batches_kept_by_the_learner_stay_intact(prefetch):
    # Small batches come from reused results; a batch the learner holds (as jax arrays,
    # which may alias host memory, or with prefetch=0 as the numpy arrays themselves)
    # must never be refilled by a later one.
    with serve(prioritized()) as client:
        fill(client, "p", 200)
        with BatchIterator(client, "p", 4, max_batches=40, prefetch=prefetch) as batches:
            kept = list(batches)
        assert len(kept) == 40
        for batch in kept:
            x, i = np.asarray(batch.data["x"]), np.asarray(batch.data["i"])
            assert np.array_equal(x, np.repeat(i[:, None].astype(np.float32), 3, axis=1))
        assert len({tuple(np.asarray(b.data["i"]).tolist()) for b in kept}) > 20


class _Blocked:
    """TD errors that are not ready until ``ready`` is set (like a JAX array whose step
    is still running); records the threads that fetched them."""

    def __init__(self, values):
        self.values = np.asarray(values, np.float64)
        self.ready = threading.Event()
        self.fetched_by = []

    def __array__(self, dtype=None, copy=None):
        self.fetched_by.append(threading.get_ident())
        assert self.ready.wait(10)
        return self.values if dtype is None else self.values.astype(dtype)


def test_update_priorities_without_waiting_returns_before_the_td_errors_exist():
    with serve(prioritized()) as client:
        fill(client, "p", 10)
        with BatchIterator(client, "p", 10, max_batches=2) as batches:
            batch = next(batches)
            keys = batch.info.key
            td = _Blocked(np.where(np.arange(10) == 0, 9.0, -2.0))
            start = time.monotonic()
            assert batches.update_priorities(keys, td, epsilon=1.0, wait=False) is None
            assert time.monotonic() - start < 1.0
            next(batches)  # the learner goes on while the update waits for its errors
            unchanged = client.sample_batch("p", 200, timeout=1)
            assert set(unchanged.info.priority.tolist()) == {1.0}
            td.ready.set()
            assert batches.flush() == 10
            assert td.fetched_by and threading.get_ident() not in td.fetched_by
        expected = {}
        for key, error in zip(keys, td.values):
            expected[int(key)] = abs(error) + 1.0
        later = client.sample_batch("p", 200, timeout=1)
        for key, priority in zip(later.info.key, later.info.priority):
            assert priority == expected.get(int(key), 1.0)


def test_queued_updates_apply_in_order_and_close_applies_the_last_ones():
    with serve(prioritized()) as client:
        fill(client, "p", 4)
        batches = BatchIterator(client, "p", 4, max_batches=1)
        keys = next(batches).info.key
        for value in range(1, 30):  # more than MAX_PENDING_UPDATES: some calls wait
            batches.update_priorities(keys, jax.numpy.full(4, float(value)), epsilon=0.0,
                                      wait=False)
        batches.close()
        later = client.sample_batch("p", 100, timeout=1)
        updated = set(keys.tolist())  # (drawn with replacement: maybe not all 4)
        for key, priority in zip(later.info.key.tolist(), later.info.priority.tolist()):
            assert priority == (29.0 if key in updated else 1.0)


def test_a_queued_update_that_fails_raises_from_the_next_call():
    with serve(prioritized()) as client:
        fill(client, "p", 4)
        with BatchIterator(client, "p", 4, max_batches=3) as batches:
            keys = next(batches).info.key
            batches.update_priorities(keys, np.full(4, np.nan), wait=False)
            with pytest.raises(errors.InvalidPriorityError):
                batches.flush()
            batches.flush()  # raised once
            batches.update_priorities(keys, np.full(4, np.inf), wait=False)
            deadline = time.monotonic() + 10
            while batches._updates._error is None and time.monotonic() < deadline:
                time.sleep(0.01)
            with pytest.raises(errors.InvalidPriorityError):
                next(batches)
            assert next(batches) is not None


def test_batches_reach_the_device_through_the_jitted_identity_with_every_dtype(monkeypatch):
    transfers = []
    monkeypatch.setattr(jax, "device_put", lambda *a, **k: transfers.append(a) or None)
    item = {"u8": np.arange(3, dtype=np.uint8), "i8": np.int8(-5), "f16": np.float16(1.5),
            "i32": np.arange(2, dtype=np.int32), "f32": np.float32(2.5),
            "flag": np.bool_(True), "f64": np.float64(0.25)}
    table = shmreplay.Table("u", selectors.Uniform(), selectors.Fifo(), 100,
                            rate_limiters.MinSize(1))
    with serve(table) as client:
        for i in range(20):
            client.insert({**item, "u8": item["u8"] + i, "i32": item["i32"] * i,
                           "f32": np.float32(i)}, {"u": 1.0})
        with BatchIterator(client, "u", 8, max_batches=3, importance_beta=0.5) as batches:
            got = list(batches)
    assert transfers == [] and len(got) == 3  # no device_put: the jitted path
    for batch in got:
        data = {key: np.asarray(leaf) for key, leaf in batch.data.items()}
        rows = data["f32"].astype(int)
        assert np.array_equal(data["u8"], np.arange(3, dtype=np.uint8) + rows[:, None])
        assert np.array_equal(data["i32"], np.arange(2, dtype=np.int32) * rows[:, None])
        assert data["i8"].dtype == np.int8 and set(data["i8"].tolist()) == {-5}
        assert data["f16"].dtype == np.float16 and set(data["f16"].tolist()) == {1.5}
        assert data["flag"].dtype == np.bool_ and data["flag"].all()
        assert data["f64"].dtype == np.float32 and set(data["f64"].tolist()) == {0.25}
        assert np.allclose(np.asarray(batch.weights), batch.info.importance_weights(0.5))
        assert all(leaf.devices() == {batches.device} for leaf in batch.data.values())

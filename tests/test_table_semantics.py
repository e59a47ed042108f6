"""Black-box Reverb conformance of a table, through ``Server`` / ``Client``.

Restates Reverb's C++ ``table_test.cc`` and the Python ``client_test.py`` cases
(reference §2.2-2.3). The ``rate_limiter_test.cc`` cases live in
``tests/test_rate_limiters.py`` (they exercise the limiter formulas on live tables).

"Blocks" is checked with ``timeout=0.1`` -> ``DeadlineExceededError``, or with a thread
that is still alive after 100 ms; "unblocks" with that thread finishing after the
unblocking call. Every blocking call has a timeout.
"""

import contextlib
import pickle
import time

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay.replay_sample import ReplaySample
from shmreplay.specs import TensorSpec
import _names
from _background import Background

INT = TensorSpec((), np.int64)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

@contextlib.contextmanager
def serve(*tables):
    """A running buffer holding ``tables`` and a client attached to it by name."""
    with shmreplay.Server(tables=list(tables), name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield server, client
        finally:
            client.close()


class InThread(Background):
    """Runs ``fn(client)`` in a thread with its own Client attached to ``name``."""

    def __init__(self, name, fn):
        def attached():
            with shmreplay.Client(name) as client:
                return fn(client)

        super().__init__(attached)


def insert(client, table, value, priority=1.0, timeout=1.0):
    client.insert(np.int64(value), priorities={table: priority}, timeout=timeout)


def sample_one(client, table, timeout=1.0):
    """One sampled item via sample_batch: (value, info-of-row-0)."""
    s = client.sample_batch(table, batch_size=1, timeout=timeout)
    assert len(s.info.key) == 1
    return int(np.asarray(s.data).reshape(-1)[0]), s.info


def sample_value(client, table, timeout=1.0):
    return sample_one(client, table, timeout)[0]


def size(client, table):
    return client.server_info()[table].current_size


def uniform_table(name="t", max_size=100, limiter=None, max_times_sampled=0,
                  sampler=None, remover=None, signature=INT):
    return shmreplay.Table(
        name=name, sampler=sampler or selectors.Uniform(), remover=remover or selectors.Fifo(),
        max_size=max_size, rate_limiter=limiter or rate_limiters.MinSize(1),
        max_times_sampled=max_times_sampled, signature=signature)


# --------------------------------------------------------------------------------------
# table_test.cc
# --------------------------------------------------------------------------------------

def test_sample_blocks_when_not_enough_items():
    table = uniform_table()
    with serve(table) as (server, client):
        with pytest.raises(errors.DeadlineExceededError):
            client.sample_batch("t", batch_size=1, timeout=0.1)
        waiter = InThread(server.name, lambda c: c.sample_batch("t", batch_size=1, timeout=10))
        assert waiter.still_blocked()
        insert(client, "t", 7)
        s = waiter.finish()
        assert np.asarray(s.data).tolist() == [7]


def test_deadline_exceeded_is_a_timeout_error():
    with serve(uniform_table()) as (server, client):
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            client.sample_batch("t", batch_size=1, timeout=0.2)
        elapsed = time.monotonic() - start
        assert 0.15 <= elapsed < 1.5
        with pytest.raises(errors.DeadlineExceededError):
            next(client.sample("t", timeout=0.1))


def test_sample_matches_insert():
    signature = {"obs": TensorSpec((3,), np.float32), "n": INT}
    table = uniform_table(signature=signature)
    item = {"obs": np.array([1.5, -2.0, 3.25], np.float32), "n": np.int64(42)}
    with serve(table) as (server, client):
        client.insert(item, priorities={"t": 2.5}, timeout=1)
        [step] = next(client.sample("t", timeout=1, unpack_as_table_signature=True))
        np.testing.assert_array_equal(step.data["obs"], item["obs"])
        assert step.data["obs"].dtype == np.float32
        assert int(step.data["n"]) == 42
        assert step.info.probability == 1.0
        assert step.info.table_size == 1
        assert step.info.priority == 2.5
        assert step.info.times_sampled == 1
        assert step.info.key != 0


def test_sample_increments_sample_times():
    with serve(uniform_table()) as (server, client):
        insert(client, "t", 3)
        keys = set()
        for expected in range(1, 6):
            value, info = sample_one(client, "t")
            assert value == 3
            assert int(info.times_sampled[0]) == expected
            keys.add(int(info.key[0]))
        assert len(keys) == 1
        assert client.server_info()["t"].num_unique_samples == 1


def test_max_times_sampled_is_respected():
    with serve(uniform_table(max_times_sampled=2)) as (server, client):
        insert(client, "t", 5)
        _, first = sample_one(client, "t")
        value, second = sample_one(client, "t")
        assert value == 5
        assert int(first.times_sampled[0]) == 1
        # the sample that reaches the limit is still returned, with the table size
        # from before the deletion
        assert int(second.times_sampled[0]) == 2
        assert int(second.table_size[0]) == 1
        info = client.server_info()["t"]
        assert info.current_size == 0
        assert info.num_deleted == 1
        with pytest.raises(errors.DeadlineExceededError):
            client.sample_batch("t", batch_size=1, timeout=0.1)


def test_sample_not_full_batch():
    with serve(uniform_table(max_times_sampled=1)) as (server, client):
        insert(client, "t", 9)
        start = time.monotonic()
        s = client.sample_batch("t", batch_size=2, timeout=5)
        # the table ran out of items: a partial batch, without waiting for the timeout
        assert time.monotonic() - start < 2.0
        assert len(s.info.key) == 1
        assert np.asarray(s.data).tolist() == [9]
        assert size(client, "t") == 0


def test_insert_deletes_when_overflowing():
    table = uniform_table(max_size=10, sampler=selectors.Fifo(), remover=selectors.Fifo(),
                          max_times_sampled=1)
    with serve(table) as (server, client):
        for i in range(15):
            insert(client, "t", i)
        info = client.server_info()["t"]
        assert info.current_size == 10
        assert info.num_inserted == 15
        assert info.num_deleted == 5
        s = client.sample_batch("t", batch_size=10, timeout=1)
        assert np.asarray(s.data).tolist() == list(range(5, 15))


def test_use_as_queue():
    with serve(shmreplay.Table.queue("q", 10, signature=INT)) as (server, client):
        for i in range(10):
            insert(client, "q", i)
        with pytest.raises(errors.DeadlineExceededError):
            insert(client, "q", 99, timeout=0.1)
        assert size(client, "q") == 10
        # the 11th insert blocks until a sample makes room
        inserter = InThread(server.name, lambda c: insert(c, "q", 10, timeout=10))
        assert inserter.still_blocked()
        order = [sample_value(client, "q")]
        inserter.finish()
        order += [sample_value(client, "q") for _ in range(10)]
        assert order == list(range(11))
        assert size(client, "q") == 0
        # empty: samples block; the next insert is sampled at once
        with pytest.raises(errors.DeadlineExceededError):
            client.sample_batch("q", batch_size=1, timeout=0.1)
        sampler = InThread(server.name, lambda c: sample_value(c, "q", timeout=10))
        assert sampler.still_blocked()
        insert(client, "q", 11)
        assert sampler.finish() == 11
        assert size(client, "q") == 0


def test_use_as_stack():
    with serve(shmreplay.Table.stack("s", 5, signature=INT)) as (server, client):
        for i in range(5):
            insert(client, "s", i)
        with pytest.raises(errors.DeadlineExceededError):
            insert(client, "s", 99, timeout=0.1)
        assert [sample_value(client, "s") for _ in range(5)] == [4, 3, 2, 1, 0]
        assert size(client, "s") == 0


def test_reset_resets_rate_limiter():
    table = uniform_table(limiter=rate_limiters.RateLimiter(1, 1, -1, 1))
    with serve(table) as (server, client):
        insert(client, "t", 1)
        with pytest.raises(errors.DeadlineExceededError):
            insert(client, "t", 2, timeout=0.1)
        inserter = InThread(server.name, lambda c: insert(c, "t", 3, timeout=10))
        assert inserter.still_blocked()
        client.reset("t")
        inserter.finish()
        info = client.server_info()["t"]
        assert info.current_size == 1
        assert info.rate_limiter_info.insert_stats.completed == 1
        assert sample_value(client, "t") == 3


def test_reset_clears_all_data():
    with serve(uniform_table()) as (server, client):
        for i in range(5):
            insert(client, "t", i)
        client.sample_batch("t", batch_size=10, timeout=1)
        client.reset("t")
        info = client.server_info()["t"]
        assert info.current_size == 0
        assert info.num_unique_samples == 0
        assert info.rate_limiter_info.insert_stats.completed == 0
        assert info.rate_limiter_info.sample_stats.completed == 0
        with pytest.raises(errors.DeadlineExceededError):
            client.sample_batch("t", batch_size=1, timeout=0.1)
        insert(client, "t", 77)
        s = client.sample_batch("t", batch_size=20, timeout=1)
        assert set(np.asarray(s.data).tolist()) == {77}


def test_blocks_samples_when_size_too_small_due_to_auto_delete():
    table = uniform_table(sampler=selectors.Fifo(), remover=selectors.Fifo(),
                          max_times_sampled=2,
                          limiter=rate_limiters.RateLimiter(1, 3, 0, 5))
    with serve(table) as (server, client):
        for i in range(3):
            insert(client, "t", i)
        assert table.can_sample(1)
        first, info1 = sample_one(client, "t")
        second, info2 = sample_one(client, "t")
        assert (first, second) == (0, 0)
        assert int(info1.key[0]) == int(info2.key[0])
        assert size(client, "t") == 2          # item #0 hit max_times_sampled
        assert not table.can_sample(1)
        sampler = InThread(server.name, lambda c: sample_value(c, "t", timeout=10))
        assert sampler.still_blocked()
        insert(client, "t", 3)
        assert sampler.finish() == 1


def test_blocks_samples_when_size_too_small_due_to_explicit_delete():
    table = uniform_table(sampler=selectors.Fifo(), remover=selectors.Fifo(),
                          max_times_sampled=2,
                          limiter=rate_limiters.RateLimiter(1, 3, 0, 5))
    with serve(table) as (server, client):
        for i in range(3):
            insert(client, "t", i)
        value, info = sample_one(client, "t")
        assert value == 0
        client.mutate_priorities("t", deletes=[int(info.key[0])])
        assert size(client, "t") == 2
        assert not table.can_sample(1)
        with pytest.raises(errors.DeadlineExceededError):
            client.sample_batch("t", batch_size=1, timeout=0.1)
        sampler = InThread(server.name, lambda c: sample_value(c, "t", timeout=10))
        assert sampler.still_blocked()
        insert(client, "t", 3)
        assert sampler.finish() == 1           # key #1 is next in line


def test_sample_sets_table_size():
    with serve(uniform_table()) as (server, client):
        for i in range(1, 11):
            insert(client, "t", i)
            _, info = sample_one(client, "t")
            assert int(info.table_size[0]) == i


def test_mutate_priorities_applies_deletes_before_updates():
    with serve(uniform_table()) as (server, client):
        insert(client, "t", 1)
        insert(client, "t", 2)
        s = client.sample_batch("t", batch_size=200, timeout=1)
        key_of = dict(zip(np.asarray(s.data).tolist(), s.info.key.tolist()))
        assert set(key_of) == {1, 2}
        client.mutate_priorities("t", updates={key_of[1]: 5.0}, deletes=[key_of[1]])
        assert size(client, "t") == 1
        s = client.sample_batch("t", batch_size=50, timeout=1)
        assert set(np.asarray(s.data).tolist()) == {2}


def test_stale_and_unknown_keys_are_ignored_and_keys_are_never_reused():
    table = uniform_table(sampler=selectors.Prioritized(1.0), max_size=1)
    with serve(table) as (server, client):
        insert(client, "t", 1)
        _, info = sample_one(client, "t")
        old_key = int(info.key[0])
        client.mutate_priorities("t", deletes=[old_key])
        client.mutate_priorities("t", deletes=[old_key])        # already gone: ignored
        insert(client, "t", 2, priority=1.0)                    # most likely the same slot
        _, info = sample_one(client, "t")
        new_key = int(info.key[0])
        assert new_key != old_key
        # a stale key must not reach the new item living in the same slot
        client.mutate_priorities("t", updates={old_key: 7.0}, deletes=[12345])
        client.update_priorities("t", keys=np.array([old_key], np.uint64),
                                 priorities=np.array([9.0]))
        value, info = sample_one(client, "t")
        assert value == 2
        assert float(info.priority[0]) == 1.0
        assert size(client, "t") == 1


def test_one_insert_creates_one_item_per_table():
    a = uniform_table("a")
    b = uniform_table("b", sampler=selectors.Prioritized(1.0))
    with serve(a, b) as (server, client):
        client.insert(np.int64(5), priorities={"a": 1.0, "b": 3.0}, timeout=1)
        info = client.server_info()
        assert info["a"].current_size == 1
        assert info["b"].current_size == 1
        value, sa = sample_one(client, "a")
        assert value == 5 and float(sa.priority[0]) == 1.0
        value, sb = sample_one(client, "b")
        assert value == 5 and float(sb.priority[0]) == 3.0


# --------------------------------------------------------------------------------------
# client_test.py (fixture table: Prioritized(1)/Fifo/1000/MinSize(3), int64 scalar)
# --------------------------------------------------------------------------------------

def prioritized_table(name="dist"):
    return shmreplay.Table(name=name, sampler=selectors.Prioritized(1), remover=selectors.Fifo(),
                           max_size=1000, rate_limiter=rate_limiters.MinSize(3), signature=INT)


def test_sample_sets_table_size_client():
    with serve(prioritized_table()) as (server, client):
        for i in range(1, 11):
            insert(client, "dist", i)
            if i >= 3:
                [step] = next(client.sample("dist", timeout=1))
                assert step.info.table_size == i


def test_sample_sets_probability():
    with serve(prioritized_table()) as (server, client):
        for i in range(1, 11):
            insert(client, "dist", i)
            if i >= 3:
                [step] = next(client.sample("dist", timeout=1))
                assert step.info.probability == pytest.approx(1.0 / i, rel=1e-9)
                s = client.sample_batch("dist", batch_size=8, timeout=1)
                np.testing.assert_allclose(s.info.probability, 1.0 / i, rtol=1e-9)


def test_sample_sets_priority():
    with serve(prioritized_table()) as (server, client):
        for i in range(3):
            insert(client, "dist", i)
        s = client.sample_batch("dist", batch_size=300, timeout=1)
        key_of = dict(zip(np.asarray(s.data).tolist(), s.info.key.tolist()))
        assert set(key_of) == {0, 1, 2}
        wanted = {0: 0.5, 1: 2.0, 2: 4.25}
        client.mutate_priorities("dist", updates={key_of[v]: p for v, p in wanted.items()})
        s = client.sample_batch("dist", batch_size=300, timeout=1)
        for value, priority in zip(np.asarray(s.data).tolist(), s.info.priority.tolist()):
            assert priority == wanted[value]
        [step] = next(client.sample("dist", timeout=1))
        assert step.info.priority == wanted[int(step.data[0])]


def test_insert_raises_if_priorities_empty():
    with serve(prioritized_table()) as (server, client):
        with pytest.raises(ValueError, match=r"(?i)priorit"):
            client.insert(np.int64(1), priorities={})
        assert size(client, "dist") == 0


def frequencies(values, n):
    return np.bincount(np.asarray(values).reshape(-1), minlength=n) / len(values)


def test_insert_distribution():
    with serve(prioritized_table()) as (server, client):
        for value, priority in enumerate([1.0, 0.1, 0.0]):
            insert(client, "dist", value, priority)
        s = client.sample_batch("dist", batch_size=10_000, timeout=2)
        freq = frequencies(s.data, 3)
        assert freq[0] == pytest.approx(1.0 / 1.1, abs=0.05)
        assert freq[1] == pytest.approx(0.1 / 1.1, abs=0.05)
        assert freq[2] == 0.0                   # a zero priority is never sampled


def test_mutate_priorities_update_distribution():
    with serve(prioritized_table()) as (server, client):
        for value in range(3):
            insert(client, "dist", value)
        value, info = sample_one(client, "dist")
        client.mutate_priorities("dist", updates={int(info.key[0]): 0.5})
        s = client.sample_batch("dist", batch_size=10_000, timeout=2)
        freq = frequencies(s.data, 3)
        for v in range(3):
            assert freq[v] == pytest.approx(0.2 if v == value else 0.4, abs=0.05)


def test_mutate_priorities_delete():
    with serve(prioritized_table()) as (server, client):
        for value in range(4):
            insert(client, "dist", value)
        value, info = sample_one(client, "dist")
        deleted = int(info.key[0])
        client.mutate_priorities("dist", deletes=[deleted])
        assert size(client, "dist") == 3
        s = client.sample_batch("dist", batch_size=2000, timeout=2)
        assert len(set(s.info.key.tolist())) == 3
        assert deleted not in set(s.info.key.tolist())
        assert value not in set(np.asarray(s.data).tolist())


def test_reset_gives_disjoint_keys():
    with serve(prioritized_table()) as (server, client):
        for value in range(5):
            insert(client, "dist", value)
        before = set(client.sample_batch("dist", batch_size=1000, timeout=2).info.key.tolist())
        assert len(before) == 5
        client.reset("dist")
        for value in range(5):
            insert(client, "dist", value)
        after = set(client.sample_batch("dist", batch_size=1000, timeout=2).info.key.tolist())
        assert len(after) == 5
        assert not before & after
        assert 0 not in before | after


def test_sample_info_dtypes_and_importance_weights():
    with serve(prioritized_table()) as (server, client):
        for value, priority in enumerate([1.0, 2.0, 5.0]):
            insert(client, "dist", value, priority)
        s = client.sample_batch("dist", batch_size=64, timeout=1)
        assert s.info.key.dtype == np.uint64
        assert s.info.probability.dtype == np.float64
        assert s.info.table_size.dtype == np.int64
        assert s.info.priority.dtype == np.float64
        assert s.info.times_sampled.dtype == np.int32
        assert all(f.shape == (64,) for f in s.info)
        np.testing.assert_allclose(s.info.probability, s.info.priority / 8.0, rtol=1e-12)
        w = s.info.importance_weights(beta=0.4)
        expected = (3 * s.info.probability) ** -0.4
        np.testing.assert_allclose(w, expected / expected.max(), rtol=1e-6)
        assert w.dtype == np.float32
        # sample() gives Python scalars
        [step] = next(client.sample("dist", timeout=1))
        assert type(step.info.key) is int
        assert type(step.info.probability) is float
        assert type(step.info.table_size) is int
        assert type(step.info.priority) is float
        assert type(step.info.times_sampled) is int


def test_server_info():
    nested = {"a": TensorSpec((3,), np.int64), "b": TensorSpec((3, 2, 2), np.float32)}
    tables = [prioritized_table(),
              shmreplay.Table.queue("nested", 10, signature=nested),
              shmreplay.Table.queue("unsigned", 10)]
    with serve(*tables) as (server, client):
        for value in range(3):
            insert(client, "dist", value)
        sample_one(client, "dist")
        info = client.server_info()
        assert set(info) == {"dist", "nested", "unsigned"}
        dist = info["dist"]
        assert dist.name == "dist"
        assert dist.current_size == 3
        assert dist.num_unique_samples == 1
        assert dist.max_size == 1000
        assert dist.max_times_sampled == 0
        assert dist.sampler_options["prioritized"]["priority_exponent"] == 1
        assert "fifo" in dist.remover_options
        # read as attributes too, as Reverb's test_server_info reads its protos
        assert dist.sampler_options.prioritized.priority_exponent == 1
        assert dist.remover_options.fifo is True and dist.sampler_options.fifo is False
        # an unset field of the proto's oneof reads as its default, as in Reverb
        assert dist.sampler_options.heap.min_heap is False
        assert not dist.sampler_options.HasField("heap")
        with pytest.raises(AttributeError, match="no field 'nonsense'"):
            dist.sampler_options.nonsense
        assert dist.num_inserted == 3
        assert dist.num_sampled == 1
        assert dist.num_deleted == 0
        assert dist.rate_limiter_info.min_size_to_sample == 3
        assert (dist.signature.shape, np.dtype(dist.signature.dtype)) == ((), np.int64)
        sig = info["nested"].signature
        assert set(sig) == {"a", "b"}
        assert tuple(sig["a"].shape) == (3,) and np.dtype(sig["a"].dtype) == np.int64
        assert tuple(sig["b"].shape) == (3, 2, 2) and np.dtype(sig["b"].dtype) == np.float32
        assert info["nested"].max_times_sampled == 1
        assert "fifo" in info["nested"].sampler_options
        assert info["unsigned"].signature is None
        assert info["unsigned"].current_size == 0
        # the live Table handle reports the same
        assert tables[0].info.current_size == 3
        assert tables[0].info.num_unique_samples == 1


def test_pickle_client():
    with serve(prioritized_table()) as (server, client):
        clone = pickle.loads(pickle.dumps(client))
        try:
            clone.insert(np.int64(11), priorities={"dist": 1.0}, timeout=1)
        finally:
            clone.close()
        assert size(client, "dist") == 1


def test_write_and_sample_different_shapes_and_dtypes():
    # Reverb inserts differently shaped items into one unsigned queue; shmreplay columns
    # have fixed shapes, so the restatement puts the three shapes/dtypes into each item.
    with serve(shmreplay.Table.queue("q", 10)) as (server, client):
        items = [(np.array(i, np.int64), np.full([2, 2], i + 0.5, np.float32),
                  np.full([3, 3], -i, np.int32)) for i in range(3)]
        for item in items:
            client.insert(item, priorities={"q": 1.0}, timeout=1)
        got = list(client.sample("q", num_samples=3, timeout=1))
        assert len(got) == 3
        for item, [step] in zip(items, got):
            for want, have in zip(item, step.data):
                np.testing.assert_array_equal(np.asarray(have), want)
                assert np.asarray(have).dtype == want.dtype
                assert np.asarray(have).shape == want.shape
        assert size(client, "q") == 0


def test_sample_emit_timesteps_false_adds_time_dim():
    with serve(shmreplay.Table.queue("q", 10)) as (server, client):
        client.insert(np.ones([3, 3], np.float32), priorities={"q": 1.0}, timeout=1)
        sample = next(client.sample("q", emit_timesteps=False, timeout=1))
        assert isinstance(sample, ReplaySample)
        # Reverb's data is the flat list of the item's columns.
        assert isinstance(sample.data, list) and len(sample.data) == 1
        np.testing.assert_array_equal(sample.data[0], np.ones([1, 3, 3], np.float32))


def test_localhost_client_attaches_to_the_same_buffer():
    with serve(prioritized_table()) as (server, client):
        other = server.localhost_client()
        try:
            insert(other, "dist", 1)
        finally:
            other.close()
        assert size(client, "dist") == 1


# --------------------------------------------------------------------------------------
# batch-level semantics (SampleFlexibleBatch) and server_test.py
# --------------------------------------------------------------------------------------

def test_times_sampled_increments_within_one_batch():
    with serve(uniform_table()) as (server, client):
        insert(client, "t", 4)
        s = client.sample_batch("t", batch_size=5, timeout=1)
        assert s.info.times_sampled.tolist() == [1, 2, 3, 4, 5]
        assert np.asarray(s.data).tolist() == [4] * 5
        info = client.server_info()["t"]
        assert info.num_unique_samples == 1
        assert info.num_sampled == 5
        assert info.rate_limiter_info.sample_stats.completed == 5


def test_max_times_sampled_within_one_batch():
    # each draw sees the table as left by the previous one: deleted items are not drawn
    # again, and table_size is the size before that draw's own deletion
    with serve(uniform_table(max_times_sampled=1)) as (server, client):
        for i in range(3):
            insert(client, "t", i)
        s = client.sample_batch("t", batch_size=10, timeout=1)
        assert sorted(np.asarray(s.data).tolist()) == [0, 1, 2]
        assert s.info.table_size.tolist() == [3, 2, 1]
        np.testing.assert_array_equal(s.info.probability, [1 / 3, 1 / 2, 1.0])
        assert (s.info.times_sampled == 1).all()
        assert size(client, "t") == 0


def test_prioritized_probability_within_a_depleting_batch():
    table = uniform_table(sampler=selectors.Prioritized(1.0), max_times_sampled=1)
    with serve(table) as (server, client):
        insert(client, "t", 0, priority=1.0)
        insert(client, "t", 1, priority=3.0)
        s = client.sample_batch("t", batch_size=2, timeout=1)
        first, second = np.asarray(s.data).tolist()
        assert {first, second} == {0, 1}
        assert s.info.probability[0] == pytest.approx([1 / 4, 3 / 4][first], rel=1e-12)
        assert s.info.probability[1] == 1.0


def test_insert_batch_priorities_and_order():
    with serve(uniform_table(sampler=selectors.Prioritized(1.0)),
               shmreplay.Table.queue("q", 10, signature=INT)) as (server, client):
        keys = client.insert_batch(np.arange(5, dtype=np.int64),
                                   priorities={"t": np.array([0, 0, 5, 0, 0.0]), "q": 1.0},
                                   timeout=1)
        assert len(set(np.asarray(keys["t"]).tolist())) == 5
        s = client.sample_batch("t", batch_size=100, timeout=1)
        assert set(np.asarray(s.data).tolist()) == {2}
        assert (s.info.priority == 5.0).all()
        s = client.sample_batch("q", batch_size=5, timeout=1)
        assert np.asarray(s.data).tolist() == [0, 1, 2, 3, 4]


def test_timeout_zero_does_not_wait():
    with serve(uniform_table()) as (server, client):
        start = time.monotonic()
        with pytest.raises(errors.DeadlineExceededError):
            client.sample_batch("t", batch_size=1, timeout=0)
        assert time.monotonic() - start < 0.5
        insert(client, "t", 1, timeout=0)
        assert sample_value(client, "t", timeout=0) == 1


def test_can_sample_and_can_insert_ignore_max_size_and_max_times_sampled():
    # server_test.py::test_can_sample
    table = uniform_table(limiter=rate_limiters.MinSize(2), max_times_sampled=1, max_size=2)
    with serve(table) as (server, client):
        assert not table.can_sample(1)
        insert(client, "t", 0)
        assert not table.can_sample(1)
        insert(client, "t", 1)
        assert table.can_sample(1)
        assert table.can_sample(2)
        assert table.can_sample(3)       # only the limiter is asked, not the item count
        assert table.can_insert(1)


def test_table_info_for_every_selector_combination():
    # server_test.py::test_table_info, one server per limiter holding all 36 combinations
    chosen = {"Uniform": selectors.Uniform, "Prioritized": lambda: selectors.Prioritized(0.7),
              "Fifo": selectors.Fifo, "Lifo": selectors.Lifo,
              "MinHeap": selectors.MinHeap, "MaxHeap": selectors.MaxHeap}
    option_key = {"Uniform": "uniform", "Prioritized": "prioritized", "Fifo": "fifo",
                  "Lifo": "lifo", "MinHeap": "heap", "MaxHeap": "heap"}
    limiters = [lambda: rate_limiters.MinSize(10), lambda: rate_limiters.Queue(10),
                lambda: rate_limiters.SampleToInsertRatio(1, 10, 1),
                lambda: rate_limiters.Stack(10)]
    for make_limiter in limiters:
        tables = [shmreplay.Table(f"{s}-{r}", chosen[s](), chosen[r](), 10, make_limiter())
                  for s in chosen for r in chosen]
        unserved = {t.name: t.info for t in tables}     # Table.info works before serving
        with serve(*tables) as (server, client):
            info = client.server_info()
            for s in chosen:
                for r in chosen:
                    name = f"{s}-{r}"
                    for i in (info[name], unserved[name]):
                        assert i.name == name
                        assert i.max_size == 10
                        assert i.current_size == 0
                        assert i.signature is None
                        assert option_key[s] in i.sampler_options
                        assert option_key[r] in i.remover_options
                    if s in ("MinHeap", "MaxHeap"):
                        assert info[name].sampler_options["heap"]["min_heap"] == (s == "MinHeap")
                    if s == "Prioritized":
                        assert info[name].sampler_options["prioritized"][
                            "priority_exponent"] == 0.7


def test_prioritized_sampler_and_heap_remover_share_priority_updates():
    table = uniform_table(sampler=selectors.Prioritized(1.0), remover=selectors.MinHeap(),
                          max_size=3)
    with serve(table) as (server, client):
        keys = {v: client.insert(np.int64(v), priorities={"t": p}, timeout=1)["t"]
                for v, p in [(0, 1.0), (1, 2.0), (2, 3.0)]}
        client.mutate_priorities("t", updates={keys[2]: 0.5})   # now the remover's choice
        insert(client, "t", 3, priority=4.0)
        s = client.sample_batch("t", batch_size=2000, timeout=1)
        assert set(np.asarray(s.data).tolist()) == {0, 1, 3}
        np.testing.assert_allclose(s.info.probability, s.info.priority / 7.0, rtol=1e-12)

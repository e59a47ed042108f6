"""``shmreplay.tf.PackedBatches``: batches handed to a ``tf.function`` as one packed
argument and taken apart inside it (issue 20, the TF learner feed)."""

import collections
import contextlib
import time

import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay import tf as shmreplay_tf
import _names
from _serving import serve

WIDE = 70_000  # float32: 280 KB a row, above _outputs.POOL_FROM (passed alone)
Pair = collections.namedtuple("Pair", ["first", "second"])


def uniform(name="u", size=64):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), size,
                           rate_limiters.MinSize(1))


def item(i):
    """Leaves of every kind the packing meets: small numeric ones (packed, of sizes 1 to
    8, in a namedtuple and a nested dict), a bool and a wide one (each passed alone)."""
    return {"u8": np.full(3, i, np.uint8), "f16": np.full(2, i, np.float16),
            "pair": Pair(np.int32(i), np.float64(i)), "deep": {"u64": np.uint64(i)},
            "flag": np.bool_(i % 2), "wide": np.full(WIDE, i, np.float32)}


def fill(client, table, count, make=item):
    keys = {}
    for i in range(1, count + 1):
        keys[int(client.insert(make(i), {table: 1.0})[table])] = i
    return keys


def expected(rows, make=item):
    return tf.nest.map_structure(lambda *leaves: np.stack(leaves), *[make(i) for i in rows])


def assert_batch_is(sample, rows, make=item):
    want = expected(rows, make)
    tf.nest.assert_same_structure(sample.data, want)
    for got, leaf in zip(tf.nest.flatten(sample.data), tf.nest.flatten(want)):
        assert got.dtype.as_numpy_dtype == leaf.dtype and got.shape == leaf.shape
        np.testing.assert_array_equal(got.numpy(), leaf)


def test_unpack_inside_a_tf_function_gives_each_row_its_item():
    with serve(uniform()) as (name, client):
        keys = fill(client, "u", 20)
        batches = shmreplay_tf.PackedBatches(name, "u", 8, max_batches=6)

        @tf.function
        def step(packed):
            return batches.unpack(packed)

        got = [(batch.info, step(batch.packed)) for batch in batches]
        batches.close()
    assert len(got) == 6
    for info, sample in got:
        # (the bool and the wide leaf cross alone, the rest in one uint8 tensor)
        np.testing.assert_array_equal(sample.info.key.numpy(), info.key)
        assert_batch_is(sample, [keys[int(key)] for key in info.key])
        assert sample.info.key.dtype == tf.uint64 and sample.info.table_size.dtype == tf.int64
        assert sample.info.probability.numpy().tolist() == [1 / 20] * 8
        assert sample.info.table_size.numpy().tolist() == [20] * 8


def test_pack_gives_what_unpack_takes_for_a_sample_batch():
    with serve(uniform()) as (name, client):
        keys = fill(client, "u", 12)
        sample = client.sample_batch("u", 5)
        with shmreplay_tf.PackedBatches(name, "u", 5) as batches:
            back = batches.unpack(batches.pack(sample))
    np.testing.assert_array_equal(back.info.key.numpy(), sample.info.key)
    assert_batch_is(back, [keys[int(key)] for key in sample.info.key])


def test_a_step_written_for_make_dataset_takes_unpacked_batches_unchanged():
    with serve(uniform()) as (name, client):
        fill(client, "u", 10)
        dataset = shmreplay_tf.make_dataset(name, "u", batch_size=4)
        with shmreplay_tf.PackedBatches(client, "u", 4) as batches:
            assert batches.element_spec == dataset.element_spec

            @tf.function
            def total(sample):  # a step over make_dataset's elements
                return tf.reduce_sum(sample.data["pair"].first) + tf.cast(
                    tf.reduce_sum(sample.info.times_sampled), tf.int32)

            total(next(iter(dataset)))
            packed = next(batches)
            on_packed = tf.function(lambda p: total(batches.unpack(p)))
            assert int(on_packed(packed.packed)) > 0
            assert total.experimental_get_tracing_count() == 1  # the same trace served both


def test_the_batches_tensors_are_not_overwritten_by_later_batches():
    # A batch kept by the learner must not change when later batches are sampled: the
    # wide leaf's tensor shares the engine's pooled output memory (DLPack), which the
    # pool must not hand to a later batch while the tensor lives.
    with serve(uniform()) as (name, client):
        keys = fill(client, "u", 30)
        with shmreplay_tf.PackedBatches(name, "u", 4) as batches:
            kept = next(batches)
            rows = [keys[int(key)] for key in kept.info.key]
            for _ in range(20):
                next(batches)
            assert_batch_is(batches.unpack(kept.packed), rows)


@contextlib.contextmanager
def four_prioritized():
    """A buffer whose table "p" (proportional to priority) holds 4 items of priority 1."""
    table = shmreplay.Table("p", selectors.Prioritized(1.0), selectors.Fifo(), 16,
                            rate_limiters.MinSize(1))
    with serve(table) as (name, client):
        fill(client, "p", 4, make=lambda i: {"x": np.float32(i)})
        yield name, client


def test_update_priorities_sets_abs_td_to_the_exponent_plus_epsilon():
    with four_prioritized() as (name, client):
        with shmreplay_tf.PackedBatches(name, "p", 3) as batches:
            batch = next(batches)
            keys = np.unique(batch.info.key)
            td = tf.constant([-2.0] * len(keys))
            assert batches.update_priorities(keys, td, exponent=2.0, epsilon=0.5) == len(keys)
        priorities = {}
        for _ in range(1000):  # (until every item was drawn: the weights are 4.5 and 1)
            sample = client.sample_batch("p", 4)
            priorities.update(zip(sample.info.key.tolist(), sample.info.priority.tolist()))
            if len(priorities) == 4:
                break
    assert all(priorities[int(key)] == 4.5 for key in keys)
    assert sorted(v for k, v in priorities.items() if k not in set(keys.tolist())) == \
        [1.0] * (4 - len(keys))


def test_a_refused_priority_update_raises_and_changes_nothing():
    with four_prioritized() as (name, client):
        with shmreplay_tf.PackedBatches(name, "p", 4) as batches:
            batch = next(batches)
            with pytest.raises(shmreplay.errors.InvalidPriorityError, match="Table .p.*nan"):
                batches.update_priorities(batch.info.key, tf.constant([np.nan, 1, 1, 1]))
        sample = client.sample_batch("p", 8)
    assert sample.info.priority.tolist() == [1.0] * 8


def test_max_batches_and_the_rate_limiter_timeout_end_the_iteration():
    signed = shmreplay.Table("s", selectors.Uniform(), selectors.Fifo(), 8,
                             rate_limiters.MinSize(1),
                             signature={"x": tf.TensorSpec([2], tf.float32)})
    with serve(uniform(), signed) as (name, client):
        with shmreplay_tf.PackedBatches(name, "s", 2, rate_limiter_timeout_ms=200) as empty:
            start = time.monotonic()
            assert list(empty) == []  # nothing to sample: ends after the timeout
            assert 0.15 < time.monotonic() - start < 10
        with pytest.raises(ValueError, match="Table u .*does not have a signature"):
            shmreplay_tf.PackedBatches(name, "u", 2)  # no signature and no item yet
        fill(client, "u", 5)
        with shmreplay_tf.PackedBatches(name, "u", 2, max_batches=3) as three:
            assert len(list(three)) == 3
            with pytest.raises(StopIteration):
                next(three)


def test_bad_tables_and_arguments_are_refused_when_made():
    any_length = shmreplay.Table(
        "v", selectors.Uniform(), selectors.Fifo(), 8, rate_limiters.MinSize(1),
        signature={"x": tf.TensorSpec([None, 2], tf.float32)})
    open_inner = shmreplay.Table(
        "w", selectors.Uniform(), selectors.Fifo(), 8, rate_limiters.MinSize(1),
        signature={"x": tf.TensorSpec([2, None], tf.float32)})
    with serve(uniform(), any_length, open_inner) as (name, client):
        fill(client, "u", 2)
        with shmreplay_tf.PackedBatches(tf.constant(name), "u", 2) as by_tensor_name:
            assert len(next(by_tensor_name).info.key) == 2
        with pytest.raises(ValueError, match="table named missing"):
            shmreplay_tf.PackedBatches(name, "missing", 2)
        with pytest.raises(ValueError, match="'v' holds items whose shapes are not fixed"
                                             r" \(\(None, 2\)\).*pad_to"):
            shmreplay_tf.PackedBatches(name, "v", 2)
        with pytest.raises(ValueError, match=r"'w' .*not fixed \(\(2, None\)\)"):
            shmreplay_tf.PackedBatches(name, "w", 2)
        for bad in (0, 2.5, True):
            with pytest.raises(ValueError, match="batch_size"):
                shmreplay_tf.PackedBatches(name, "u", bad)
        for bad in (-1, 2.5):
            with pytest.raises(ValueError, match="max_batches"):
                shmreplay_tf.PackedBatches(name, "u", 2, max_batches=bad)
        with pytest.raises(ValueError, match="rate_limiter_timeout_ms"):
            shmreplay_tf.PackedBatches(name, "u", 2, rate_limiter_timeout_ms=None)
    with pytest.raises(shmreplay.errors.BufferNotFoundError):
        shmreplay_tf.PackedBatches(_names.unique("gone"), "u", 2)


def test_a_failure_when_made_detaches_the_client_it_attached(monkeypatch):
    from shmreplay import _tf_common, _tf_feed
    attached = []
    connect = _tf_common.connect
    monkeypatch.setattr(_tf_common, "connect",
                        lambda address: attached.append(connect(address)) or attached[-1])

    def no_packing(*args):
        raise RuntimeError("no packing")
    with serve(uniform()) as (name, client):
        fill(client, "u", 2)
        with pytest.raises(ValueError, match="table named missing"):
            shmreplay_tf.PackedBatches(name, "missing", 2)
        monkeypatch.setattr(_tf_feed, "Packing", no_packing)
        with pytest.raises(RuntimeError, match="no packing"):
            shmreplay_tf.PackedBatches(name, "u", 2)
    mine = [c for c in attached if c is not client]
    assert len(mine) >= 2 and all(c._closed for c in mine)


def test_nothing_is_sampled_ahead_of_the_loop():
    # A queue hands each item out once: what the iterator took is gone from it.
    queue = shmreplay.Table.queue("q", 32)
    with serve(queue) as (name, client):
        fill(client, "q", 20, make=lambda i: {"x": np.float32(i)})
        with shmreplay_tf.PackedBatches(name, "q", 4) as batches:
            first = next(batches)
            assert client.server_info()["q"].current_size == 16
            second = next(batches)
            assert client.server_info()["q"].current_size == 12
        assert first.info.key.tolist() + second.info.key.tolist() == sorted(
            first.info.key.tolist() + second.info.key.tolist())  # FIFO order
        with shmreplay_tf.PackedBatches(name, "q", 4, max_batches=0) as none:
            assert list(none) == []
        assert client.server_info()["q"].current_size == 12

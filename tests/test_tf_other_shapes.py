"""Reverb's per-item datasets over items of other shapes (issue 19, point 2 and 3).

A table without a signature keeps items whose shapes are not its columns' in its general
store. ``sample_batch`` cannot stack such items, but Reverb's ``TrajectoryDataset`` and
``TimestepDataset`` read them one by one, each at its own shape, when the spec leaves
the shape open. Each test checks every item against what was written, and that no item
drawn is lost on the way (a queue ends empty).

TensorFlow is imported only in this file (and the other TF-only test files).
"""

import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay.errors import SchemaError

ITEMS = [np.arange(3, dtype=np.float32), np.arange(5, dtype=np.float32) + 10,
         np.full((2, 2), 7, np.float32), np.arange(4, dtype=np.float32) + 20]
SPEC_B = tf.TensorShape([])


def _fill(client, table="q"):
    for index, a in enumerate(ITEMS):
        client.insert({"a": a, "b": np.int32(index)}, {table: 1.0})


@pytest.fixture
def queue(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 100)], name=buffer_name) as server:
        client = server.localhost_client()
        _fill(client)
        yield client


def _read(client, cls, a_shape, b_shape, in_flight, count=len(ITEMS)):
    dataset = cls(client.server_address, "q", max_in_flight_samples_per_worker=in_flight,
                  dtypes={"a": tf.float32, "b": tf.int32},
                  shapes={"a": a_shape, "b": b_shape}, rate_limiter_timeout_ms=2000)
    return [(sample.data["a"].numpy(), int(np.reshape(sample.data["b"].numpy(), ())))
            for sample in dataset.take(count)]


@pytest.mark.parametrize("in_flight", [1, 3, 8])
def test_trajectory_dataset_reads_each_item_at_its_own_shape(queue, in_flight):
    """An inserted item is one timestep: ``[1, *S]``, as Reverb gives it to a spec of
    unknown rank; several in flight cannot share a chunk, and none is lost."""
    got = _read(queue, shmreplay.TrajectoryDataset, tf.TensorShape(None),
                tf.TensorShape([1]), in_flight)
    assert [b for _, b in got] == [0, 1, 2, 3]
    for (a, _), written in zip(got, ITEMS):
        assert a.shape == (1,) + written.shape
        np.testing.assert_array_equal(a[0], written)
    assert queue.server_info()["q"].current_size == 0


@pytest.mark.parametrize("in_flight", [1, 4])
def test_timestep_dataset_reads_each_item_as_one_timestep(queue, in_flight):
    got = _read(queue, shmreplay.TimestepDataset, tf.TensorShape(None), SPEC_B, in_flight)
    assert [b for _, b in got] == [0, 1, 2, 3]
    for (a, _), written in zip(got, ITEMS):
        np.testing.assert_array_equal(a, written)


def test_a_spec_with_an_open_dimension_reads_the_items_that_fit_it(queue):
    """Spec ``[None]``: the 3- and 5-element items come, the 2x2 one is refused naming
    the column and both shapes, as Reverb refuses it."""
    got = _read(queue, shmreplay.TimestepDataset, tf.TensorShape([None]), SPEC_B, 1, 2)
    assert [a.shape for a, _ in got] == [(3,), (5,)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"column \['a'\].*\[2,2\]"):
        _read(queue, shmreplay.TimestepDataset, tf.TensorShape([None]), SPEC_B, 1, 1)


def test_sample_batch_still_refuses_to_stack_them(queue):
    with pytest.raises(SchemaError, match=r"column \['a'\]"):
        queue.sample_batch("q", 4, timeout=5)


def test_writer_items_of_another_shape_come_as_written(buffer_name):
    """A table first filled by a writer: later writers' items whose steps have another
    shape go to the general store whole, and the dataset gives them as written."""
    with shmreplay.Server([shmreplay.Table.queue("q", 100)], name=buffer_name) as server:
        client = server.localhost_client()
        for width, base in ((2, 0.0), (3, 100.0)):
            with client.trajectory_writer(num_keep_alive_refs=2) as writer:
                for step in range(2):
                    writer.append({"o": np.full(width, base + step, np.float32)})
                writer.create_item("q", 1.0, {"o": writer.history["o"][-2:]})
        dataset = shmreplay.TrajectoryDataset(
            client.server_address, "q", max_in_flight_samples_per_worker=2,
            dtypes={"o": tf.float32}, shapes={"o": tf.TensorShape([None, None])},
            rate_limiter_timeout_ms=2000)
        got = [sample.data["o"].numpy() for sample in dataset.take(2)]
        np.testing.assert_array_equal(got[0], [[0, 0], [1, 1]])
        np.testing.assert_array_equal(got[1], [[100] * 3, [101] * 3])


def test_a_fixed_table_read_with_an_open_time_dimension(buffer_name):
    """A table of fixed 3-step items, read with the spec ``[None, 2]``: Reverb gives the
    items (the spec fits them). It used to refuse them as 'columns of any length ... not
    those the dataset was made for'."""
    signature = {"x": tf.TensorSpec([3, 2], tf.float32)}
    with shmreplay.Server([shmreplay.Table.queue("q", 10, signature=signature)],
                          name=buffer_name) as server:
        client = server.localhost_client()
        with client.trajectory_writer(num_keep_alive_refs=3) as writer:
            for step in range(3):
                writer.append({"x": np.full(2, step, np.float32)})
            writer.create_item("q", 1.0, {"x": writer.history["x"][:]})
        dataset = shmreplay.TrajectoryDataset(
            client.server_address, "q", max_in_flight_samples_per_worker=1,
            dtypes={"x": tf.float32}, shapes={"x": tf.TensorShape([None, 2])},
            rate_limiter_timeout_ms=2000)
        (sample,) = list(dataset.take(1))
        np.testing.assert_array_equal(sample.data["x"].numpy(), [[0, 0], [1, 1], [2, 2]])

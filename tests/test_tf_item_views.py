"""``shmreplay.tf``'s per-item datasets give each column the shape its spec asks for,
decided from the table's layout (the columns' forms), not guessed from the spec; a
spec that fits no form of a column is an error naming the column and both shapes."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay import tf as shmreplay_tf
import _names


@contextlib.contextmanager
def queue_of(*fills):
    """A buffer with a queue ``q``; each fill(client) writes its items."""
    with shmreplay.Server([shmreplay.Table.queue("q", 20)], name=_names.unique("views")) as server:
        with shmreplay.Client(server.name) as client:
            for fill in fills:
                fill(client)
            yield server.name


def inserted(client):  # items from insert: whole items {"x": f32 [], "v": i64 [3]}
    for value in range(2):
        client.insert({"x": np.float32(value), "v": np.arange(3) + value}, {"q": 1.0})


def one_step_windows(client):  # {"o": f32 [1, 2]}: a [-1:] window, kept as one step
    with client.trajectory_writer(1) as writer:
        for t in range(2):
            writer.append({"o": np.full(2, t, np.float32)})
            writer.create_item("q", 1.0, {"o": writer.history["o"][-1:]})


def sequences(client):  # {"o": f32 [3, 2]}: sequences of 3 steps
    with client.trajectory_writer(3) as writer:
        for t in range(3):
            writer.append({"o": np.full(2, t, np.float32)})
        writer.create_item("q", 1.0, {"o": writer.history["o"][-3:]})


def first(dataset):
    return next(iter(dataset))


def trajectories(name, dtypes, shapes):
    return shmreplay_tf.TrajectoryDataset(name, "q", dtypes, shapes, 1,
                                          rate_limiter_timeout_ms=1000)


def timesteps(name, dtypes, shapes):
    return shmreplay_tf.TimestepDataset(name, "q", dtypes, shapes, 1,
                                        rate_limiter_timeout_ms=1000)


ITEM = {"x": tf.float32, "v": tf.int64}


def test_each_one_step_column_takes_the_time_dimension_its_spec_asks_for():
    # Decided per column from its form: one column with the time dimension of 1 and
    # one without is fine (the spec was read as all-or-nothing and refused it).
    with queue_of(inserted) as name:
        sample = first(trajectories(name, ITEM, {"x": (1,), "v": (3,)}))
        assert sample.data["x"].shape == (1,) and sample.data["v"].shape == (3,)
    with queue_of(one_step_windows) as name:  # stored [1, 2]: read as [2] or [1, 2]
        assert first(trajectories(name, {"o": tf.float32}, {"o": (2,)})).data["o"].shape == (2,)
        assert first(trajectories(name, {"o": tf.float32},
                                  {"o": (None, 2)})).data["o"].shape == (1, 2)


@pytest.mark.parametrize("fill, make, dtypes, shapes, message", [
    (inserted, trajectories, ITEM, {"x": (), "v": (2, 3)},
     r"index 0 \(column \['v'\]\). Specification has \(dtype, shape\): \(int64, \[2,3\]\)."
     r"  Tensor has \(dtype, shape\): \(int64, \[1,3\]\). .*\(\[3\] or \[1,3\]\)"),
    (sequences, trajectories, {"o": tf.float32}, {"o": (2,)},
     r"column \['o'\]\). Specification .*\(float, \[2\]\).  Tensor .*\(float, \[3,2\]\). "
     r"The items are sequences of (3 steps|any length \(this one of 3 steps\))"),
    # An inserted [5, 2] is one timestep (Reverb: [1, 5, 2]), not 5 guessed from the spec.
    (lambda c: c.insert({"o": np.zeros((5, 2), np.float32)}, {"q": 1.0}), timesteps,
     {"o": tf.float32}, {"o": (2,)},
     r"column \['o'\]\). Specification .*\(float, \[2\]\).  Tensor .*\(float, \[5,2\]\). "
     r"\(each item is one timestep"),
    # A sequence is cut into its timesteps, whatever the spec's rank says.
    (sequences, timesteps, {"o": tf.float32}, {"o": (3, 2)},
     r"column \['o'\]\). Specification .*\(float, \[3,2\]\).  Tensor .*\(float, \[2\]\). "
     r"\(one timestep of items of (3 steps|any length)\)"),
], ids=["insert-item-wrong-rank", "sequence-without-time", "inserted-is-one-timestep",
        "timestep-spec-with-time"])
def test_a_spec_that_fits_no_form_of_a_column_names_it_and_both_shapes(
        fill, make, dtypes, shapes, message):
    with queue_of(fill) as name:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            first(make(name, dtypes, shapes))


def test_timesteps_of_sequences_and_of_inserted_items():
    with queue_of(sequences) as name:
        got = [s.data["o"].numpy().tolist() for s in
               timesteps(name, {"o": tf.float32}, {"o": (2,)}).take(3)]
        assert got == [[0, 0], [1, 1], [2, 2]]
    with queue_of(lambda c: c.insert({"o": np.ones((5, 2), np.float32)}, {"q": 1.0})) as name:
        assert first(timesteps(name, {"o": tf.float32}, {"o": (5, 2)})).data["o"].shape == (5, 2)

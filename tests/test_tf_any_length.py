"""The TensorFlow datasets over a table of items of any length (issue 19, point 3).

Reverb's per-item datasets give each item at its own length (``TimestepDataset`` its
own number of timesteps); ``make_dataset`` and ``ReplayBuffer.as_dataset`` give padded
batches with the lengths. Each item is checked against what was written.

TensorFlow is imported only in this file (and the other TF-only test files).
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf

import _any_length_workers as W
import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay import tf as shmreplay_tf

LENGTHS = [3, 7, 1, 12, 5, 2]
BASE = 100


def _written(lengths=LENGTHS, base=BASE):
    """``{first step: length}`` of the episodes ``W.write_episodes`` writes."""
    starts = base + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return dict(zip(starts.tolist(), lengths))


def _check_item(obs, step, written):
    """An item at its own length: one written episode, whole."""
    obs, step = np.asarray(obs), np.asarray(step)
    assert written[int(step[0])] == len(step) == len(obs), (step, written)
    assert (step == np.arange(step[0], step[0] + len(step))).all()
    assert (obs == step[:, None]).all()


def _check_padded(data, lengths, written, width):
    """Each row of a padded batch: its episode, then zeros up to ``width``."""
    assert data["obs"].shape[1] == data["step"].shape[1] == width
    assert (np.asarray(lengths["obs"]) == np.asarray(lengths["step"])).all()
    for obs, step, length in zip(np.asarray(data["obs"]), np.asarray(data["step"]),
                                 np.asarray(lengths["step"])):
        _check_item(obs[:length], step[:length], written)
        assert (step[length:] == 0).all() and (obs[length:] == 0).all()


def _uniform(name="eps"):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), 100,
                           rate_limiters.MinSize(1), signature=W.SIGNATURE)


@pytest.fixture
def episodes(buffer_name):
    """A uniform table and a queue, each holding the episodes ``LENGTHS``."""
    tables = [_uniform(), shmreplay.Table.queue("queue", 100, signature=W.SIGNATURE),
              shmreplay.Table.queue("plain", 100)]  # (no signature: for TimestepDataset)
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", LENGTHS, BASE)
        with client.trajectory_writer(num_keep_alive_refs=20) as writer:
            value = BASE
            for length in LENGTHS:  # (W.write_episodes writes to one table)
                for _ in range(length):
                    writer.append({"obs": np.full(4, value, np.float32),
                                   "step": np.int64(value)})
                    value += 1
                for table in ("queue", "plain"):
                    writer.create_item(table, 1.0, {"obs": writer.history["obs"][-length:],
                                                    "step": writer.history["step"][-length:]})
                writer.end_episode()
        yield buffer_name
        client.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_trajectory_dataset_gives_each_item_at_its_own_length(episodes, workers):
    dataset = shmreplay_tf.TrajectoryDataset.from_table_signature(
        episodes, "eps", max_in_flight_samples_per_worker=4, num_workers_per_iterator=workers)
    assert dataset.element_spec.data["obs"].shape.as_list() == [None, 4]
    assert dataset.element_spec.data["step"].shape.as_list() == [None]
    seen = set()
    for sample in dataset.take(60):
        _check_item(sample.data["obs"], sample.data["step"], _written())
        seen.add(int(sample.data["step"][0]))
    assert seen == set(_written())  # (60 draws of 6 items: all of them, p > 0.99)


def test_trajectory_dataset_of_a_queue_gives_the_episodes_in_order(episodes):
    dataset = shmreplay_tf.TrajectoryDataset.from_table_signature(
        episodes, "queue", max_in_flight_samples_per_worker=4, rate_limiter_timeout_ms=300)
    items = [(s.data["obs"].numpy(), s.data["step"].numpy()) for s in dataset]
    assert [len(step) for _, step in items] == LENGTHS
    for obs, step in items:
        _check_item(obs, step, _written())


_STEP_DTYPES = {"obs": tf.float32, "step": tf.int64}
_STEP_SHAPES = {"obs": tf.TensorShape([4]), "step": tf.TensorShape([])}


def test_a_timestep_dataset_is_checked_against_the_signature_as_it_is(episodes):
    """As in Reverb: a trajectory signature is no timestep's, so a TimestepDataset of
    such a table is refused when it starts (a table without a signature takes it)."""
    dataset = shmreplay_tf.TimestepDataset.from_table_signature(episodes, "queue", 4)
    assert dataset.element_spec.data["obs"].shape.as_list() == [None, 4]
    steps = shmreplay_tf.TimestepDataset(episodes, "queue", _STEP_DTYPES, _STEP_SHAPES, 4)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Requested incompatible tensor at flattened index 0 from "
                             r"table 'queue'.  Requested \(dtype, shape\): \(float, \[4\]\)."
                             r"  Signature \(dtype, shape\): \(float, \[\?,4\]\)"):
        next(iter(steps))


def test_timestep_dataset_cuts_each_item_into_its_own_timesteps(episodes):
    dataset = shmreplay_tf.TimestepDataset(
        episodes, "plain", _STEP_DTYPES, _STEP_SHAPES, max_in_flight_samples_per_worker=4,
        rate_limiter_timeout_ms=300)
    steps, keys = [], []
    for sample in dataset:
        assert (sample.data["obs"].numpy() == sample.data["step"].numpy()).all()
        steps.append(int(sample.data["step"]))
        keys.append(int(sample.info.key))
    assert steps == list(range(BASE, BASE + sum(LENGTHS)))  # every step once, in order
    runs = [len(list(group)) for _, group in itertools.groupby(keys)]
    assert runs == LENGTHS  # each item's info on its own steps


def test_timestep_dataset_with_two_workers_gives_every_step_once(episodes):
    dataset = shmreplay_tf.TimestepDataset(
        episodes, "plain", _STEP_DTYPES, _STEP_SHAPES, max_in_flight_samples_per_worker=2,
        num_workers_per_iterator=2, rate_limiter_timeout_ms=300)
    steps = {}
    for sample in dataset:
        assert (sample.data["obs"].numpy() == sample.data["step"].numpy()).all()
        steps.setdefault(int(sample.info.key), []).append(int(sample.data["step"]))
    assert sorted(len(run) for run in steps.values()) == sorted(LENGTHS)
    for run in steps.values():  # each item's steps, in order
        assert run == list(range(run[0], run[0] + len(run))) and _written()[run[0]] == len(run)


def test_timestep_dataset_refuses_items_whose_columns_differ_in_length(buffer_name):
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 10,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        with client.trajectory_writer(num_keep_alive_refs=5) as writer:
            for t in range(3):
                writer.append({"obs": np.full(2, t, np.float32), "action": np.int32(t)})
            writer.create_item("t", 1.0, {"obs": writer.history["obs"][-3:],
                                          "action": writer.history["action"][-2:]})
        dtypes = {"obs": tf.float32, "action": tf.int32}
        dataset = shmreplay_tf.TimestepDataset(buffer_name, "t", dtypes,
                                               {"obs": [2], "action": []}, 2)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="can't split non timestep trajectory"):
            next(iter(dataset))
        # Each item whole is fine: its columns at their own lengths.
        item = next(iter(shmreplay_tf.TrajectoryDataset(
            buffer_name, "t", dtypes, {"obs": [None, 2], "action": [None]}, 2)))
        assert item.data["obs"].shape == (3, 2) and item.data["action"].numpy().tolist() == [1, 2]
        client.close()


def test_a_spec_with_a_fixed_time_dimension_refuses_items_of_another_length(episodes):
    dataset = shmreplay_tf.TrajectoryDataset(
        episodes, "eps", {"obs": tf.float32, "step": tf.int64},
        {"obs": (7, 4), "step": (None,)}, max_in_flight_samples_per_worker=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="give the spec a None time"):
        for _ in dataset.take(50):  # (the 7-step item passes, the others do not)
            pass


def test_make_dataset_gives_padded_batches_with_their_lengths(episodes):
    dataset = shmreplay_tf.make_dataset(episodes, "eps", batch_size=16)
    sample_spec, lengths_spec = dataset.element_spec
    assert sample_spec.data["obs"].shape.as_list() == [16, None, 4]
    assert lengths_spec["step"].shape.as_list() == [16]
    for sample, lengths in dataset.take(4):
        assert isinstance(sample, shmreplay.ReplaySample)
        width = int(np.max(lengths["step"]))  # padded to the batch's longest item
        _check_padded(sample.data, lengths, _written(), width)


def test_make_dataset_pads_to_pad_to_and_refuses_longer_items(episodes):
    dataset = shmreplay_tf.make_dataset(episodes, "eps", batch_size=8, pad_to=20)
    assert dataset.element_spec[0].data["obs"].shape.as_list() == [8, 20, 4]
    for sample, lengths in dataset.take(3):
        _check_padded(sample.data, lengths, _written(), 20)
    short = shmreplay_tf.make_dataset(episodes, "eps", batch_size=64, pad_to=11)
    with pytest.raises(tf.errors.InvalidArgumentError, match="pad_to=11.*12 steps"):
        next(iter(short))


def test_pad_to_where_it_means_nothing_is_refused(episodes):
    with pytest.raises(ValueError, match="batch_size=None"):
        shmreplay_tf.make_dataset(episodes, "eps", batch_size=None, pad_to=4)
    with pytest.raises(ValueError, match="integer >= 1"):
        shmreplay_tf.make_dataset(episodes, "eps", batch_size=4, pad_to=0)


def test_pad_to_on_a_table_of_fixed_shapes_is_refused(buffer_name):
    table = shmreplay.Table("fixed", selectors.Uniform(), selectors.Fifo(), 10,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        client.insert({"x": np.zeros(3, np.float32)}, {"fixed": 1.0})
        with pytest.raises(ValueError, match="fixed shapes"):
            shmreplay_tf.make_dataset(buffer_name, "fixed", batch_size=4, pad_to=4)
        sample = next(iter(shmreplay_tf.make_dataset(buffer_name, "fixed", batch_size=4)))
        assert isinstance(sample, shmreplay.ReplaySample)  # a fixed table: as before
        client.close()


def test_replay_buffer_as_dataset_over_items_of_any_length(episodes):
    buffer = shmreplay_tf.ReplayBuffer(episodes, "eps")
    try:
        for (data, info), lengths in buffer.as_dataset(sample_batch_size=8).take(2):
            assert info.key.shape == (8,)
            _check_padded(data, lengths, _written(), int(np.max(lengths["step"])))
        for (data, _), lengths in buffer.as_dataset(sample_batch_size=8, pad_to=16).take(1):
            _check_padded(data, lengths, _written(), 16)
        for data, info in buffer.as_dataset().take(5):  # one item at its own length
            _check_item(data["obs"], data["step"], _written())
    finally:
        buffer.close()
    queue = shmreplay_tf.ReplayBuffer(episodes, "queue")
    try:
        batches = list(queue.as_dataset(sample_batch_size=2, single_deterministic_pass=True))
        firsts = [int(step[0]) for (data, _), _ in batches for step in data["step"].numpy()]
        assert firsts == list(_written())  # the queue's order, whole batches
        for (data, _), lengths in batches:
            _check_padded(data, lengths, _written(), int(np.max(lengths["step"])))
    finally:
        queue.close()


def test_sequence_length_reads_items_of_that_length_and_refuses_others(buffer_name):
    with shmreplay.Server([_uniform()], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", [4, 4, 4], BASE)
        dataset = shmreplay_tf.make_dataset(buffer_name, "eps", 8, sequence_length=4)
        assert dataset.element_spec.data["obs"].shape.as_list() == [8, 4, 4]
        sample = next(iter(dataset))  # Acme's fixed sequences: a plain ReplaySample
        assert isinstance(sample, shmreplay.ReplaySample)
        _check_padded(sample.data, {"obs": [4] * 8, "step": [4] * 8}, _written([4] * 3), 4)
        spec = {"obs": (4, 4), "step": (4,)}  # a per-item spec with that length
        item = next(iter(shmreplay_tf.TrajectoryDataset(
            buffer_name, "eps", {"obs": tf.float32, "step": tf.int64}, spec, 2)))
        assert item.data["obs"].shape == (4, 4)
        W.write_episodes(client, "eps", [6], BASE + 100)
        for dataset in (shmreplay_tf.make_dataset(buffer_name, "eps", 64, sequence_length=4),
                        shmreplay_tf.TrajectoryDataset(
                            buffer_name, "eps", {"obs": tf.float32, "step": tf.int64}, spec,
                            64)):
            with pytest.raises(tf.errors.InvalidArgumentError, match="6"):
                for _ in dataset.take(20):
                    pass
        client.close()


def test_a_dataset_made_before_its_buffer_says_to_make_it_again(buffer_name):
    # Made before the buffer exists, it cannot know that it must cut items to lengths.
    dataset = shmreplay_tf.TrajectoryDataset(
        buffer_name, "eps", {"obs": tf.float32, "step": tf.int64},
        {"obs": (None, 4), "step": (None,)}, max_in_flight_samples_per_worker=2)
    with shmreplay.Server([_uniform()], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", [3, 5], BASE)
        with pytest.raises(tf.errors.InvalidArgumentError, match="make the dataset again"):
            next(iter(dataset))
        again = shmreplay_tf.TrajectoryDataset(
            buffer_name, "eps", {"obs": tf.float32, "step": tf.int64},
            {"obs": (None, 4), "step": (None,)}, max_in_flight_samples_per_worker=2)
        item = next(iter(again))
        _check_item(item.data["obs"], item.data["step"], _written([3, 5]))
        client.close()

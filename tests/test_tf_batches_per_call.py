"""``make_dataset(batches_per_call=k)``: k batches per trip into Python, handed out one
by one, each still a whole ``sample_batch`` of its own (issue 20)."""


import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay import _tf_packing, rate_limiters, selectors
from shmreplay import tf as shmreplay_tf
from _serving import serve


def item(i):  # packed leaves of three dtypes, and a bool that crosses stacked
    return {"obs": np.full(3, i, np.float32), "step": np.int64(i), "flag": np.bool_(i % 2)}


@pytest.fixture
def trips(monkeypatch):
    """How many batches each trip into Python brought (``pack_rows`` calls)."""
    seen = []
    pack_rows = _tf_packing.Packing.pack_rows
    monkeypatch.setattr(_tf_packing.Packing, "pack_rows",
                        lambda self, batches: seen.append(len(batches)) or pack_rows(self, batches))
    return seen


def check_items(batch, batch_size):
    data = {key: leaf.numpy() for key, leaf in batch.data.items()}
    assert data["obs"].shape == (batch_size, 3) and data["flag"].dtype == bool
    steps = data["step"]
    np.testing.assert_array_equal(data["obs"], np.repeat(steps[:, None], 3, 1))
    np.testing.assert_array_equal(data["flag"], steps % 2 == 1)
    return steps


def prioritized(name="p", size=100):
    return shmreplay.Table(name, selectors.Prioritized(0.8), selectors.Fifo(), size,
                           rate_limiters.MinSize(1))


def test_each_trip_brings_k_whole_batches_and_max_batches_holds(trips):
    with serve(prioritized()) as (name, client):
        keys = {int(client.insert(item(i), {"p": 1.0 + i})["p"]): i for i in range(50)}
        dataset = shmreplay_tf.make_dataset(name, "p", 4, max_batches=7, batches_per_call=3)
        assert dataset.element_spec.data["obs"].shape == (4, 3)
        batches = list(dataset)
    assert trips == [3, 3, 1]  # no batch sampled and thrown away
    assert len(batches) == 7
    for batch in batches:
        steps = check_items(batch, 4)
        assert [keys[int(key)] for key in batch.info.key.numpy()] == steps.tolist()
        assert batch.info.probability.shape == (4,)


def test_default_is_several_for_small_random_batches_and_one_for_queues(trips):
    queue = shmreplay.Table.queue("q", 100)
    with serve(prioritized(), queue) as (name, client):
        for i in range(60):
            client.insert(item(i), {"p": 1.0, "q": 1.0})
        list(shmreplay_tf.make_dataset(name, "p", 2, max_batches=8))
        assert trips == [8]  # 2 items of 32 bytes and their info: 8 fit 512 KiB
        trips.clear()
        fifo = list(shmreplay_tf.make_dataset(name, "q", 2, max_batches=5))
        assert trips == []  # one batch per trip: the order, and no batch taken ahead
        assert [check_items(b, 2).tolist() for b in fifo] == [[0, 1], [2, 3], [4, 5],
                                                              [6, 7], [8, 9]]
        # batches of 512 KiB or more: one per trip
        assert _tf_packing.default_batches_per_call(_tf_packing.BLOCK_BYTES, False) == 1
        assert _tf_packing.default_batches_per_call(_tf_packing.BLOCK_BYTES // 3, False) == 3


def test_a_timeout_hands_out_the_batches_taken_then_ends_in_order(trips):
    with serve(shmreplay.Table.queue("q", 100)) as (name, client):
        for i in range(10):
            client.insert(item(i), {"q": 1.0})
        dataset = shmreplay_tf.make_dataset(name, "q", 2, batches_per_call=4,
                                            rate_limiter_timeout_ms=200)
        got = [check_items(batch, 2).tolist() for batch in dataset]
    assert got == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert trips == [4, 1, 0]  # a partial trip, then an empty one ends the dataset


def test_in_a_tf_function_the_rows_arrive_as_batches():
    with serve(prioritized()) as (name, client):
        for i in range(20):
            client.insert(item(i), {"p": 1.0})
        iterator = iter(shmreplay_tf.make_dataset(name, "p", 5, batches_per_call=3))

        @tf.function
        def step(it):
            sample = next(it)
            return sample.data["step"], sample.data["obs"]

        for _ in range(7):
            steps, obs = step(iterator)
            assert steps.shape == (5,)
            np.testing.assert_array_equal(obs.numpy()[:, 0], steps.numpy())
        del iterator


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_a_bad_batches_per_call_is_refused(value):
    with serve(prioritized()) as (name, client):
        client.insert(item(0), {"p": 1.0})
        with pytest.raises(ValueError, match="batches_per_call must be None or an integer"):
            shmreplay_tf.make_dataset(name, "p", 2, batches_per_call=value)


def test_items_of_any_length_refuse_several_batches_per_call():
    signature = {"x": tf.TensorSpec([None], tf.float32)}
    table = shmreplay.Table("v", selectors.Uniform(), selectors.Fifo(), 10,
                            rate_limiters.MinSize(1), signature=signature)
    with serve(table) as (name, client):
        with pytest.raises(ValueError, match="batches_per_call=2 needs items of fixed shapes.*'v'"):
            shmreplay_tf.make_dataset(name, "v", 2, batches_per_call=2)
        # and the default, one per trip, works
        client.insert({"x": np.ones(3, np.float32)}, {"v": 1.0})
        sample, lengths = next(iter(shmreplay_tf.make_dataset(name, "v", 2)))
        assert lengths["x"].numpy().tolist() == [3, 3]


def test_parallel_calls_split_max_batches_exactly(trips):
    with serve(prioritized()) as (name, client):
        keys = {int(client.insert(item(i), {"p": 1.0})["p"]): i for i in range(30)}
        dataset = shmreplay_tf.make_dataset(name, "p", 3, max_batches=7, batches_per_call=3,
                                            num_parallel_calls=2)
        batches = list(dataset)
    assert sorted(trips) == [1, 3, 3] and len(batches) == 7
    for batch in batches:
        steps = check_items(batch, 3)
        assert [keys[int(key)] for key in batch.info.key.numpy()] == steps.tolist()


def test_fixed_sequences_from_items_of_any_length_travel_in_rows(trips):
    signature = {"obs": tf.TensorSpec([None, 3], tf.float32),
                 "step": tf.TensorSpec([None], tf.int64), "flag": tf.TensorSpec([None], tf.bool)}
    table = shmreplay.Table("v", selectors.Uniform(), selectors.Fifo(), 20,
                            rate_limiters.MinSize(1), signature=signature)
    with serve(table) as (name, client):
        for i in range(6):
            steps = np.arange(i, i + 4)
            client.insert({"obs": np.repeat(steps[:, None], 3, 1).astype(np.float32),
                           "step": steps, "flag": steps % 2 == 1}, {"v": 1.0})
        dataset = shmreplay_tf.make_dataset(name, "v", 2, sequence_length=4, max_batches=3,
                                            batches_per_call=2)
        assert dataset.element_spec.data["obs"].shape == (2, 4, 3)
        batches = list(dataset)
    assert trips == [2, 1] and len(batches) == 3
    for batch in batches:
        obs, steps = batch.data["obs"].numpy(), batch.data["step"].numpy()
        np.testing.assert_array_equal(obs, np.repeat(steps[..., None], 3, 2))
        np.testing.assert_array_equal(batch.data["flag"].numpy(), steps % 2 == 1)
        np.testing.assert_array_equal(steps - steps[:, :1], np.tile(np.arange(4), (2, 1)))

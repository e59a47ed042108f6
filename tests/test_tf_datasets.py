"""``shmreplay.tf``: Reverb's dataset semantics (reference §1.12), the batched fast path,
and the tf_agents-style buffer. TensorFlow is imported only in this file."""

import time

import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay import _tf_common, tf as shmreplay_tf
from shmreplay.specs import TensorSpec
import _names
from _serving import serve
import _waiting

ITEM = {"x": np.float32, "v": np.int64}
ITEM_SHAPES = {"x": (), "v": (3,)}


def fill(client, table, values):
    for value in values:
        client.insert({"x": np.float32(value), "v": np.arange(3) + value}, {table: 1.0},
                      timeout=1)


def uniform(name="u", max_size=100, min_size=1):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(min_size))


def prioritized(name="p", max_size=50):
    return shmreplay.Table(name, selectors.Prioritized(1.0), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1))


def trajectory_dataset(name, table, **kwargs):
    kwargs.setdefault("max_in_flight_samples_per_worker", 2)
    return shmreplay_tf.TrajectoryDataset(name, table, ITEM, ITEM_SHAPES, **kwargs)


# --- TrajectoryDataset ------------------------------------------------------------------

def test_elements_are_replay_samples_with_reverbs_info_dtypes():
    with serve(uniform()) as (name, client):
        fill(client, "u", range(5))
        sample = next(iter(trajectory_dataset(name, "u")))
        assert isinstance(sample, shmreplay.ReplaySample)
        assert [f.dtype for f in sample.info] == [tf.uint64, tf.float64, tf.int64, tf.float64,
                                                  tf.int32]
        assert sample.data["v"].shape == (3,) and sample.data["v"].dtype == tf.int64
        x = float(sample.data["x"])
        assert sample.data["v"].numpy().tolist() == [x, x + 1, x + 2]
        assert int(sample.info.table_size) == 5 and float(sample.info.probability) == 0.2


def test_max_samples_ends_the_dataset_without_over_consuming():
    # Reverb's test_max_samples: a queue of 10, max_samples=4 leaves 6 items.
    with serve(shmreplay.Table.queue("q", 10)) as (name, client):
        fill(client, "q", range(10))
        got = list(trajectory_dataset(name, "q", max_samples=4,
                                      max_in_flight_samples_per_worker=3).as_numpy_iterator())
        assert [float(s.data["x"]) for s in got] == [0, 1, 2, 3]
        assert client.server_info()["q"].current_size == 6


def test_reading_takes_no_more_than_max_in_flight_items_ahead():
    with serve(shmreplay.Table.queue("q", 20)) as (name, client):
        fill(client, "q", range(20))
        iterator = iter(trajectory_dataset(name, "q", max_in_flight_samples_per_worker=3))
        assert float(next(iterator).data["x"]) == 0
        taken = _waiting.settled(
            lambda: 20 - client.server_info()["q"].current_size, 3, overrun=0.3)
        assert taken == 3  # max_in_flight_samples_per_worker: nothing more runs ahead
        for expected in (1, 2, 3):
            assert float(next(iterator).data["x"]) == expected
        assert client.server_info()["q"].current_size == 14


def test_fifo_order_is_kept_with_one_worker_and_batching():
    with serve(shmreplay.Table.queue("q", 20)) as (name, client):
        fill(client, "q", range(12))
        dataset = trajectory_dataset(name, "q", rate_limiter_timeout_ms=100).batch(4)
        assert [b.data["x"].tolist() for b in dataset.as_numpy_iterator()] == [
            [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize("timeout_ms", [0, 1000])
def test_rate_limiter_timeout_ends_iteration(timeout_ms):
    with serve(uniform(min_size=5)) as (name, client):
        fill(client, "u", range(2))  # below min_size: nothing can be sampled
        start = time.monotonic()
        assert list(trajectory_dataset(name, "u", rate_limiter_timeout_ms=timeout_ms)) == []
        assert timeout_ms / 1000 <= time.monotonic() - start < timeout_ms / 1000 + 2


def test_zero_timeout_still_yields_what_is_there():
    with serve(uniform()) as (name, client):
        fill(client, "u", range(3))
        got = list(trajectory_dataset(name, "u", rate_limiter_timeout_ms=0).take(5))
        assert len(got) == 5


def test_parallel_workers_share_max_samples_exactly():
    with serve(shmreplay.Table.queue("q", 20)) as (name, client):
        fill(client, "q", range(20))
        dataset = trajectory_dataset(name, "q", num_workers_per_iterator=3, max_samples=7,
                                     max_in_flight_samples_per_worker=2)
        got = sorted(float(s.data["x"]) for s in dataset.as_numpy_iterator())
        assert got == list(range(7))
        assert client.server_info()["q"].current_size == 13


@pytest.mark.parametrize("bad", [
    dict(max_in_flight_samples_per_worker=0), dict(num_workers_per_iterator=0),
    dict(num_workers_per_iterator=-2), dict(max_samples_per_stream=0),
    dict(rate_limiter_timeout_ms=-2), dict(max_samples=0), dict(max_samples=-2)])
def test_options_are_validated(bad):
    with serve(uniform()) as (name, client):
        with pytest.raises(ValueError):
            trajectory_dataset(name, "u", **bad)


def test_dtypes_and_shapes_must_have_the_same_structure():
    with serve(uniform()) as (name, client):
        with pytest.raises(ValueError):
            shmreplay_tf.TrajectoryDataset(name, "u", {"x": np.float32}, {"y": ()}, 2)


def test_from_table_signature():
    signature = {"x": TensorSpec((), np.float32), "v": TensorSpec((3,), np.int64)}
    signed = shmreplay.Table("s", selectors.Fifo(), selectors.Fifo(), 10,
                             rate_limiters.MinSize(1), signature=signature)
    with serve(signed, uniform("b"), uniform("a")) as (name, client):
        fill(client, "s", [7])
        sample = next(iter(shmreplay_tf.TrajectoryDataset.from_table_signature(name, "s", 2)))
        assert float(sample.data["x"]) == 7
        with pytest.raises(ValueError, match="does not contain any table named nope. "
                                             "Found: a, b, s."):
            shmreplay_tf.TrajectoryDataset.from_table_signature(name, "nope", 2)
        with pytest.raises(ValueError, match="does not have a signature"):
            shmreplay_tf.TrajectoryDataset.from_table_signature(name, "a", 2)
        fill(client, "a", [1])  # the first item fixes the shapes: now they are known
        assert shmreplay_tf.TrajectoryDataset.from_table_signature(name, "a", 2).element_spec \
            .data["v"].shape == (3,)


def test_sequence_items_and_squeezed_columns():
    with serve(uniform("t")) as (name, client):
        with client.trajectory_writer(3) as writer:
            for t in range(5):
                writer.append({"o": np.full(2, t, np.float32), "r": np.float32(t)})
                if t >= 2:
                    writer.create_item("t", 1.0, {"o": writer.history["o"][-3:],
                                                  "r": writer.history["r"][-1]})
        dataset = shmreplay_tf.TrajectoryDataset(
            name, "t", {"o": np.float32, "r": np.float32}, {"o": (3, 2), "r": ()}, 4)
        for sample in dataset.take(8).as_numpy_iterator():
            last = sample.data["r"]
            assert sample.data["o"][:, 0].tolist() == [last - 2, last - 1, last]


# --- TimestepDataset and the legacy ReplayDataset ----------------------------------------

def test_timestep_dataset_cuts_items_into_timesteps_in_order():
    with serve(shmreplay.Table.queue("q", 10)) as (name, client):
        with client.writer(3) as writer:
            for t in range(6):
                writer.append({"o": np.float32(t)})
                if t % 3 == 2:
                    writer.create_item("q", 3, 1.0)  # items [0, 1, 2] and [3, 4, 5]
        dataset = shmreplay_tf.TimestepDataset(name, "q", {"o": np.float32}, {"o": ()}, 2,
                                               rate_limiter_timeout_ms=100)
        got = list(dataset.as_numpy_iterator())
        assert [float(s.data["o"]) for s in got] == [0, 1, 2, 3, 4, 5]
        keys = [int(s.info.key) for s in got]
        assert keys[0] == keys[1] == keys[2] != keys[3] == keys[4] == keys[5]


def test_timestep_dataset_of_whole_items_is_one_timestep_per_item():
    with serve(shmreplay.Table.queue("q", 10)) as (name, client):
        fill(client, "q", range(3))
        dataset = shmreplay_tf.TimestepDataset(name, "q", ITEM, ITEM_SHAPES, 2,
                                               rate_limiter_timeout_ms=100)
        assert [float(s.data["x"]) for s in dataset.as_numpy_iterator()] == [0, 1, 2]


def test_legacy_replay_dataset_as_in_reverbs_tutorial():
    with serve(shmreplay.Table.queue("q", 10)) as (name, client):
        with client.writer(2) as writer:
            for t in range(4):
                writer.append({"o": np.float32(t)})
                if t % 2 == 1:
                    writer.create_item("q", 2, 1.0)
        # One item in flight: take(1) consumes exactly one item of the queue (a worker
        # takes max_in_flight_samples_per_worker items at a time, as Reverb's do).
        per_item = shmreplay_tf.ReplayDataset(name, "q", {"o": tf.float32}, {"o": []}, 1,
                                              sequence_length=2, emit_timesteps=False,
                                              rate_limiter_timeout_ms=100)
        assert [s.data["o"].tolist() for s in per_item.take(1).as_numpy_iterator()] == [[0, 1]]
        per_step = shmreplay_tf.ReplayDataset(name, "q", {"o": tf.float32}, {"o": []}, 2,
                                              rate_limiter_timeout_ms=100)
        assert [float(s.data["o"]) for s in per_step.as_numpy_iterator()] == [2, 3]
        with pytest.raises(ValueError, match="sequence_length"):
            shmreplay_tf.ReplayDataset(name, "q", {"o": tf.float32}, {"o": []}, 2,
                                       emit_timesteps=False)


# --- make_dataset: whole batches ------------------------------------------------------------

def test_make_dataset_yields_full_batches_in_fifo_order():
    with serve(shmreplay.Table.queue("q", 20)) as (name, client):
        fill(client, "q", range(10))
        dataset = shmreplay_tf.make_dataset(name, "q", batch_size=4, prefetch_size=0,
                                            rate_limiter_timeout_ms=100)
        assert dataset.element_spec.data["v"].shape == (4, 3)
        got = [b.data["x"].tolist() for b in dataset.as_numpy_iterator()]
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the last 2 items never fill a batch
        assert client.server_info()["q"].current_size == 0


def test_datasets_accept_a_client_and_attach_like_it(monkeypatch):
    # A group member reads a shared buffer through a Client(name, trust_group=True); the
    # datasets' workers must attach the same way, not by name alone.
    with serve(shmreplay.Table.queue("q", 20)) as (name, client):
        fill(client, "q", range(4))
        attached = []
        real = _tf_common.Client

        def recording_client(address, trust_group=False):
            attached.append((address, trust_group))
            return real(address, trust_group=trust_group)

        monkeypatch.setattr(_tf_common, "Client", recording_client)
        trusted = real(name, trust_group=True)
        dataset = shmreplay_tf.make_dataset(trusted, "q", batch_size=2, prefetch_size=0,
                                            rate_limiter_timeout_ms=100)
        got = [b.data["x"].tolist() for b in dataset.as_numpy_iterator()]
        assert got == [[0, 1], [2, 3]]
        assert attached and all(a == (name, True) for a in attached)
        trusted.close()


def test_make_dataset_parallel_workers_and_max_batches():
    with serve(uniform()) as (name, client):
        fill(client, "u", range(10))
        dataset = shmreplay_tf.make_dataset(name, "u", batch_size=8, num_parallel_calls=2,
                                            max_batches=5)
        batches = list(dataset.as_numpy_iterator())
        assert len(batches) == 5
        assert all(b.info.key.shape == (8,) and b.info.key.dtype == np.uint64 for b in batches)
        # Parallel calls and prefetch take no batch beyond max_batches.
        assert client.server_info()["u"].num_sampled == 5 * 8


@pytest.mark.parametrize("rows, width", [(96, 1024), (8, 16)])
def test_make_dataset_batches_kept_by_the_learner_stay_intact(rows, width):
    """Batches reach TensorFlow in reused memory (large ones from ``_outputs``, small
    ones as reused results from ``_batch_outputs``): a batch the learner still holds
    must not be reused for a later one. 96 x 4 KiB of obs is above the pooling size;
    8 x 64 bytes is a small batch."""
    with serve(uniform(max_size=4 * rows)) as (name, client):
        ids = np.arange(4 * rows)
        client.insert_batch({"id": ids, "obs": np.repeat(ids[:, None], width, 1).astype(np.int32)},
                            {"u": 1.0}, timeout=5)
        dataset = shmreplay_tf.make_dataset(name, "u", batch_size=rows, num_parallel_calls=2,
                                            max_batches=30)
        kept = []
        for batch in dataset:
            kept = (kept + [batch])[-4:]
            for old in kept:
                np.testing.assert_array_equal(old.data["obs"].numpy(),
                                              np.repeat(old.data["id"].numpy()[:, None], width, 1))


def test_make_dataset_acme_style_options():
    with serve(uniform("t")) as (name, client):
        with client.writer(3) as writer:
            for t in range(5):
                writer.append({"o": np.float32(t)})
                if t >= 2:
                    writer.create_item("t", 3, 1.0)
        batch = next(iter(shmreplay_tf.make_dataset(name, "t", 2, sequence_length=3)))
        assert batch.data["o"].shape == (2, 3)
        # The table holds items of any length (no signature, a writer's items): each
        # batch is checked against sequence_length.
        with pytest.raises(tf.errors.InvalidArgumentError, match="sequence_length=4"):
            next(iter(shmreplay_tf.make_dataset(name, "t", 2, sequence_length=4)))
        item = next(iter(shmreplay_tf.make_dataset(name, "t", None, prefetch_size=0)))
        assert item.data["o"].shape == (3,)
        with pytest.raises(ValueError):
            shmreplay_tf.make_dataset(name, "t", 0)


# --- the tf_agents-style buffer --------------------------------------------------------------

def test_tf_agents_style_replay_buffer():
    with serve(prioritized()) as (name, client):
        fill(client, "p", range(10))
        buffer = shmreplay_tf.ReplayBuffer(name, "p")
        try:
            assert buffer.capacity == 50 and buffer.num_frames() == 10
            assert buffer.get_table_info().current_size == 10
            data, info = next(iter(buffer.as_dataset(sample_batch_size=4)))
            assert data["v"].shape == (4, 3) and info.key.shape == (4,)
            with pytest.raises(ValueError, match="num_steps"):
                buffer.as_dataset(sample_batch_size=4, num_steps=2)
            assert buffer.update_priorities(info.key, tf.constant([5.0] * 4)) == 4
            later = client.sample_batch("p", 200, timeout=1)
            updated = set(info.key.numpy().tolist())
            assert {float(p) for k, p in zip(later.info.key, later.info.priority)
                    if int(k) in updated} == {5.0}
            buffer.clear()
            assert buffer.num_frames() == 0
        finally:
            buffer.close()


def test_tf_agents_style_single_deterministic_pass():
    with serve(shmreplay.Table.queue("q", 10)) as (name, client):
        fill(client, "q", range(6))
        buffer = shmreplay_tf.ReplayBuffer(name, "q")
        try:
            got = [d["x"].tolist() for d, _ in
                   buffer.as_dataset(sample_batch_size=3, single_deterministic_pass=True)
                   .as_numpy_iterator()]
            assert got == [[0, 1, 2], [3, 4, 5]]
        finally:
            buffer.close()


# --- found by a review against Reverb and tf_agents ----------------------------------------

def test_a_wrong_dtype_or_shape_is_an_error_not_a_silent_cast():
    # tf.data's from_generator would cast float32 2.75 to int32 2 without a word.
    with serve(uniform()) as (name, client):
        fill(client, "u", [2.75])
        for dataset in (
                shmreplay_tf.TrajectoryDataset(name, "u", {"x": tf.int32, "v": tf.int64},
                                               ITEM_SHAPES, 2),
                shmreplay_tf.TimestepDataset(name, "u", {"x": tf.float32, "v": tf.int32},
                                             ITEM_SHAPES, 2),
                shmreplay_tf.TrajectoryDataset(name, "u", ITEM, {"x": (), "v": (4,)}, 2)):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="incompatible tensor at flattened index"):
                next(iter(dataset))


@pytest.mark.parametrize("workers, in_flight", [(1, 1), (2, 1), (2, 3)])
def test_parallel_workers_take_no_more_than_max_in_flight_each(workers, in_flight):
    # tf.data's interleave and its injected prefetch once took ~3.5x the bound.
    with serve(shmreplay.Table.queue("q", 100)) as (name, client):
        fill(client, "q", range(100))
        iterator = iter(trajectory_dataset(name, "q", num_workers_per_iterator=workers,
                                           max_in_flight_samples_per_worker=in_flight))
        read = sorted(float(next(iterator).data["x"]) for _ in range(5))
        time.sleep(0.5)  # let anything that runs ahead run
        taken = 100 - client.server_info()["q"].current_size
        assert 0 <= taken - 5 <= workers * in_flight, (taken, read)
        assert len(set(read)) == 5


@pytest.mark.parametrize("prefetch, calls, batches_taken", [(0, 1, 1), (1, 1, 2), (2, 2, 5)])
def test_make_dataset_takes_prefetch_plus_parallel_calls_batches_ahead(prefetch, calls,
                                                                       batches_taken):
    with serve(shmreplay.Table.queue("q", 100)) as (name, client):
        fill(client, "q", range(100))
        iterator = iter(shmreplay_tf.make_dataset(name, "q", batch_size=2,
                                                  prefetch_size=prefetch,
                                                  num_parallel_calls=calls))
        next(iterator)
        taken = _waiting.settled(
            lambda: 100 - client.server_info()["q"].current_size, 2 * batches_taken)
        assert taken == 2 * batches_taken


def test_insert_items_get_a_time_dimension_of_one_when_asked():
    # Reverb samples an item from insert as [1, ...], as Client.sample does here.
    with serve(uniform()) as (name, client):
        fill(client, "u", [1])
        dataset = shmreplay_tf.ReplayDataset(name, "u", ITEM, ITEM_SHAPES, 2,
                                             sequence_length=1, emit_timesteps=False)
        sample = next(iter(dataset))
        assert sample.data["v"].shape == (1, 3) and sample.data["x"].numpy().tolist() == [1.0]


def test_address_and_table_may_be_string_tensors():
    with serve(uniform()) as (name, client):
        fill(client, "u", [3])
        dataset = shmreplay_tf.TrajectoryDataset(tf.constant(name), tf.constant("u"), ITEM,
                                                 ITEM_SHAPES, 2)
        assert float(next(iter(dataset)).data["x"]) == 3.0
        spec = shmreplay_tf.TrajectoryDataset.from_table_signature(
            tf.constant(name), tf.constant("u"), 2).element_spec
        assert spec.data["v"].shape == (3,)


def test_from_table_signature_waits_for_the_buffer_up_to_its_timeout():
    name = _names.unique()
    with pytest.raises(shmreplay.errors.BufferNotFoundError):
        shmreplay_tf.TrajectoryDataset.from_table_signature(name, "u", 2)
    started = time.monotonic()
    with pytest.raises(shmreplay.errors.DeadlineExceededError, match="appeared within"):
        shmreplay_tf.TrajectoryDataset.from_table_signature(name, "u", 2,
                                                            get_signature_timeout_secs=0.3)
    assert 0.3 <= time.monotonic() - started < 5


def test_tf_agents_style_buffer_in_a_tf_function_and_single_pass_rules():
    with serve(prioritized()) as (name, client):
        fill(client, "p", range(4))
        buffer = shmreplay_tf.ReplayBuffer(name, "p")
        try:
            keys = np.unique(client.sample_batch("p", 200, timeout=1).info.key)
            assert len(keys) == 4  # (each is missed with probability 0.75 ** 200)

            @tf.function
            def update(k, p):
                return buffer.update_priorities(k, p)

            assert int(update(tf.constant(keys), tf.constant([7.0] * 4, tf.float64))) == 4
            later = client.sample_batch("p", 100, timeout=1)
            assert {float(p) for p in later.info.priority} == {7.0}
            # tf_agents refuses a "single deterministic pass" over a random sampler.
            with pytest.raises(ValueError, match="deterministic"):
                buffer.as_dataset(sample_batch_size=2, single_deterministic_pass=True)
        finally:
            buffer.close()


def test_datasets_are_reachable_from_the_top_level_as_in_reverb():
    assert shmreplay.TrajectoryDataset is shmreplay_tf.TrajectoryDataset
    assert shmreplay.TimestepDataset is shmreplay_tf.TimestepDataset


_Pair = __import__("collections").namedtuple("_Pair", ["parts", "label"])


def test_lists_in_items_become_tuples_in_every_dataset():
    # tf.data takes a list for one tensor: lists become tuples, also inside namedtuples.
    with serve(shmreplay.Table.queue("nt", 10), shmreplay.Table.queue("l", 10)) as (name, client):
        for i in range(2):
            client.insert(_Pair([np.float32(i), np.float32(10 + i)], np.int32(i)), {"nt": 1.0})
            client.insert({"l": [np.float32(i), np.int32(i)]}, {"l": 1.0})
        batch = next(iter(shmreplay_tf.make_dataset(name, "nt", batch_size=1, max_batches=1)))
        assert isinstance(batch.data, _Pair) and isinstance(batch.data.parts, tuple)
        assert [t.numpy().tolist() for t in batch.data.parts] == [[0.0], [10.0]]
        ds = shmreplay_tf.TrajectoryDataset.from_table_signature(name, "l", 1)
        first = next(iter(ds)).data["l"]
        assert isinstance(first, tuple) and [float(first[0]), int(first[1])] == [0.0, 0]
        ds = shmreplay_tf.TimestepDataset.from_table_signature(name, "nt", 1)
        assert [float(t) for t in next(iter(ds)).data.parts] == [1.0, 11.0]


def test_items_with_a_none_value_are_refused_with_a_clear_error():
    # (Only a signature can give items a None: insert refuses one in a first item.)
    table = shmreplay.Table.queue("q", 10, signature={"a": None,
                                                      "b": TensorSpec((), np.float32)})
    with serve(table) as (name, client):
        client.insert({"a": None, "b": np.float32(1)}, {"q": 1.0})
        for make in (lambda: shmreplay_tf.make_dataset(name, "q", batch_size=1),
                     lambda: shmreplay_tf.TrajectoryDataset.from_table_signature(name, "q", 1)):
            with pytest.raises(ValueError, match="None value"):
                make()
        assert client.server_info()["q"].current_size == 1


def test_timestep_dataset_from_table_signature_cuts_sequence_items_into_timesteps():
    with serve(shmreplay.Table.queue("q", 10)) as (name, client):
        with client.writer(3) as writer:
            for t in range(3):
                writer.append({"x": np.int64(t)})
            writer.create_item("q", 3, 1.0)
        ds = shmreplay_tf.TimestepDataset.from_table_signature(name, "q", 1, max_samples=1)
        assert ds.element_spec.data["x"].shape == ()
        assert [int(e.data["x"]) for e in ds] == [0, 1, 2]


def test_a_zero_size_column_is_refused_by_the_per_item_datasets_and_read_by_make_dataset():
    # tf.data's unbatch kills the process (SIGSEGV) on a zero-size component.
    with serve(shmreplay.Table.queue("q", 10)) as (name, client):
        for i in range(2):
            client.insert({"x": np.zeros(0, np.uint8), "y": np.float32(i)}, {"q": 1.0})
        for dataset in (shmreplay_tf.TrajectoryDataset, shmreplay_tf.TimestepDataset):
            with pytest.raises(ValueError, match="no elements"):
                dataset.from_table_signature(name, "q", 1)
        batch = next(iter(shmreplay_tf.make_dataset(name, "q", batch_size=2, max_batches=1)))
        assert batch.data["x"].shape == (2, 0) and batch.data["y"].numpy().tolist() == [0, 1]


def test_timestep_dataset_from_a_signature_is_the_same_before_and_after_items():
    # A signature is taken as it is (as Reverb does), whenever the dataset is made.
    table = shmreplay.Table.queue("q", 10, signature={"a": TensorSpec((3, 2), np.float32)})
    with serve(table) as (name, client):
        before = shmreplay_tf.TimestepDataset.from_table_signature(name, "q", 1).element_spec
        with client.trajectory_writer(3) as writer:
            for t in range(3):
                writer.append({"a": np.full(2, t, np.float32)})
            writer.create_item("q", 1.0, {"a": writer.history["a"][-3:]})
        after = shmreplay_tf.TimestepDataset.from_table_signature(name, "q", 1).element_spec
        assert before.data == after.data == {"a": tf.TensorSpec((3, 2), tf.float32)}

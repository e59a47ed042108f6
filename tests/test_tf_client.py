"""``shmreplay.tf.TFClient``: Reverb's TFClient ops (reference §1.13) in every way
TensorFlow runs them: eagerly, in ``tf.function``, in graph mode (a v1 Session) and in a
``tf.data`` ``map``. TensorFlow is imported only in this file (and its spawned child)."""

import concurrent.futures
import contextlib
import itertools
import multiprocessing

import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay import _tf_common, tf as shmreplay_tf
from shmreplay.specs import TensorSpec
import _mp_workers as W
import _names
import _tf_client_workers

MODES = ["eager", "function", "graph", "map"]
F64 = tf.float64


def table(name, signature=None):
    return shmreplay.Table(name, selectors.Prioritized(1.0), selectors.Fifo(), 100,
                           rate_limiters.MinSize(1), signature=signature)


@contextlib.contextmanager
def serve(*tables):
    tables = tables or (table("dist"), table("dist2"))
    with shmreplay.Server(list(tables), name=_names.unique("tfclient")) as server:
        with shmreplay.Client(server.name) as client:
            yield shmreplay_tf.TFClient(server.name), client


def run(mode, build):
    """Builds ``build()`` (TFClient calls returning a nest of tensors, an op or None)
    and runs it once in ``mode``; returns its value as numpy (None for an op)."""
    is_op = []

    def tensors():
        out = build()
        is_op.append(out is None or isinstance(out, tf.Operation))
        return tf.constant(0) if is_op[-1] else out

    if mode == "eager":
        out = build()
        return None if out is None else tf.nest.map_structure(lambda t: t.numpy(), out)
    if mode == "graph":
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            return session.run(build())
    if mode == "function":
        value = tf.nest.map_structure(lambda t: t.numpy(), tf.function(tensors)())
    else:
        # (a map's function cannot return lists, which tf.data takes for tensors)
        value = next(tf.data.Dataset.range(1).map(
            lambda _: _tf_common.as_tuples(tensors())).as_numpy_iterator())
    return None if is_op[-1] else value


def insert(client, data, tables=("dist",), priorities=(1.0,)):
    return client.insert(data, tf.constant(list(tables)), tf.constant(list(priorities), F64))


def state(client):
    """What a failed call must not change: each table's counters (items, inserts,
    samples, deletions)."""
    return {name: (info.current_size, info.num_inserted, info.num_sampled, info.num_deleted,
                   info.num_unique_samples)
            for name, info in client.server_info().items()}


def priorities_of(client, name):
    batch = client.sample_batch(name, 200, timeout=1)
    return dict(zip(batch.info.key.tolist(), batch.info.priority.tolist()))


# --- the methods, in every mode ------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_insert_then_sample_returns_the_data_and_reverbs_info(mode):
    with serve() as (tf_client, client):
        assert run(mode, lambda: insert(tf_client, [tf.constant([1, 2, 3], tf.int8),
                                                    tf.constant(2.5, F64)])) is None
        sample = run(mode, lambda: tf_client.sample("dist", [tf.int8, F64]))
        assert isinstance(sample, shmreplay.ReplaySample)
        np.testing.assert_array_equal(sample.data[0], np.array([1, 2, 3], np.int8))
        assert sample.data[0].dtype == np.int8 and float(sample.data[1]) == 2.5
        info = sample.info
        assert [np.asarray(f).dtype for f in info] == [np.uint64, np.float64, np.int64,
                                                       np.float64, np.int32]
        assert (int(info.table_size), float(info.probability), float(info.priority),
                int(info.times_sampled)) == (1, 1.0, 1.0, 1)
        assert int(info.key) == next(iter(priorities_of(client, "dist")))


@pytest.mark.parametrize("mode", MODES)
def test_insert_into_two_tables_makes_one_item_in_each_with_its_priority(mode):
    with serve() as (tf_client, client):
        run(mode, lambda: insert(tf_client, [tf.constant([7, 8], tf.int64)],
                                 ("dist", "dist2"), (1.0, 2.0)))
        assert list(priorities_of(client, "dist").values()) == [1.0]
        assert list(priorities_of(client, "dist2").values()) == [2.0]
        for name in ("dist", "dist2"):
            data = run(mode, lambda: tf_client.sample(name, [tf.int64])).data
            assert len(data) == 1 and data[0].tolist() == [7, 8]


@pytest.mark.parametrize("mode", MODES)
def test_insert_converts_python_values_as_tensorflow_does(mode):
    with serve() as (tf_client, client):
        run(mode, lambda: insert(tf_client, [1.5, [1, 2]]))  # float32 and int32, as tensors
        data = run(mode, lambda: tf_client.sample("dist", [tf.float32, tf.int32])).data
        assert float(data[0]) == 1.5 and data[1].tolist() == [1, 2]


def test_insert_into_no_table_inserts_nothing():
    with serve() as (tf_client, client):
        tf_client.insert([tf.constant(1.0)], tf.constant([], tf.string),
                         tf.constant([], tf.float64))
        assert {info.current_size for info in client.server_info().values()} == {0}


def test_a_table_named_twice_gets_two_items():
    with serve() as (tf_client, client):
        insert(tf_client, [tf.constant(1.0)], ("dist", "dist", "dist2"), (1.0, 3.0, 2.0))
        assert sorted(priorities_of(client, "dist").values()) == [1.0, 3.0]
        assert list(priorities_of(client, "dist2").values()) == [2.0]


@pytest.mark.parametrize("mode", MODES)
def test_sample_nests_the_data_as_data_dtypes(mode):
    with serve() as (tf_client, client):
        client.insert({"a": np.float32(1.5), "b": (np.arange(2), np.int32(4))}, {"dist": 1.0})
        dtypes = {"a": tf.float32, "b": (tf.int64, tf.int32)}
        data = run(mode, lambda: tf_client.sample(tf.constant("dist"), dtypes)).data
        assert set(data) == {"a", "b"} and isinstance(data["b"], tuple)
        assert (float(data["a"]), data["b"][0].tolist(), int(data["b"][1])) == (1.5, [0, 1], 4)


def test_sample_returns_the_first_timestep_of_a_sequence_item():
    # Reverb's op reads one timestep of one item (GetNextTimestep, max_samples=1).
    with serve() as (tf_client, client):
        with client.writer(3) as writer:
            for step in range(3):
                writer.append([np.float32(step), np.full(2, step, np.int64)])
            writer.create_item("dist", 3, 1.0)
        data = tf_client.sample("dist", [tf.float32, tf.int64]).data
        assert float(data[0]) == 0.0 and data[1].numpy().tolist() == [0, 0]


def test_sample_waits_for_the_rate_limiter_like_reverbs_op():
    with serve() as (tf_client, client):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(tf_client.sample, "dist", [F64])
            with pytest.raises(concurrent.futures.TimeoutError):
                future.result(timeout=0.2)
            client.insert([np.zeros(2)], {"dist": 1.0})
            assert future.result(timeout=10).data[0].numpy().tolist() == [0.0, 0.0]


@pytest.mark.parametrize("mode", MODES)
def test_update_priorities_sets_known_keys_and_ignores_unknown_ones(mode):
    with serve() as (tf_client, client):
        for value in range(3):
            client.insert([np.float64(value)], {"dist": 1.0})
        keys = sorted(priorities_of(client, "dist"))
        result = run(mode, lambda: tf_client.update_priorities(
            "dist", tf.constant([keys[1], 999_999], tf.uint64), tf.constant([3.0, 5.0], F64)))
        assert result is None
        assert priorities_of(client, "dist") == {keys[0]: 1.0, keys[1]: 3.0, keys[2]: 1.0}


# --- bad input: Reverb's graph-construction errors; TensorFlow's runtime errors -------------

def test_insert_checks_its_arguments_when_the_op_is_built():
    with serve() as (tf_client, _):
        data, one = [tf.constant([1, 2, 3], tf.int8)], tf.constant([1.0], F64)
        for tables, priorities in [(tf.constant([["dist"]]), one), (tf.constant("dist"), one),
                                   (tf.constant([1]), one),
                                   (tf.constant(["dist"]), tf.constant([[1.0]], F64)),
                                   (tf.constant(["dist"]), tf.constant(1.0, F64)),
                                   (tf.constant(["dist"]), tf.constant([1.0], tf.float32)),
                                   (tf.constant(["dist", "dist2"]), one)]:
            with pytest.raises(ValueError):
                tf_client.insert(data, tables, priorities)


_AS_REVERBS_SAMPLE = "as Reverb's sample op"  # see test_sample_dtype_mismatch_...


def _bad_calls():
    """(what, call(tf_client, key) building the op, the TensorFlow error, message part)."""
    vec = lambda *values: tf.constant(values, F64)  # noqa: E731
    return [
        ("insert, unknown second table", lambda c, k: insert(
            c, [tf.constant([1.0, 2.0], F64)], ("dist", "nope"), (1.0, 1.0)),
         tf.errors.NotFoundError, "'nope' was not found"),
        ("insert, wrong shape", lambda c, k: insert(c, [tf.constant([1.0, 2.0, 3.0], F64)]),
         tf.errors.InvalidArgumentError, "dist"),
        ("insert, wrong dtype", lambda c, k: insert(c, [tf.constant([1, 2], tf.int32)]),
         tf.errors.InvalidArgumentError, "dist"),
        ("insert, negative priority", lambda c, k: insert(
            c, [tf.constant([1.0, 2.0], F64)], ("dist", "dist2"), (1.0, -1.0)),
         tf.errors.InvalidArgumentError, "priorit"),
        ("sample, unknown table", lambda c, k: c.sample("nope", [F64]),
         tf.errors.NotFoundError, "'nope' was not found"),
        ("sample, wrong dtype", lambda c, k: c.sample("dist", [tf.float32]),
         _AS_REVERBS_SAMPLE, "float64, data_dtypes asks for float32"),
        ("sample, wrong count", lambda c, k: c.sample("dist", [F64, F64]),
         tf.errors.InvalidArgumentError, "1 tensors, data_dtypes asks for 2"),
        ("update, unknown table", lambda c, k: c.update_priorities(
            "nope", tf.constant([k], tf.uint64), vec(2.0)),
         tf.errors.NotFoundError, "'nope' was not found"),
        ("update, negative priority", lambda c, k: c.update_priorities(
            "dist", tf.constant([k, k], tf.uint64), vec(2.0, -1.0)),
         tf.errors.InvalidArgumentError, "priorit"),
        ("update, keys of rank 2", lambda c, k: c.update_priorities(
            "dist", tf.constant([[k]], tf.uint64), tf.constant([[2.0]], F64)),
         tf.errors.InvalidArgumentError, "rank 1"),
        ("update, shapes differ", lambda c, k: c.update_priorities(
            "dist", tf.constant([k, k], tf.uint64), vec(2.0)),
         tf.errors.InvalidArgumentError, "do not match in shape"),
    ]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", _bad_calls(), ids=lambda case: case[0])
def test_bad_calls_raise_tensorflows_error_and_change_nothing(mode, case):
    _, call, error, message = case
    if error is _AS_REVERBS_SAMPLE and mode != "eager":
        error, message = tf.errors.InternalError, "does not match declared output type int32"
    elif error is _AS_REVERBS_SAMPLE:
        error = tf.errors.InvalidArgumentError
    signature = [TensorSpec((2,), np.float64)]
    with serve(table("dist", signature), table("dist2", signature)) as (tf_client, client):
        client.insert([np.array([1.0, 2.0])], {"dist": 1.0})
        key = next(iter(client._engine("dist").sample(1, 1).info.key.tolist()))
        before = state(client)
        with pytest.raises(error, match=message):
            run(mode, lambda: call(tf_client, key))
        assert state(client) == before
        assert priorities_of(client, "dist") == {key: 1.0}


@pytest.mark.parametrize("mode", MODES)
def test_sample_dtype_mismatch_raises_what_reverbs_op_raises(mode, capfd):
    # Reverb 0.14's reverb_client_sample (measured): eagerly InvalidArgumentError ("Type
    # mismatch"); in a graph, TensorFlow's check of the op's output dtypes fails first:
    # InternalError, as its tf_client_test.py expects. A wrong count is
    # InvalidArgumentError everywhere. Unlike Reverb, nothing is sampled.
    with serve() as (tf_client, client):
        client.insert([np.zeros(3)], {"dist": 1.0})
        before = state(client)
        expected = tf.errors.InvalidArgumentError if mode == "eager" else tf.errors.InternalError
        with pytest.raises(expected) as raised:
            run(mode, lambda: tf_client.sample("dist", [tf.float32]))
        assert not isinstance(raised.value, tf.errors.InvalidArgumentError if mode != "eager"
                              else tf.errors.InternalError)
        assert "float64, data_dtypes asks for float32" in (
            str(raised.value) if mode == "eager" else capfd.readouterr().err)  # logged
        with pytest.raises(tf.errors.InvalidArgumentError, match="asks for 2"):
            run(mode, lambda: tf_client.sample("dist", [F64, F64]))
        assert state(client) == before


def test_seed_002s_calls_take_the_table_as_a_one_element_tensor():
    with serve() as (tf_client, client):
        step = [np.zeros(4), np.ones(1), np.ones(1), np.zeros(4), np.zeros(1)]
        tf_client.insert([tf.constant(x) for x in step], tables=tf.constant(["dist"]),
                         priorities=tf.constant([1.0], dtype=tf.float64))
        sample = tf_client.sample(tf.constant(["dist"]), data_dtypes=[F64] * 5)
        assert [t.shape.as_list() for t in sample.data] == [[4], [1], [1], [4], [1]]
        tf_client.update_priorities(tf.constant(["dist"]), keys=tf.reshape(sample.info.key, [1]),
                                    priorities=tf.constant([4.0], dtype=tf.float64))
        assert list(priorities_of(client, "dist").values()) == [4.0]
        with pytest.raises(tf.errors.InvalidArgumentError, match="exactly one string"):
            tf_client.sample(tf.constant(["dist", "dist2"]), [F64] * 5)


# --- the legacy dataset, seed 002's way ---------------------------------------------------

def test_dataset_is_reverbs_legacy_replay_dataset_as_seed_002_calls_it():
    with serve() as (tf_client, client):
        for value in range(4):
            client.insert([np.full(4, value, np.float64), np.ones(1), np.ones(1),
                           np.zeros(4), np.zeros(1)], {"dist": 1.0})
        dtypes = [F64] * 5
        dataset = tf_client.dataset(tf.constant(["dist"]), dtypes, [4, 1, 1, 4, 1])
        assert [spec.shape.as_list() for spec in dataset.element_spec.data] == [
            [4], [1], [1], [4], [1]]
        samples = list(itertools.islice(dataset, 8))
        assert len(samples) == 8
        assert all(s.data[0].numpy().tolist() == [float(s.data[0][0])] * 4 for s in samples)
        assert {float(s.data[0][0]) for s in samples} <= {0.0, 1.0, 2.0, 3.0}


def test_dataset_repeated_eagerly_is_the_same_dataset_and_each_iterator_samples_anew():
    with serve(shmreplay.Table.queue("q", 10)) as (tf_client, client):
        for value in range(4):
            client.insert([np.float64(value)], {"q": 1.0})
        first = tf_client.dataset("q", [F64], [[]], capacity=1)
        assert tf_client.dataset("q", [F64], [[]], capacity=1) is first
        assert tf_client.dataset("q", [F64], [[]], capacity=2) is not first
        # Two iterators of one dataset: each takes its own items from the queue.
        assert [float(s.data[0]) for s in itertools.islice(first, 2)] == [0.0, 1.0]
        assert [float(s.data[0]) for s in itertools.islice(first, 2)] == [2.0, 3.0]


def test_dataset_in_graph_mode_belongs_to_its_graph():
    with serve() as (tf_client, client):
        client.insert([np.arange(3.0)], {"dist": 1.0})
        for _ in range(2):  # a second graph gets its own dataset
            with tf.Graph().as_default(), tf.compat.v1.Session() as session:
                dataset = tf_client.dataset("dist", [F64], [3])
                element = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
                assert session.run(element).data[0].tolist() == [0.0, 1.0, 2.0]


# --- connecting ---------------------------------------------------------------------------

def test_tfclient_is_lazy_at_the_top_level_and_attaches_on_first_use():
    assert shmreplay.TFClient is shmreplay_tf.TFClient
    name = _names.unique("tfclient")
    early = shmreplay_tf.TFClient(name, shared_name="shared", name="learner")  # no buffer yet
    assert early.server_address == name
    with shmreplay.Server([table("dist")], name=name) as server:
        with shmreplay.Client(server.name) as client:
            insert(early, [tf.constant(1.0, F64)])
            assert client.server_info()["dist"].current_size == 1


def test_spawned_child_uses_tfclient_in_a_tf_data_pipeline():
    ctx = multiprocessing.get_context("spawn")
    with serve() as (_, client):
        queue = ctx.Queue()
        child = ctx.Process(target=_tf_client_workers.insert_and_sample_in_pipeline,
                            args=(client.server_address, "dist", 5, queue))
        with W.processes(child, join_timeout=30):
            inserted, sampled = W.get(queue, timeout=120, expect_tag="ok")
        assert inserted == 5 and len(sampled) == 5
        assert all(row[0] == row[1] and 100 <= row[0] < 105 for row in sampled)
        assert client.server_info()["dist"].current_size == 5

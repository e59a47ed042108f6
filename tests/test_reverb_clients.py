"""What Reverb's own clients pass to the Reverb API (Acme 0.4's adders and datasets,
TF-Agents 0.19's replay buffer and observers, Reverb's own dataset tests), accepted with
Reverb's meaning: the writer's keywords, empty sub-nests in a dataset's ``dtypes``,
addresses as ``tf.constant`` and graph mode, and interleaved datasets that drain a table.
"""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay import tf as shmreplay_tf
import _names

HERE = os.path.dirname(os.path.abspath(__file__))


def uniform(name="u", max_size=20, signature=None):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1), signature=signature)


@pytest.fixture
def served():
    servers = []

    def serve(*tables):
        server = shmreplay.Server(list(tables), name=_names.unique("rvclients"))
        servers.append(server)
        return server.name, shmreplay.Client(server.name)

    yield serve
    for server in servers:
        server.stop()


# --- keywords Acme and TF-Agents pass ---------------------------------------------------

def test_trajectory_writer_takes_acmes_get_signature_timeout_ms(served):
    # Acme's adders: client.trajectory_writer(num_keep_alive_refs=..,
    # get_signature_timeout_ms=300_000); TF-Agents' observers: validate_items=False.
    name, client = served(uniform())
    with client.trajectory_writer(num_keep_alive_refs=2,
                                  get_signature_timeout_ms=300_000) as writer:
        writer.append({"x": np.float32(1)})
        writer.create_item("u", 1.0, {"x": writer.history["x"][-1:]})
    with client.trajectory_writer(2, validate_items=False,
                                  get_signature_timeout_ms=None) as writer:
        writer.append({"x": np.float32(2)})
        writer.create_item("u", 1.0, {"x": writer.history["x"][-1:]})
    assert client.server_info()["u"].current_size == 2
    with pytest.raises(TypeError, match="get_signature_timeout_ms"):
        client.trajectory_writer(2, get_signature_timeout_ms="soon")


def test_get_signature_timeout_ms_bounds_a_lazy_clients_wait_for_its_buffer():
    # Reverb's writer fetched the signatures within get_signature_timeout_ms; a lazy
    # Client's writer waits that long for the buffer, then says so.
    client = shmreplay.Client(_names.unique("rvmissing"))
    try:
        started = time.monotonic()
        with pytest.raises(shmreplay.DeadlineExceededError):
            client.trajectory_writer(1, get_signature_timeout_ms=200)
        assert 0.15 <= time.monotonic() - started < 5
    finally:
        client.close()


def test_datasets_take_max_samples_per_stream(served):
    # TF-Agents' make_reverb_dataset passes max_samples_per_stream=-1; any value >= 1
    # is accepted too (no streams here), anything else refused as in Reverb.
    name, client = served(uniform())
    client.insert(np.float32(3), {"u": 1.0})
    for per_stream in (-1, 1, 100):
        dataset = shmreplay_tf.TrajectoryDataset(
            name, "u", tf.float32, (), max_in_flight_samples_per_worker=1,
            max_samples_per_stream=per_stream, max_samples=1)
        assert [float(s.data) for s in dataset] == [3.0]
    with pytest.raises(ValueError, match="max_samples_per_stream"):
        shmreplay_tf.TrajectoryDataset(name, "u", tf.float32, (), 1, max_samples_per_stream=0)


def test_client_has_reverbs_server_address_attribute(served):
    # Reverb's test_pickle compares ``_server_address`` of a Client and its pickled copy.
    import pickle
    name, client = served(uniform())
    copy = pickle.loads(pickle.dumps(client))
    try:
        assert copy._server_address == client._server_address == name
    finally:
        copy.close()


# --- empty sub-nests ----------------------------------------------------------------------

STEP_DTYPES = {"obs": tf.float32, "extras": (), "info": {}}


def write_steps(client, table, count=3, length=2):
    """Items of ``length`` steps whose ``extras`` and ``info`` are empty, as Acme writes
    (``extras=()``) and TF-Agents (``policy_info=()``)."""
    with client.trajectory_writer(length) as writer:
        for i in range(count + length - 1):
            writer.append({"obs": np.full(2, i, np.float32), "extras": (), "info": {}})
            if writer.episode_steps >= length:
                writer.create_item(table, 1.0, {"obs": writer.history["obs"][-length:],
                                                "extras": (), "info": {}})


def check_empty_sub_nests(element, obs_shape):
    assert element.data["extras"] == () and element.data["info"] == {}
    assert element.data["obs"].shape == obs_shape


@pytest.mark.parametrize("shape_style", ["tuples", "lists", "TensorShape"])
def test_trajectory_dataset_takes_empty_sub_nests(served, shape_style):
    name, client = served(uniform())
    write_steps(client, "u")
    obs = {"tuples": (2, 2), "lists": [2, 2], "TensorShape": tf.TensorShape([2, 2])}[shape_style]
    empty = [] if shape_style == "lists" else ()
    dataset = shmreplay_tf.TrajectoryDataset(
        name, "u", STEP_DTYPES, {"obs": obs, "extras": empty, "info": {}},
        max_in_flight_samples_per_worker=2)
    check_empty_sub_nests(next(iter(dataset)), (2, 2))


def test_timestep_and_replay_datasets_take_empty_sub_nests(served):
    name, client = served(uniform())
    write_steps(client, "u")
    shapes = {"obs": (2,), "extras": (), "info": {}}
    timesteps = shmreplay_tf.TimestepDataset(name, "u", STEP_DTYPES, shapes, 2)
    check_empty_sub_nests(next(iter(timesteps)), (2,))
    legacy = shmreplay_tf.ReplayDataset(name, "u", STEP_DTYPES, shapes, 2, sequence_length=2,
                                        emit_timesteps=False)
    check_empty_sub_nests(next(iter(legacy)), (2, 2))


def test_from_table_signature_and_make_dataset_keep_empty_sub_nests(served):
    # Acme's make_reverb_dataset reads the structure from the table's signature.
    signature = {"obs": shmreplay.TensorSpec((2, 2), np.float32), "extras": (), "info": {}}
    name, client = served(uniform(signature=signature))
    write_steps(client, "u")
    dataset = shmreplay_tf.TrajectoryDataset.from_table_signature(name, "u", 2)
    check_empty_sub_nests(next(iter(dataset)), (2, 2))
    batches = shmreplay_tf.make_dataset(name, "u", batch_size=2)
    check_empty_sub_nests(next(iter(batches)), (2, 2, 2))
    buffer = shmreplay_tf.ReplayBuffer(name, "u")
    try:
        data, _ = next(iter(buffer.as_dataset(sample_batch_size=2, num_steps=2)))
        assert data["extras"] == () and data["obs"].shape == (2, 2, 2)
    finally:
        buffer.close()


def test_a_sub_nest_that_dtypes_does_not_have_is_refused(served):
    name, _ = served(uniform())
    with pytest.raises(ValueError, match="same structure"):
        shmreplay_tf.TrajectoryDataset(name, "u", {"obs": tf.float32, "extras": ()},
                                       {"obs": (2,), "extras": ((1,),)}, 1)


def test_datasets_match_items_to_dtypes_leaf_by_leaf(served):
    # Reverb's dataset tests read a table of ``[x]`` items (legacy Writer, insert of a
    # list) with a bare dtype, and dict items with a tuple: only the leaves must match.
    name, client = served(uniform("one"), uniform("pair"))
    for i in range(3):
        client.insert([np.full(2, i, np.float32)], {"one": 1.0})
        client.insert({"a": np.float32(i), "b": np.int64(i)}, {"pair": 1.0})
    bare = shmreplay_tf.TimestepDataset(name, "one", tf.float32, (2,), 1)
    assert next(iter(bare)).data.shape == (2,)
    as_tuple = shmreplay_tf.TrajectoryDataset(name, "pair", (tf.float32, tf.int64), ((), ()), 1)
    a, b = next(iter(as_tuple)).data
    assert a.dtype == tf.float32 and b.dtype == tf.int64 and int(a) == int(b)


def test_a_mismatched_dataset_says_so_in_reverbs_words(served):
    # Reverb's test_incompatible_dataset_shapes_and_types_without_signature matches on
    # TensorFlow's dtype names and shapes written [3,3].
    name, client = served(uniform())
    with client.writer(2) as writer:  # as Reverb's test fills its table
        for _ in range(2):
            writer.append([np.zeros((3, 3), np.float32)])
        writer.create_item("u", 2, 1.0)
    dataset = shmreplay_tf.TimestepDataset(name, "u", (tf.float32,), (tf.TensorShape([]),), 1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Specification has \(dtype, shape\): \(float, \[\]\)\.  "
                             r"Tensor has \(dtype, shape\): \(float, \[3,3\]\)\."):
        next(iter(dataset))


# --- tf.constant addresses and graph mode ---------------------------------------------------

def test_datasets_take_address_and_table_as_eager_constants(served):
    name, client = served(uniform())
    client.insert(np.float32(5), {"u": 1.0})
    dataset = shmreplay_tf.TrajectoryDataset(tf.constant(name), tf.constant("u"), tf.float32,
                                             (), max_in_flight_samples_per_worker=1)
    assert float(next(iter(dataset)).data) == 5.0


@pytest.mark.parametrize("iterator", ["initializable", "one_shot"])
def test_datasets_work_in_graph_mode(served, iterator):
    # Reverb's dataset tests: tf.compat.v1 graphs, addresses as tf.constant, and
    # make_initializable_iterator / make_one_shot_iterator run in a Session.
    name, client = served(uniform())
    client.insert(np.float32(7), {"u": 1.0})
    with tf.Graph().as_default():
        datasets = [
            shmreplay_tf.TrajectoryDataset(tf.constant(name), tf.constant("u"), tf.float32,
                                           tf.TensorShape([]), max_in_flight_samples_per_worker=1),
            shmreplay_tf.TimestepDataset(tf.constant(name), tf.constant("u"), tf.float32,
                                         tf.TensorShape([]), max_in_flight_samples_per_worker=1),
            shmreplay_tf.TrajectoryDataset.from_table_signature(tf.constant(name),
                                                                tf.constant("u"), 1),
        ]
        with tf.compat.v1.Session() as session:
            for dataset in datasets:
                # As Reverb's tests call them: methods of the dataset (a DatasetV1).
                if iterator == "initializable":
                    it = dataset.make_initializable_iterator()
                    session.run(it.initializer)
                else:
                    it = dataset.make_one_shot_iterator()
                sample = session.run(it.get_next())
                assert float(np.ravel(sample.data)[0]) == 7.0
                assert sample.info.key.dtype == np.uint64


def test_a_symbolic_address_that_is_no_constant_is_refused():
    with tf.Graph().as_default():
        address = tf.compat.v1.placeholder(tf.string, ())
        with pytest.raises(TypeError, match="server_address"):
            shmreplay_tf.TrajectoryDataset(address, "u", tf.float32, (), 1)


# --- interleaved datasets draining a table -----------------------------------------------

_DRAIN = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import shmreplay
    from shmreplay import rate_limiters, selectors, tf as shmreplay_tf

    name, rounds = sys.argv[1], int(sys.argv[2])
    for round_ in range(rounds):
        table = shmreplay.Table("p", selectors.Prioritized(1.0), selectors.Fifo(), 3,
                                rate_limiters.MinSize(1), max_times_sampled=10)
        with shmreplay.Server([table], name=f"{name}-{round_}") as server:
            with shmreplay.Client(server.name) as client:
                with client.trajectory_writer(1) as writer:
                    for k in range(3):
                        writer.append(np.int64(k))
                        writer.create_item("p", float(k), writer.history[-1:])

                def one(_):
                    return shmreplay_tf.TrajectoryDataset(
                        server.name, "p", tf.int64, (1,), max_in_flight_samples_per_worker=1,
                        num_workers_per_iterator=1)

                options = tf.data.Options()
                options.experimental_deterministic = False
                dataset = (tf.data.Dataset.range(3)
                           .interleave(one, cycle_length=3, num_parallel_calls=3)
                           .with_options(options).batch(3, drop_remainder=True))
                iterator = iter(dataset)
                counts = np.zeros(3, int)
                for _ in range(10):
                    np.add.at(counts, next(iterator).data.numpy().ravel(), 1)
                del iterator  # its workers wait on the drained table: this must end
                assert counts.tolist() == [10, 10, 10], counts
        print("round", round_, "ok", flush=True)
""")


def test_interleaved_datasets_drain_an_expiring_table_and_end():
    # TF-Agents' test_prioritized_table_max_sample: three interleaved datasets, one item
    # in flight each, take all 30 samples of 3 items that expire after 10; then the
    # datasets wait on an empty table. Before the fix their generators waited inside
    # tf.data's calls, and dropping the iterator (or the interleave) hung in most rounds.
    rounds = 6
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]), TF_CPP_MIN_LOG_LEVEL="3")
    try:
        done = subprocess.run([sys.executable, "-c", _DRAIN, _names.unique("rvdrain"),
                               str(rounds)], env=env, capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the drain hung; output so far: {exc.stdout!r}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("ok") == rounds

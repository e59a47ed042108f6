"""``TableInfo`` as Reverb's: the selector and rate limiter protos' accessors, the
signature as given, ``num_episodes`` and ``num_unique_samples`` (Reverb's
server_test.py ``TableTest`` and client_test.py ``test_server_info`` read these)."""

import multiprocessing
import os
import subprocess
import sys
import zlib

import cloudpickle
import numpy as np
import pytest

import _address_workers as workers
import _names
import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay._ops import checkpoint as _checkpoint

SELECTORS = {
    "uniform": (selectors.Uniform, "uniform", False),
    "prioritized": (lambda: selectors.Prioritized(0.8), "prioritized", False),
    "min_heap": (selectors.MinHeap, "heap", True),
    "max_heap": (selectors.MaxHeap, "heap", True),
    "fifo": (selectors.Fifo, "fifo", True),
    "lifo": (selectors.Lifo, "lifo", True),
}
LIMITERS = {
    "min_size": lambda: rate_limiters.MinSize(10),
    "queue": lambda: rate_limiters.Queue(10),
    "ratio": lambda: rate_limiters.SampleToInsertRatio(1.0, 10, 1.0),
    "stack": lambda: rate_limiters.Stack(10),
}
ONEOF = ("fifo", "uniform", "prioritized", "heap", "lifo")


@pytest.mark.parametrize("limiter", sorted(LIMITERS))
@pytest.mark.parametrize("sampler", sorted(SELECTORS))
def test_selector_options_answer_as_reverbs_protos(sampler, limiter):
    make, field, deterministic = SELECTORS[sampler]
    remover = "lifo" if sampler == "fifo" else "fifo"
    table = shmreplay.Table("t", sampler=make(), remover=SELECTORS[remover][0](),
                            max_size=100, rate_limiter=LIMITERS[limiter]())
    info = table.info
    options = info.sampler_options
    assert [name for name in ONEOF if options.HasField(name)] == [field]
    assert options.WhichOneof("distribution") == field
    assert info.remover_options.HasField(remover) and info.remover_options.WhichOneof(
        "distribution") == remover
    assert options.is_deterministic is deterministic
    # Unset fields read as the proto's defaults.
    assert options.prioritized.priority_exponent == (0.8 if field == "prioritized" else 0.0)
    assert options.heap.min_heap is (sampler == "min_heap")
    for flag in ("fifo", "uniform", "lifo"):
        assert getattr(options, flag) is (flag == field)
    with pytest.raises(ValueError, match="is_deterministic"):
        options.HasField("is_deterministic")  # a proto3 scalar has no presence
    assert (info.name, info.max_size, info.current_size) == ("t", 100, 0)
    assert (info.num_episodes, info.num_deleted_episodes, info.signature) == (0, 0, None)


def test_rate_limiter_info_answers_as_reverbs_proto(buffer_name):
    limiter = rate_limiters.SampleToInsertRatio(2.0, 3, 10.0)
    table = shmreplay.Table("t", sampler=selectors.Fifo(), remover=selectors.Fifo(),
                            max_size=100, rate_limiter=limiter)
    with shmreplay.Server([table], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            for value in range(4):
                client.insert({"x": np.full(2, value, np.float32)}, {"t": 1.0}, timeout=5)
            client.sample_batch("t", 3, timeout=5)
            info = client.server_info(timeout=5)["t"].rate_limiter_info
    assert info.samples_per_insert == 2.0
    assert info.min_size_to_sample == 3
    assert (info.min_diff, info.max_diff) == (limiter.min_diff, limiter.max_diff)
    assert info.insert_stats.completed == 4 and info.sample_stats.completed == 3
    assert info.HasField("insert_stats") and info.HasField("sample_stats")
    with pytest.raises(ValueError, match="samples_per_insert"):
        info.HasField("samples_per_insert")
    # Reverb's test_replace: a limiter rebuilt from the info, one field changed.
    rebuilt = rate_limiters.RateLimiter(
        samples_per_insert=info.samples_per_insert, min_size_to_sample=1,
        min_diff=info.min_diff, max_diff=info.max_diff)
    assert table.replace(rate_limiter=rebuilt).info.rate_limiter_info.min_size_to_sample == 1


def test_num_unique_samples_counts_items_sampled_at_least_once(buffer_name):
    table = shmreplay.Table("t", sampler=selectors.Fifo(), remover=selectors.Fifo(),
                            max_size=10, rate_limiter=rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            for value in range(3):
                client.insert({"x": np.full(2, value, np.float32)}, {"t": 1.0}, timeout=5)
            client.sample_batch("t", 2, timeout=5)  # FIFO: the first item, twice
            assert client.server_info()["t"].num_unique_samples == 1
            client.mutate_priorities("t", deletes=[])
            info = client.server_info()["t"]
            assert info.table_worker_time.running_ms == 0  # no worker thread here
            client.reset("t")
            assert client.server_info()["t"].num_unique_samples == 0


def test_signature_is_none_when_none_was_given(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            client.insert({"x": np.zeros(2, np.float32)}, {"q": 1.0}, timeout=5)
            assert client.server_info()["q"].signature is None  # as Reverb's


_SIGNATURE_SCRIPT = """
import sys
import numpy as np
import shmreplay
if sys.argv[1] == "tf":
    import tensorflow as tf
    given = (tf.TensorSpec([], tf.int32), {"a": tf.TensorSpec((1, 1), tf.float64, "a_name")})
else:
    given = (shmreplay.TensorSpec((), np.int32), {"a": shmreplay.TensorSpec((1, 1), np.float64)})
table = shmreplay.Table.queue("q", 10, signature=given)
with shmreplay.Server([table], name=sys.argv[2]) as server:
    with shmreplay.Client(server.name) as client:
        served = client.server_info()["q"].signature
assert table.info.signature == given == served, (given, served)
if sys.argv[1] == "tf":
    assert type(served[0]) is tf.TensorSpec and served[1]["a"].name == "a_name"
else:
    assert type(served[0]) is shmreplay.TensorSpec
    assert "tensorflow" not in sys.modules, "info imported TensorFlow"
print("ok")
"""


@pytest.mark.parametrize("kind", ["tf", "numpy"])
def test_signature_is_given_back_as_given(kind):
    pytest.importorskip("tensorflow") if kind == "tf" else None
    result = subprocess.run(
        [sys.executable, "-c", _SIGNATURE_SCRIPT, kind, _names.unique("sig")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.stdout.strip().endswith("ok"), result.stderr[-3000:]


# --- num_episodes -------------------------------------------------------------------------


def _fifo(max_size=100, name="t"):
    """Uniform sampling, FIFO eviction."""
    return shmreplay.Table(name, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                           max_size=max_size, rate_limiter=rate_limiters.MinSize(1))


def _episodes(client, table="t"):
    return client.server_info(timeout=5)[table].num_episodes


def _write_episodes(client, episodes, steps, table="t"):
    """``episodes`` TrajectoryWriter episodes of ``steps`` one-step items each."""
    with client.trajectory_writer(2) as writer:
        for episode in range(episodes):
            for step in range(steps):
                writer.append({"x": np.full(2, 10 * episode + step, np.float32)})
                writer.create_item(table, 1.0, {"x": writer.history["x"][-1]})
            writer.end_episode()


def test_num_episodes_counts_writer_episodes_and_inserts(buffer_name):
    with shmreplay.Server([_fifo(), _fifo(name="l")], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            for value in range(3):  # each insert is its own episode
                client.insert({"x": np.full(2, value, np.float32)}, {"t": 1.0}, timeout=5)
            assert _episodes(client) == 3
            _write_episodes(client, episodes=2, steps=4)
            assert _episodes(client) == 5
            assert client.server_info()["t"].current_size == 3 + 8
            for _ in range(2):
                with client.writer(2) as writer:  # a legacy Writer's items: one episode
                    for value in range(3):
                        writer.append({"x": np.full(2, value, np.float32)})
                        writer.create_item("l", 1, 1.0)
            assert _episodes(client, "l") == 2
            assert client.server_info()["l"].current_size == 6


def test_episodes_of_writers_in_spawned_processes_are_distinct(buffer_name):
    spawn = multiprocessing.get_context("spawn")
    with shmreplay.Server([_fifo()], name=buffer_name) as server:
        result = spawn.Queue()
        procs = [spawn.Process(target=workers.write_episode, args=(server.name, 3, result))
                 for _ in range(2)]
        for proc in procs:
            proc.start()
        outcomes = [result.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(30)
        assert outcomes == ["ok", "ok"]
        with shmreplay.Client(server.name) as client:
            assert client.server_info()["t"].current_size == 6
            assert _episodes(client) == 2  # alike seeds, distinct episodes


def test_num_episodes_follows_eviction_deletion_and_reset(buffer_name):
    with shmreplay.Server([_fifo(max_size=6)], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            _write_episodes(client, episodes=3, steps=3)  # 9 items, FIFO keeps the last 6
            assert client.server_info()["t"].current_size == 6
            assert _episodes(client) == 2
            # Every key (200 uniform draws of 6 miss one with p < 1e-14); keys grow with
            # insertion, so sorted they are in insertion order.
            keys = np.unique(client.sample_batch("t", 200, timeout=5).info.key)
            assert len(keys) == 6
            client.mutate_priorities("t", deletes=[int(k) for k in keys[:3]])
            assert _episodes(client) == 1  # the second episode's items are gone
            client.reset("t")
            assert _episodes(client) == 0
            client.insert({"x": np.zeros(2, np.float32)}, {"t": 1.0}, timeout=5)
            assert _episodes(client) == 1


def test_num_episodes_survives_a_checkpoint(buffer_name, tmp_path):
    with shmreplay.Server([_fifo()], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            _write_episodes(client, episodes=3, steps=2)
            client.insert({"x": np.zeros(2, np.float32)}, {"t": 1.0}, timeout=5)
            path = client.checkpoint(str(tmp_path / "t.ckpt"))
    with shmreplay.Server(name=buffer_name, checkpoint=path) as server:
        with shmreplay.Client(server.name) as client:
            assert client.server_info()["t"].current_size == 7
            assert _episodes(client) == 4
            _write_episodes(client, episodes=1, steps=1)  # new ids never meet the old
            assert _episodes(client) == 5
    # A format 1 file (before episodes were saved) restores, each item its own episode.
    _as_format_1(path)
    with shmreplay.Server(name=buffer_name, checkpoint=path) as server:
        with shmreplay.Client(server.name) as client:
            assert _episodes(client) == 7


def _as_format_1(path):
    """Rewrites a checkpoint as format 1 wrote it: no ``episode`` arrays."""
    data = bytearray(open(path, "rb").read())
    header = np.frombuffer(bytes(data[:_checkpoint.FILE_HEADER.itemsize]),
                           _checkpoint.FILE_HEADER).copy()
    offset, length = int(header["manifest_offset"][0]), int(header["manifest_len"][0])
    manifest = cloudpickle.loads(bytes(data[offset:offset + length]))
    manifest["format"] = 1
    for table in manifest["tables"]:
        del table["arrays"]["episode"]
    blob = cloudpickle.dumps(manifest)
    data = data[:offset] + blob
    header["version"] = 1
    header["manifest_len"] = len(blob)
    header["manifest_crc"] = zlib.crc32(blob)
    header["file_len"] = len(data)
    data[:_checkpoint.FILE_HEADER.itemsize] = header.tobytes()
    open(path, "wb").write(bytes(data))

"""Writers' items that the table's columns cannot hold go to its general store whole,
as in Reverb, where any item goes into a table without a signature
(``shmreplay._writers.general_items``)."""

import multiprocessing

import numpy as np
import pytest

import _general_workers as GW
import shmreplay
from shmreplay import errors, rate_limiters, selectors

SPAWN = multiprocessing.get_context("spawn")


def _items(client, count, table="q"):
    return [s.data for s in client.sample(table, count, emit_timesteps=False, timeout=5)]


def test_items_of_other_shapes_dtypes_and_structures_come_back_as_written(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 20)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with client.trajectory_writer(3) as writer:
            for step in range(3):
                writer.append({"obs": np.full(3, step, np.float32), "done": step == 2})
            writer.create_item("q", 1.0, {"obs": writer.history["obs"][-2:]})  # columns
            writer.create_item("q", 1.0, {"obs": writer.history["obs"][-3:]})  # length
            writer.create_item("q", 1.0, {"o": writer.history["obs"][-1],      # structure,
                                          "d": writer.history["done"][-2:]})  # squeezed
        with client.trajectory_writer(2) as writer:
            writer.append({"obs": np.ones((2, 2), np.int32)})
            writer.create_item("q", 1.0, {"obs": writer.history["obs"][-1:]})  # shape
        got = _items(client, 4)
        assert [item[0].shape for item in got[:2]] == [(2, 3), (3, 3)]
        done, squeezed = got[2]  # (flat, in the order of the sorted keys "d", "o")
        assert done.tolist() == [False, True] and squeezed.tolist() == [2, 2, 2]
        assert got[3][0].shape == (1, 2, 2) and got[3][0].dtype == np.int32
        assert client.verify("q") == []


def test_legacy_writer_items_of_strings(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 20)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with client.writer(3) as writer:
            for word in ("a", "bc", "def"):
                writer.append([word, np.int64(len(word))])
            writer.create_item("q", 3, 1.0)
            writer.create_item("q", 1, 1.0)
        words, lengths = _items(client, 1)[0]
        assert words.dtype == object and words.tolist() == [b"a", b"bc", b"def"]
        assert lengths.tolist() == [1, 2, 3]
        assert [c.tolist() for c in _items(client, 1)[0]] == [[b"def"], [3]]
        with pytest.raises(errors.SchemaError, match="cannot be stored"):
            with client.writer(2) as writer:
                writer.append([object()])


def test_episodes_of_general_store_items_are_counted(buffer_name):
    table = shmreplay.Table("u", selectors.Uniform(), selectors.Fifo(), 20,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        for episode in range(3):  # (a writer keeps each column's shape: one per episode)
            with client.trajectory_writer(2) as writer:
                for step in range(2):
                    writer.append({"x": np.full(episode + 1, step, np.float32)})
                    writer.create_item("u", 1.0, {"x": writer.history["x"][-1:]})
                writer.end_episode()
        info = client.server_info()["u"]
        assert info.current_size == 6 and info.num_episodes == 3


def test_another_process_writes_them_by_name(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 20)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        proc = SPAWN.Process(target=GW.write_items_of_two_shapes, args=(server.name, "q"))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 0
        got = [item[0] for item in _items(client, 3)]
        assert got[0].tolist() == [[1, 1], [2, 2]]
        assert got[1].shape == (1, 2, 2) and (got[1] == 7).all()
        assert got[2].tolist() == [b"one", b"two"]


def test_a_checkpoint_keeps_them_as_written(buffer_name, tmp_path):
    with shmreplay.Server([shmreplay.Table.queue("q", 20)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with client.trajectory_writer(2) as writer:
            writer.append({"x": np.float32(1)})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
        with client.trajectory_writer(2) as writer:
            writer.append({"x": np.ones(4, np.int16)})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
        path = client.checkpoint(str(tmp_path / "ckpt"))
    with shmreplay.Server(name=buffer_name, checkpoint=path) as server, \
            shmreplay.Client(server.name) as client:
        got = [item[0] for item in _items(client, 2)]
        assert got[0].shape == (1,) and got[1].shape == (1, 4) and got[1].dtype == np.int16


def test_sample_batch_pads_items_that_differ_only_in_length(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 20)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"x": np.zeros(3, np.float32), "w": b"-"}, {"q": 1.0})  # the columns
        client.sample_batch("q", 1, timeout=5)
        with client.trajectory_writer(5) as writer:
            for step in range(5):
                writer.append({"x": np.full(2, step, np.float32), "w": f"s{step}"})
            for length in (2, 5):
                writer.create_item("q", 1.0, {"x": writer.history["x"][-length:],
                                              "w": writer.history["w"][-length:]})
        batch = client.sample_batch("q", 2, timeout=5)
        assert batch.data["x"].shape == (2, 5, 2)
        assert batch.lengths["x"].tolist() == [2, 5] and batch.lengths["w"].tolist() == [2, 5]
        np.testing.assert_array_equal(batch.data["x"][0, :, 0], [3, 4, 0, 0, 0])
        assert batch.data["w"][0].tolist() == [b"s3", b"s4", b"", b"", b""]
        for size in (2, 3):  # a squeezed column has no time dimension: never padded
            with client.trajectory_writer(2) as writer:
                writer.append({"x": np.zeros(size, np.float32), "w": "a"})
                writer.create_item("q", 1.0, {"x": writer.history["x"][-1],
                                              "w": writer.history["w"][-1:]})
        with pytest.raises(errors.SchemaError, match=r"column \['x'\].*\(2,\).*\(3,\)"):
            client.sample_batch("q", 2, timeout=5)

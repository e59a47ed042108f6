"""String columns in a signature (``tf.string``): every item of such a table goes to its
general store, checked against the signature (``shmreplay._schema.open_shapes``); and a
process's first sample of a table whose items are in the general store reads them."""

import multiprocessing

import numpy as np
import pytest

import _general_workers as GW
import shmreplay
from shmreplay import errors

SPAWN = multiprocessing.get_context("spawn")
SIGNATURE = {"name": shmreplay.TensorSpec((), np.bytes_),
             "x": shmreplay.TensorSpec((2,), np.float32)}


def _table(**kwargs):
    return shmreplay.Table.queue("q", 10, signature=SIGNATURE, **kwargs)


def test_a_string_column_takes_strings_of_any_length_and_checks_the_rest(buffer_name):
    table = _table()
    assert table.has_strings and table.column_specs[0].dtype == np.dtype(object)
    with shmreplay.Server([table], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"name": b"ab", "x": np.ones(2, np.float32)}, {"q": 1.0})
        client.insert({"name": "a longer name", "x": np.zeros(2, np.float32)}, {"q": 1.0})
        with pytest.raises(errors.SchemaError, match=r"column \['name'\].*int64\[\].*string"):
            client.insert({"name": 3, "x": np.zeros(2, np.float32)}, {"q": 1.0})
        with pytest.raises(errors.SchemaError, match=r"column \['x'\]"):
            client.insert({"name": b"c", "x": np.zeros(3, np.float32)}, {"q": 1.0})
        assert client.server_info()["q"].current_size == 2
        got = [s.data for s in client.sample("q", 2, emit_timesteps=False, timeout=5,
                                             unpack_as_table_signature=True)]
        assert [d["name"].tolist() for d in got] == [[b"ab"], [b"a longer name"]]
        assert got[0]["x"].shape == (1, 2)


def test_writers_items_of_strings(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with client.trajectory_writer(2) as writer:
            writer.append({"name": b"w", "x": np.full(2, 5, np.float32)})
            writer.create_item("q", 1.0, {"name": writer.history["name"][-1],
                                          "x": writer.history["x"][-1]})
        batch = client.sample_batch("q", 1, timeout=5)
        assert batch.data["name"].tolist() == [b"w"] and batch.data["x"].tolist() == [[5, 5]]


def test_without_a_general_store_a_string_table_refuses_its_items(buffer_name):
    with shmreplay.Server([_table(arena_bytes=0)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with pytest.raises(errors.SchemaError, match="string columns"):
            client.insert({"name": b"ab", "x": np.ones(2, np.float32)}, {"q": 1.0})


@pytest.mark.parametrize("signature", [None, SIGNATURE])
def test_a_fresh_process_first_sample_reads_general_store_items(buffer_name, signature):
    table = shmreplay.Table.queue("q", 10, signature=signature)
    with shmreplay.Server([table], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        for index in range(3):
            client.insert({"name": f"item-{index}".encode(), "x": np.full(2, index, np.float32)},
                          {"q": 1.0})
        out = SPAWN.Queue()
        proc = SPAWN.Process(target=GW.sample_first_items, args=(server.name, "q", 3, out))
        proc.start()
        got = out.get(timeout=120)
        proc.join(60)
        assert proc.exitcode == 0
        first, *rest = got
        assert first["name"] == [b"item-0"] and first["x"] == [[0.0, 0.0]]
        names = [item["name"] if isinstance(item, dict) else item[0] for item in rest]
        assert names == [[b"item-1"], [b"item-2"]]

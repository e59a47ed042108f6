"""Signatures with open dimensions (a None after the first): the first item settles the
columns' shapes, items of other shapes that fit the signature go to the table's general
store, the rest is refused naming the signature (``shmreplay._schema.open_shapes``)."""

import logging
import multiprocessing

import numpy as np
import pytest

import _general_workers as GW
import shmreplay
from shmreplay import errors
from shmreplay._schema import storage as _storage

SPAWN = multiprocessing.get_context("spawn")


def _fifo(signature, name="t", max_size=20, **kwargs):
    return shmreplay.Table.queue(name, max_size, signature=signature, **kwargs)


def _drain(client, count, table="t"):
    return [sample.data[0] for sample in client.sample(table, count, emit_timesteps=False,
                                                       timeout=5)]


def test_legacy_writer_items_match_an_open_signature_per_step(buffer_name):
    signature = shmreplay.TensorSpec((None, None), np.float32)
    with shmreplay.Server([_fifo(signature)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with client.writer(10) as writer:
            for step in range(8):
                writer.append([np.full((3, 3), step, np.float32)])
                if step >= 4:
                    writer.create_item("t", 5 if step % 2 else 2, 1.0)
        assert client.server_info()["t"].signature == signature  # as given
        columns = _drain(client, 4)
        assert [c.shape for c in columns] == [(2, 3, 3), (5, 3, 3), (2, 3, 3), (5, 3, 3)]
        np.testing.assert_array_equal(columns[1][:, 0, 0], [1, 2, 3, 4, 5])


def test_inserts_of_other_shapes_go_to_the_arena_in_the_signature_form(buffer_name):
    signature = shmreplay.TensorSpec((None, None), np.float32)
    with shmreplay.Server([_fifo(signature)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.ones(4, np.float32), {"t": 1.0})        # settles [None, 4]
        client.insert(np.ones((2, 4), np.float32), {"t": 1.0})   # a sequence, in place
        client.insert(np.full(7, 7, np.float32), {"t": 1.0})     # the arena
        client.insert(np.full((3, 2), 2, np.float32), {"t": 1.0})
        engine = client._engine("t")
        assert engine.storage.signature.shape == (None, 4) and engine.arena is not None
        got = _drain(client, 4)
        assert [c.shape for c in got] == [(1, 4), (2, 4), (1, 7), (3, 2)]
        np.testing.assert_array_equal(got[2], np.full((1, 7), 7, np.float32))


@pytest.mark.parametrize("item, words", [
    (np.ones((2, 2, 2), np.float32), r"float32\[2, 2, 2\], which does not fit the "
                                     r"signature's float32\[None, None\]"),
    (np.ones(3, np.int32), r"int32\[1, 3\], which does not fit"),
])
def test_an_item_that_does_not_fit_the_signature_is_refused_and_nothing_changes(
        buffer_name, item, words):
    signature = shmreplay.TensorSpec((None, None), np.float32)
    with shmreplay.Server([_fifo(signature)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.ones(4, np.float32), {"t": 1.0})
        with pytest.raises(errors.SchemaError, match=r"Table 't', column <root>: .*" + words):
            client.insert(item, {"t": 1.0})
        assert client.server_info()["t"].current_size == 1
        client.verify("t")


def test_a_fixed_first_dimension_with_an_open_second(buffer_name):
    signature = {"x": shmreplay.TensorSpec((3, None), np.int64)}
    with shmreplay.Server([_fifo(signature)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"x": np.zeros((3, 5), np.int64)}, {"t": 1.0})
        client.insert({"x": np.ones((3, 6), np.int64)}, {"t": 1.0})
        with pytest.raises(errors.SchemaError, match="does not fit the signature's"):
            client.insert({"x": np.ones((4, 5), np.int64)}, {"t": 1.0})
        got = [s.data for s in client.sample("t", 2, emit_timesteps=False, timeout=5)]
        assert [d[0].shape for d in got] == [(1, 3, 5), (1, 3, 6)]  # (Reverb's view)
        client.insert({"x": np.zeros((3, 5), np.int64)}, {"t": 1.0})
        assert client.sample_batch("t", 1, timeout=5).data["x"].shape == (1, 3, 5)


def test_reset_forgets_the_settled_shapes(buffer_name):
    signature = shmreplay.TensorSpec((None, None), np.float32)
    with shmreplay.Server([_fifo(signature)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.ones(4, np.float32), {"t": 1.0})
        client.reset("t")
        client.insert(np.ones(9, np.float32), {"t": 1.0})
        assert client._engine("t").storage.signature.shape == (None, 9)
        assert _drain(client, 1)[0].shape == (1, 9)


def test_writer_items_of_another_shape_go_to_the_general_store(buffer_name):
    signature = shmreplay.TensorSpec((None, None), np.float32)
    with shmreplay.Server([_fifo(signature)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with client.trajectory_writer(2) as writer:
            writer.append(np.ones(5, np.float32))
            writer.create_item("t", 1.0, writer.history[-1:])
        with client.trajectory_writer(3) as writer:
            for step in range(3):
                writer.append(np.full(6, step, np.float32))
            writer.create_item("t", 1.0, writer.history[-3:])  # [3, 6]: the store
            writer.create_item("t", 1.0, writer.history[-1])    # [6], squeezed: the
            # signature gives this column a time dimension, so the item gets one
        with client.trajectory_writer(2) as writer:
            writer.append(np.ones((2, 2), np.float32))
            with pytest.raises(errors.SchemaError, match=r"the item has float32\[1, 2, 2\]"):
                writer.create_item("t", 1.0, writer.history[-1:])  # fits no [None, None]
        got = _drain(client, 3)
        assert [c.shape for c in got] == [(1, 5), (3, 6), (1, 6)]
        np.testing.assert_array_equal(got[1][:, 0], [0, 1, 2])


def test_another_process_inserts_both_shapes_by_name(buffer_name):
    signature = shmreplay.TensorSpec((None, None), np.float32)
    with shmreplay.Server([_fifo(signature)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        proc = SPAWN.Process(target=GW.insert_open_shapes, args=(server.name, "t", [4, 7, 4, 2]))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 0
        got = _drain(client, 4)
        assert [c.shape for c in got] == [(1, 4), (1, 7), (1, 4), (1, 2)]
        assert [float(c[0, 0]) for c in got] == [4, 7, 4, 2]


def test_an_open_signature_takes_arena_bytes_a_closed_one_refuses_them():
    open_table = _fifo(shmreplay.TensorSpec((None, None), np.float32), arena_bytes=1 << 16)
    assert open_table.arena_bytes == 1 << 16 and open_table.shapes_from_data
    closed = shmreplay.TensorSpec((None, 3), np.float32)
    assert not _fifo(closed).shapes_from_data
    with pytest.raises(ValueError, match="arena_bytes"):
        _fifo(closed, arena_bytes=1 << 16)


def test_the_default_step_budget_takes_at_most_a_quarter_of_free_shared_memory(
        monkeypatch, caplog):
    cell = shmreplay.TensorSpec((64,), np.float32)
    steps = _storage.step_storage(shmreplay.TensorSpec((None, 64), np.float32), [cell],
                                  [100], [False], [None])
    monkeypatch.setattr(_storage._segment, "free_bytes", lambda: 64 << 20)
    with caplog.at_level(logging.WARNING, logger="shmreplay"):
        capped = _storage.variable_step_storage(steps, 1_000_000, 100, 100, table="big")
    per_row = 64 * 4 + 8 + 8
    assert capped.row_budget == (64 << 20) // 4 // per_row
    assert "table 'big'" in caplog.text and "max_steps" in caplog.text
    chosen = _storage.variable_step_storage(steps, 1_000_000, 100, 100, max_steps=5000)
    assert chosen.row_budget == 5000
    small = _storage.variable_step_storage(steps, 10, 100, 100)
    assert small.row_budget == 2 * 10 * 100  # (small tables keep the usual budget)


def test_without_a_general_store_other_shapes_are_refused_with_the_reason(buffer_name):
    signature = shmreplay.TensorSpec((None, None), np.float32)
    with shmreplay.Server([_fifo(signature, arena_bytes=0)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with client.trajectory_writer(2) as writer:
            writer.append(np.ones(5, np.float32))
            writer.create_item("t", 1.0, writer.history[-1:])
        with client.trajectory_writer(2) as writer:
            writer.append(np.ones(6, np.float32))
            with pytest.raises(errors.SchemaError,
                               match=r"fixed the open dimensions to \[None, 5\] .*arena_bytes"):
                writer.create_item("t", 1.0, writer.history[-1:])
        assert client.server_info()["t"].current_size == 1

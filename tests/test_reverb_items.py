"""Items as Reverb's own calls see them: ``Client.sample``'s flat data and time
dimensions, signatures matched by flattened leaves, and items from ``insert`` and from
both writers side by side in one table (issue 17, parts 1 and 2)."""

import contextlib

import numpy as np
import pytest

import shmreplay
from shmreplay import errors
from shmreplay.specs import TensorSpec
import _names


@contextlib.contextmanager
def serve(*tables):
    with shmreplay.Server(list(tables), name=_names.unique("reverb-items")) as server:
        client = shmreplay.Client(server.name)
        try:
            yield client
        finally:
            client.close()


def queue(name="q", signature=None):
    return shmreplay.Table.queue(name, 10, signature=signature)


# --- Client.sample: Reverb's flat data -------------------------------------------------


def test_sample_data_is_the_flat_list_of_columns():
    # Reverb: data[0] of an item that is one [2, 3] array is the whole array (with its
    # time dimension of 1), not its first row.
    with serve(queue()) as client:
        item = np.arange(6, dtype=np.float32).reshape(2, 3)
        for _ in range(2):
            client.insert(item, {"q": 1.0}, timeout=1)
        sample = next(client.sample("q", emit_timesteps=False, timeout=1))
        assert isinstance(sample.data, list) and len(sample.data) == 1
        np.testing.assert_array_equal(sample.data[0], item[None])
        [step] = next(client.sample("q", timeout=1))
        assert isinstance(step.data, list)
        np.testing.assert_array_equal(step.data[0], item)


def test_sample_flattens_in_tree_order_and_unpacks_on_request():
    with serve(queue()) as client:
        item = {"b": np.float32(2.0), "a": {"y": np.int64(1), "x": np.zeros(2, np.int32)}}
        for _ in range(2):
            client.insert(item, {"q": 1.0}, timeout=1)
        flat = next(client.sample("q", emit_timesteps=False, timeout=1)).data
        # dm-tree order: dict keys sorted, depth first: a.x, a.y, b.
        assert [column.shape for column in flat] == [(1, 2), (1,), (1,)]
        assert [column.dtype for column in flat] == [np.int32, np.int64, np.float32]
        # Reverb unpacks only a table with a signature; without one the data stays flat.
        flat = next(client.sample("q", emit_timesteps=False, timeout=1,
                                  unpack_as_table_signature=True)).data
        assert isinstance(flat, list) and [c.shape for c in flat] == [(1, 2), (1,), (1,)]
    signature = {"b": TensorSpec((), np.float32),
                 "a": {"y": TensorSpec((), np.int64), "x": TensorSpec((2,), np.int32)}}
    with serve(queue(signature=signature)) as client:
        client.insert(item, {"q": 1.0}, timeout=1)
        nest = next(client.sample("q", emit_timesteps=False, timeout=1,
                                  unpack_as_table_signature=True)).data
        assert nest["a"]["x"].shape == (1, 2) and float(nest["b"][0]) == 2.0


def test_emit_timesteps_splits_every_column_along_its_first_dimension():
    with serve(queue(), queue("q2")) as client:
        writer = client.trajectory_writer(3)
        for t in range(3):
            writer.append({"obs": np.full(2, t, np.float32), "act": np.int64(t)})
        history = writer.history
        # Squeezed columns have no time dimension, yet Reverb splits them along their
        # first dimension too: obs [2] and act [-2:] give two "timesteps".
        writer.create_item("q", 1.0, {"obs": history["obs"][-1], "act": history["act"][-2:]})
        writer.flush(timeout_ms=1000)
        steps = next(client.sample("q", timeout=1))
        assert len(steps) == 2
        assert [float(step.data[1]) for step in steps] == [2.0, 2.0]
        assert [int(step.data[0]) for step in steps] == [1, 2]
        assert all(isinstance(column, np.ndarray) and column.ndim == 0
                   for step in steps for column in step.data)
        writer.create_item("q2", 1.0, {"obs": history["obs"][-3:], "act": history["act"][-2:]})
        writer.flush(timeout_ms=1000)
        writer.close()
        with pytest.raises(ValueError, match="Can't split non timestep trajectory"):
            next(client.sample("q2", timeout=1))


# --- one table, items from insert and both writers -------------------------------------

OBS = np.arange(15, dtype=np.float32)


def _reverb_shapes(client, table, count):
    """Client.sample's view of the next ``count`` items of a queue (FIFO)."""
    return [next(client.sample(table, emit_timesteps=False, timeout=1)).data[0].shape
            for _ in range(count)]


def _fill(client, table, order):
    """Inserts one item per kind in ``order``; returns Reverb's shape for each."""
    writer = client.trajectory_writer(2)
    expected = []
    for kind in order:
        writer.append({"obs": OBS})
        if kind == "insert":
            client.insert({"obs": OBS}, {table: 1.0}, timeout=1)
            expected.append((1, 15))
        elif kind == "window":
            writer.create_item(table, 1.0, {"obs": writer.history["obs"][-1:]})
            expected.append((1, 15))
        elif kind == "squeezed":
            writer.create_item(table, 1.0, {"obs": writer.history["obs"][-1]})
            expected.append((15,))
        else:  # the legacy writer's one-step item
            with client.writer(1) as legacy:
                legacy.append({"obs": OBS})
                legacy.create_item(table, 1, 1.0)
            expected.append((1, 15))
        writer.flush(timeout_ms=1000)
    writer.close()
    return expected


@pytest.mark.parametrize("order", [
    ("insert", "window", "squeezed", "legacy"),
    ("window", "insert", "squeezed", "legacy"),
    ("squeezed", "insert", "window", "legacy"),
    ("legacy", "squeezed", "window", "insert"),
])
def test_inserts_and_one_step_writer_items_share_a_table(order):
    with serve(queue(), queue("peek")) as client:
        expected = _fill(client, "q", order)
        # shmreplay's own calls return the table's layout, fixed by its first item.
        first = (15,) if order[0] in ("insert", "squeezed") else (1, 15)
        batch = client.sample_batch("q", 4, timeout=1)
        assert batch.data["obs"].shape == (4,) + first
        np.testing.assert_array_equal(batch.data["obs"].reshape(4, 15), np.tile(OBS, (4, 1)))
        _fill(client, "q", order)
        # Reverb's Client.sample returns each item as Reverb stores it.
        assert _reverb_shapes(client, "q", 4) == expected
        # After a reset, in the other order.
        _fill(client, "q", order)
        client.reset("q")
        assert client.server_info()["q"].current_size == 0
        expected = _fill(client, "q", order[::-1])
        assert _reverb_shapes(client, "q", 4) == expected


def test_a_declared_signature_wins_over_the_first_item():
    signature = TensorSpec((), np.int64)
    with serve(queue(signature=signature)) as client:
        with client.writer(1) as legacy:  # a one-step item: int64[1]
            legacy.append(np.int64(7))
            legacy.create_item("q", 1, 1.0)
        client.insert(np.int64(8), {"q": 1.0}, timeout=1)  # exactly the signature
        client.insert([np.int64(9)], {"q": 1.0}, timeout=1)  # flattened leaves match
        writer = client.trajectory_writer(1)
        writer.append([np.int64(10)])
        writer.create_item("q", 1.0, writer.history[0][-1:])
        writer.create_item("q", 1.0, writer.history[0][-1])
        writer.flush(timeout_ms=1000)
        writer.close()
        # (the legacy Writer's item per step made the column one of any length, as in
        # Reverb: the batch comes padded, here to the one step every item has)
        batch = client.sample_batch("q", 5, timeout=1)
        assert batch.data.shape == (5, 1) and batch.data[:, 0].tolist() == [7, 8, 9, 10, 10]
        assert batch.lengths.tolist() == [1] * 5
        assert client.server_info()["q"].current_size == 0
        _ = [client.insert(np.int64(v), {"q": 1.0}, timeout=1) for v in (1, 2)]
        with client.writer(1) as legacy:
            legacy.append(np.int64(3))
            legacy.create_item("q", 1, 1.0)
        assert _reverb_shapes(client, "q", 3) == [(1,), (1,), (1,)]


def test_a_signature_with_a_time_dimension_of_one_takes_single_steps():
    with serve(queue(signature={"obs": TensorSpec((1, 15), np.float32)})) as client:
        client.insert({"obs": OBS}, {"q": 1.0}, timeout=1)          # Reverb: [1, 15]
        client.insert({"obs": OBS[None]}, {"q": 1.0}, timeout=1)    # Reverb: [1, 1, 15]
        batch = client.sample_batch("q", 2, timeout=1)
        assert batch.data["obs"].shape == (2, 1, 15)
        client.insert({"obs": OBS}, {"q": 1.0}, timeout=1)
        client.insert({"obs": OBS[None]}, {"q": 1.0}, timeout=1)
        assert _reverb_shapes(client, "q", 2) == [(1, 15), (1, 1, 15)]
        with pytest.raises(errors.SchemaError, match=r"'q'.*\['obs'\].*\(2, 15\)"):
            client.insert({"obs": np.zeros((2, 15), np.float32)}, {"q": 1.0}, timeout=1)
        assert client.server_info()["q"].current_size == 0


def test_named_data_must_still_name_the_signature():
    signature = {"obs": TensorSpec((15,), np.float32)}
    with serve(queue(signature=signature)) as client:
        with pytest.raises(errors.SchemaError, match="structure"):
            client.insert({"observation": OBS}, {"q": 1.0}, timeout=1)
        client.insert([OBS], {"q": 1.0}, timeout=1)  # positional data: by its leaves
        assert client.sample_batch("q", 1, timeout=1).data["obs"].shape == (1, 15)


def _insert_flipped(name):
    with shmreplay.Client(name) as client:
        writer = client.trajectory_writer(1)
        writer.append({"obs": OBS})
        writer.create_item("q", 1.0, {"obs": writer.history["obs"][-1]})  # squeezed
        writer.flush(timeout_ms=5000)
        writer.close()


def test_another_process_sees_each_items_form():
    import multiprocessing
    with serve(queue()) as client:
        client.insert({"obs": OBS}, {"q": 1.0}, timeout=1)
        child = multiprocessing.get_context("spawn").Process(
            target=_insert_flipped, args=(client.server_address,))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert _reverb_shapes(client, "q", 2) == [(1, 15), (15,)]


def test_a_checkpoint_keeps_each_items_form(tmp_path):
    with serve(queue()) as client:
        _fill(client, "q", ("window", "squeezed", "insert"))
        path = client.checkpoint(str(tmp_path / "forms.ckpt"))
    with shmreplay.Server([queue()], name=_names.unique("reverb-items"),
                          checkpoint=path) as server, shmreplay.Client(server.name) as client:
        assert _reverb_shapes(client, "q", 3) == [(1, 15), (15,), (1, 15)]

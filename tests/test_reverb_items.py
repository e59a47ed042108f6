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

"""Black-box conformance of ``Client.trajectory_writer`` / ``TrajectoryColumn``.

Restates Reverb's ``trajectory_writer_test.py`` (the mocked cases checked through a real
buffer: items are sampled back instead of read from a mock) and the TrajectoryWriter
cases of ``trajectory_writer_test.cc`` (reference §1.9, §1.15, §2.2-2.3). The last test
checks the storage claim: items share the steps they reference, and steps no live item
references are reused.

Steps carry their own index, so sampled items show exactly which steps they reference.
Tables are unsigned (the first item fixes a table's shapes). Every blocking call has a
timeout; "does not flush" is checked by a ``with`` block that returns while the rate
limiter refuses the writer's pending item.
"""

import contextlib
import gc
import os
import re
import time

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay.replay_sample import ReplaySample

from _background import Background
import _names
from _nests import sample_nests


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

@contextlib.contextmanager
def serve(*tables):
    """A running buffer holding ``tables`` and a client attached to it by name."""
    tables = tables or (shmreplay.Table.queue("q", 10),)
    with shmreplay.Server(tables=list(tables), name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield server, client
        finally:
            client.close()


@contextlib.contextmanager
def trajectory_writer(client, num_keep_alive_refs, **kwargs):
    writer = client.trajectory_writer(num_keep_alive_refs, **kwargs)
    try:
        yield writer
    finally:
        writer.close()


def queue(name="q", max_size=10):
    return shmreplay.Table.queue(name, max_size)


def size(client, table="q"):
    return client.server_info()[table].current_size


def values(column_history, n):
    """Positions ``0..n-1`` of a history leaf: the step's value, or None for no data."""
    out = []
    for i in range(n):
        try:
            column = column_history[i]
        except ValueError:          # a TrajectoryColumn over a None reference
            out.append(None)
            continue
        out.append(column.numpy().tolist())
    return out


def unbatch(nest):
    """Removes the batch dim of 1 from every leaf of a sampled nest."""
    if isinstance(nest, dict):
        return {k: unbatch(v) for k, v in nest.items()}
    if isinstance(nest, (list, tuple)):
        return type(nest)(unbatch(v) for v in nest)
    leaf = np.asarray(nest)
    assert leaf.shape[:1] == (1,)
    return leaf[0]


def one(client, table="q", timeout=1.0):
    """The data of one sampled item, with its batch dim of 1 removed."""
    s = client.sample_batch(table, batch_size=1, timeout=timeout)
    assert len(s.info.key) == 1
    return unbatch(s.data)


def settle(client, writer, table, expected, timeout=10.0):
    """Samples ``table`` one item at a time while flushing ``writer``, until ``expected``
    items came back; then checks that nothing is left in the writer or the table."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        with contextlib.suppress(errors.DeadlineExceededError):
            writer.flush(timeout_ms=50)
        with contextlib.suppress(errors.DeadlineExceededError):
            got.append(one(client, table, timeout=0.5))
    assert len(got) == expected
    writer.flush(timeout_ms=1000)
    assert size(client, table) == 0
    return got


# --------------------------------------------------------------------------------------
# construction and configure
# --------------------------------------------------------------------------------------

def test_validates_num_keep_alive_refs():
    # client_test.py::test_validates_trajectory_writer_config
    with serve() as (server, client):
        for bad in (0, -1):
            with pytest.raises(ValueError):
                client.trajectory_writer(bad)
        with trajectory_writer(client, 1) as writer:
            assert isinstance(writer, shmreplay.TrajectoryWriter)
        with trajectory_writer(client, 3, validate_items=False) as writer:
            writer.append({"x": 1})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
            writer.flush(timeout_ms=1000)
        assert one(client)["x"].tolist() == [1]


@pytest.mark.parametrize("num_keep_alive_refs, max_chunk_length, valid", [
    (1, None, True), (0, None, False), (-1, None, False), (1, 1, True),
    (1, 0, False), (1, -1, False), (5, 5, True), (4, 5, False)])
def test_configure_validates_params(num_keep_alive_refs, max_chunk_length, valid):
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        writer.append({"a": 1})
        for path in (("a",), ("unseen",)):
            if valid:
                writer.configure(path, num_keep_alive_refs=num_keep_alive_refs,
                                 max_chunk_length=max_chunk_length)
            else:
                with pytest.raises(ValueError):
                    writer.configure(path, num_keep_alive_refs=num_keep_alive_refs,
                                     max_chunk_length=max_chunk_length)
        writer.append({"a": 2})
        writer.create_item("q", 1.0, {"a": writer.history["a"][-1:]})
        writer.flush(timeout_ms=1000)
        assert one(client)["a"].tolist() == [2]


def test_configure_unseen_column_applies_once_it_appears():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        writer.append({"x": 3, "y": 2})
        writer.configure(("z",), num_keep_alive_refs=2, max_chunk_length=1)
        writer.append({"a": 4})
        writer.append({"z": 5})
        writer.append({"z": 6})
        writer.create_item("q", 1.0, {"z": writer.history["z"][-2:]})
        writer.flush(timeout_ms=1000)
        assert one(client)["z"].tolist() == [5, 6]


# --------------------------------------------------------------------------------------
# history
# --------------------------------------------------------------------------------------

def test_history_requires_append_to_be_called_before():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        with pytest.raises(RuntimeError):
            _ = writer.history


def test_append_returns_none():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        assert writer.append({"x": 1}) is None
        assert writer.append({"x": 2}, partial_step=True) is None


def test_history_contains_references_when_data_flat():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        for i in range(3):
            writer.append(i)
        assert writer.history[:].numpy().tolist() == [0, 1, 2]
        assert values(writer.history, 3) == [0, 1, 2]


def test_history_numpy_values():
    # TrajectoryColumnTest.test_numpy / test_numpy_squeeze
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        for i in range(10):
            writer.append({"a": i, "b": np.ones([3, 3], np.float64) * i})
            a = writer.history["a"][:].numpy()
            np.testing.assert_array_equal(a, np.arange(i + 1, dtype=np.int64))
            assert a.dtype == np.int64
            np.testing.assert_array_equal(
                writer.history["b"][:].numpy(),
                np.stack([np.ones([3, 3]) * x for x in range(i + 1)]))
            assert writer.history["a"][-1].numpy() == i
            assert np.shape(writer.history["a"][-1].numpy()) == ()
            if i >= 2:
                np.testing.assert_array_equal(writer.history["b"][-3:].numpy(),
                                              np.stack([np.ones([3, 3]) * x
                                                        for x in range(i - 2, i + 1)]))
            else:  # as in Reverb, a window reaching before the first step is not cut short
                with pytest.raises(ValueError, match="None"):
                    writer.history["b"][-3:]  # noqa: B018


def test_numpy_scalar_fields_read_back_as_arrays():
    # numpy scalars are kept without a copy (they are immutable); reading them back
    # still gives arrays of the field's dtype.
    with serve() as (server, client), trajectory_writer(client, 3) as writer:
        for i in range(3):
            writer.append({"r": np.float32(i) / 2, "n": np.int16(i)})
        squeezed = writer.history["r"][-1].numpy()
        assert type(squeezed) is np.ndarray and squeezed.shape == () and squeezed == 1.0
        assert squeezed.dtype == np.float32
        window = writer.history["n"][-3:].numpy()
        assert window.dtype == np.int16 and window.tolist() == [0, 1, 2]
        with pytest.raises(errors.SchemaError, match="dtype"):
            writer.append({"r": np.float64(1.0), "n": np.int16(3)})


def test_python_scalars_become_int64_float64_and_bool():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        writer.append({"i": 3, "f": 1.5, "b": True})
        history = writer.history
        assert history["i"][:].dtype == np.int64
        assert history["f"][:].dtype == np.float64
        assert history["b"][:].dtype == np.bool_
        writer.create_item("q", 1.0, {k: history[k][:] for k in ("i", "f", "b")})
        writer.flush(timeout_ms=1000)
        data = one(client)
        assert data["i"].dtype == np.int64 and data["i"].tolist() == [3]
        assert data["f"].dtype == np.float64 and data["f"].tolist() == [1.5]
        assert data["b"].dtype == np.bool_ and data["b"].tolist() == [True]


def test_history_contains_structured_references():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        writer.append({"observation": 1, "first_step": True})
        writer.append({"action": 2, "reward": 101})
        writer.append({"action": 3, "reward": 103})
        history = writer.history
        assert set(history) == {"observation", "first_step", "action", "reward"}
        assert {k: values(history[k], 3) for k in history} == {
            "action": [None, 2, 3],
            "first_step": [True, None, None],
            "observation": [1, None, None],
            "reward": [None, 101, 103],
        }
        with pytest.raises(ValueError):          # a column over a missing value
            writer.history["action"][:]


def test_history_structure_evolves_with_data():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        def mapped(n):
            history = writer.history
            return {k: values(history[k], n) for k in history}

        writer.append({"x": 1, "z": 2})
        assert mapped(1) == {"x": [1], "z": [2]}
        writer.append({"z": 3, "y": 4})
        assert mapped(2) == {"x": [1, None], "z": [2, 3], "y": [None, 4]}
        writer.append({"w": 5})
        assert mapped(3) == {"x": [1, None, None], "z": [2, 3, None],
                             "y": [None, 4, None], "w": [None, None, 5]}
        writer.append({"x": 6, "w": 7})
        assert mapped(4) == {"x": [1, None, None, 6], "z": [2, 3, None, None],
                             "y": [None, 4, None, None], "w": [None, None, 5, 7]}
        assert writer.episode_steps == 4
        # a new column still lines up with the old ones: step 3 holds x=6 and w=7
        writer.create_item("q", 1.0, {"x": writer.history["x"][-1],
                                      "w": writer.history["w"][-2:]})
        writer.flush(timeout_ms=1000)
        data = one(client)
        assert data["x"].tolist() == 6
        assert data["w"].tolist() == [5, 7]


@pytest.mark.parametrize("first, second, expected", [
    ((0,), (0, 1), ([0, 0], [None, 1])),
    ({"x": 0}, {"x": 0, "y": 1}, {"x": [0, 0], "y": [None, 1]}),
    ([0], [0, 1], [[0, 0], [None, 1]]),
], ids=["tuple", "dict", "list"])
def test_append_with_more_fields(first, second, expected):
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        writer.append(first)
        writer.append(second)
        history = writer.history
        if isinstance(expected, dict):
            assert {k: values(history[k], 2) for k in history} == expected
        else:
            assert [values(column, 2) for column in history] == list(expected)


# --------------------------------------------------------------------------------------
# partial steps
# --------------------------------------------------------------------------------------

def test_partial_append_appends_to_the_same_step():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        def mapped(n):
            history = writer.history
            return {k: values(history[k], n) for k in history}

        writer.append({"x": 1, "z": 2}, partial_step=True)
        assert mapped(1) == {"x": [1], "z": [2]}
        writer.append({"y": 4}, partial_step=True)
        assert mapped(1) == {"x": [1], "z": [2], "y": [4]}
        writer.append({"w": 5})                              # closes the step
        assert mapped(1) == {"x": [1], "z": [2], "y": [4], "w": [5]}
        writer.append({"w": 6})                              # a new step
        assert mapped(2) == {"x": [1, None], "z": [2, None], "y": [4, None], "w": [5, 6]}
        # one item from the fields of the step filled by three appends
        writer.create_item("q", 1.0, {k: writer.history[k][0] for k in ("x", "y", "z", "w")})
        writer.flush(timeout_ms=1000)
        data = one(client)
        assert {k: data[k].tolist() for k in data} == {"x": 1, "y": 4, "z": 2, "w": 5}


def test_columns_must_not_appear_more_than_once_in_the_same_step():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        writer.append({"x": 1, "z": 2}, partial_step=True)
        # an unseen column next to an already set column given as None is fine
        writer.append({"x": None, "y": 3}, partial_step=True)
        with pytest.raises(ValueError, match="has already been set in the active step") as e:
            writer.append({"x": 4})
        assert "x" in str(e.value)


# --------------------------------------------------------------------------------------
# indexing the history; sampled items
# --------------------------------------------------------------------------------------

def three_steps(writer):
    for i in (1, 2, 3):
        writer.append({"x": i})


def test_history_can_be_indexed_by_ints():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        three_steps(writer)
        writer.create_item("q", 1.0, {"first": writer.history["x"][0],
                                      "last": writer.history["x"][-1]})
        writer.flush(timeout_ms=1000)
        s = client.sample_batch("q", batch_size=1, timeout=1)
        # squeezed columns: no time dim
        assert np.asarray(s.data["first"]).tolist() == [1]
        assert np.asarray(s.data["last"]).tolist() == [3]


def test_history_can_be_indexed_by_slices():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        three_steps(writer)
        for _ in range(3):
            writer.create_item("q", 1.0, {"first_two": writer.history["x"][:2],
                                          "last_two": writer.history["x"][-2:]})
        writer.flush(timeout_ms=1000)
        s = client.sample_batch("q", batch_size=1, timeout=1)
        assert np.asarray(s.data["first_two"]).tolist() == [[1, 2]]
        assert np.asarray(s.data["last_two"]).tolist() == [[2, 3]]
        sample = next(sample_nests(client, "q", emit_timesteps=False, timeout=1))
        assert np.asarray(sample.data["first_two"]).tolist() == [1, 2]
        assert np.asarray(sample.data["last_two"]).tolist() == [2, 3]
        timesteps = next(sample_nests(client, "q", emit_timesteps=True, timeout=1))
        assert len(timesteps) == 2
        assert [(int(t.data["first_two"]), int(t.data["last_two"])) for t in timesteps] == [
            (1, 2), (2, 3)]


def test_history_can_be_indexed_by_lists():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        three_steps(writer)
        writer.create_item("q", 1.0, {"first_and_last": writer.history["x"][[0, -1]],
                                      "permuted": writer.history["x"][[1, 0, 2]]})
        writer.flush(timeout_ms=1000)
        s = client.sample_batch("q", batch_size=1, timeout=1)
        assert np.asarray(s.data["first_and_last"]).tolist() == [[1, 3]]
        assert np.asarray(s.data["permuted"]).tolist() == [[2, 1, 3]]


def obs_action_steps(writer, n=5):
    for i in range(n):
        writer.append({"obs": np.array([i, -i], np.float32), "action": i})


def test_columns_of_different_lengths_in_one_item():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        obs_action_steps(writer)
        for _ in range(3):
            writer.create_item("q", 1.0, {"obs": writer.history["obs"][-3:],
                                          "action": writer.history["action"][-2:]})
        writer.flush(timeout_ms=1000)
        s = client.sample_batch("q", batch_size=1, timeout=1)
        expected_obs = np.array([[2, -2], [3, -3], [4, -4]], np.float32)
        np.testing.assert_array_equal(s.data["obs"], expected_obs[None])
        assert np.asarray(s.data["obs"]).dtype == np.float32
        assert np.asarray(s.data["action"]).tolist() == [[3, 4]]
        assert np.asarray(s.data["action"]).dtype == np.int64
        sample = next(sample_nests(client, "q", emit_timesteps=False, timeout=1))
        np.testing.assert_array_equal(sample.data["obs"], expected_obs)
        assert np.asarray(sample.data["action"]).tolist() == [3, 4]
        # such an item cannot be split into timesteps
        with pytest.raises(ValueError, match=re.escape(
                "Can't split non timestep trajectory into timesteps.")):
            next(sample_nests(client, "q", emit_timesteps=True, timeout=1))


def test_equal_length_columns_split_into_timesteps():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        obs_action_steps(writer)
        writer.create_item("q", 1.0, {"obs": writer.history["obs"][-3:],
                                      "action": writer.history["action"][-3:]})
        writer.flush(timeout_ms=1000)
        timesteps = next(sample_nests(client, "q", emit_timesteps=True, timeout=1))
        assert isinstance(timesteps, list) and len(timesteps) == 3
        assert all(isinstance(t, ReplaySample) for t in timesteps)
        assert len({t.info for t in timesteps}) == 1
        for i, t in zip((2, 3, 4), timesteps):
            np.testing.assert_array_equal(t.data["obs"], np.array([i, -i], np.float32))
            assert int(t.data["action"]) == i


def test_squeezed_column_has_no_time_dim():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        obs_action_steps(writer)
        writer.create_item("q", 1.0, {"obs": writer.history["obs"][-1],
                                      "actions": writer.history["action"][-2:]})
        writer.append({"obs": np.array([5, -5], np.float32), "action": 5})
        writer.create_item("q", 1.0, {"obs": writer.history["obs"][-1],
                                      "actions": writer.history["action"][-2:]})
        writer.flush(timeout_ms=1000)
        s = client.sample_batch("q", batch_size=2, timeout=1)
        obs = np.asarray(s.data["obs"])
        assert obs.shape == (2, 2) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs, [[4, -4], [5, -5]])
        assert np.asarray(s.data["actions"]).tolist() == [[3, 4], [4, 5]]


def test_item_structure_is_the_trajectory_nest():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        obs_action_steps(writer, 3)
        history = writer.history
        writer.create_item("q", 1.0, (history["action"][-1],
                                      {"pair": history["obs"][-2:],
                                       "again": [history["action"][0], history["action"][:]]}))
        writer.flush(timeout_ms=1000)
        last, nest = one(client)
        assert last.tolist() == 2
        np.testing.assert_array_equal(nest["pair"], [[1, -1], [2, -2]])
        first, every = nest["again"]
        assert first.tolist() == 0
        assert every.tolist() == [0, 1, 2]


def test_one_step_shared_by_items_of_two_tables():
    with serve(queue("a"), queue("b")) as (server, client), \
            trajectory_writer(client, 5) as writer:
        for i in range(4):
            writer.append({"x": i})
            writer.create_item("a", 1.0, {"x": writer.history["x"][-1]})
            if i >= 1:
                writer.create_item("b", 2.0, {"x": writer.history["x"][-2:]})
        writer.flush(timeout_ms=1000)
        a = client.sample_batch("a", batch_size=4, timeout=1)
        b = client.sample_batch("b", batch_size=3, timeout=1)
        assert np.asarray(a.data["x"]).tolist() == [0, 1, 2, 3]
        assert np.asarray(b.data["x"]).tolist() == [[0, 1], [1, 2], [2, 3]]
        assert b.info.priority.tolist() == [2.0, 2.0, 2.0]


# --------------------------------------------------------------------------------------
# create_item validation
# --------------------------------------------------------------------------------------

def test_create_item_checks_type_of_leaves():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        writer.append({"x": 3, "y": 2})
        writer.append({"x": 3, "y": 2})
        writer.create_item("q", 1.0, {"x": writer.history["x"][0],
                                      "y": writer.history["y"][:]})
        with pytest.raises(TypeError):
            writer.create_item("q", 1.0, {"x": writer.history["x"][0],
                                          "y": writer.history["y"][:].numpy()})
        with pytest.raises(TypeError):
            writer.create_item("q", 1.0, {"x": writer.history["x"][0], "y": 2})
        with pytest.raises(TypeError, match="got None"):  # Reverb: TypeError too
            writer.create_item("q", 1.0, {"x": writer.history["x"][0], "y": None})
        with pytest.raises(TypeError, match="got None"):
            writer.create_item("q", 1.0, {"x": None})
        with pytest.raises(TypeError, match="got None"):
            writer.create_item("q", 1.0, {"x": writer.history["x"][0],
                                          "y": [writer.history["y"][:], None]})
        writer.flush(timeout_ms=1000)
        assert size(client) == 1


def test_a_first_item_too_large_for_its_own_storage_fixes_nothing():
    # Mixed columns (fields of several steps) take a row per reference; 70 such columns
    # of 2 steps overflow the rows a table of max_size 1 would get.
    fields = [f"f{i}" for i in range(70)]
    table = shmreplay.Table("q", selectors.Fifo(), selectors.Fifo(), 1, rate_limiters.MinSize(1),
                            max_steps=100)  # (without a signature: a budget of steps)
    with serve(table) as (server, client), trajectory_writer(client, 2) as writer:
        for _ in range(2):
            writer.append({field: np.float32(1) for field in fields})
        history = writer.history
        mixed = {f"c{i}": shmreplay.TrajectoryColumn(
            [history[f][-2]._refs[0], history[fields[(i + 1) % 70]][-1]._refs[0]])
            for i, f in enumerate(fields)}
        with pytest.raises(errors.SchemaError, match="140 distinct steps.*Nothing was stored"):
            writer.create_item("q", 1.0, mixed)
        assert client.server_info()["q"].signature is None  # no layout was fixed
        writer.create_item("q", 1.0, {"x": history["f0"][-2:]})  # a different item fits
        writer.flush(timeout_ms=1000)
        assert one(client)["x"].tolist() == [1.0, 1.0]


def test_create_item_errors_leave_the_table_unchanged():
    # (no general store: an item the columns refuse is refused, as with a signature)
    with serve(shmreplay.Table.queue("q", 10, arena_bytes=0)) as (server, client), \
            trajectory_writer(client, 5) as writer:
        obs_action_steps(writer, 4)
        history = writer.history
        writer.create_item("q", 1.0, {"obs": history["obs"][-2:]})
        writer.flush(timeout_ms=1000)
        assert size(client) == 1

        def unchanged():
            writer.flush(timeout_ms=1000)
            assert size(client) == 1

        for empty in ({}, [], ()):
            with pytest.raises(ValueError):
                writer.create_item("q", 1.0, empty)
            unchanged()
        with pytest.raises(errors.InvalidPriorityError):
            writer.create_item("q", float("nan"), {"obs": history["obs"][-2:]})
        unchanged()
        with pytest.raises(errors.InvalidPriorityError):
            writer.create_item("q", -0.5, {"obs": history["obs"][-2:]})
        unchanged()
        with pytest.raises(errors.TableNotFoundError) as excinfo:
            writer.create_item("no-such-table", 1.0, {"obs": history["obs"][-2:]})
        assert isinstance(excinfo.value, ValueError)     # Reverb raises ValueError here
        assert "no-such-table" in str(excinfo.value)
        unchanged()
        with pytest.raises(errors.SchemaError):          # the table's items hold obs,
            writer.create_item("q", 1.0, {"obs": history["action"][-2:]})  # not actions
        unchanged()
        with pytest.raises(errors.SchemaError):          # ... under the key obs
            writer.create_item("q", 1.0, {"action": history["action"][-2:]})
        unchanged()
        writer.create_item("q", 1.0, {"obs": history["obs"][-2:]})
        writer.flush(timeout_ms=1000)
        s = client.sample_batch("q", batch_size=10, timeout=1)
        assert len(s.info.key) == 2                      # the two valid items only
        np.testing.assert_array_equal(s.data["obs"], [[[2, -2], [3, -3]]] * 2)


def test_expired_references_are_rejected():
    with serve() as (server, client), trajectory_writer(client, 2) as writer:
        writer.append({"x": 0})
        writer.append({"x": 1})
        early = writer.history["x"][0:2]                 # steps 0 and 1, alive now
        np.testing.assert_array_equal(early.numpy(), [0, 1])
        for i in range(2, 5):
            writer.append({"x": i})
        # steps 0..2 are older than num_keep_alive_refs
        with pytest.raises(RuntimeError):
            early.numpy()
        with pytest.raises(ValueError):
            writer.create_item("q", 1.0, {"x": early})
        with pytest.raises(ValueError):
            writer.create_item("q", 1.0, {"x": writer.history["x"][-3:]})
        with pytest.raises(ValueError):
            writer.create_item("q", 1.0, {"x": writer.history["x"][0]})
        writer.flush(timeout_ms=1000)
        assert size(client) == 0
        writer.create_item("q", 1.0, {"x": writer.history["x"][-2:]})
        writer.flush(timeout_ms=1000)
        assert one(client)["x"].tolist() == [3, 4]


def test_item_cannot_mix_references_from_two_episodes():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        writer.append({"x": 0})
        writer.append({"x": 1})
        writer.end_episode(clear_buffers=False)
        writer.append({"x": 2})
        with pytest.raises(ValueError):
            writer.create_item("q", 1.0, {"x": writer.history["x"][-2:]})
        with pytest.raises(ValueError):
            writer.create_item("q", 1.0, {"a": writer.history["x"][0],
                                          "b": writer.history["x"][-1]})
        writer.flush(timeout_ms=1000)
        assert size(client) == 0
        # either side of the boundary on its own is fine
        writer.append({"x": 3})
        writer.create_item("q", 1.0, {"x": writer.history["x"][-2:]})
        writer.create_item("q", 1.0, {"x": writer.history["x"][0:2]})
        writer.flush(timeout_ms=1000)
        s = client.sample_batch("q", batch_size=2, timeout=1)
        assert np.asarray(s.data["x"]).tolist() == [[2, 3], [0, 1]]


def test_create_item_never_blocks():
    with serve(queue("q", 1)) as (server, client), trajectory_writer(client, 5) as writer:
        def five_items():
            for i in range(5):
                writer.append({"x": i})
                writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})

        Background(five_items).finish(wait=5)
        assert size(client) == 1
        got = settle(client, writer, "q", expected=5)
        assert [d["x"].tolist() for d in got] == [[i] for i in range(5)]


# --------------------------------------------------------------------------------------
# episodes
# --------------------------------------------------------------------------------------

def test_episode_steps():
    with serve() as (server, client), trajectory_writer(client, 1) as writer:
        for _ in range(3):
            assert writer.episode_steps == 0
            for i in range(1, 11):
                writer.append({"x": 3, "y": 2})
                assert writer.episode_steps == i
            writer.end_episode(timeout_ms=1000)


def test_episode_steps_partial_step():
    with serve() as (server, client), trajectory_writer(client, 1) as writer:
        for _ in range(3):
            assert writer.episode_steps == 0
            for i in range(1, 4):
                writer.append({"x": 3}, partial_step=True)
                assert writer.episode_steps == i - 1
                writer.append({"y": 2})
                assert writer.episode_steps == i
            writer.end_episode(timeout_ms=1000)


@pytest.mark.parametrize("clear_buffers", [True, False])
def test_episode_steps_reset_on_end_episode(clear_buffers):
    with serve() as (server, client), trajectory_writer(client, 1) as writer:
        assert writer.episode_steps == 0
        writer.append([1])
        assert writer.episode_steps == 1
        writer.end_episode(clear_buffers=clear_buffers, timeout_ms=1000)
        assert writer.episode_steps == 0
        writer.append([2])
        assert writer.episode_steps == 1


def test_end_episode_clear_buffers_clears_history():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        for i in range(3):
            writer.append({"x": i})
        old = writer.history["x"][-2:]
        writer.end_episode(clear_buffers=True, timeout_ms=1000)
        # Like Reverb: the structure stays, each column empty; old references expired.
        assert len(writer.history["x"]) == 0 and writer.history["x"][:].shape == (0,)
        with pytest.raises(RuntimeError, match="expired"):
            old.numpy()
        writer.append({"x": 10})
        column = writer.history["x"][:]
        assert len(column) == 1
        assert column.numpy().tolist() == [10]
        assert writer.history["x"][-1].numpy() == 10


def test_end_episode_without_clearing_keeps_history():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        for i in range(3):
            writer.append({"x": i})
        writer.end_episode(clear_buffers=False, timeout_ms=1000)
        assert writer.history["x"][-3:].numpy().tolist() == [0, 1, 2]
        writer.append({"x": 10})
        assert writer.history["x"][-1].numpy() == 10
        assert writer.history["x"][-4:-1].numpy().tolist() == [0, 1, 2]


# --------------------------------------------------------------------------------------
# flush, timeouts and the context manager
# --------------------------------------------------------------------------------------

def test_flush_checks_block_until_num_items():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        writer.flush(0)
        writer.flush(1)
        with pytest.raises(ValueError):
            writer.flush(-1)


def test_flush_block_until_num_items_leaves_that_many_pending():
    with serve(queue("q", 1)) as (server, client), trajectory_writer(client, 5) as writer:
        for i in range(3):
            writer.append({"x": i})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
        assert size(client) == 1                          # 2 items wait in the writer
        writer.flush(2, timeout_ms=100)
        with pytest.raises(errors.DeadlineExceededError):
            writer.flush(1, timeout_ms=100)
        assert one(client)["x"].tolist() == [0]
        writer.flush(1, timeout_ms=1000)                  # item 1 goes in, item 2 waits
        assert size(client) == 1
        with pytest.raises(errors.DeadlineExceededError):
            writer.flush(timeout_ms=100)
        got = settle(client, writer, "q", expected=2)
        assert [d["x"].tolist() for d in got] == [[1], [2]]


def test_timeout_on_flush():
    with serve(queue("queue", 1)) as (server, client), trajectory_writer(client, 1) as writer:
        writer.append([1])
        created = 0
        start = time.monotonic()
        with pytest.raises(errors.DeadlineExceededError):
            for _ in range(4):
                writer.create_item("queue", 1.0, writer.history[0][:])
                created += 1
                writer.flush(timeout_ms=1)
        assert time.monotonic() - start < 2.0
        assert created == 2                               # the second item did not fit
        assert size(client, "queue") == 1
        # the timed-out item stayed queued in the writer
        got = settle(client, writer, "queue", expected=created)
        assert [d.tolist() for d in got] == [[1], [1]]  # the trajectory is one column


def test_timeout_on_end_episode():
    with serve(queue("queue", 1)) as (server, client), trajectory_writer(client, 1) as writer:
        writer.append([1])
        created = 0
        with pytest.raises(errors.DeadlineExceededError):
            for _ in range(4):
                writer.create_item("queue", 1.0, writer.history[0][:])
                created += 1
                writer.end_episode(clear_buffers=False, timeout_ms=1)
        assert created == 2
        assert size(client, "queue") == 1
        settle(client, writer, "queue", expected=created)


def one_inserted_one_pending(client, writer):
    """Queue of 1: item x=0 is in the table, item x=1 waits in the writer."""
    writer.append({"x": 0})
    writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
    writer.append({"x": 1})
    writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
    assert size(client) == 1


def sample_two_in_background(client):
    """Takes x=0 at once, then waits (up to 5 s) until something inserts x=1."""
    return Background(lambda: [one(client, timeout=5)["x"].tolist() for _ in range(2)])


def test_a_refusing_table_does_not_hold_back_items_of_other_tables():
    # Reverb queues refused inserts per table; items of other tables keep going in.
    free = shmreplay.Table("u", sampler=selectors.Uniform(), remover=selectors.Fifo(),
                           max_size=100, rate_limiter=rate_limiters.MinSize(1))
    with serve(queue("q", 1), free) as (server, client), \
            trajectory_writer(client, 1) as writer:
        for i in range(5):
            writer.append({"x": i})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
            writer.create_item("u", 1.0, {"x": writer.history["x"][-1:]})
        assert size(client, "u") == 5 and size(client, "q") == 1
        assert writer.num_pending_items == 4
        got = settle(client, writer, "q", expected=5)
        assert [d["x"].tolist() for d in got] == [[0], [1], [2], [3], [4]]  # q's order kept


def test_a_flush_waiting_for_a_full_table_still_feeds_the_others():
    # A and B are queues of one. A0 and B0 go in; A1 and B1 wait in the writer. Nobody
    # samples A; a learner takes B0 and waits for B1, which must not wait behind A1.
    with serve(queue("A", 1), queue("B", 1)) as (server, client), \
            trajectory_writer(client, 1) as writer:
        for i in range(2):
            writer.append({"x": i})
            for table in "AB":
                writer.create_item(table, 1.0, {"x": writer.history["x"][-1:]})
        assert writer.num_pending_items == 2
        def learner_takes_b_late():  # after the flush below has started waiting on A
            time.sleep(0.5)
            return [one(client, "B", timeout=5)["x"].tolist() for _ in range(2)]
        learner = Background(learner_takes_b_late)
        with pytest.raises(errors.DeadlineExceededError):
            writer.flush(timeout_ms=2000)  # A1 can never go in
        assert learner.finish(wait=5) == [[0], [1]]
        assert writer.num_pending_items == 1  # A1 only
        writer.close()


def test_end_episode_flushes():
    with serve(queue("q", 1)) as (server, client), trajectory_writer(client, 5) as writer:
        one_inserted_one_pending(client, writer)
        sampler = sample_two_in_background(client)
        writer.end_episode(timeout_ms=5000)        # returns once x=1 is in the table
        assert sampler.finish(wait=10) == [[0], [1]]
        assert writer.episode_steps == 0


def test_exit_flushes_on_normal_exit():
    with serve(queue("q", 1)) as (server, client), trajectory_writer(client, 5) as writer:
        with writer as entered:
            assert entered is writer
            one_inserted_one_pending(client, writer)
            sampler = sample_two_in_background(client)
        assert sampler.finish(wait=10) == [[0], [1]]          # __exit__ flushed x=1


def test_exit_flushes_on_other_errors():
    with serve(queue("q", 1)) as (server, client), trajectory_writer(client, 5) as writer:
        with pytest.raises(ValueError, match="user code"):
            with writer:
                one_inserted_one_pending(client, writer)
                sampler = sample_two_in_background(client)
                raise ValueError("user code failed")
        assert sampler.finish(wait=10) == [[0], [1]]


def test_exit_flushes_on_bad_input_errors():
    # Reverb raises ValueError for a bad priority, and its __exit__ flushes then.
    with serve(queue("q", 1)) as (server, client), trajectory_writer(client, 5) as writer:
        with pytest.raises(errors.InvalidPriorityError):
            with writer:
                one_inserted_one_pending(client, writer)
                sampler = sample_two_in_background(client)
                writer.create_item("q", float("nan"), {"x": writer.history["x"][-1:]})
        assert sampler.finish(wait=10) == [[0], [1]]
        assert writer.num_pending_items == 0


def test_exit_does_not_flush_on_a_deadline_error():
    with serve(queue("q", 1)) as (server, client), trajectory_writer(client, 5) as writer:
        one_inserted_one_pending(client, writer)

        def leave_with_deadline_error():
            with pytest.raises(errors.DeadlineExceededError):
                with writer:
                    raise errors.DeadlineExceededError("test")

        # a flush would block: the queue is full and nobody samples
        Background(leave_with_deadline_error).finish(wait=2)
        assert size(client) == 1
        got = settle(client, writer, "q", expected=2)
        assert [d["x"].tolist() for d in got] == [[0], [1]]


def test_exit_does_not_close():
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        with writer:
            writer.append({"x": 1})
        writer.append({"x": 2})
        writer.create_item("q", 1.0, {"x": writer.history["x"][-2:]})
        writer.flush(timeout_ms=1000)
        assert one(client)["x"].tolist() == [1, 2]


# --------------------------------------------------------------------------------------
# column dtype and shape validation (TrajectoryColumnTest, real server)
# --------------------------------------------------------------------------------------

def test_dtype_of_columns_are_validated():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        data = {"scalar": 1, "nest": {"sub": 1.0, "sub_list": [1, 2, 3]}}
        writer.append(data)

        bad = {"scalar": 1.0, "nest": {"sub": 1.0, "sub_list": [1, 2, 3]}}
        with pytest.raises(errors.SchemaError) as e:
            writer.append(bad)
        assert "('scalar',)" in str(e.value)

        bad = {"scalar": 1, "nest": {"sub": 1, "sub_list": [1, 2, 3]}}
        with pytest.raises(errors.SchemaError) as e:
            writer.append(bad)
        assert "('nest', 'sub')" in str(e.value)

        bad = {"scalar": 1, "nest": {"sub": 1.0, "sub_list": [1, 2.0, 3]}}
        with pytest.raises(errors.SchemaError) as e:
            writer.append(bad)
        assert "('nest', 'sub_list', 1)" in str(e.value)

        # the rejected steps were not appended
        writer.append({"scalar": 2, "nest": {"sub": 2.0, "sub_list": [4, 5, 6]}})
        assert writer.episode_steps == 2
        assert writer.history["scalar"][:].numpy().tolist() == [1, 2]
        assert writer.history["nest"]["sub_list"][1][:].numpy().tolist() == [2, 5]


def test_shapes_of_columns_are_validated():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        def data():
            return {"scalar": 1, "nest": {"sub": np.array([1.0, 2.0]),
                                          "sub_list": [np.arange(3), np.arange(3),
                                                       np.arange(3)]}}

        writer.append(data())

        bad = data()
        bad["scalar"] = np.arange(2)
        with pytest.raises(errors.SchemaError) as e:
            writer.append(bad)
        assert "('scalar',)" in str(e.value)

        bad = data()
        bad["nest"]["sub"] = bad["nest"]["sub"].reshape([1, 2])
        with pytest.raises(errors.SchemaError) as e:
            writer.append(bad)
        assert "('nest', 'sub')" in str(e.value)

        bad = data()
        bad["nest"]["sub_list"][0] = np.arange(10)
        with pytest.raises(errors.SchemaError) as e:
            writer.append(bad)
        assert "('nest', 'sub_list', 0)" in str(e.value)

        writer.append(data())
        assert writer.episode_steps == 2
        assert writer.history["nest"]["sub"][:].shape == (2, 2)


# --------------------------------------------------------------------------------------
# TrajectoryColumn
# --------------------------------------------------------------------------------------

def test_column_len_iter_and_indexing():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        for i in range(10):
            writer.append({"a": i})
        history = writer.history["a"]
        for i in range(1, 10):
            assert len(history[-i:]) == i
        assert len(history[-1]) == 1
        assert len(history[[0, 5, 9]]) == 3
        column = history[5:]                      # steps 5..9
        assert len(list(column)) == 5
        assert column[1].numpy() == 6 and column[1].shape == ()
        assert column[1:3].numpy().tolist() == [6, 7]
        assert column[[4, 0]].numpy().tolist() == [9, 5]
        # a column made from references taken out of another column
        refs = list(column)
        reversed_column = shmreplay.TrajectoryColumn(refs[::-1], path=("a",))
        assert reversed_column.numpy().tolist() == [9, 8, 7, 6, 5]
        writer.create_item("q", 1.0, {"a": reversed_column})
        writer.flush(timeout_ms=1000)
        assert one(client)["a"].tolist() == [9, 8, 7, 6, 5]


@pytest.mark.parametrize("data", [0, 1.0, True, np.zeros(()), np.zeros(1), np.zeros((1, 1)),
                                  np.zeros((3, 4, 2))],
                         ids=["int", "float", "bool", "np()", "np(1)", "np(1,1)", "np(3,4,2)"])
def test_column_shape(data):
    expected = np.asarray(data).shape
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        for _ in range(9):
            writer.append({"a": data})
        for i in range(1, 10):
            assert writer.history["a"][-i:].shape == (i, *expected)
        assert writer.history["a"][-1].shape == expected


def test_column_shape_squeezed():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        writer.append({"a": np.arange(10).reshape(2, 5)})
        assert writer.history["a"][-1].shape == (2, 5)
        refs = list(writer.history["a"][:])
        assert shmreplay.TrajectoryColumn(refs, squeeze=True).shape == (2, 5)
        assert shmreplay.TrajectoryColumn(refs).shape == (1, 2, 5)


def test_column_dtype():
    cases = {"py_int": 0, "py_float": 1.0, "py_bool": True}
    for dtype in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                  np.uint8, np.uint16, np.uint32, np.uint64, np.complex64, np.complex128,
                  np.bool_):
        cases[np.dtype(dtype).name] = np.zeros((), dtype)
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        writer.append(cases)
        writer.append(cases)
        for name, data in cases.items():
            expected = np.asarray(data).dtype
            assert writer.history[name][:].dtype == expected, name
            assert writer.history[name][-1].dtype == expected, name
            assert writer.history[name][:].numpy().dtype == expected, name


def test_column_validates_squeeze():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        writer.append({"a": 1})
        writer.append({"a": 2})
        refs = list(writer.history["a"][:])
        assert len(refs) == 2
        column = shmreplay.TrajectoryColumn(refs[:1], squeeze=True)   # exactly one: fine
        assert column.numpy() == 1
        with pytest.raises(ValueError):
            shmreplay.TrajectoryColumn([], squeeze=True)
        with pytest.raises(ValueError):
            shmreplay.TrajectoryColumn(refs, squeeze=True)


def test_column_none_raises():
    with serve() as (server, client), trajectory_writer(client, 10) as writer:
        writer.append({"a": 1})
        refs = list(writer.history["a"][:])
        with pytest.raises(ValueError, match="None"):
            shmreplay.TrajectoryColumn([None])
        with pytest.raises(ValueError, match="None"):
            shmreplay.TrajectoryColumn([refs[0], None])


# --------------------------------------------------------------------------------------
# storage: items share steps; unreferenced steps are reused
# --------------------------------------------------------------------------------------

OBS_SIZE = 256                      # float32[256]: 1 KiB per step
SEQUENCE = 80                       # R2D2: items of the last 80 steps ...
PERIOD = 40                         # ... every 40 steps (consecutive items overlap by 40)
MAX_ITEMS = 1000


def test_items_share_steps_and_evicted_steps_are_reused():
    table = shmreplay.Table("r2d2", sampler=selectors.Uniform(), remover=selectors.Fifo(),
                            max_size=MAX_ITEMS, rate_limiter=rate_limiters.MinSize(1))
    step_bytes = OBS_SIZE * 4
    max_steps = MAX_ITEMS * PERIOD + SEQUENCE + 256         # distinct steps + writer + slack
    referenced = MAX_ITEMS * PERIOD + (SEQUENCE - PERIOD)   # 40,040: what live items need

    with serve(table) as (server, client), trajectory_writer(client, SEQUENCE) as writer:
        def run(start, stop):
            for i in range(start, stop):
                writer.append({"obs": np.full(OBS_SIZE, i, np.float32)})
                if i + 1 >= SEQUENCE and (i + 1) % PERIOD == 0:
                    writer.create_item("r2d2", 1.0, {"obs": writer.history["obs"][-SEQUENCE:]})
            writer.flush(timeout_ms=20_000)

        def check_items(first_live_item, last_live_item):
            s = client.sample_batch("r2d2", batch_size=32, timeout=5)
            obs = np.asarray(s.data["obs"])
            assert obs.shape == (32, SEQUENCE, OBS_SIZE) and obs.dtype == np.float32
            assert (obs == obs[:, :, :1]).all()
            for row in obs[:, :, 0]:
                start = int(row[0])
                assert start % PERIOD == 0
                assert first_live_item <= start // PERIOD <= last_live_item
                np.testing.assert_array_equal(row, np.arange(start, start + SEQUENCE))

        # 40,040 steps: items after steps 80, 120, ..., 40,040 -> exactly 1000 items
        run(0, 40_040)
        info = client.server_info()["r2d2"]
        assert info.current_size == MAX_ITEMS
        assert info.num_inserted == MAX_ITEMS
        # 80,000 step references, but only the 40,040 distinct steps are stored
        assert referenced <= info.num_stored_steps <= max_steps
        # The data segment's stores are reserved as the table fills, ahead of the rows
        # handed out (docs/design.md): storage_bytes (the memory held) covers the steps
        # stored and is at most the segment's size.
        size = os.stat("/dev/shm" + client._buffer.by_name["r2d2"].data_segment.name).st_size
        assert referenced * step_bytes <= info.storage_bytes <= size
        held_before = info.storage_bytes
        stored_before = info.num_stored_steps
        check_items(0, MAX_ITEMS - 1)

        # 200 more items evict the 200 oldest; their 8,000 steps must be reused
        run(40_040, 48_040)
        info = client.server_info()["r2d2"]
        assert info.current_size == MAX_ITEMS
        assert info.num_inserted == MAX_ITEMS + 200
        assert info.num_deleted == 200
        assert referenced <= info.num_stored_steps <= max_steps
        assert info.num_stored_steps <= stored_before + SEQUENCE
        assert info.storage_bytes <= held_before  # (no more than before: rows were reused)
        check_items(200, MAX_ITEMS + 199)


# --------------------------------------------------------------------------------------
# what a writer remembers about rows (regressions found by the multi-process tests)
# --------------------------------------------------------------------------------------

def test_a_row_taken_over_right_after_commit_is_not_mistaken_for_the_writers_step(monkeypatch):
    # Writer A commits an item over its step; before A returns, writer B evicts that
    # item (a table of 1) and takes over its row. A must not remember B's row as
    # holding its step: A's next item over the same step must read A's value.
    from shmreplay._writers import writing as _writing
    with serve(shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 1,
                               rate_limiters.MinSize(1))) as (server, client):
        a, b = client.trajectory_writer(2), client.trajectory_writer(2)
        real = _writing.kernels.commit_one
        armed = [False]

        def commit_one(*args):
            key = real(*args)
            if armed[0]:
                armed[0] = False
                for value in (222.0, 333.0):  # the first evicts A's item, the second reuses its row
                    b.append({"x": np.float64(value)})
                    b.create_item("t", 1.0, {"x": b.history["x"][-1:]})
            return key

        monkeypatch.setattr(_writing.kernels, "commit_one", commit_one)
        a.append({"x": np.float64(111.0)})
        armed[0] = True
        a.create_item("t", 1.0, {"x": a.history["x"][-1:]})
        a.create_item("t", 1.0, {"x": a.history["x"][-1:]})
        assert client.sample_batch("t", 1, timeout=1).data["x"].tolist() == [[111.0]]
        assert client.verify("t") == []
        a.close(), b.close()


def test_every_field_of_a_new_step_is_remembered():
    # An item over a new step with two fields writes both fields into the step's row;
    # the writer must remember both (a white-box check: forgetting one only shows as a
    # needless second copy, or, with a row taken over, as another writer's data).
    with serve(shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 10,
                               rate_limiters.MinSize(1))) as (server, client), \
            trajectory_writer(client, 2) as writer:
        writer.append({"a": 1.0, "b": 2})
        for _ in range(3):
            writer.create_item("t", 1.0, {"a": writer.history["a"][-1:],
                                          "b": writer.history["b"][-1:]})
        info = client.server_info()["t"]
        assert (info.current_size, info.num_stored_steps) == (3, 1)
        (row, _, stores_written), = writer._tables["t"].entries.values()
        assert stores_written == 0b11
        batch = client.sample_batch("t", 3, timeout=1)
        assert batch.data["a"].tolist() == [[1.0]] * 3 and batch.data["b"].tolist() == [[2]] * 3


def test_a_nested_value_after_flat_steps_becomes_new_columns():
    # Steps read without flattening (the same flat dict as before) must still notice a
    # nested value: it is a structure change, not a leaf.
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        writer.append({"x": 1, "y": 2})
        writer.append({"x": 3, "y": {"z": 4}})
        writer.append({"x": 5, "y": None})
        history = writer.history
        assert values(history["x"], 3) == [1, 3, 5]
        assert values(history["y"]["z"], 3) == [None, 4, None]


# --------------------------------------------------------------------------------------
# the short paths: whole flat steps, and a writer's usual item
# --------------------------------------------------------------------------------------
# After a few whole flat steps, ``append`` and ``create_item`` take shorter paths. These
# tests first establish them, then give input the short paths must not accept as usual.

def usual_items(writer, n=3):
    """Appends ``n`` whole steps ``{a: float32 i, b: float32 10*i}`` (continuing the
    writer's count) and creates the usual item ``{a, b: history[-2:]}`` after each."""
    start = writer.episode_steps
    for i in range(start, start + n):
        writer.append({"a": np.float32(i), "b": np.float32(10 * i)})
        if writer.episode_steps >= 2:
            writer.create_item("q", 1.0, {k: writer.history[k][-2:] for k in ("a", "b")})


def drain(client, table="q"):
    """Every item of a queue table, oldest first, as ``{field: list}``."""
    out = []
    while size(client, table):
        out.append({k: v.tolist() for k, v in one(client, table).items()})
    return out


def test_whole_steps_are_checked_copied_and_converted_like_any_step():
    with serve(queue("q", 50), queue("r", 50)) as (server, client), \
            trajectory_writer(client, 3) as writer:
        usual_items(writer)
        before = drain(client)
        assert before == [{"a": [0, 1], "b": [0, 10]}, {"a": [1, 2], "b": [10, 20]}]
        with pytest.raises(errors.SchemaError, match="'b'"):
            writer.append({"a": np.float32(3), "b": np.float64(30)})
        with pytest.raises(errors.SchemaError, match="'a'"):
            writer.append({"a": np.zeros(2, np.float32), "b": np.float32(30)})
        with pytest.raises(errors.SchemaError, match="'a'"):
            writer.append({"a": 3, "b": np.float32(30)})  # a Python int is int64
        assert writer.episode_steps == 3  # nothing appended
        # The caller's array is copied at append: changing it later changes nothing.
        with trajectory_writer(client, 3) as arrays:
            buf = np.array([1.0, 2.0], np.float32)
            for i in range(3):
                buf[:] = [i, -i]
                arrays.append({"v": buf, "w": i})
            buf[:] = 99
            arrays.create_item("r", 1.0, {"v": arrays.history["v"][-3:],
                                          "w": arrays.history["w"][-3:]})
            arrays.flush(timeout_ms=1000)
            assert drain(client, "r") == [{"v": [[0, 0], [1, -1], [2, -2]], "w": [0, 1, 2]}]


def test_a_step_with_other_keys_after_whole_steps_takes_new_columns():
    with serve(queue("q", 50)) as (server, client), trajectory_writer(client, 3) as writer:
        usual_items(writer)
        writer.append({"a": np.float32(3), "c": np.float32(-3)})  # no 'b', a new 'c'
        history = writer.history
        assert values(history["b"], 4) == [None, 10, 20, None]  # step 0 expired
        assert values(history["c"], 4) == [None, None, None, -3]
        writer.append({"a": np.float32(4), "b": np.float32(40), "c": np.float32(-4)})
        writer.append({"a": np.float32(5), "b": np.float32(50), "c": np.float32(-5)})
        assert values(writer.history["a"], 6) == [None, None, None, 3, 4, 5]  # kept 3
        assert values(writer.history["b"], 6) == [None, None, None, None, 40, 50]


def test_end_episode_clearing_buffers_resets_the_short_path():
    with serve(queue("q", 50)) as (server, client), trajectory_writer(client, 3) as writer:
        usual_items(writer)
        writer.end_episode(clear_buffers=True)
        drain(client)
        for i in (7, 8, 9):
            writer.append({"a": np.float32(i), "b": np.float32(10 * i)})
        assert values(writer.history["a"], 3) == [7, 8, 9]
        writer.create_item("q", 1.0, {k: writer.history[k][-2:] for k in ("a", "b")})
        writer.flush(timeout_ms=1000)
        assert drain(client) == [{"a": [8, 9], "b": [80, 90]}]


def test_usual_item_keys_over_other_fields_are_not_taken_as_usual():
    with serve(queue("q", 50)) as (server, client), trajectory_writer(client, 3) as writer:
        usual_items(writer)
        drain(client)
        h = writer.history
        writer.create_item("q", 1.0, {"a": h["b"][-2:], "b": h["a"][-2:]})  # swapped
        writer.flush(timeout_ms=1000)
        assert drain(client) == [{"a": [10, 20], "b": [1, 2]}]


def test_usual_item_keys_over_other_steps_are_not_taken_as_usual():
    with serve(queue("q", 50)) as (server, client), trajectory_writer(client, 3) as writer:
        usual_items(writer)
        drain(client)
        earlier = writer.history["a"][-2:]  # steps 1, 2: a window taken one step ago
        writer.append({"a": np.float32(3), "b": np.float32(30)})
        writer.create_item("q", 1.0, {"a": earlier, "b": writer.history["b"][-2:]})
        writer.flush(timeout_ms=1000)
        assert drain(client) == [{"a": [1, 2], "b": [20, 30]}]


def test_a_step_takes_a_position_in_every_column_when_it_opens():
    # As in Reverb: the open step's absent fields read as None, so windows of different
    # fields cover the same steps (Acme's SequenceAdder cuts history[k][-n-1:-1] while
    # the next observation's step is open).
    with serve(queue("q", 50)) as (server, client), trajectory_writer(client, 4) as writer:
        for t in range(3):
            writer.append({"obs": np.int64(t)}, partial_step=True)
            writer.append({"act": np.int64(100 + t)})
        writer.append({"obs": np.int64(3)}, partial_step=True)
        h = writer.history
        with pytest.raises(ValueError, match="None"):
            h["act"][-1]  # noqa: B018 - the open step has no action yet
        writer.create_item("q", 1.0, {"obs": h["obs"][-4:-1], "act": h["act"][-4:-1]})
        writer.flush(timeout_ms=1000)
        assert drain(client) == [{"obs": [0, 1, 2], "act": [100, 101, 102]}]
        writer.append({"act": np.int64(103)})  # completes step 3
        writer.append({"x": np.int64(-4)}, partial_step=True)  # a new field, in a new step
        assert values(writer.history["obs"], 5) == [None, 1, 2, 3, None]
        assert values(writer.history["x"], 5) == [None, None, None, None, -4]
        # end_episode with a step open ends that step as it is (its absent fields None)
        writer.end_episode(clear_buffers=False)
        writer.append({"obs": np.int64(5), "act": np.int64(105), "x": np.int64(-5)})
        assert values(writer.history["act"], 6) == [None, None, 102, 103, None, 105]
        assert writer.episode_steps == 1


def test_usual_item_keys_over_expired_or_two_episodes_refs_are_refused():
    with serve(queue("q", 50)) as (server, client), trajectory_writer(client, 3) as writer:
        usual_items(writer)
        old = {k: writer.history[k][-2:] for k in ("a", "b")}   # steps 1, 2
        usual_items(writer, 2)                                  # steps 3, 4: 1 expires
        with pytest.raises(ValueError, match="expired"):
            writer.create_item("q", 1.0, old)
        writer.end_episode(clear_buffers=False)
        last = writer.history["b"][-2:]                         # steps 3, 4
        writer.append({"a": np.float32(5), "b": np.float32(50)})
        with pytest.raises(ValueError, match="episode"):
            writer.create_item("q", 1.0, {"a": writer.history["a"][-2:], "b": last})
        writer.flush(timeout_ms=1000)
        assert len(drain(client)) == 4  # the usual items only


def test_a_none_field_in_a_flat_dict_is_skipped_not_shifted():
    # {'a': None, 'b': x}: None is no value (as in Reverb), and the dict must not be
    # read as a flat dict whose keys pair up with its leaves ('a' stored as 'b').
    with serve() as (server, client), trajectory_writer(client, 2) as writer:
        writer.append({"a": None, "b": np.float32(1)})
        writer.append({"a": np.float32(2), "b": np.float32(3)})
        writer.append({"a": np.float32(4), "b": np.float32(5)})
        assert sorted(writer.history) == ["a", "b"]
        writer.create_item("q", 1.0, {"a": writer.history["a"][-2:],
                                      "b": writer.history["b"][-2:]})
        writer.flush(timeout_ms=1000)
        assert drain(client) == [{"a": [2, 4], "b": [3, 5]}]


def test_a_field_that_skips_steps_expires_after_keep_newer_values():
    # As in Reverb: num_keep_alive_refs counts a field's values, not steps; history
    # shows only the last steps, but a column taken earlier stays usable.
    with serve() as (server, client), trajectory_writer(client, 2) as writer:
        writer.append({"obs": np.float32(0), "init": np.float32(42)})
        init = writer.history["init"][-1]
        for t in range(1, 4):
            writer.append({"obs": np.float32(t)})
        assert init.numpy() == 42
        writer.create_item("q", 1.0, {"init": init, "obs": writer.history["obs"][-2:]})
        writer.append({"obs": np.float32(4), "init": np.float32(43)})
        writer.append({"obs": np.float32(5), "init": np.float32(44)})  # 42 expires
        with pytest.raises(RuntimeError, match="expired"):
            init.numpy()
        with pytest.raises(ValueError, match="expired"):
            writer.create_item("q", 1.0, {"init": init})
        writer.flush(timeout_ms=1000)
        assert drain(client) == [{"init": 42, "obs": [2, 3]}]


def test_history_positions_before_the_first_step_read_as_missing_values():
    # Reverb's history: a position before the first step has no value (ValueError for a
    # column over it); one at or past the end is an IndexError.
    with serve() as (server, client), trajectory_writer(client, 5) as writer:
        for i in range(3):
            writer.append({"x": i})
        h = writer.history["x"]
        for index in (-4, slice(-5, None), slice(-4, -1), slice(-6, None, 2), [0, -4]):
            with pytest.raises(ValueError, match="None"):
                h[index]  # noqa: B018
        for index in (3, [0, 3]):
            with pytest.raises(IndexError):
                h[index]  # noqa: B018
        assert h[-3:].numpy().tolist() == [0, 1, 2] and h[0:5].numpy().tolist() == [0, 1, 2]
        assert h[-3::2].numpy().tolist() == [0, 2] and h[-3].numpy() == 0


def test_configure_names_a_namedtuple_field_as_reverb_does():
    import collections
    Step = collections.namedtuple("Step", ["obs", "act"])
    with serve() as (server, client), trajectory_writer(client, 3) as writer:
        writer.configure(("act",), num_keep_alive_refs=1)  # before the field appears
        for i in range(3):
            writer.append(Step(np.float32(i), np.int64(i)))
        assert writer.history.obs[-3:].numpy().tolist() == [0, 1, 2]
        # As in Reverb, history shows the writer's 3 steps; the field keeps 1 value.
        with pytest.raises(RuntimeError, match="expired"):
            writer.history.act[-2:].numpy()
        with pytest.raises(ValueError, match="expired"):
            writer.create_item("q", 1.0, {"act": writer.history.act[-2:]})
        writer.configure(("obs",), num_keep_alive_refs=1)  # an existing field
        writer.append(Step(np.float32(3), np.int64(3)))
        with pytest.raises(ValueError, match="expired"):
            writer.create_item("q", 1.0, {"obs": writer.history.obs[-2:]})
        writer.create_item("q", 1.0, {"obs": writer.history.obs[-1],
                                      "act": writer.history.act[-1]})
        writer.flush(timeout_ms=1000)
        assert drain(client) == [{"obs": 3, "act": 3}]


def test_none_for_a_field_the_open_step_has_is_no_second_value():
    with serve() as (server, client), trajectory_writer(client, 3) as writer:
        writer.append({"a": np.float32(1), "b": np.int64(2)}, partial_step=True)
        writer.append({"c": np.float32(3), "b": None}, partial_step=True)  # same keys' shape
        writer.append({"a": None, "b": None, "d": np.int64(4)})
        assert {k: values(writer.history[k], 1) for k in "abcd"} == {
            "a": [1], "b": [2], "c": [3], "d": [4]}


def test_history_keeps_no_data_of_a_fields_expired_values():
    # configure gives 'obs' a keep of 1 while the writer keeps 6 steps: history still
    # shows 6 positions, but only the newest obs may keep its array alive.
    import weakref
    with serve() as (server, client), trajectory_writer(client, 6) as writer:
        writer.configure(("obs",), num_keep_alive_refs=1)
        alive = []
        for i in range(6):
            writer.append({"obs": np.full(1000, i, np.float32), "t": np.int64(i)})
            alive.append(weakref.ref(writer.history["obs"][-1]._refs[0].value))
        gc.collect()
        assert [ref() is not None for ref in alive] == [False] * 5 + [True]
        with pytest.raises(ValueError, match="expired"):
            writer.create_item("q", 1.0, {"obs": writer.history["obs"][-2:]})
        assert writer.history["obs"][-2:].shape == (2, 1000)  # expired refs keep their shape


def test_a_field_given_only_as_none_has_a_column_of_none():
    # Reverb: history mirrors the appended structure; a field never given a value has
    # a column of None as long as the others.
    with serve() as (server, client):
        writer = client.trajectory_writer(3)
        writer.append({"x": 1, "y": None, "t": (None, 2)})
        writer.append({"x": 2, "y": None})
        history = writer.history
        assert sorted(history) == ["t", "x", "y"]
        assert len(history["y"]) == len(history["x"]) == 2
        assert len(history["t"][0]) == 2
        assert [history["y"].ref_at(i) for i in range(2)] == [None, None]
        with pytest.raises(ValueError, match="cannot contain any None"):
            writer.create_item("q", 1.0, history["y"][-1:])
        writer.append({"x": 3, "y": 5})  # its first value: a real column from now on
        history = writer.history
        assert len(history["y"]) == 3 and history["y"].ref_at(0) is None
        writer.create_item("q", 1.0, {"y": history["y"][-1]})
        writer.flush(timeout_ms=1000)
        writer.close()
        assert int(client.sample_batch("q", 1, timeout=1).data["y"][0]) == 5


def test_column_errors_use_reverbs_words_for_dtypes_and_shapes():
    # Reverb's messages name dtypes and shapes as TensorFlow does.
    with serve() as (server, client):
        writer = client.trajectory_writer(2)
        writer.append({"scalar": np.int64(1), "nest": {"sub": np.zeros(2, np.float32)}})
        with pytest.raises(ValueError, match=r"column \('scalar',\)\. Got double but "
                                             r"expected int64\."):
            writer.append({"scalar": 1.5})
        with pytest.raises(ValueError, match=r"column \('nest', 'sub'\)\. Got \[1,2\] which "
                                             r"is incompatible with \[2\]\."):
            writer.append({"nest": {"sub": np.zeros((1, 2), np.float32)}})
        with pytest.raises(ValueError, match=r"Got double but expected float\."):
            writer.append({"nest": {"sub": np.zeros(2, np.float64)}})
        writer.close()

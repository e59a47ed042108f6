"""Black-box conformance of the legacy ``Client.writer`` (Reverb's ``Writer``).

Restates Reverb's ``client_test.py`` writer cases and ``writer_test.cc``
(reference §1.7-1.8, §1.15, §2.2-2.3) against shmreplay's public API, plus how sequence
items and ``Client.insert`` items come back from ``sample`` / ``sample_batch``.

Steps carry their own index (``{'x': i}``), so every item can be checked to reference
exactly the right steps: an item of 3 steps created after step 7 is ``[5, 6, 7]``.
Tables here are unsigned: the first item of a table fixes its shapes. Every blocking
call has a timeout; "blocks" is checked with a thread that is still alive after 100 ms.
"""

import concurrent.futures
import contextlib
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
    with shmreplay.Server(tables=list(tables), name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield server, client
        finally:
            client.close()


def queue(name, max_size=20):
    return shmreplay.Table.queue(name, max_size)


def uniform(name, max_size=100):
    return shmreplay.Table(name=name, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                           max_size=max_size, rate_limiter=rate_limiters.MinSize(1))


def size(client, table):
    return client.server_info()[table].current_size


def drain(client, table, timeout=1.0):
    """Samples every item of a queue table (FIFO order): ReplaySample with [B, ...] leaves."""
    n = size(client, table)
    assert n > 0, f"table {table!r} is empty"
    s = client.sample_batch(table, batch_size=n, timeout=timeout)
    assert len(s.info.key) == n
    return s


def step(i):
    return {"x": np.int64(i)}


def xs(sample):
    """The sampled ``x`` column as nested Python lists."""
    return np.asarray(sample.data["x"]).tolist()


# --------------------------------------------------------------------------------------
# constructor validation (client_test.py)
# --------------------------------------------------------------------------------------

def test_writer_is_a_writer_and_validates_max_sequence_length():
    with serve(queue("q")) as (server, client):
        for bad in (0, -1):
            with pytest.raises(ValueError):
                client.writer(bad)
        writer = client.writer(1)
        assert isinstance(writer, shmreplay.Writer)
        writer.close()


def test_writer_validates_chunk_length():
    with serve(queue("q")) as (server, client):
        for ok in (None, 1, 2):
            client.writer(2, chunk_length=ok).close()
        for bad in (0, -1, 3):
            with pytest.raises(ValueError):
                client.writer(2, chunk_length=bad)


def test_writer_validates_max_in_flight_items():
    with serve(queue("q")) as (server, client):
        for ok in (None, 1, 25):
            client.writer(2, max_in_flight_items=ok).close()
        for bad in (0, -1):
            with pytest.raises(ValueError):
                client.writer(2, max_in_flight_items=bad)


# --------------------------------------------------------------------------------------
# items reference exactly the right steps
# --------------------------------------------------------------------------------------

def test_items_reference_the_last_num_timesteps_steps():
    lengths = (1, 3, 5)
    with serve(*(queue(f"t{k}") for k in lengths)) as (server, client):
        expected = {k: [] for k in lengths}
        with client.writer(5) as writer:
            for i in range(10):
                writer.append(step(i))
                for k in lengths:
                    if i + 1 >= k:
                        writer.create_item(f"t{k}", k, 1.0)
                        expected[k].append(list(range(i + 1 - k, i + 1)))
        for k in lengths:
            assert size(client, f"t{k}") == len(expected[k])
            assert xs(drain(client, f"t{k}")) == expected[k]
        # e.g. the 3-step item created after step 7
        assert [5, 6, 7] in expected[3]


def test_writer_items_in_client_test_pattern():
    # client_test.py::test_writer, one table per item length
    with serve(queue("one"), queue("two")) as (server, client):
        with client.writer(2) as writer:
            writer.append(step(0))
            writer.create_item("one", 1, 1.0)
            writer.append(step(1))
            writer.create_item("two", 2, 1.0)
            writer.append(step(2))
            writer.create_item("one", 1, 1.0)
        assert xs(drain(client, "one")) == [[0], [2]]
        assert xs(drain(client, "two")) == [[0, 1]]


def test_steps_beyond_max_sequence_length_are_dropped():
    with serve(queue("q")) as (server, client):
        with client.writer(3) as writer:
            for i in range(10):
                writer.append(step(i))
            with pytest.raises(ValueError):
                writer.create_item("q", 4, 1.0)
            writer.create_item("q", 3, 1.0)
        assert xs(drain(client, "q")) == [[7, 8, 9]]


def test_fifo_queue_returns_items_in_creation_order():
    with serve(queue("q")) as (server, client):
        with client.writer(2) as writer:
            for i in range(10):
                writer.append(step(i))
                if i >= 1:
                    writer.create_item("q", 2, 1.0)
        got = [xs(sample) for sample in
               sample_nests(client, "q", num_samples=9, emit_timesteps=False, timeout=1)]
        assert got == [[i - 1, i] for i in range(1, 10)]
        assert size(client, "q") == 0


def test_one_writer_feeds_two_tables_from_the_same_steps():
    # Reverb tutorial: every step makes a 1-step item in A and, once 3 steps exist, a
    # 3-step item in B.
    with serve(queue("A"), queue("B")) as (server, client):
        with client.writer(3) as writer:
            for i in range(8):
                writer.append({"obs": np.full(2, i, np.float32), "t": np.int64(i)})
                writer.create_item("A", 1, 1.0)
                if i >= 2:
                    writer.create_item("B", 3, 1.0)
        info = client.server_info()
        assert info["A"].current_size == 8
        assert info["B"].current_size == 6
        a, b = drain(client, "A"), drain(client, "B")
        assert np.asarray(a.data["t"]).tolist() == [[i] for i in range(8)]
        assert np.asarray(a.data["obs"]).shape == (8, 1, 2)
        assert np.asarray(b.data["t"]).tolist() == [[i - 2, i - 1, i] for i in range(2, 8)]
        np.testing.assert_array_equal(
            b.data["obs"],
            np.stack([np.stack([np.full(2, j, np.float32) for j in (i - 2, i - 1, i)])
                      for i in range(2, 8)]))
        assert np.asarray(b.data["obs"]).dtype == np.float32


def test_many_items_share_the_writer_steps_and_unreferenced_steps_are_not_stored():
    # writer_test.cc::DoesNotSendTimestepsWhenThereAreNoItems, and data stored once
    with serve(uniform("t")) as (server, client):
        with client.writer(8) as writer:
            for i in range(100):
                writer.append(step(i))
            writer.create_item("t", 8, 1.0)          # steps 92..99
            for i in range(100, 104):
                writer.append(step(i))
                writer.create_item("t", 8, 1.0)      # ... up to 96..103
            writer.flush(timeout=5)
        info = client.server_info()["t"]
        assert info.current_size == 5
        # 12 distinct steps (92..103) are referenced; items must share them (5 x 8 = 40
        # copies otherwise) and the 92 unreferenced steps must not be stored.
        assert 12 <= info.num_stored_steps <= 20
        s = client.sample_batch("t", batch_size=200, timeout=1)
        starts = {row[0] for row in xs(s)}
        assert starts <= {92, 93, 94, 95, 96}
        for row in xs(s):
            assert row == list(range(row[0], row[0] + 8))


# --------------------------------------------------------------------------------------
# append_sequence
# --------------------------------------------------------------------------------------

def test_append_sequence_behaves_like_multiple_append_calls():
    # writer_test.cc::AppendSequenceBehavesLikeMutlipleAppendCalls
    n = 6
    xs_ = np.arange(n, dtype=np.int64)
    ys = np.stack([np.full(2, i + 0.5, np.float32) for i in range(n)])
    with serve(queue("one_by_one"), queue("sequence")) as (server, client):
        with client.writer(5) as simple:
            for i in range(n):
                simple.append({"x": xs_[i], "y": ys[i]})
                if i >= 3:
                    simple.create_item("one_by_one", 4, 1.0)
        with client.writer(5) as batched:
            batched.append_sequence({"x": xs_[:4], "y": ys[:4]})
            batched.create_item("sequence", 4, 1.0)
            batched.append_sequence({"x": xs_[4:], "y": ys[4:]})
            batched.create_item("sequence", 4, 1.0)
        # the second append_sequence added 2 steps; the first item comes from the
        # first call, so compare the two items each side created after steps 3 and 5
        a, b = drain(client, "one_by_one"), drain(client, "sequence")
        assert xs(a)[0] == xs(b)[0] == [0, 1, 2, 3]
        assert xs(a)[-1] == xs(b)[-1] == [2, 3, 4, 5]
        np.testing.assert_array_equal(np.asarray(a.data["y"])[[0, -1]], b.data["y"])
        assert np.asarray(b.data["y"]).dtype == np.float32
        assert np.asarray(b.data["x"]).dtype == np.int64


def test_append_sequence_and_append_mix():
    with serve(queue("q")) as (server, client):
        with client.writer(5) as writer:
            writer.append_sequence({"x": np.arange(3, dtype=np.int64)})
            writer.append(step(3))
            writer.create_item("q", 3, 1.0)           # spans both calls
        assert xs(drain(client, "q")) == [[1, 2, 3]]


def test_append_sequence_rejects_bad_input_and_appends_nothing():
    with serve(queue("q")) as (server, client):
        with client.writer(5) as writer:
            writer.append_sequence({"x": np.arange(3, dtype=np.int64),
                                    "y": np.zeros((3, 2), np.float32)})
            with pytest.raises(ValueError):           # a scalar leaf
                writer.append_sequence({"x": np.int64(100), "y": np.zeros((1, 2), np.float32)})
            with pytest.raises(ValueError):           # leading dims differ
                writer.append_sequence({"x": np.arange(100, 103, dtype=np.int64),
                                        "y": np.full((2, 2), 100, np.float32)})
            with pytest.raises(ValueError):           # T == 0
                writer.append_sequence({"x": np.zeros(0, np.int64),
                                        "y": np.zeros((0, 2), np.float32)})
            with pytest.raises(ValueError):           # still only 3 steps appended
                writer.create_item("q", 4, 1.0)
            writer.create_item("q", 3, 1.0)
        s = drain(client, "q")
        assert xs(s) == [[0, 1, 2]]
        np.testing.assert_array_equal(s.data["y"], np.zeros((1, 3, 2), np.float32))


# --------------------------------------------------------------------------------------
# create_item errors leave the table unchanged
# --------------------------------------------------------------------------------------

def test_create_item_errors_leave_the_table_unchanged():
    with serve(queue("q")) as (server, client):
        with client.writer(4) as writer:
            with pytest.raises(ValueError):           # nothing appended yet
                writer.create_item("q", 1, 1.0)
            for i in range(3):
                writer.append(step(i))
            writer.create_item("q", 2, 1.0)           # [1, 2]
            writer.flush(timeout=1)
            assert size(client, "q") == 1

            def unchanged():
                writer.flush(timeout=1)
                assert size(client, "q") == 1

            with pytest.raises(ValueError):
                writer.create_item("q", 0, 1.0)
            unchanged()
            with pytest.raises(ValueError):
                writer.create_item("q", -1, 1.0)
            unchanged()
            with pytest.raises(ValueError):           # > max_sequence_length
                writer.create_item("q", 5, 1.0)
            unchanged()
            with pytest.raises(ValueError):           # > steps appended so far
                writer.create_item("q", 4, 1.0)
            unchanged()
            with pytest.raises(errors.InvalidPriorityError):
                writer.create_item("q", 2, float("nan"))
            unchanged()
            with pytest.raises(errors.InvalidPriorityError):
                writer.create_item("q", 2, -1.0)
            unchanged()
            with pytest.raises(errors.TableNotFoundError) as excinfo:
                writer.create_item("no-such-table", 2, 1.0)
            assert isinstance(excinfo.value, ValueError)   # Reverb raises ValueError here
            assert "no-such-table" in str(excinfo.value)
            unchanged()
            # the writer is still usable after the errors
            writer.append(step(3))
            writer.create_item("q", 2, 1.0)           # [2, 3]
        info = client.server_info()["q"]
        assert info.current_size == 2
        assert info.num_inserted == 2
        assert xs(drain(client, "q")) == [[1, 2], [2, 3]]
        with pytest.raises(errors.DeadlineExceededError):
            client.sample_batch("q", batch_size=1, timeout=0.1)


def test_writer_error_classes_match_reverb_builtins():
    assert issubclass(errors.InvalidPriorityError, ValueError)
    assert issubclass(errors.SchemaError, ValueError)
    assert issubclass(errors.ClosedError, RuntimeError)
    assert issubclass(errors.TableNotFoundError, RuntimeError)
    assert issubclass(errors.TableNotFoundError, KeyError)
    assert issubclass(errors.TableNotFoundError, ValueError)


# --------------------------------------------------------------------------------------
# schema of steps
# --------------------------------------------------------------------------------------

def test_schema_changes_between_steps_raise_schema_error_naming_the_column():
    with serve(queue("q")) as (server, client):
        with client.writer(4) as writer:
            writer.append({"pos": np.int64(0), "velocity": np.zeros(2, np.float32)})
            with pytest.raises(errors.SchemaError) as excinfo:   # dtype change
                writer.append({"pos": np.int64(90), "velocity": np.zeros(2, np.float64)})
            assert "velocity" in str(excinfo.value)
            with pytest.raises(errors.SchemaError) as excinfo:   # shape change
                writer.append({"pos": np.int64(91), "velocity": np.zeros(3, np.float32)})
            assert "velocity" in str(excinfo.value)
            with pytest.raises(errors.SchemaError) as excinfo:   # dtype change, other column
                writer.append({"pos": np.int32(92), "velocity": np.zeros(2, np.float32)})
            assert "pos" in str(excinfo.value)
            with pytest.raises(errors.SchemaError) as excinfo:   # a scalar for an array
                writer.append({"pos": np.int64(95), "velocity": np.float32(0.0)})
            assert "velocity" in str(excinfo.value) and "shape" in str(excinfo.value)
            with pytest.raises(errors.SchemaError):              # a field is missing
                writer.append({"pos": np.int64(93)})
            with pytest.raises(errors.SchemaError):              # an extra field
                writer.append({"pos": np.int64(94), "velocity": np.zeros(2, np.float32),
                               "extra": np.int64(0)})
            writer.append({"pos": np.int64(1), "velocity": np.ones(2, np.float32)})
            writer.create_item("q", 2, 1.0)
        s = drain(client, "q")
        # the rejected steps were not appended
        assert np.asarray(s.data["pos"]).tolist() == [[0, 1]]
        np.testing.assert_array_equal(s.data["velocity"],
                                      [[np.zeros(2, np.float32), np.ones(2, np.float32)]])


def test_python_scalars_are_stored_only_when_the_column_holds_them_exactly():
    with serve(queue("q")) as (server, client):
        with client.writer(4) as writer:
            writer.append({"action": np.int64(1), "done": False, "k": np.uint8(1),
                           "reward": np.float32(0.5)})
            bad = [({"action": 2.7}, "action", "float 2.7"),   # would truncate to 2
                   ({"done": 5}, "done", "int 5"),              # would become True
                   ({"k": 300}, "k", "int 300"),                # out of uint8's range
                   ({"k": -1}, "k", "int -1"),
                   ({"reward": True}, "reward", "bool True"),
                   ({"reward": 2**24 + 1}, "reward", "int 16777217"),  # rounds in float32
                   ({"reward": 10**40}, "reward", "int 1"),          # inf in float32
                   ({"reward": 1e300}, "reward", "float 1e.300: it overflows"),
                   ({"action": 5.0}, "action", "float 5.0: a Python float is never")]
            for change, column, what in bad:
                step = {"action": 2, "done": True, "k": 2, "reward": 1.5}
                step.update(change)
                with pytest.raises(errors.SchemaError, match=f"'{column}'.*Python {what}"):
                    writer.append(step)
            assert writer.num_steps == 1
            writer.append({"action": 2, "done": True, "k": 2, "reward": 1})  # exact: stored
            # a float is rounded to a float field's precision; inf and nan are floats too
            writer.append({"action": 3, "done": False, "k": 3, "reward": 0.1})
            writer.append({"action": 4, "done": False, "k": 4, "reward": float("inf")})
            assert writer.num_steps == 4
            writer.create_item("q", 4, 1.0)
        s = drain(client, "q")
        assert {k: np.asarray(v).tolist() for k, v in s.data.items()} == {
            "action": [[1, 2, 3, 4]], "done": [[False, True, False, False]],
            "k": [[1, 2, 3, 4]], "reward": [[0.5, 1.0, np.float32(0.1), np.inf]]}
        assert s.data["k"].dtype == np.uint8 and s.data["reward"].dtype == np.float32


def test_python_scalars_in_nested_steps_are_checked_the_same_way():
    with serve(queue("q")) as (server, client):
        with client.writer(2) as writer:
            writer.append((np.int32(1), [0.5]))
            with pytest.raises(errors.SchemaError, match="Python float 1.9"):
                writer.append((1.9, [0.25]))
            writer.append((7, [0.25]))
            assert writer.num_steps == 2


def test_a_table_signature_may_describe_one_step_of_the_items():
    # Reverb's legacy Writer accepts a signature per step or for the whole [T, ...] item.
    def signed(name):
        return shmreplay.Table(name, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                               max_size=10, rate_limiter=rate_limiters.MinSize(1),
                               signature={"obs": shmreplay.TensorSpec([4], np.float32)})
    with serve(signed("per_step"), signed("wrong_dtype")) as (server, client):
        with client.writer(3) as writer:
            for i in range(3):
                writer.append({"obs": np.full(4, i, np.float32)})
            writer.create_item("per_step", 3, 1.0)
            writer.create_item("per_step", 1, 1.0)  # as in Reverb: any length, per step
        with client.writer(3) as writer:
            writer.append({"obs": np.zeros(4, np.float64)})
            with pytest.raises(errors.SchemaError, match="obs"):
                writer.create_item("wrong_dtype", 1, 1.0)
        items = [s.data[0] for s in client.sample("per_step", 40, emit_timesteps=False)]
        assert {item.shape for item in items} == {(1, 4), (3, 4)}  # (misses one: 2^-39)
        assert max(items, key=len)[:, 0].tolist() == [0, 1, 2]
        assert size(client, "wrong_dtype") == 0
        assert client.server_info()["per_step"].signature["obs"].shape == (4,)


# --------------------------------------------------------------------------------------
# close and the context manager
# --------------------------------------------------------------------------------------

def test_use_after_close_raises_closed_error_and_double_close_value_error():
    with serve(queue("q")) as (server, client):
        writer = client.writer(2)
        writer.append(step(0))
        writer.create_item("q", 1, 1.0)
        writer.close()
        assert size(client, "q") == 1                 # close flushed
        with pytest.raises(errors.ClosedError):
            writer.append(step(1))
        with pytest.raises(errors.ClosedError):
            writer.append_sequence({"x": np.arange(2, dtype=np.int64)})
        with pytest.raises(errors.ClosedError):
            writer.create_item("q", 1, 1.0)
        with pytest.raises(errors.ClosedError):
            writer.flush(timeout=1)
        with pytest.raises(RuntimeError):             # Reverb raises RuntimeError
            writer.append(step(2))
        with pytest.raises(ValueError):
            writer.close()
        assert size(client, "q") == 1


def test_context_manager_closes_and_refuses_a_closed_writer():
    with serve(queue("q")) as (server, client):
        writer = client.writer(3)
        with writer as entered:
            assert entered is writer
            for i in range(3):
                writer.append(step(i))
            writer.create_item("q", 3, 1.0)
        # __exit__ = close: items are in the table and the writer is closed
        assert xs(drain(client, "q")) == [[0, 1, 2]]
        with pytest.raises(errors.ClosedError):
            writer.append(step(3))
        with pytest.raises(ValueError):
            with writer:
                pass


def test_context_manager_closes_on_an_exception():
    with serve(queue("q")) as (server, client):
        writer = client.writer(1)
        with pytest.raises(KeyError):
            with writer:
                writer.append(step(5))
                writer.create_item("q", 1, 1.0)
                raise KeyError("user code failed")
        assert xs(drain(client, "q")) == [[5]]
        with pytest.raises(errors.ClosedError):
            writer.append(step(6))


# --------------------------------------------------------------------------------------
# sampling sequence items, and interplay with Client.insert
# --------------------------------------------------------------------------------------

def nested_step(i):
    return {"obs": np.full((2, 3), i, np.float32), "a": np.int64(i),
            "nested": (np.bool_(i % 2 == 0), np.full(4, i, np.uint8))}


def fill_uniform_with_4_step_items(client, table="t", steps=10):
    with client.writer(4) as writer:
        for i in range(steps):
            writer.append(nested_step(i))
            if i >= 3:
                writer.create_item(table, 4, 1.0)


def test_sample_batch_shapes_are_batch_time_step():
    with serve(uniform("t")) as (server, client):
        fill_uniform_with_4_step_items(client)
        s = client.sample_batch("t", batch_size=16, timeout=1)
        obs, a = np.asarray(s.data["obs"]), np.asarray(s.data["a"])
        flag, bytes_ = np.asarray(s.data["nested"][0]), np.asarray(s.data["nested"][1])
        assert obs.shape == (16, 4, 2, 3) and obs.dtype == np.float32
        assert a.shape == (16, 4) and a.dtype == np.int64
        assert flag.shape == (16, 4) and flag.dtype == np.bool_
        assert bytes_.shape == (16, 4, 4) and bytes_.dtype == np.uint8
        assert s.info.key.shape == (16,)
        for b in range(16):
            start = int(a[b, 0])
            assert 0 <= start <= 6
            assert a[b].tolist() == list(range(start, start + 4))
            np.testing.assert_array_equal(obs[b], [np.full((2, 3), t, np.float32)
                                                   for t in range(start, start + 4)])
            assert flag[b].tolist() == [t % 2 == 0 for t in range(start, start + 4)]
            assert bytes_[b, :, 0].tolist() == list(range(start, start + 4))


def test_sample_emit_timesteps_gives_one_sample_per_timestep():
    with serve(uniform("t")) as (server, client):
        fill_uniform_with_4_step_items(client)
        for timesteps in sample_nests(client, "t", num_samples=5, emit_timesteps=True, timeout=1):
            assert isinstance(timesteps, list) and len(timesteps) == 4
            assert all(isinstance(ts, ReplaySample) for ts in timesteps)
            assert len({ts.info for ts in timesteps}) == 1      # all share the info
            assert type(timesteps[0].info.key) is int
            values = [int(ts.data["a"]) for ts in timesteps]
            start = values[0]
            assert values == list(range(start, start + 4))
            for t, ts in zip(values, timesteps):
                assert np.asarray(ts.data["obs"]).shape == (2, 3)
                np.testing.assert_array_equal(ts.data["obs"], np.full((2, 3), t, np.float32))
                assert np.asarray(ts.data["a"]).shape == ()
                assert bool(ts.data["nested"][0]) == (t % 2 == 0)
                assert np.asarray(ts.data["nested"][1]).tolist() == [t] * 4


def test_sample_without_emit_timesteps_gives_time_major_leaves():
    with serve(uniform("t")) as (server, client):
        fill_uniform_with_4_step_items(client)
        for sample in sample_nests(client, "t", num_samples=5, emit_timesteps=False, timeout=1):
            assert isinstance(sample, ReplaySample)
            a = np.asarray(sample.data["a"])
            assert a.shape == (4,)
            start = int(a[0])
            assert a.tolist() == list(range(start, start + 4))
            assert np.asarray(sample.data["obs"]).shape == (4, 2, 3)
            assert np.asarray(sample.data["nested"][1]).shape == (4, 4)
            assert type(sample.info.probability) is float


def test_one_step_items_keep_a_time_dim_of_one():
    with serve(queue("q")) as (server, client):
        with client.writer(1) as writer:
            for i in range(3):
                writer.append(step(i))
                writer.create_item("q", 1, 1.0)
        s = client.sample_batch("q", batch_size=1, timeout=1)
        assert np.asarray(s.data["x"]).shape == (1, 1)
        [ts] = next(sample_nests(client, "q", emit_timesteps=True, timeout=1))
        assert int(ts.data["x"]) == 1
        sample = next(sample_nests(client, "q", emit_timesteps=False, timeout=1))
        assert np.asarray(sample.data["x"]).tolist() == [2]


def test_sample_trajectory_written_with_legacy_writer():
    # client_test.py::test_sample_trajectory_written_with_legacy_writer
    with serve(queue("q")) as (server, client):
        with client.writer(3) as writer:
            for i in range(3):
                writer.append([np.int64(i), np.ones([2, 2], np.float64)])
            writer.create_item("q", 3, 1.0)
        sample = next(client.sample("q", emit_timesteps=False, timeout=1))
        first, second = sample.data
        np.testing.assert_array_equal(first, np.array([0, 1, 2]))
        np.testing.assert_array_equal(second, np.ones([3, 2, 2]))


def test_insert_and_writer_items_side_by_side():
    # Client.insert items keep their own shapes; writer items get [T, ...]
    with serve(queue("flat"), queue("seq")) as (server, client):
        with client.writer(3) as writer:
            for i in range(3):
                writer.append(np.full(3, i, np.float32))
                client.insert(np.full([3, 3], i, np.float32), priorities={"flat": 1.0},
                              timeout=1)
            writer.create_item("seq", 3, 1.0)
        client.insert(np.full([3, 3], 3, np.float32), priorities={"flat": 1.0}, timeout=1)
        info = client.server_info()
        assert info["flat"].current_size == 4
        assert info["seq"].current_size == 1

        s = client.sample_batch("flat", batch_size=2, timeout=1)
        np.testing.assert_array_equal(s.data, [np.zeros([3, 3]), np.ones([3, 3])])
        assert np.asarray(s.data).shape == (2, 3, 3)
        # Client.sample's data is Reverb's flat list of columns.
        sample = next(client.sample("flat", emit_timesteps=False, timeout=1))
        np.testing.assert_array_equal(sample.data[0], np.full([1, 3, 3], 2, np.float32))
        [ts] = next(client.sample("flat", emit_timesteps=True, timeout=1))
        np.testing.assert_array_equal(ts.data[0], np.full([3, 3], 3, np.float32))

        sample = next(client.sample("seq", emit_timesteps=False, timeout=1))
        assert len(sample.data) == 1
        np.testing.assert_array_equal(sample.data[0],
                                      [np.full(3, i, np.float32) for i in range(3)])


def test_delta_encoded_and_chunk_length_do_not_change_the_data():
    with serve(queue("plain"), queue("delta"), queue("chunked")) as (server, client):
        writers = {"plain": client.writer(4),
                   "delta": client.writer(4, delta_encoded=True),
                   "chunked": client.writer(4, chunk_length=1)}
        for table, writer in writers.items():
            with writer:
                for i in range(6):
                    writer.append({"x": np.int64(3 * i - 7), "y": np.full(2, i, np.int32)})
                    if i >= 3:
                        writer.create_item(table, 4, 1.0)
        samples = {table: drain(client, table) for table in writers}
        for table in ("delta", "chunked"):
            assert xs(samples[table]) == xs(samples["plain"]) == [
                [3 * j - 7 for j in range(i - 3, i + 1)] for i in range(3, 6)]
            np.testing.assert_array_equal(samples[table].data["y"], samples["plain"].data["y"])
            assert np.asarray(samples[table].data["y"]).dtype == np.int32


# --------------------------------------------------------------------------------------
# rate limiting: max_in_flight_items and flush(timeout)
# --------------------------------------------------------------------------------------

def test_flush_times_out_while_the_rate_limiter_refuses_then_succeeds():
    # writer_test.cc::BlocksWhenMaxInFlighItemsReached
    with serve(shmreplay.Table.queue("q", 2)) as (server, client):
        writer = client.writer(1, max_in_flight_items=1)

        def three_items():
            for i in range(3):
                writer.append(step(i))
                writer.create_item("q", 1, 1.0)

        # items 0 and 1 fit; item 2 waits in the writer (1 in flight): no call blocks
        Background(three_items).finish()
        assert size(client, "q") == 2
        with pytest.raises(errors.DeadlineExceededError):
            writer.flush(timeout=0.2)
        with pytest.raises(TimeoutError):
            writer.flush(timeout=0.05)
        assert size(client, "q") == 2                 # nothing lost, nothing extra

        # with max_in_flight_items items waiting, the next create_item blocks
        writer.append(step(3))
        blocked = Background(lambda: writer.create_item("q", 1, 1.0))
        assert blocked.still_blocked()
        assert xs(client.sample_batch("q", batch_size=1, timeout=1)) == [[0]]
        blocked.finish()                              # item 2 went in, item 3 waits
        with pytest.raises(errors.DeadlineExceededError):
            writer.flush(timeout=0.2)

        # sampling makes room: the flush succeeds
        assert xs(client.sample_batch("q", batch_size=2, timeout=1)) == [[1], [2]]
        writer.flush(timeout=2)
        assert size(client, "q") == 1
        assert xs(client.sample_batch("q", batch_size=1, timeout=1)) == [[3]]
        writer.close()
        assert client.server_info()["q"].num_inserted == 4


def test_a_refusing_table_does_not_hold_back_items_of_other_tables():
    with serve(queue("q", 1), uniform("u")) as (server, client):
        writer = client.writer(1, max_in_flight_items=None)
        for i in range(4):
            writer.append(step(i))
            writer.create_item("q", 1, 1.0)
            writer.create_item("u", 1, 1.0)
        assert size(client, "u") == 4 and size(client, "q") == 1
        got = []
        for _ in range(4):
            got.append(xs(client.sample_batch("q", 1, timeout=1.0)))
            with contextlib.suppress(errors.DeadlineExceededError):
                writer.flush(timeout=0.05)  # puts the next waiting item in
        assert got == [[[0]], [[1]], [[2]], [[3]]]  # q's order kept
        writer.close(timeout=1.0)


def test_insert_batch_into_a_writers_table_holds_nothing_while_it_waits():
    # A writer defined the table's step storage, so a batch takes one reservation per
    # item. Waiting for room with some of them held blocked everyone else, and the
    # timeout was applied per item.
    with serve(queue("q", 4)) as (server, client):
        with client.writer(1) as writer:
            for i in range(4):
                writer.append(step(i))
                writer.create_item("q", 1, 1.0)
        started = time.monotonic()
        with pytest.raises(errors.DeadlineExceededError):
            client.insert_batch({"x": np.array([[10], [11]])}, {"q": 1.0}, timeout=0.3)
        assert time.monotonic() - started < 1.5
        info = client.server_info()["q"]
        assert info.current_size == 4 and client.verify("q") == []
        assert xs(client.sample_batch("q", 1, timeout=1)) == [[0]]

        def batch_of_two():  # room for one, not two: it waits, then times out
            with pytest.raises(errors.DeadlineExceededError):
                client.insert_batch({"x": np.array([[10], [11]])}, {"q": 1.0}, timeout=1.0)
            return "timed out"
        waiting = Background(batch_of_two)
        time.sleep(0.3)
        client.insert({"x": np.array([5])}, {"q": 1.0}, timeout=0)  # the room is free
        assert waiting.finish(wait=5) == "timed out"
        assert xs(client.sample_batch("q", 1, timeout=1)) == [[1]]
        assert xs(client.sample_batch("q", 1, timeout=1)) == [[2]]
        client.insert_batch({"x": np.array([[10], [11]])}, {"q": 1.0}, timeout=1.0)
        assert xs(drain(client, "q")) == [[3], [5], [10], [11]]


def test_max_in_flight_items_none_never_blocks_create_item():
    with serve(shmreplay.Table.queue("q", 1)) as (server, client):
        writer = client.writer(1, max_in_flight_items=None)

        def five_items():
            for i in range(5):
                writer.append(step(i))
                writer.create_item("q", 1, 1.0)

        Background(five_items).finish()
        assert size(client, "q") == 1
        got = []
        for _ in range(5):
            with contextlib.suppress(errors.DeadlineExceededError):
                writer.flush(timeout=0.05)
            got += xs(client.sample_batch("q", batch_size=1, timeout=1))
        assert got == [[i] for i in range(5)]
        writer.flush(timeout=1)
        writer.close()


def test_many_threads_with_short_lived_writers():
    # client_test.py::test_multithreaded_writer (scaled down)
    with serve(uniform("t", max_size=100)) as (server, client):
        def write(i):
            with client.writer(1) as writer:
                writer.append(step(i))
                writer.create_item("t", 1, 1.0)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(write, i) for i in range(200)]
            for future in futures:
                future.result(timeout=60)
        info = client.server_info()["t"]
        assert info.current_size == 100
        assert info.num_inserted == 200
        s = client.sample_batch("t", batch_size=500, timeout=1)
        assert np.asarray(s.data["x"]).shape == (500, 1)
        assert set(np.asarray(s.data["x"]).reshape(-1).tolist()) <= set(range(200))


def test_a_none_leaf_is_no_field_and_steps_keep_the_first_structure():
    with serve(queue("q")) as (server, client):
        with client.writer(2) as writer:
            writer.append({"a": None, "b": np.float32(1)})
            writer.append({"a": None, "b": np.float32(2)})
            with pytest.raises(errors.SchemaError, match="structure"):
                writer.append({"a": np.float32(9), "b": np.float32(3)})
            writer.create_item("q", 2, 1.0)
        s = drain(client, "q")
        assert s.data["b"].tolist() == [[1, 2]] and s.data["a"] is None

"""Client API details not covered by the Reverb conformance files."""

import os
import pickle

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay._shm import peek as _peek
from shmreplay._shm import layout as L
from shmreplay.specs import TensorSpec


def _table(name="t", **kwargs):
    kwargs.setdefault("max_size", 100)
    return shmreplay.Table(name, kwargs.pop("sampler", selectors.Uniform()),
                           kwargs.pop("remover", selectors.Fifo()),
                           rate_limiter=kwargs.pop("rate_limiter", rate_limiters.MinSize(1)),
                           **kwargs)


def _segment_sizes(name):
    """``(allocated, size)`` bytes of this buffer's segments, summed."""
    infos = [os.stat(f"/dev/shm/{entry}") for entry in _peek.segments_of(name)]
    return sum(i.st_blocks * 512 for i in infos), sum(i.st_size for i in infos)


def test_a_million_slots_reserve_their_memory_before_it_is_written(buffer_name):
    # A page allocated only when first written would kill its writer with SIGBUS if
    # /dev/shm were full by then: the stores are reserved ahead of the slots handed out
    # (a first chunk of 64 MiB here; tests/test_growing_segments.py has the growth),
    # not all at once, so a large max_size costs nothing until used.
    signature = {"obs": shmreplay.TensorSpec((64,), np.float32), "r": shmreplay.TensorSpec((), np.float32)}
    with shmreplay.Server([_table(max_size=10**6, sampler=selectors.Prioritized(0.6),
                                  signature=signature)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for i in range(100):
            client.insert({"obs": np.full(64, i, np.float32), "r": 1.0}, {"t": 1.0})
        used, reserved = _segment_sizes(buffer_name)
        client.close()
    assert len(_peek.segments_of(buffer_name)) == 0
    assert reserved > 300 * 2**20  # the segments span the full capacity...
    assert 64 * 2**20 <= used < reserved - 100 * 2**20  # ...and hold a first chunk of it


class _FakeTFShape:
    def __init__(self, dims):
        self._dims = dims

    def as_list(self):
        return list(self._dims)


class _FakeTFDType:
    as_numpy_dtype = np.float32


class _FakeTFSpec:
    """Duck-types tf.TensorSpec (TensorShape.as_list, DType.as_numpy_dtype)."""

    def __init__(self, dims):
        self.shape = _FakeTFShape(dims)
        self.dtype = _FakeTFDType()


def test_signature_accepts_tensorflow_like_specs(buffer_name):
    with shmreplay.Server([_table(signature={"x": _FakeTFSpec([3])})], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        info = client.server_info()["t"]
        assert info.signature["x"] == shmreplay.TensorSpec((3,), np.float32)
        with pytest.raises(errors.SchemaError, match=r"expected dtype float32, got float64"):
            client.insert({"x": np.zeros(3)}, {"t": 1.0})
        client.close()


def test_signature_with_unknown_dimensions_is_taken_as_given():
    # A None after the first dimension: the first item settles it (test_open_dims.py).
    assert _table(signature={"x": _FakeTFSpec([3, None])}).column_specs[0].shape == (3, None)
    # A None time dimension takes writer items of any length (test_any_length.py).
    assert _table(signature={"x": _FakeTFSpec([None, 3])}).column_specs[0].shape == (None, 3)


def test_insert_returns_keys_that_sampling_reports(buffer_name):
    with shmreplay.Server([_table(), _table("u")], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        keys = client.insert({"x": np.arange(3.0)}, {"t": 1.0, "u": 2.0})
        assert set(keys) == {"t", "u"}
        assert client.sample_batch("t", 1).info.key[0] == keys["t"]
        assert client.sample_batch("u", 1).info.priority[0] == 2.0
        client.close()


def test_sample_generator_follows_reverb_shapes(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"x": np.ones((3, 3), np.float32)}, {"t": 1.0})
        steps = next(client.sample("t", emit_timesteps=True, timeout=5))
        # Reverb's data is the flat list of columns unless unpacked.
        assert len(steps) == 1 and steps[0].data[0].shape == (3, 3)
        assert isinstance(steps[0].data, list) and len(steps[0].data) == 1
        assert isinstance(steps[0].info.key, int) and isinstance(steps[0].info.probability, float)
        sample = next(client.sample("t", emit_timesteps=False, timeout=5))
        assert isinstance(sample.data, list) and sample.data[0].shape == (1, 3, 3)
        # Without a signature, Reverb's unpack_as_table_signature keeps the flat list.
        sample = next(client.sample("t", emit_timesteps=False, timeout=5,
                                    unpack_as_table_signature=True))
        assert isinstance(sample.data, list) and sample.data[0].shape == (1, 3, 3)
        assert len(list(client.sample("t", num_samples=4, timeout=5))) == 4
        client.close()


def test_none_leaves_keep_their_place_in_the_sampled_nest(buffer_name):
    # A signature's None is no column; sampled items have it where it was, and the other
    # fields under their own names (a dict with a None value is not read as a flat dict).
    # (Without a signature, a None in the first item is refused: tests/test_first_errors.py.)
    tables = [shmreplay.Table.queue("d", 10, signature={"a": None, "b": TensorSpec((), np.float32)}),
              shmreplay.Table.queue("t", 10, signature=(None, TensorSpec((), np.float32)))]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for i in range(2):
            client.insert({"a": None, "b": np.float32(i)}, {"d": 1.0})
            client.insert((None, np.float32(i)), {"t": 1.0})
        batch = client.sample_batch("d", 2, timeout=5).data
        assert batch["a"] is None and batch["b"].tolist() == [0.0, 1.0]
        first, second = client.sample_batch("t", 2, timeout=5).data
        assert first is None and second.tolist() == [0.0, 1.0]
        client.close()


def test_importance_weights_match_the_formula(buffer_name):
    with shmreplay.Server([_table(sampler=selectors.Prioritized(1.0))], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert_batch({"x": np.zeros((4, 2))}, {"t": np.array([1.0, 2.0, 3.0, 4.0])})
        sample = client.sample_batch("t", 64, timeout=5)
        n, p = sample.info.table_size.astype(float), sample.info.probability
        raw = (n * p) ** -0.5
        np.testing.assert_allclose(sample.info.importance_weights(0.5), raw / raw.max(), rtol=1e-6)
        np.testing.assert_allclose(sample.info.importance_weights(0.5, normalize=False), raw, rtol=1e-6)
        assert sample.info.importance_weights(0.5).dtype == np.float32
        client.close()


def test_insert_batch_into_scattered_free_slots_keeps_each_item_whole(buffer_name):
    # Deletes in a scrambled order leave free slots that are not one run: the batch is
    # copied row by row, not as one slice per column.
    with shmreplay.Server([_table(max_size=16)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        rows = np.arange(12, dtype=np.float64)[:, None] * np.ones(3)
        keys = client.insert_batch({"x": rows[:8]}, {"t": 1.0})["t"]
        client.mutate_priorities("t", deletes=[int(keys[i]) for i in (5, 1, 6, 2)])
        new_keys = client.insert_batch({"x": rows[8:]}, {"t": 1.0})["t"]
        engine = client._buffer.by_name["t"]
        slots = [int(k) & ((1 << int(engine.ctrl[L.C_SLOT_BITS])) - 1) for k in new_keys]
        assert slots != list(range(slots[0], slots[0] + 4))  # the scattered path ran
        expected = {int(k): row for k, row in zip(keys, rows)}
        expected.update({int(k): row for k, row in zip(new_keys, rows[8:])})
        for i in (5, 1, 6, 2):
            del expected[int(keys[i])]
        sample = client.sample_batch("t", 256, timeout=5)
        assert {int(k) for k in sample.info.key} == set(expected)
        for key, row in zip(sample.info.key, sample.data["x"]):
            np.testing.assert_array_equal(row, expected[int(key)])
        client.close()


def test_client_pickles_by_name(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        clone = pickle.loads(pickle.dumps(client))
        assert clone.server_address == server.name
        clone.insert({"x": np.zeros(1)}, {"t": 1.0})
        assert client.server_info()["t"].current_size == 1
        clone.close()
        client.close()


def test_server_cannot_be_pickled(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        with pytest.raises(TypeError, match="send server.name"):
            pickle.dumps(server)


def test_table_is_a_live_handle(buffer_name):
    table = _table(rate_limiter=rate_limiters.MinSize(2))
    assert table.info.current_size == 0  # unserved: configuration only
    with shmreplay.Server([table], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"x": np.zeros(1)}, {"t": 1.0})
        assert table.info.current_size == 1 and not table.can_sample(1)
        client.insert({"x": np.zeros(1)}, {"t": 1.0})
        assert table.can_sample(1)
        client.close()
    with pytest.raises(RuntimeError, match="not served"):
        table.can_sample(1)


def test_verify_reports_a_corrupted_sum_tree(buffer_name):
    with shmreplay.Server([_table(sampler=selectors.Prioritized(1.0))], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert_batch({"x": np.zeros((5, 1))}, {"t": 1.0})
        assert client.verify("t") == []
        trees = client._buffer.by_name["t"].arrays[4]
        trees[0][1] += 1.0  # corrupt the root
        assert client.verify("t") == ["sum-tree does not match the priorities"]
        client.close()


def test_python_scalars_fill_compatible_columns(buffer_name):
    signature = {"r": shmreplay.TensorSpec((), np.float32), "a": shmreplay.TensorSpec((), np.int32)}
    with shmreplay.Server([_table(signature=signature)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"r": 0.5, "a": 3}, {"t": 1.0})
        sample = client.sample_batch("t", 1, timeout=5)
        assert sample.data["r"].dtype == np.float32 and sample.data["r"][0] == 0.5
        assert sample.data["a"].dtype == np.int32 and sample.data["a"][0] == 3
        with pytest.raises(errors.SchemaError, match="column \\['a'\\]: expected dtype int32"):
            client.insert({"r": 0.5, "a": 2.5}, {"t": 1.0})
        client.close()


def test_import_loads_no_tensorflow_or_jax_and_compiles_nothing():
    import subprocess
    import sys
    code = ("import sys, shmreplay\n"
            "from shmreplay._shm.kernels import table\n"
            "assert 'tensorflow' not in sys.modules and 'jax' not in sys.modules\n"
            "assert not any(getattr(getattr(table, n), 'signatures', None) for n in dir(table))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_reverb_top_level_names():
    # ``import shmreplay as reverb``: Reverb's base error catches ours; its datasets are
    # at the top level (imported from shmreplay.tf on first use: tested with TF).
    assert shmreplay.ReverbError is shmreplay.ShmReplayError
    assert issubclass(shmreplay.DeadlineExceededError, shmreplay.ReverbError)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        shmreplay.NoSuchName  # noqa: B018


def test_a_namedtuple_counts_by_name_and_fields_not_by_class(buffer_name):
    # A namedtuple defined in a script's __main__ is another class in each process (and
    # in the table's unpickled copy): items of an equal namedtuple are the same items.
    import collections
    first = collections.namedtuple("Transition", "obs reward")
    again = collections.namedtuple("Transition", "obs reward")
    other = collections.namedtuple("Transition", "obs action")
    # (arena_bytes=0: refused, not stored whole in the general store; see test_general_items)
    tables = [shmreplay.Table.queue("q", 10, arena_bytes=0), shmreplay.Table.queue("w", 10)]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(first(np.zeros(2, np.float32), np.float32(1)), {"q": 1.0})
        client.insert(again(np.ones(2, np.float32), np.float32(2)), {"q": 1.0})
        with pytest.raises(errors.SchemaError, match="structure"):
            client.insert(other(np.ones(2, np.float32), np.float32(3)), {"q": 1.0})
        with client.writer(2) as writer:
            writer.append(first(np.float32(1), np.float32(1)))
            writer.append(again(np.float32(2), np.float32(2)))
            writer.create_item("w", 2, 1.0)
        assert client.sample_batch("q", 2, timeout=1).data.reward.tolist() == [1, 2]
        assert client.sample_batch("w", 1, timeout=1).data.obs.tolist() == [[1, 2]]
        client.close()

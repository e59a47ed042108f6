"""Items of any shape, dtype or structure in one table (its general store, the arena).

Reverb takes items of any shape into a table without a signature, and strings; these
tests fail on a shmreplay whose tables refuse items that differ from the first one.
"""

import multiprocessing
import os
import signal

import numpy as np
import pytest

import _general_workers as GW
import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay._shm import crash_points as _crash_points
from shmreplay._shm import layout as L
from shmreplay._shm.kernels import codes

SPAWN = multiprocessing.get_context("spawn")


def _uniform(name="t", max_size=100, **kwargs):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1), **kwargs)


def _same(got, want):
    """``got`` (a flat list of Reverb columns) is ``want``'s leaves with a time dimension."""
    from shmreplay._schema import general_codec
    leaves = general_codec.flatten(want)[1]
    assert len(got) == len(leaves)
    for column, leaf in zip(got, leaves):
        if isinstance(leaf, (bytes, str)):
            expected = np.array([leaf.encode() if isinstance(leaf, str) else leaf], object)
        else:
            expected = np.asarray(leaf)[None]
        assert column.shape == expected.shape
        if expected.dtype == object:
            assert column.dtype == object and column.tolist() == expected.tolist()
        else:
            assert column.dtype == expected.dtype
            np.testing.assert_array_equal(column, expected)


def _drain(client, count, table="t"):
    return [sample.data for sample in client.sample(table, count, emit_timesteps=False,
                                                    timeout=5)]


def test_items_of_different_shapes_and_dtypes_come_back_as_inserted(buffer_name):
    # Reverb's client_test.test_write_and_sample_different_shapes_and_dtypes: one table
    # without a signature, one item of each kind, each sampled back as inserted.
    items = [np.float32(1.5), np.ones((2, 2), np.int64), np.zeros((3,), np.uint8),
             {"a": b"bytes", "b": [np.float64(2.0), np.int32(3)]}, "text",
             np.array([[b"x", b"yz"]], object), np.array(["u1", "u22"])]
    with shmreplay.Server([shmreplay.Table.queue("t", 100)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        for item in items:
            client.insert(item, {"t": 1.0})
        for got, want in zip(_drain(client, len(items)), items):
            if isinstance(want, np.ndarray) and want.dtype.kind == "U":
                want = [s.encode() for s in want.tolist()]
                assert got[0].tolist() == [want]
                continue
            _same(got, want)
        assert client.verify("t") == []


def test_sample_batch_names_the_difference_or_stacks_items_that_agree(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("t", 100)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.zeros(3, np.float32), {"t": 1.0})  # defines the columns
        client.insert(np.zeros(5, np.float32), {"t": 1.0})
        with pytest.raises(errors.SchemaError, match=r"Table 't', column <root>.*\(3,\).*\(5,\)"):
            client.sample_batch("t", 2, timeout=5)
        client.insert(np.ones((2, 2), np.int8), {"t": 1.0})
        client.insert(np.full((2, 2), 2, np.int8), {"t": 1.0})
        batch = client.sample_batch("t", 2, timeout=5)  # two arena items that agree
        assert batch.data.shape == (2, 2, 2) and batch.data.dtype == np.int8
        assert batch.data[:, 0, 0].tolist() == [1, 2]
        client.insert({"a": np.int8(1)}, {"t": 1.0})
        client.insert(np.zeros(3, np.float32), {"t": 1.0})
        with pytest.raises(errors.SchemaError, match="different structures"):
            client.sample_batch("t", 2, timeout=5)


def test_insert_batch_of_another_shape_goes_to_the_arena(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("t", 100)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"t": 1.0})
        keys = client.insert_batch(np.arange(6, dtype=np.int64).reshape(3, 2), {"t": 1.0})
        assert len(keys["t"]) == 3
        got = _drain(client, 4)
        assert [g[0].tolist() for g in got[1:]] == [[[0, 1]], [[2, 3]], [[4, 5]]]


def test_eviction_deletes_and_max_times_sampled_free_arena_pages(buffer_name):
    # 64 KiB of arena; each item takes ~12 KiB: the remover evicts to make room, and
    # pages freed by deletes and by max_times_sampled are reused.
    tables = [_uniform("t", 1000, arena_bytes=64 << 10),
              shmreplay.Table.queue("q", 1000, arena_bytes=64 << 10)]
    with shmreplay.Server(tables, name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        for table in ("t", "q"):
            client.insert(np.float32(0), {table: 1.0})
        keys = [client.insert(np.full(1500, i, np.float64), {"t": 1.0})["t"] for i in range(40)]
        info = client.server_info()["t"]
        assert 1 < info.current_size < 10  # evicted by the remover (FIFO) to make room
        assert client.verify("t") == []
        client.mutate_priorities("t", deletes=keys[-3:])
        for i in range(40):  # a queue: each sample deletes its item, freeing its pages
            client.insert(np.full(1500, i, np.float64), {"q": 1.0})
            got = _drain(client, 1, "q")[0]
            if i == 0:
                got = _drain(client, 1, "q")[0]  # (the first item was the float32)
            assert got[0].shape == (1, 1500) and got[0][0, 0] == i
        assert client.verify("q") == [] and client.verify("t") == []


def test_an_item_larger_than_the_whole_arena_is_refused_and_the_table_kept(buffer_name):
    with shmreplay.Server([_uniform(arena_bytes=4096)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"t": 1.0})
        client.insert(np.zeros(10), {"t": 1.0})
        with pytest.raises(errors.ArenaFullError, match=r"Table 't'.*arena_bytes"):
            client.insert(np.zeros(1000), {"t": 1.0})
        assert client.server_info()["t"].current_size == 2
        assert client.verify("t") == []


def test_a_table_whose_arena_is_off_refuses_other_shapes_as_before(buffer_name):
    with shmreplay.Server([_uniform(arena_bytes=0)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"t": 1.0})
        with pytest.raises(errors.SchemaError, match="expected shape"):
            client.insert(np.zeros(3, np.float32), {"t": 1.0})


def test_reset_forgets_the_layout_and_the_arena_items(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("t", 10)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"t": 1.0})
        client.insert(b"bytes", {"t": 1.0})
        engine = client._engine("t")
        assert engine.ctrl[L.C_ARENA_ITEMS] == 1
        client.reset("t")
        client.insert(np.zeros(4, np.int8), {"t": 1.0})  # a new layout
        assert engine.ctrl[L.C_ARENA_ITEMS] == 0
        assert _drain(client, 1)[0][0].shape == (1, 4)


def test_a_hostile_arena_item_raises_a_typed_error(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("t", 10)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"t": 1.0})
        key = client.insert({"a": np.arange(4.0)}, {"t": 1.0})["t"]
        arena = client._engine("t").arena
        slot = key & ((1 << int(client._engine("t").ctrl[L.C_SLOT_BITS])) - 1)
        start = int(arena.extents[slot, L.X_PAGE]) * L.ARENA_PAGE
        raw = bytes(arena.data[start:start + int(arena.extents[slot, L.X_BYTES])])
        # A leaf whose offset and length point past the item.
        hostile = raw.replace(b'"<f8",[4],0,32]', b'"<f8",[4],0,9999999]')
        assert hostile != raw and len(hostile) == len(raw) + 5
        arena.data[start:start + len(hostile)] = np.frombuffer(hostile, np.uint8)
        arena.extents[slot, L.X_BYTES] = len(hostile)
        _drain(client, 1)  # the float32
        with pytest.raises(errors.CorruptItemError, match=f"Table 't': item {key}"):
            _drain(client, 1)
        # A header length past the end, and garbage.
        from shmreplay._schema import general_codec
        for bad in (raw[:4] + (10 ** 6).to_bytes(4, "little") + raw[8:], b"\xff" * 64,
                    raw.replace(b'"<f8"', b'"|O8"'), raw[:-8]):
            with pytest.raises(errors.CorruptItemError):
                general_codec.decode(bad, "t", 1)


def test_verify_reports_an_extent_that_is_not_its_slots(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("t", 10)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"t": 1.0})
        key = client.insert(b"x" * 600, {"t": 1.0})["t"]
        engine = client._engine("t")
        slot = key & ((1 << int(engine.ctrl[L.C_SLOT_BITS])) - 1)
        engine.arena.owners[int(engine.arena.extents[slot, L.X_PAGE]) + 1] = slot + 2
        assert any("arena" in problem for problem in client.verify("t"))


def test_another_process_inserts_items_of_many_kinds_that_this_one_samples(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("t", 100)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        child = SPAWN.Process(target=GW.insert_heterogeneous, args=(server.name, "t", 12))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        for index, got in enumerate(_drain(client, 12)):
            _same(got, GW.heterogeneous(index))
        assert client.verify("t") == []


@pytest.mark.parametrize("where", ["reserve_kernel", "mid_write"])
def test_an_inserter_killed_inside_an_arena_insert_leaves_nothing_torn(buffer_name, where):
    table = _uniform(arena_bytes=32 << 10)
    with shmreplay.Server([table], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"t": 1.0})
        client.insert({"name": b"before", "values": np.full(300, 1.0)}, {"t": 1.0})
        ready, go = SPAWN.Event(), SPAWN.Event()
        child = SPAWN.Process(target=GW.insert_arena_items_until_killed,
                              args=(server.name, "t", ready, go, where == "mid_write"))
        child.start()
        try:
            assert ready.wait(60)
            engine = client._engine("t")
            if where == "reserve_kernel":
                _crash_points.arm(engine, codes.STOP_ARENA_RESERVED, child.pid)
            go.set()
            assert _crash_points.wait_stopped(child.pid, 30)
            _crash_points.disarm(engine)
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
        finally:
            if child.is_alive():
                child.kill()
                child.join(10)
        assert client.verify("t") == []  # (frees the dead writer's slot and pages)
        assert engine.ctrl[L.C_PENDING] == 0
        # Every item that can be sampled decodes whole; the torn one never appears.
        for got in _drain(client, 30):
            if len(got) == 2:
                assert got[0].tolist() in ([b"before"], [b"torn?"])
                assert (got[1] == got[1].flat[0]).all()
        # The arena is usable: pages of the dead writer's item are taken again.
        for i in range(200):
            client.insert({"name": b"after", "values": np.full(300, 2.0)}, {"t": 1.0})
        assert client.verify("t") == []


def test_checkpoint_round_trip_keeps_arena_items(buffer_name, tmp_path):
    items = [np.float32(1.0), b"bytes", np.ones((2, 3), np.int16), {"k": "text"},
             np.float32(2.0)]
    path = str(tmp_path / "ckpt")
    with shmreplay.Server([shmreplay.Table.queue("t", 100)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        for item in items:
            client.insert(item, {"t": 1.0})
        written = client.checkpoint(path)
    restored_name = buffer_name + "-r"
    with shmreplay.Server([shmreplay.Table.queue("t", 100)], name=restored_name,
                          checkpoint=written) as server, \
            shmreplay.Client(server.name) as client:
        assert client.verify("t") == []
        for got, want in zip(_drain(client, len(items)), items):
            _same(got, want)
        client.insert(np.zeros(7), {"t": 1.0})  # the restored arena takes new items
        assert _drain(client, 1)[0][0].shape == (1, 7)


def test_one_insert_into_two_tables_all_or_none_when_one_takes_it_in_its_arena(buffer_name):
    tables = [shmreplay.Table.queue("odd", 10, arena_bytes=4096),
              shmreplay.Table.queue("signed", 10, signature=np.zeros(2, np.int64))]
    with shmreplay.Server(tables, name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"odd": 1.0})
        keys = client.insert(np.arange(2), {"odd": 1.0, "signed": 1.0})  # arena + columns
        assert set(keys) == {"odd", "signed"}
        with pytest.raises(errors.ArenaFullError):  # too large for "odd": neither takes it
            client.insert_batch(np.zeros((3, 600), np.int64), {"odd": np.ones(3)})
        with pytest.raises(errors.SchemaError):  # "signed" refuses it: "odd" does not keep it
            client.insert(np.arange(3), {"odd": 1.0, "signed": 1.0})
        info = client.server_info()
        assert info["odd"].current_size == 2 and info["signed"].current_size == 1
        assert client.verify("odd") == [] and client.verify("signed") == []
        # A batch whose items fit one by one but not together: the remover evicts to
        # make room (as for any insert), and the slots already reserved are given back.
        with pytest.raises(errors.ArenaFullError):
            client.insert_batch(np.zeros((3, 190), np.int64), {"odd": np.ones(3)})
        assert client._engine("odd").ctrl[L.C_PENDING] == 0
        assert client.verify("odd") == []
        client.insert_batch(np.zeros((2, 190), np.int64), {"odd": np.ones(2)})


def test_a_table_with_a_signature_keeps_its_sampling_path_untouched(buffer_name):
    tables = [shmreplay.Table.queue("signed", 10, signature=np.zeros(2, np.int64))]
    with shmreplay.Server(tables, name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.arange(2), {"signed": 1.0})
        engine = client._engine("signed")
        assert engine.arena is None and "sample" not in engine.__dict__


def test_a_signature_and_an_arena_are_refused_together():
    with pytest.raises(ValueError, match=r"Table 'q': arena_bytes .* signature"):
        shmreplay.Table.queue("q", 10, signature=np.zeros(2), arena_bytes=4096)
    assert shmreplay.Table.queue("q", 10, signature=np.zeros(2), arena_bytes=0).arena_bytes == 0


def test_random_sizes_deletes_and_evictions_keep_every_item_whole(buffer_name):
    rng = np.random.default_rng(7)
    with shmreplay.Server([_uniform("t", 50, arena_bytes=32 << 10)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert(np.float32(0), {"t": 1.0})
        values = {}
        for i in range(400):
            size = int(rng.integers(1, 600))
            key = client.insert({"v": np.full(size, i, np.int32)}, {"t": 1.0})["t"]
            values[key] = (i, size)
            if rng.random() < 0.2:
                client.mutate_priorities("t", deletes=[int(rng.choice(list(values)))])
        assert client.verify("t") == []
        checked = 0
        for sample in client.sample("t", 100, emit_timesteps=False, timeout=5):
            if sample.info.key in values and len(sample.data) == 1 and sample.data[0].ndim == 2:
                i, size = values[sample.info.key]
                assert sample.data[0].shape == (1, size) and (sample.data[0] == i).all()
                checked += 1
        assert checked > 50


def test_a_first_item_of_strings_makes_a_table_whose_items_all_go_to_the_arena(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("t", 10)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"text": "first", "n": np.int8(1)}, {"t": 1.0})
        client.insert(np.zeros(2), {"t": 1.0})
        got = _drain(client, 2)
        _same(got[0], {"text": "first", "n": np.int8(1)})
        _same(got[1], np.zeros(2))

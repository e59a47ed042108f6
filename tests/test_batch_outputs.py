"""Reused results of small sampled batches (``shmreplay._engine.batch_outputs``).

A result is refilled only when nothing outside holds any part of it; these tests hold
each part in turn and check that what they hold never changes, and that a result
nobody holds is reused.
"""

import contextlib
import gc
import threading

import numpy as np
import pytest

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay._engine import batch_outputs as _batch_outputs
from shmreplay._shm import peek as _peek
import _names

CAPACITY = 64


def _item(key):
    """An item whose every leaf is derived from ``key``, so a sample can be checked."""
    return {"obs": np.full((3, 2), key, np.float32), "action": np.int64(key),
            "flag": np.bool_(key % 2), "empty": np.zeros((0,), np.float64)}


def _check(batch):
    """Each row holds the item its key says (whatever was sampled)."""
    keys = batch.data["action"]
    assert (batch.data["obs"] == keys[:, None, None].astype(np.float32)).all()
    assert (batch.data["flag"] == (keys % 2).astype(bool)).all()
    assert batch.data["empty"].shape == (len(keys), 0)


@pytest.fixture()
def client():
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), CAPACITY,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=_names.unique("results")) as server:
        client = shmreplay.Client(server.name)
        for key in range(CAPACITY):
            client.insert(_item(key), {"t": 1.0})
        yield client
        client.close()


@contextlib.contextmanager
def _small_table(tag, items):
    """A buffer with one uniform table of 8 slots holding ``items``, and a client."""
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 8,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=_names.unique(tag)) as server:
        with shmreplay.Client(server.name) as client:
            for item in items:
                client.insert(item, {"t": 1.0})
            yield client


def _pool(client, batch_size):
    return client._engine("t")._results._pools[batch_size]


def _snapshot(batch):
    return ([np.array(field, copy=True) for field in batch.info],
            {k: np.array(v, copy=True) for k, v in batch.data.items()})


def _unchanged(batch, snapshot):
    info, data = snapshot
    return (all((a == b).all() for a, b in zip(batch.info, info))
            and all((batch.data[k] == v).all() for k, v in data.items()))


def test_sampled_rows_hold_the_items_their_keys_name(client):
    action_of = {}
    for batch_size in (1, 2, 7, 32):
        for _ in range(20):
            batch = client.sample_batch("t", batch_size)
            assert batch.info.key.dtype == np.uint64 and batch.info.key.shape == (batch_size,)
            assert batch.info.times_sampled.dtype == np.int32
            assert batch.data["obs"].shape == (batch_size, 3, 2)
            _check(batch)
            for key, action in zip(batch.info.key.tolist(), batch.data["action"].tolist()):
                assert action_of.setdefault(key, action) == action  # info and data rows agree
    assert len(set(action_of.values())) == len(action_of)


def test_a_result_nobody_holds_is_reused(client):
    for _ in range(50):
        client.sample_batch("t", 4)
    assert len(_pool(client, 4)) == 1


@pytest.mark.parametrize("hold", ["batch", "info", "key", "data", "leaf", "row view",
                                  "memoryview"])
def test_whatever_part_the_caller_holds_never_changes(client, hold):
    first = client.sample_batch("t", 8)
    snapshot = _snapshot(first)
    held = {"batch": lambda b: b, "info": lambda b: b.info, "key": lambda b: b.info.key,
            "data": lambda b: b.data, "leaf": lambda b: b.data["obs"],
            "row view": lambda b: b.data["obs"][3:5],
            "memoryview": lambda b: memoryview(b.data["action"])}[hold](first)
    kept = first if hold in ("batch",) else None
    first = None
    for _ in range(20):
        batch = client.sample_batch("t", 8)
        _check(batch)
    if hold == "batch":
        assert _unchanged(kept, snapshot)
    elif hold == "info":
        assert all((a == b).all() for a, b in zip(held, snapshot[0]))
    elif hold == "key":
        assert (held == snapshot[0][0]).all()
    elif hold == "data":
        assert all((held[k] == v).all() for k, v in snapshot[1].items())
    elif hold == "leaf":
        assert (held == snapshot[1]["obs"]).all()
    elif hold == "row view":
        assert (held == snapshot[1]["obs"][3:5]).all()
    else:
        assert (np.asarray(held) == snapshot[1]["action"]).all()


def test_batches_kept_in_a_list_stay_intact_beyond_the_pool(client):
    kept = [client.sample_batch("t", 4) for _ in range(3 * _batch_outputs.PER_SIZE)]
    snapshots = [_snapshot(batch) for batch in kept]
    for _ in range(10):
        client.sample_batch("t", 4)
    assert all(_unchanged(b, s) for b, s in zip(kept, snapshots))
    assert len(_pool(client, 4)) <= _batch_outputs.PER_SIZE
    ids = {id(batch.data["obs"]) for batch in kept}
    assert len(ids) == len(kept)


def test_the_returned_dict_is_the_callers_to_change(client):
    batch = client.sample_batch("t", 2)
    batch.data["extra"] = 1
    del batch.data["obs"]
    del batch
    again = client.sample_batch("t", 2)
    assert sorted(again.data) == ["action", "empty", "flag", "obs"]
    _check(again)


def test_large_batches_take_the_general_path(client):
    engine = client._engine("t")
    row = sum(np.dtype(s.dtype).itemsize * int(np.prod(s.shape)) for s in engine.column_specs)
    big = _batch_outputs.REUSE_BELOW // row + 1
    batch = client.sample_batch("t", big)
    _check(batch)
    assert engine._results._pools[big] is None


def test_a_learner_loop_alternates_between_two_results(client):
    batch = client.sample_batch("t", 16)
    addresses = set()
    for _ in range(30):
        previous = batch
        batch = client.sample_batch("t", 16)  # ``previous`` still held here
        assert not np.shares_memory(batch.data["obs"], previous.data["obs"])
        addresses.add(batch.data["obs"].ctypes.data)
        _check(batch)
    assert len(addresses) == 2


def test_a_batch_kept_for_good_leaves_the_other_on_the_quick_path(client, monkeypatch):
    kept = client.sample_batch("t", 16)  # (a loop that keeps its first batch, to log it)
    kept_obs = kept.data["obs"].copy()
    slow = []
    claim_slow = _batch_outputs.ResultPool._claim_slow
    monkeypatch.setattr(_batch_outputs.ResultPool, "_claim_slow",
                        lambda self, size: slow.append(size) or claim_slow(self, size))
    for _ in range(30):
        batch = client.sample_batch("t", 16)
        assert not np.shares_memory(batch.data["obs"], kept.data["obs"])
        _check(batch)
    # (two more results are made: the loop also holds its previous batch during a call)
    assert len(slow) <= 2, len(slow)
    np.testing.assert_array_equal(kept.data["obs"], kept_obs)


def test_threads_sharing_a_client_never_get_each_others_rows(client):
    failures = []
    barrier = threading.Barrier(3, timeout=30)

    def learner():
        try:
            barrier.wait()
            for _ in range(300):
                batch = client.sample_batch("t", 4)
                snapshot = _snapshot(batch)
                for _ in range(3):
                    _check(client.sample_batch("t", 4))
                if not _unchanged(batch, snapshot):
                    failures.append("a held batch changed")
        except Exception as exc:  # noqa: BLE001
            failures.append(repr(exc))

    threads = [threading.Thread(target=learner) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []


def test_nested_items_are_rebuilt_for_every_result():
    items = [{"obs": {"a": np.full(2, key, np.int32)}, "pair": (np.int64(key), np.float32(key))}
             for key in range(8)]
    with _small_table("results-nest", items) as client:
        first = client.sample_batch("t", 3)
        inner = first.data["obs"]
        values = inner["a"].copy()
        first = None
        gc.collect()
        for _ in range(10):
            batch = client.sample_batch("t", 3)
            assert batch.data["obs"] is not inner
            assert (batch.data["obs"]["a"][:, 0] == batch.data["pair"][0]).all()
        assert (inner["a"] == values).all()


_Pair = __import__("collections").namedtuple("_Pair", ["key", "half"])


@pytest.mark.parametrize("nest", ["tuple", "namedtuple", "nested dict", "bare array"])
def test_the_data_of_any_nest_held_alone_never_changes(nest):
    # The caller keeps only ``batch.data``: a nest (not a flat dict) that holds every
    # leaf of the result. Its arrays must not be refilled by later batches.
    make = {"tuple": lambda k: (np.int64(k), np.float32(k / 2)),
            "namedtuple": lambda k: _Pair(np.int64(k), np.float32(k / 2)),
            "nested dict": lambda k: {"a": {"key": np.int64(k)}, "b": [np.float32(k / 2)]},
            "bare array": lambda k: np.full(3, k, np.int64)}[nest]
    with _small_table("results-held", [make(k) for k in range(8)]) as client:
        kept = client.sample_batch("t", 4).data
        values = [leaf.copy() for leaf in shmreplay.specs.optree.tree_leaves(kept)]
        for _ in range(20):
            client.sample_batch("t", 4)
        assert all((leaf == value).all() for leaf, value in
                   zip(shmreplay.specs.optree.tree_leaves(kept), values))


def test_a_queue_with_fewer_items_returns_a_short_batch_and_deletes_them():
    table = shmreplay.Table.queue("q", 8)
    with shmreplay.Server([table], name=_names.unique("results-queue")) as server:
        with shmreplay.Client(server.name) as client:
            for key in range(3):
                client.insert({"x": np.int64(key)}, {"q": 1.0})
            batch = client.sample_batch("q", 5, timeout=1)
            assert batch.data["x"].tolist() == [0, 1, 2]
            assert batch.info.key.shape == (3,)
            assert client.server_info()["q"].current_size == 0
            client.insert({"x": np.int64(9)}, {"q": 1.0})
            assert client.sample_batch("q", 1, timeout=1).data["x"].tolist() == [9]


def test_a_layout_past_its_block_is_refused_before_anything_is_drawn(client):
    # The kernel copies with raw addresses, so it checks the layout's bounds first.
    results = client._engine("t")._results
    outputs = results.claim(4)
    outputs.layout[-1] = outputs.block.size  # a row size no block of 4 rows can hold
    results.release(outputs)
    sampled = client.server_info()["t"].num_sampled
    with pytest.raises(shmreplay.errors.BufferBrokenError, match="corrupt"):
        client.sample_batch("t", 4)
    assert client.server_info()["t"].num_sampled == sampled


def _mappings_of(name):
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip().endswith("/" + name))


def test_a_closed_client_unmaps_the_data_it_sampled_from():
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 8,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=_names.unique("results-close")) as server:
        with shmreplay.Client(server.name) as writer:
            writer.insert({"x": np.float32(1.0)}, {"t": 1.0})
        segment = _peek.segments_of(server.name)[1]  # table 0's data segment
        gc.collect()
        before = _mappings_of(segment)
        client = shmreplay.Client(server.name)
        client.sample_batch("t", 4)
        client.update_priorities("t", client.sample_batch("t", 2).info.key, np.ones(2))
        assert _mappings_of(segment) == before + 1
        client.close()
        del client  # no reference cycle keeps it: no gc.collect() needed
        assert _mappings_of(segment) == before


def test_a_whole_number_batch_size_of_another_type_is_accepted(client):
    assert client.sample_batch("t", np.int64(3)).data["obs"].shape == (3, 3, 2)
    assert client.sample_batch("t", 2.0).data["obs"].shape == (2, 3, 2)


def test_a_nest_with_as_many_entries_as_leaves_is_not_taken_for_a_flat_dict():
    # {"a": {"b": x}, "c": y} has two top-level entries and two leaves: its values are
    # not its leaves, and telling so must not compare arrays with dicts.
    items = [{"a": {"b": np.full(3, key, np.int32)}, "c": np.full(3, key)} for key in range(8)]
    with _small_table("results-nest2", items) as client:
        for _ in range(3):
            batch = client.sample_batch("t", 4)
            assert (batch.data["a"]["b"] == batch.data["c"]).all()

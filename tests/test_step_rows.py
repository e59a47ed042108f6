"""Step storage under random operations: row reference counts, sharing and recovery.

Drives one table's engine directly (``reserve_item`` / commit / cancel / sample /
mutate / reset), the way writers do, on a real buffer. Every stored step holds its own
id, so a sampled item shows exactly which steps it reads. After every operation
``verify`` must find nothing wrong (reference counts equal the references items hold,
the free-row stack holds exactly the other rows), and a rebuild from slot states (the
crash-recovery path) must reproduce the counts.
"""


import numpy as np
import pytest

import shmreplay
from shmreplay._shm import layout as L
from shmreplay import errors, rate_limiters, selectors, specs
from shmreplay._shm import procs as _procs
from shmreplay._schema import storage as _storage
from shmreplay._shm.kernels import rows as row_kernels
from shmreplay._shm.kernels import table as kernels
import _names

STEP = specs.TensorSpec((), np.int64)


def _storage_for(lengths, sources):
    cells = [STEP] * len(lengths)
    signature = {f"c{i}": specs.TensorSpec((n,), np.int64) for i, n in enumerate(lengths)}
    return _storage.step_storage(signature, cells, lengths, [False] * len(lengths), sources)


class StepTable:
    """One table with step storage and a writer-like memory of where steps went."""

    def __init__(self, server, client, name, storage):
        self.client = client
        self.engine = client._buffer.by_name[name]
        self.engine.define_storage(storage)
        self.storage = storage
        self.where = {}      # step id -> (row, generation) of its last write
        self.items = {}      # key -> list per column of step ids

    def redefine(self):
        """After ``reset``: the table's layout again (a new data segment, empty rows)."""
        self.engine.define_storage(self.storage)
        self.where.clear()
        self.items.clear()

    def insert(self, columns, commit=True):
        """Reserves, writes and (optionally) commits one item; returns its key or slot."""
        steps, ref_steps = {}, []
        for column, stored in zip(columns, self.storage.columns):
            shared = self.storage.store_sources[stored.store] is not None
            for position, step in enumerate(column):
                key = step if shared else (id(column), position)
                ref_steps.append(steps.setdefault(key, len(steps)))
        known = np.full(len(steps), -1, np.int64)
        gens = np.zeros(len(steps), np.int64)
        for key, d in steps.items():
            if key in self.where:
                known[d], gens[d] = self.where[key]
        slot, rows, fresh = self.engine.reserve_item(known, gens, np.array(ref_steps), 0)
        j = 0
        for column, stored in zip(columns, self.storage.columns):
            store = self.engine.columns[stored.store]
            for step in column:
                d = ref_steps[j]
                j += 1
                row = int(rows[d])
                if fresh[d]:
                    store[row] = step
                else:  # a re-used row must still hold this very step
                    assert store[row] == step
            for d, key in ((steps[k], k) for k in steps if isinstance(k, (int, np.integer))):
                self.where[key] = (int(rows[d]), int(self.engine.rows[rows[d], L.R_GEN]))
        if not commit:
            self.engine.cancel(np.array([slot]))
            return None
        key = kernels.commit_one(*self.engine.arrays, slot, 1.0, np.empty(2), _procs.STAMP[0], 0)
        assert key > 0
        self.items[int(key)] = [list(c) for c in columns]
        return int(key)

    def check(self):
        assert self.engine.verify() == []

    def live_rows(self):
        ctrl, rows = self.engine.ctrl, self.engine.rows
        return int(ctrl[L.C_ROWS_LIVE]), rows[:ctrl[L.C_ROW_FRESH], L.R_COUNT].copy()


@pytest.fixture
def serve():
    servers = []

    def make(table):
        server = shmreplay.Server([table], name=_names.unique())
        servers.append(server)
        return server, shmreplay.Client(server.name)

    yield make
    for server in servers:
        server.stop()


@pytest.mark.parametrize("max_times", [0, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_operations_keep_rows_consistent(serve, seed, max_times):
    # Column 0: the last 3 steps; column 1: the last 2 steps of the same field (shares
    # the store); column 2: a private copy of one step (no source: never shared).
    storage = _storage_for([3, 2, 1], ["obs", "obs", None])
    # (``reset`` forgets the layout: the harness defines it again, and forgets its rows)
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 6,
                            rate_limiters.MinSize(1), max_times_sampled=max_times,
                            signature=storage.signature)
    server, client = serve(table)
    t = StepTable(server, client, "t", storage)
    rng = np.random.default_rng(seed)
    head = 3
    for _ in range(400):
        op = rng.random()
        if op < 0.55:
            head += int(rng.integers(0, 3))
            t.insert([list(range(head - 3, head)), list(range(head - 2, head)), [head]],
                     commit=rng.random() > 0.1)
        elif op < 0.75 and client.server_info()["t"].current_size:
            batch = client.sample_batch("t", int(rng.integers(1, 4)), timeout=1)
            for key, c0, c1, c2 in zip(batch.info.key, batch.data["c0"], batch.data["c1"],
                                       batch.data["c2"]):
                assert [c0.tolist(), c1.tolist(), c2.tolist()] == t.items[int(key)]
        elif op < 0.9 and t.items:
            keys = rng.choice(list(t.items), size=min(2, len(t.items)), replace=False)
            client.mutate_priorities("t", deletes=[int(k) for k in keys])
        elif op < 0.93:
            client.reset("t")
            t.redefine()
        t.check()
        if rng.random() < 0.1:
            live, counts = t.live_rows()
            row_kernels.rebuild(t.engine.ctrl, t.engine.meta, t.engine.refs, t.engine.rows)
            assert t.live_rows()[0] == live
            assert np.array_equal(np.maximum(t.live_rows()[1], 0), np.maximum(counts, 0))
            t.check()
    # Everything removed: every row is free again.
    client.reset("t")
    t.redefine()
    t.check()
    assert client.server_info()["t"].num_stored_steps == 0


def test_overlapping_items_store_each_step_once(serve):
    table = shmreplay.Table("t", selectors.Fifo(), selectors.Fifo(), 100, rate_limiters.MinSize(1))
    server, client = serve(table)
    t = StepTable(server, client, "t", _storage_for([4], ["obs"]))
    for head in range(4, 54):  # 50 items of 4 steps, each overlapping the last by 3
        t.insert([list(range(head - 4, head))])
    info = client.server_info()["t"]
    assert info.current_size == 50
    assert info.num_stored_steps == 53
    t.check()


def test_rows_run_out_then_the_remover_makes_room(serve):
    # Two columns reading different fields: an item needs 4 distinct rows, twice what the
    # row space was sized for per item, so rows run out before max_size is reached.
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 200,
                            rate_limiters.MinSize(1))
    server, client = serve(table)
    t = StepTable(server, client, "t", _storage_for([2, 2], ["a", "b"]))
    rows = int(t.engine.ctrl[L.C_ROW_CAPACITY])
    for i in range(rows // 4 + 20):
        t.insert([[4 * i, 4 * i + 1], [4 * i + 2, 4 * i + 3]])
    info = client.server_info()["t"]
    assert info.current_size < rows // 4 + 20  # the remover evicted to free rows
    assert info.num_stored_steps <= rows
    oldest = min(client.sample_batch("t", 50, timeout=1).data["c0"][:, 0])
    assert oldest > 0  # item 0 went first (Fifo remover)
    t.check()


def test_no_rows_even_with_the_table_emptied_is_an_error(serve):
    # Reservations in flight hold rows the remover cannot free: when they hold all of
    # them, a new item is refused with a clear error instead of waiting forever.
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 1,
                            rate_limiters.MinSize(1))
    server, client = serve(table)
    t = StepTable(server, client, "t", _storage_for([1, 1], ["a", "b"]))
    rows = int(t.engine.ctrl[L.C_ROW_CAPACITY])
    new, gens, two = np.full(2, -1, np.int64), np.zeros(2, np.int64), np.arange(2)
    slots = [t.engine.reserve_item(new, gens, two, 0)[0] for _ in range(rows // 2)]
    with pytest.raises(errors.SchemaError, match="more distinct steps"):
        t.engine.reserve_item(new, gens, two, 0)
    t.engine.cancel(np.array(slots))
    t.check()
    assert client.server_info()["t"].num_stored_steps == 0
    assert t.insert([[1], [2]]) > 0

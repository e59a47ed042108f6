"""Writers across processes, and writers that crash.

* Several spawned writer processes stream episodes (``TrajectoryWriter`` and the legacy
  ``Writer``) while this process samples: every sampled item is a run of consecutive
  steps of one episode of one writer, and no step is torn.
* A queue fed by another process hands back exactly the items it was given, in order,
  for ``insert``, legacy ``Writer`` and ``TrajectoryWriter`` items.
* A writer SIGKILLed at a random moment, or deterministically between reserving and
  committing an item, leaves no partial item visible, and once its reservation is
  reclaimed the table verifies clean and stores exactly the step rows live items
  reference.

Steps encode ``(writer_id, episode, t)`` (see ``_writer_workers``). Every child is
started with ``spawn``, joined with a timeout and killed if still alive; every blocking
call has a timeout.
"""

import multiprocessing
import random
import signal
import time

import numpy as np
import pytest

import _mp_workers as W
import _writer_workers as WW
import shmreplay
from shmreplay._shm import layout as L
from shmreplay import errors, rate_limiters, selectors
from shmreplay._shm import procs as _procs
from shmreplay._shm.kernels import codes

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
SEQ, LEGACY_SEQ = WW.SEQ, WW.LEGACY_SEQ


def _uniform(name, max_size, **kwargs):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1), **kwargs)


def _engine(client, table):
    engine = client._buffer.by_name[table]
    engine.has_columns()
    return engine


def _referenced_rows(engine):
    """Distinct step rows referenced by the table's slots that hold (or are writing) an
    item. Read without the lock: call it only while no other process uses the table."""
    assert engine.has_columns() and engine.storage.steps
    state = engine.meta[:, L.M_STATE]
    held = np.flatnonzero((state == codes.READY) | (state == codes.WRITING)
                          | (state == codes.DRAINING))
    if not engine.storage.variable:
        return int(np.unique(engine.refs[held]).size)
    # Items of any length (a table without a signature): their references, flattened.
    from shmreplay._shm.kernels import refpool
    columns = len(engine.storage.columns)
    lengths = np.empty((len(held), columns), np.int32)
    flat = np.empty(int(engine.refs[held, refpool.HEAD_TOTAL].sum()), np.int32)
    refpool.flatten(engine.refs, engine.capacity, columns, held.astype(np.int64), lengths, flat)
    return int(np.unique(flat).size)


def _check_sample(client, table, length, batch=16, timeout=5):
    sample = client.sample_batch(table, batch, timeout=timeout)
    bad = WW.malformed_items(sample.data, length)
    assert len(bad) == 0, f"{table}: malformed items sampled: {WW.describe(sample.data, bad)}"
    return sample


def _seq_item(writer_id, start, episode=0):
    """A whole item, as the test process inserts it into a step table."""
    steps = [WW.step(writer_id, episode, t) for t in range(start, start + SEQ)]
    return {"ids": np.stack([s["ids"] for s in steps]),
            "obs": np.stack([s["obs"] for s in steps])}


def _pending(engine):
    return int(engine.counters()[L.C_PENDING])


# --------------------------------------------------------------------------------------
# 1. several writer processes, one learner
# --------------------------------------------------------------------------------------

def test_concurrent_writer_processes_items_are_contiguous_runs_of_one_episode(buffer_name):
    """Writers 0 and 1 (TrajectoryWriter) feed ``traj`` with the last 4 steps of each
    episode; writer 2 (legacy Writer) feeds ``legacy`` with the last 3. Small tables:
    items are evicted and step rows reused all the time while this process samples.
    The ``tiny_*`` tables (2 items) free and hand out rows again within microseconds, so
    a writer that remembers a row its step no longer holds shows up as a foreign step."""
    sizes = {"traj": 500, "legacy": 300, "tiny": 2, "tiny_legacy": 2}
    lengths = {"traj": SEQ, "tiny": SEQ, "legacy": LEGACY_SEQ, "tiny_legacy": LEGACY_SEQ}
    tables = [_uniform(name, size) for name, size in sizes.items()]
    plan = [("trajectory", ["traj", "tiny"], []), ("trajectory", ["traj", "tiny"], []),
            ("legacy", [], ["legacy", "tiny_legacy"])]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        try:
            queue, go, stop = SPAWN.Queue(), SPAWN.Event(), SPAWN.Event()
            readies = [SPAWN.Event() for _ in plan]
            writers = [SPAWN.Process(target=WW.stream_episodes,
                                     args=(server.name, kind, i, 100 + i, seq, legacy,
                                           readies[i], go, stop, queue))
                       for i, (kind, seq, legacy) in enumerate(plan)]
            with W.processes(*writers):
                for ready in readies:
                    assert ready.wait(30), "a writer did not start"
                go.set()
                batches = {name: 0 for name in sizes}
                seen_writers = {name: set() for name in sizes}
                row_bound_violations = []
                deadline = time.monotonic() + 3.0
                while time.monotonic() < deadline:
                    for table, length in lengths.items():
                        sample = _check_sample(client, table, length)
                        batches[table] += 1
                        seen_writers[table].update(
                            np.asarray(sample.data["ids"])[:, 0, 0].tolist())
                        # A consistent snapshot: rows in use are referenced by held items.
                        c = _engine(client, table).counters()
                        if c[L.C_ROWS_LIVE] > (c[L.C_SIZE] + c[L.C_PENDING]) * length:
                            row_bound_violations.append(
                                (table, int(c[L.C_ROWS_LIVE]), int(c[L.C_SIZE]),
                                 int(c[L.C_PENDING])))
                stop.set()
                reports = [W.get(queue, 20, "created") for _ in writers]
                for proc in writers:
                    proc.join(10)
            assert [p.exitcode for p in writers] == [0, 0, 0]
            assert not row_bound_violations, row_bound_violations[:5]
            assert min(batches.values()) >= 10, batches
            assert seen_writers == {"traj": {0, 1}, "tiny": {0, 1}, "legacy": {2},
                                    "tiny_legacy": {2}}, seen_writers

            created = {name: 0 for name in sizes}
            for writer_id, per_table, episodes, steps in reports:
                for table, n in per_table.items():
                    created[table] += n
                # The test only means something if each writer ran many episodes.
                assert episodes >= 10 and steps >= 200, (writer_id, episodes, steps)
            assert created["traj"] >= 3 * sizes["traj"], created
            assert created["legacy"] >= 2 * sizes["legacy"], created

            for table, length in lengths.items():
                assert client.verify(table) == []
                info = client.server_info()[table]
                engine = _engine(client, table)
                assert info.num_inserted == created[table]
                assert info.current_size == sizes[table]
                assert _pending(engine) == 0
                # Rows in use are exactly those live items reference; items overlap, so
                # at most `length` per item.
                assert info.num_stored_steps == _referenced_rows(engine)
                assert info.num_stored_steps <= info.current_size * length
                for _ in range(5):
                    _check_sample(client, table, length, batch=64)
        finally:
            client.close()


# --------------------------------------------------------------------------------------
# 2. a queue fed by another process
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["insert", "writer", "trajectory"])
def test_queue_fed_by_another_process_returns_every_item_once_in_order(buffer_name, kind):
    count = 500
    with shmreplay.Server([shmreplay.Table.queue("q", 1)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        try:
            queue, ready, go = SPAWN.Queue(), SPAWN.Event(), SPAWN.Event()
            feeder = SPAWN.Process(target=WW.feed_queue,
                                   args=(server.name, "q", kind, count, ready, go, queue))
            with W.processes(feeder):
                assert ready.wait(30), "the feeder did not start"
                go.set()
                received = []
                for _ in range(count):
                    sample = client.sample_batch("q", 1, timeout=10)
                    received.append({k: np.asarray(v)[0] for k, v in sample.data.items()})
                assert W.get(queue, 20, "done") == count
                feeder.join(10)
            assert feeder.exitcode == 0
            with pytest.raises(errors.DeadlineExceededError):
                client.sample_batch("q", 1, timeout=0.1)

            firsts = [int(np.ravel(item["v"])[0]) for item in received]
            assert firsts == list(range(count)), \
                f"lost, duplicated or reordered: first differences at " \
                f"{[i for i, v in enumerate(firsts) if v != i][:5]}"
            for i, item in enumerate(received):
                if kind == "writer":  # 2 consecutive steps, sampled as [2, ...]
                    assert item["v"].tolist() == [i, i + 1]
                    assert np.array_equal(item["x"], np.stack([np.full(WW.OBS, float(i)),
                                                                np.full(WW.OBS, float(i + 1))]))
                else:
                    assert item["v"].shape == () and int(item["v"]) == i
                    assert item["pair"].tolist() == [i, i + 1]
                    assert np.array_equal(item["x"], np.full(WW.OBS, float(i)))
            info = client.server_info()["q"]
            assert info.num_inserted == count
            assert info.current_size == 0
            assert info.num_stored_steps == 0
            assert client.verify("q") == []
        finally:
            client.close()


# --------------------------------------------------------------------------------------
# 3. crashes
# --------------------------------------------------------------------------------------

def test_writers_sigkilled_while_streaming_leave_no_partial_items_and_no_leaked_rows(
        buffer_name):
    """Five writer processes, one after the other, each SIGKILLed at a random moment
    while streaming into a Uniform/Fifo table and a ``max_times_sampled=1`` one
    (TrajectoryWriters into ``traj``/``once``, legacy Writers into ``legacy``/
    ``legacy_once``: a table fed by both kinds stores more rows, see
    ``test_items_of_both_writer_kinds_in_one_table_share_step_rows``)."""
    rounds = 5
    rng = random.Random(20240611)
    targets = {"trajectory": ["traj", "once"], "legacy": ["legacy", "legacy_once"]}
    tables = [_uniform("traj", 200), _uniform("once", 200, max_times_sampled=1),
              _uniform("legacy", 200), _uniform("legacy_once", 200, max_times_sampled=1)]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        try:
            queues = [SPAWN.Queue() for _ in range(rounds)]
            gos = [SPAWN.Event() for _ in range(rounds)]
            kinds = ["trajectory" if i % 2 == 0 else "legacy" for i in range(rounds)]
            # Started together (their start-up overlaps); each streams only after its go.
            writers = [SPAWN.Process(target=WW.stream_until_killed,
                                     args=(server.name, kinds[i], 10 + i, 500 + i,
                                           targets[kinds[i]], gos[i], 200, queues[i]))
                       for i in range(rounds)]
            stored = []
            with W.processes(*writers):
                for i, proc in enumerate(writers):
                    names = targets[kinds[i]]
                    before = {t: client.server_info()[t].num_inserted for t in names}
                    gos[i].set()
                    W.get(queues[i], 30, "progress")
                    # Sample (and check) while it streams, then kill it mid-stream.
                    deadline = time.monotonic() + rng.uniform(0.0, 0.3)
                    while True:
                        for table in names:
                            _check_sample(client, table, SEQ, batch=8)
                        if time.monotonic() >= deadline:
                            break
                    assert W.kill_and_reap(proc) == -signal.SIGKILL
                    assert queues[i].empty(), W.get(queues[i], 0)

                    for table in names:
                        info = client.server_info()[table]
                        assert info.num_inserted > before[table], "the writer did not run"
                        engine = _engine(client, table)
                        assert _pending(engine) <= 1  # at most the item it was writing
                        # No partial item is visible, before or after the reclaim.
                        if info.current_size:
                            _check_sample(client, table, SEQ, batch=32)
                        assert client.verify(table) == []
                        assert _pending(engine) == 0
                        info = client.server_info()[table]
                        assert info.num_stored_steps == _referenced_rows(engine)
                        assert info.num_stored_steps <= info.current_size * SEQ
                        # Nobody is wedged: an insert from here goes through at once.
                        t0 = time.monotonic()
                        client.insert(_seq_item(99, i, episode=i), priorities={table: 1.0},
                                      timeout=1)
                        assert time.monotonic() - t0 < 1.0
                        _check_sample(client, table, SEQ, batch=32)
                        stored.append((i, table, client.server_info()[table].num_stored_steps))

            # Every reference the dead writers held was released: removing the items
            # frees every row.
            for table in ("traj", "legacy"):
                client.reset(table)
            for table in ("once", "legacy_once"):  # sampled dry instead
                for _ in range(100):
                    if client.server_info()[table].current_size == 0:
                        break
                    _check_sample(client, table, SEQ, batch=64, timeout=1)
            for table in targets["trajectory"] + targets["legacy"]:
                info = client.server_info()[table]
                assert (info.current_size, info.num_stored_steps) == (0, 0), (table, stored)
                assert client.verify(table) == []
                assert _pending(_engine(client, table)) == 0
        finally:
            client.close()


@pytest.mark.parametrize("kind", ["trajectory", "legacy"])
def test_writer_killed_between_reserve_and_commit_is_reclaimed_by_a_refused_inserter(
        buffer_name, kind):
    """A queue of 4: the writer commits 3 items, reserves and writes the 4th (which
    shares 3 steps with the 3rd), then stops before committing it and is SIGKILLed. The
    dead reservation fills the queue until a refused insert reclaims it."""
    with shmreplay.Server([shmreplay.Table.queue("q", 4)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        try:
            engine = client._buffer.by_name["q"]
            queue = SPAWN.Queue()
            writer = SPAWN.Process(target=WW.hang_before_commit,
                                   args=(server.name, "q", kind, 3, queue))
            with W.processes(writer):
                slot = W.get(queue, 30, "hanging")
                assert engine.meta[slot, L.M_STATE] == codes.WRITING
                assert engine.meta[slot, L.M_WRITER] == _procs.stamp_of(writer.pid, _procs.NS[0])
                assert W.kill_and_reap(writer) == -signal.SIGKILL
            engine.has_columns()
            assert _pending(engine) == 1
            assert client.server_info()["q"].current_size == 3
            assert not engine.can_insert(1)  # the dead reservation fills the queue
            # Steps 0..5 for the committed items, step 6 for the dead one's.
            assert client.server_info()["q"].num_stored_steps == _referenced_rows(engine) == 7
            # Refused, even a quick insert looks for dead writers and tries once more.
            t0 = time.monotonic()
            client.insert(_seq_item(99, 0), priorities={"q": 1.0}, timeout=0.01)
            elapsed = time.monotonic() - t0
            assert elapsed < 1.0, f"the insert took {elapsed:.3f} s"
            assert _pending(engine) == 0
            assert engine.meta[slot, L.M_STATE] != codes.WRITING or \
                engine.meta[slot, L.M_WRITER] != _procs.stamp_of(writer.pid, _procs.NS[0])
            assert client.verify("q") == []
            info = client.server_info()["q"]
            assert info.current_size == 4
            # The dead item's new step is freed; the test's item took 4 new rows.
            assert info.num_stored_steps == _referenced_rows(engine) == 6 + SEQ

            got = []
            for _ in range(4):
                sample = _check_sample(client, "q", SEQ, batch=1, timeout=1)
                got.append(np.asarray(sample.data["ids"])[0].tolist())
            assert got == [[[7, 0, t] for t in range(s, s + SEQ)] for s in range(3)] + \
                [[[99, 0, t] for t in range(SEQ)]]
            with pytest.raises(errors.DeadlineExceededError):
                client.sample_batch("q", 1, timeout=0.1)
            info = client.server_info()["q"]
            assert (info.current_size, info.num_stored_steps) == (0, 0)
            assert client.verify("q") == []
        finally:
            client.close()


def test_writer_killed_between_reserve_and_commit_is_reclaimed_by_verify(buffer_name):
    """Nobody blocks on a Uniform table: ``verify`` reclaims the dead reservation. The
    writer hangs before committing its 31st item (steps 30..33, after 20-item eviction
    turned its early rows over); step 33 must never be seen."""
    with shmreplay.Server([_uniform("u", 20)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        try:
            engine = client._buffer.by_name["u"]
            queue = SPAWN.Queue()
            writer = SPAWN.Process(target=WW.hang_before_commit,
                                   args=(server.name, "u", "trajectory", 30, queue))
            with W.processes(writer):
                slot = W.get(queue, 30, "hanging")
                sample = _check_sample(client, "u", SEQ, batch=64, timeout=1)
                assert np.asarray(sample.data["ids"])[:, -1, 2].max() <= 32
                assert W.kill_and_reap(writer) == -signal.SIGKILL
            engine.has_columns()
            assert engine.meta[slot, L.M_STATE] == codes.WRITING
            assert _pending(engine) == 1
            info = client.server_info()["u"]
            assert info.current_size == 20
            # The 20 live items cover steps 10..32; the dead item adds step 33.
            assert info.num_stored_steps == _referenced_rows(engine) == 23 + 1
            ids = np.asarray(_check_sample(client, "u", SEQ, batch=64, timeout=1).data["ids"])
            assert ids[:, -1, 2].max() <= 32 and ids[:, 0, 2].min() >= 10

            assert client.verify("u") == []
            assert _pending(engine) == 0
            info = client.server_info()["u"]
            assert info.num_stored_steps == _referenced_rows(engine) == 23
            client.insert(_seq_item(99, 0), priorities={"u": 1.0}, timeout=1)
            info = client.server_info()["u"]
            assert info.current_size == 20
            assert info.num_stored_steps == _referenced_rows(engine) == 22 + SEQ
            ids = np.asarray(_check_sample(client, "u", SEQ, batch=64, timeout=1).data["ids"])
            assert not np.any((ids[:, 0, 0] == 7) & (ids[:, -1, 2] > 32))
            client.reset("u")
            info = client.server_info()["u"]
            assert (info.current_size, info.num_stored_steps) == (0, 0)
            assert client.verify("u") == []
        finally:
            client.close()


# --------------------------------------------------------------------------------------
# both writer kinds in one table (single process)
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("first", ["trajectory", "legacy"])
def test_items_of_both_writer_kinds_in_one_table_share_step_rows(buffer_name, first):
    with shmreplay.Server([_uniform("t", 50)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        try:
            for writer_id, kind in enumerate([first, {"trajectory": "legacy",
                                                      "legacy": "trajectory"}[first]]):
                streamer = WW._Streamer(client, kind, writer_id, writer_id, ["t"])
                streamer.episode_length = lambda: WW.MAX_EPISODE - 1  # 36 items each
                for _ in range(3):
                    streamer.run_episode()
                streamer.finish()
            info = client.server_info()["t"]
            assert info.current_size == 50
            assert client.verify("t") == []
            _check_sample(client, "t", SEQ, batch=64)
            # 50 overlapping 4-step items of one episode need 53 rows; at most 3 more
            # for items spread over several episodes.
            assert info.num_stored_steps <= 50 + 3 * 3, info.num_stored_steps
        finally:
            client.close()

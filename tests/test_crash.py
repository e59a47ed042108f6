"""Crash safety (DESIGN invariant 5): a process SIGKILLed while holding a table's lock,
between reserve and commit, or anywhere in a tight insert loop, never wedges the others
for more than about a second, never leaves a half-written item visible, and never
corrupts the derived structures.
"""

import contextlib
import ctypes
import errno
import multiprocessing
import random
import signal
import time

import numpy as np
import pytest

import _mp_workers as W
import shmreplay
from shmreplay._shm import layout as L
from shmreplay import errors, rate_limiters, selectors
from shmreplay._shm.kernels import codes
from shmreplay.specs import TensorSpec

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
ITEM8 = {"x": TensorSpec((8,), np.float64), "v": TensorSpec((), np.int64)}



def _item(v):
    return {"x": np.full(8, float(v)), "v": np.int64(v)}


def _trylock_busy(engine) -> bool:
    """True if the table's mutex is held by someone (EBUSY); never blocks."""
    libc = ctypes.CDLL(None)
    address = ctypes.c_void_p(engine.ctrl.ctypes.data)
    result = libc.pthread_mutex_trylock(address)
    if result == 0:
        libc.pthread_mutex_unlock(address)
        return False
    assert result == errno.EBUSY, f"unexpected trylock result {result}"
    return True


def test_lock_holder_sigkilled_does_not_wedge_others(buffer_name):
    table = shmreplay.Table("per", selectors.Prioritized(0.6), selectors.Fifo(), 64,
                            rate_limiters.MinSize(1), signature=ITEM8)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        engine = client._buffer.by_name["per"]
        try:
            for v in range(50):
                client.insert(_item(v), priorities={"per": 0.5 + v}, timeout=5)
            recoveries = int(engine.ctrl[L.C_RECOVERIES])
            queue, go = SPAWN.Queue(), SPAWN.Event()
            may_lock, locked, ready = SPAWN.Event(), SPAWN.Event(), SPAWN.Event()
            holder = SPAWN.Process(target=W.hold_lock_forever,
                                   args=(server.name, "per", may_lock, locked, queue))
            waiter = SPAWN.Process(target=W.insert_when_told,
                                   args=(server.name, "per", 1000, ready, go, queue))
            with W.processes(waiter, holder):
                # The waiter is set up first (its server_info() call takes the lock).
                assert ready.wait(20)
                may_lock.set()
                assert locked.wait(20), "the child did not take the lock"
                assert _trylock_busy(engine), "the lock is not held"
                go.set()  # the waiter now blocks on the lock of the soon-dead holder
                time.sleep(0.3)
                assert queue.empty(), "an insert went through while the lock was held"
                killed_at = time.monotonic()
                assert W.kill_and_reap(holder) == -signal.SIGKILL
                start, done_at = W.get(queue, 5, "inserted")
                assert done_at - killed_at < 1.0, f"waiter took {done_at - killed_at:.3f} s"
                waiter.join(10)
            assert waiter.exitcode == 0
            # This process is not wedged either.
            t0 = time.monotonic()
            client.insert(_item(2000), priorities={"per": 3.0}, timeout=1)
            sample = client.sample_batch("per", 32, timeout=1)
            assert time.monotonic() - t0 < 1.0
            assert np.all(sample.data["x"] == sample.data["v"][:, None])
            assert client.verify("per") == []
            assert int(engine.ctrl[L.C_RECOVERIES]) == recoveries + 1
            info = client.server_info()["per"]
            assert info.current_size == 52 and info.num_inserted == 52
            assert not _trylock_busy(engine)
        finally:
            client.close()


@contextlib.contextmanager
def _queue_of_one(buffer_name):
    """A buffer with a queue ``q`` of one item: ``(server, client, engine)``."""
    with shmreplay.Server([shmreplay.Table.queue("q", 1, signature=ITEM8)],
                          name=buffer_name) as server:
        client = server.localhost_client()
        try:
            yield server, client, client._buffer.by_name["q"]
        finally:
            client.close()


def test_writer_dying_between_reserve_and_commit_frees_its_slot(buffer_name):
    # A queue of one: the dead writer's reservation alone fills the rate limiter.
    with _queue_of_one(buffer_name) as (server, client, engine):
        # A first item (taken off the queue again) makes the table's stores.
        client.insert(_item(1), priorities={"q": 1.0}, timeout=5)
        client.sample_batch("q", 1, timeout=5)
        queue = SPAWN.Queue()
        writer = SPAWN.Process(target=W.reserve_and_die, args=(server.name, "q", queue))
        with W.processes(writer):
            dead_slot = W.get(queue, 20, "reserved")
            writer.join(10)
        assert writer.exitcode == -signal.SIGKILL
        assert engine.meta[dead_slot, L.M_STATE] == codes.WRITING  # nobody freed it yet
        assert int(engine.ctrl[L.C_PENDING]) == 1
        assert not engine.can_insert(1)  # the reservation counts against the limiter
        # Even a call that does not wait frees it: refused, it looks for dead
        # writers (at most every 0.2 s) and tries once more.
        client.insert(_item(7), priorities={"q": 1.0}, timeout=0)
        assert int(engine.ctrl[L.C_PENDING]) == 0
        assert client.server_info()["q"].current_size == 1
        assert client.verify("q") == []
        # Only the live insert is visible; the half-written slot never is.
        sample = client.sample_batch("q", 1, timeout=1)
        assert sample.data["v"].tolist() == [7]
        assert np.all(sample.data["x"] == 7.0)
        with pytest.raises(errors.DeadlineExceededError):
            client.sample_batch("q", 1, timeout=0.1)
        assert client.verify("q") == []


def test_a_refused_call_reclaims_a_dead_writers_slot_at_most_every_fifth_second(buffer_name):
    with _queue_of_one(buffer_name) as (server, client, engine):
        client.insert(_item(1), priorities={"q": 1.0}, timeout=0)  # q is full
        with pytest.raises(errors.DeadlineExceededError):  # nothing to reclaim
            client.insert(_item(2), priorities={"q": 1.0}, timeout=0)
        queue = SPAWN.Queue()
        writer = SPAWN.Process(target=W.reserve_and_die, args=(server.name, "q", queue))
        client.sample_batch("q", 1, timeout=1)  # room for the dying writer
        with W.processes(writer):
            W.get(queue, 20, "reserved")
            writer.join(10)
        assert int(engine.ctrl[L.C_PENDING]) == 1
        time.sleep(0.25)  # past the last scan's 0.2 s
        client.insert(_item(3), priorities={"q": 1.0}, timeout=0)
        assert int(engine.ctrl[L.C_PENDING]) == 0
        assert client.sample_batch("q", 1, timeout=1).data["v"].tolist() == [3]
        assert client.verify("q") == []


def test_verify_reclaims_slots_of_dead_writers(buffer_name):
    # _sync's protocol: "A blocked inserter (and ``verify``) checks those pids and frees
    # the slots of dead writers". Here nobody blocks, so only verify can free the slot.
    table = shmreplay.Table("u", selectors.Uniform(), selectors.Fifo(), 8,
                            rate_limiters.MinSize(1), signature=ITEM8)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        engine = client._buffer.by_name["u"]
        try:
            client.insert(_item(1), priorities={"u": 1.0}, timeout=5)
            queue = SPAWN.Queue()
            writer = SPAWN.Process(target=W.reserve_and_die, args=(server.name, "u", queue))
            with W.processes(writer):
                W.get(queue, 20, "reserved")
                writer.join(10)
            assert writer.exitcode == -signal.SIGKILL
            assert int(engine.ctrl[L.C_PENDING]) == 1
            assert client.verify("u") == []
            assert int(engine.ctrl[L.C_PENDING]) == 0, "verify left the dead writer's slot reserved"
        finally:
            client.close()


def test_writers_sigkilled_mid_insert_loop_leave_a_clean_table(buffer_name):
    width = 2048
    table = shmreplay.Table(
        "per", selectors.Prioritized(0.7), selectors.Fifo(), 32, rate_limiters.MinSize(1),
        signature={"x": TensorSpec((width,), np.float64), "v": TensorSpec((), np.float64)})
    rng = random.Random(1234)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        engine = client._buffer.by_name["per"]
        try:
            for round_ in range(2):
                queue = SPAWN.Queue()
                readies = [SPAWN.Event(), SPAWN.Event()]
                writers = [SPAWN.Process(target=W.insert_loop,
                                         args=(server.name, "per", width, 10 * round_ + i,
                                               readies[i], queue))
                           for i in range(2)]
                with W.processes(*writers):
                    for ready in readies:
                        assert ready.wait(20)
                    before = client.server_info()["per"].num_inserted
                    # Kill each writer at its own random moment, while the parent samples.
                    for proc in writers:
                        deadline = time.monotonic() + rng.uniform(0.02, 0.3)
                        while time.monotonic() < deadline:
                            s = client.sample_batch("per", 8, timeout=1)
                            bad = W.torn_rows(s.data)
                            assert len(bad) == 0, f"half-written item sampled: {s.data['v'][bad]}"
                        assert W.kill_and_reap(proc) == -signal.SIGKILL
                    assert queue.empty(), W.get(queue, 0)
                assert client.server_info()["per"].num_inserted > before, "writers did not run"
                # Nobody is wedged: both directions complete promptly.
                t0 = time.monotonic()
                client.insert({"x": np.full(width, -1.0), "v": np.float64(-1.0)},
                              priorities={"per": 1.0}, timeout=1)
                s = client.sample_batch("per", 64, timeout=1)
                assert time.monotonic() - t0 < 1.0
                assert len(W.torn_rows(s.data)) == 0
                assert client.verify("per") == []
                info = client.server_info()["per"]
                assert info.current_size == 32
                # Dead writers' slots are at most one reservation per killed writer.
                assert int(engine.ctrl[L.C_PENDING]) <= 2 * (round_ + 1) * 4
        finally:
            client.close()

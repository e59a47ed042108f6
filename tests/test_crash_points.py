"""Crash injection: a process SIGKILLed at chosen points inside each operation.

Kernel points (``shmreplay._shm.crash_points``) stop a child *inside* a locked kernel, half
way through changing the table; Python-level points stop it between the locked steps
(half way through copying an item in or out, blocked on a rate limiter, inside a
checkpoint). The test then SIGKILLs it there and checks what DESIGN.md promises: the
others are not wedged (each call below has a one-second budget), no half-written item
is ever visible, every insert that returned is still there, a batch is all or nothing,
and the table verifies.
"""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

import _crash_workers as CW
import shmreplay
from shmreplay._shm import crash_points as _crash_points
from shmreplay._shm import layout as L
from shmreplay import rate_limiters, selectors
from shmreplay._shm.kernels import codes
from test_crash import _trylock_busy

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")


def _table(kind, max_size=10_000):
    if kind == "queue":
        return shmreplay.Table.queue("t", max_size, signature=CW.ITEM)
    if kind == "fifo":
        return shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), max_size,
                               rate_limiters.MinSize(1), signature=CW.ITEM)
    return shmreplay.Table("t", selectors.Prioritized(0.7), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1), signature=CW.ITEM)


class Victim:
    """A child process running ``worker``, stopped at a point and then SIGKILLed."""

    def __init__(self, server, worker, *args, point=None, lock_held=True):
        self.acks = SPAWN.RawArray("q", 1_000_000)
        self.count = SPAWN.RawValue("q", 0)
        ready, go = SPAWN.Event(), SPAWN.Event()
        self.process = SPAWN.Process(target=worker, args=(server.name, "t", *args, ready, go,
                                                          self.acks, self.count)
                                     if worker is CW.repeat else
                                     (server.name, "t", ready, go, self.acks, self.count, *args))
        self.process.start()
        try:
            assert ready.wait(60), "the child did not start"
            client = server.localhost_client()
            engine = client._engine("t")
            if point is not None:
                _crash_points.arm(engine, point, self.process.pid)
            go.set()
            assert _crash_points.wait_stopped(self.process.pid, 30), "the child never stopped"
            if point is not None:
                _crash_points.disarm(engine)
            assert _trylock_busy(engine) == lock_held
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(10)
            assert self.process.exitcode == -signal.SIGKILL
            client.close()
        finally:
            if self.process.is_alive():
                self.process.kill()
                self.process.join(10)

    @property
    def acknowledged(self):
        return set(self.acks[:self.count.value])


def _visible(client):
    """Every live item's value (checked whole: x == v), from a consistent snapshot."""
    from shmreplay._ops import checkpoint as _checkpoint
    arrays = _checkpoint.snapshot_table(client._engine("t")).arrays
    v, x = arrays["store0"], arrays["store1"]  # whole items: v [n], x [n, 8]
    assert (x == v[:, None]).all(), "a half-written item is visible"
    return set(v.tolist())


def _assert_healthy(client, kind="prioritized"):
    """Both directions answer within a second, nothing torn, and the table verifies."""
    started = time.monotonic()
    client.insert({"x": np.full(8, -1.0), "v": np.int64(-1)}, {"t": 1.0}, timeout=1)
    batch = client.sample_batch("t", 8, timeout=1)
    assert time.monotonic() - started < 1.0
    assert (batch.data["x"] == batch.data["v"][:, None]).all()
    assert client.verify("t") == []


def _prefill(client, count, start=10_000_000):
    client.insert_batch(CW.items(np.arange(start, start + count)), {"t": 1.0})
    return set(range(start, start + count))


def test_batch_commit_killed_half_way_is_rolled_back(buffer_name):
    with shmreplay.Server([_table("prioritized")], name=buffer_name) as server:
        client = server.localhost_client()
        before = _prefill(client, 16)
        victim = Victim(server, CW.repeat, "insert_batch", point=codes.STOP_COMMIT_HALF)
        # All or nothing: exactly the batches whose insert_batch returned are there.
        assert _visible(client) == before | victim.acknowledged
        assert client.verify("t") == []
        assert int(client._engine("t").ctrl[L.C_RECOVERIES]) == 1
        _assert_healthy(client)
        client.close()


def test_batch_commit_killed_while_evicting(buffer_name):
    with shmreplay.Server([_table("fifo", max_size=20)], name=buffer_name) as server:
        client = server.localhost_client()
        _prefill(client, 20)
        victim = Victim(server, CW.repeat, "insert_batch", point=codes.STOP_COMMIT_EVICT)
        visible = _visible(client)
        # The first batch's commit was evicting when its process died. The batch was in
        # by then: it stays, whole, and the evictions are finished (Fifo: the oldest 8).
        assert not victim.acknowledged
        assert len(visible) == 20
        assert visible & set(range(10_000_000, 10_000_020)) == set(range(10_000_008, 10_000_020))
        assert len(visible - set(range(10_000_000, 10_000_020))) == 8  # the whole batch
        _assert_healthy(client)
        client.close()


def test_single_commit_killed_before_its_counters_leaves_a_whole_item(buffer_name):
    with shmreplay.Server([_table("prioritized")], name=buffer_name) as server:
        client = server.localhost_client()
        victim = Victim(server, CW.repeat, "insert", point=codes.STOP_COMMIT_ONE)
        visible = _visible(client)
        acknowledged = victim.acknowledged
        assert acknowledged <= visible  # every insert that returned is there
        assert len(visible - acknowledged) <= 1  # plus, whole, the one being committed
        info = client.server_info()["t"]
        assert info.current_size == len(visible)
        _assert_healthy(client)
        client.close()


def test_sampler_killed_inside_the_sample_kernel(buffer_name):
    with shmreplay.Server([_table("queue", max_size=64)], name=buffer_name) as server:
        client = server.localhost_client()
        _prefill(client, 64)
        Victim(server, CW.repeat, "sample", point=codes.STOP_SAMPLE_DRAWN)
        assert client.verify("t") == []  # reclaims the dead sampler's DRAINING slots
        taken = 64 - client.server_info()["t"].current_size
        # Every slot is usable again: the queue refills to max_size without blocking.
        client.insert_batch(CW.items(np.arange(taken)), {"t": 1.0}, timeout=1)
        assert client.server_info()["t"].current_size == 64
        _assert_healthy_queue(client)
        client.close()


def _assert_healthy_queue(client):
    started = time.monotonic()
    batch = client.sample_batch("t", 2, timeout=1)
    client.insert_batch(CW.items(np.arange(2)), {"t": 1.0}, timeout=1)
    assert time.monotonic() - started < 1.0
    assert (batch.data["x"] == batch.data["v"][:, None]).all()
    assert client.verify("t") == []


def test_priority_updater_killed_between_deletes_and_updates(buffer_name):
    with shmreplay.Server([_table("prioritized")], name=buffer_name) as server:
        client = server.localhost_client()
        before = _prefill(client, 200)
        Victim(server, CW.repeat, "mutate", point=codes.STOP_MUTATE_HALF)
        assert _visible(client) < before  # the deletes happened
        assert client.verify("t") == []  # sum-tree matches the priorities
        _assert_healthy(client)
        client.close()


def test_writer_killed_inside_reserve_item(buffer_name):
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 50, rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        _write_steps(client, range(100, 110))
        Victim(server, CW.repeat, "writer", point=codes.STOP_RESERVE_ITEM)
        assert client.verify("t") == []  # row reference counts were rebuilt
        started = time.monotonic()
        batch = client.sample_batch("t", 16, timeout=1)
        values = batch.data["v"]
        assert (np.diff(values, axis=1) == 1).all()  # contiguous steps, nothing torn
        assert (batch.data["x"] == values[:, :, None]).all()
        _write_steps(client, range(3))  # and writers still work
        assert time.monotonic() - started < 1.0
        assert client.verify("t") == []
        client.close()


def test_writer_of_items_of_any_length_killed_inside_reserve_item(buffer_name):
    """The pool's chains and the rows' counts are rebuilt from the slots alone."""
    signature = {"x": shmreplay.TensorSpec((None, 8), np.float64),
                 "v": shmreplay.TensorSpec((None,), np.int64)}
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 50,
                            rate_limiters.MinSize(1), signature=signature)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        _write_steps(client, range(100, 110))
        Victim(server, CW.repeat, "writer_any_length", point=codes.STOP_RESERVE_ITEM)
        assert client.verify("t") == []  # row counts and free blocks were rebuilt
        started = time.monotonic()
        batch = client.sample_batch("t", 64, timeout=1)
        for values, x, length in zip(batch.data["v"], batch.data["x"], batch.lengths["v"]):
            assert (np.diff(values[:length]) == 1).all()  # contiguous steps, nothing torn
            assert (x[:length] == values[:length, None]).all() and (x[length:] == 0).all()
        _write_steps(client, range(3))  # and writers still work
        assert time.monotonic() - started < 1.0
        assert client.verify("t") == []
        client.close()


def _write_steps(client, values):
    """Items of 3 consecutive steps over ``values``, through a TrajectoryWriter."""
    with client.trajectory_writer(3) as writer:
        for t, value in enumerate(values):
            writer.append({"x": np.full(8, float(value)), "v": np.int64(value)})
            if t >= 2:
                writer.create_item("t", 1.0, {"x": writer.history["x"][-3:],
                                              "v": writer.history["v"][-3:]})


def test_inserter_killed_half_way_through_copying_an_item(buffer_name):
    with shmreplay.Server([_table("queue", max_size=4)], name=buffer_name) as server:
        client = server.localhost_client()
        _prefill(client, 3)
        Victim(server, CW.stop_halfway_through_copying, lock_held=False)
        # The torn slot is never visible; the queue's last place is reclaimed for us.
        started = time.monotonic()
        client.insert({"x": np.full(8, 5.0), "v": np.int64(5)}, {"t": 1.0}, timeout=1)
        assert time.monotonic() - started < 1.0
        assert _visible(client) == set(range(10_000_000, 10_000_003)) | {5}
        _assert_healthy_queue(client)
        client.close()


def test_sampler_killed_while_copying_its_sample_out(buffer_name):
    with shmreplay.Server([_table("queue", max_size=8)], name=buffer_name) as server:
        client = server.localhost_client()
        _prefill(client, 8)
        Victim(server, CW.stop_while_copying_a_sample, lock_held=False)
        assert client.server_info()["t"].current_size == 4  # it took (and deleted) 4
        # Their slots are DRAINING for a dead process: an insert into the full queue
        # reclaims them instead of waiting forever.
        client.insert_batch(CW.items(np.arange(4)), {"t": 1.0}, timeout=1)
        _assert_healthy_queue(client)
        client.close()


def test_sampler_killed_while_blocked_on_the_rate_limiter(buffer_name):
    with shmreplay.Server([_table("queue", max_size=8)], name=buffer_name) as server:
        client = server.localhost_client()
        engine = client._engine("t")

        def blocked():
            return int(engine.ctrl[L.C_ITEMS_WAITERS]) > 0

        acks = SPAWN.RawArray("q", 1)
        ready, go = SPAWN.Event(), SPAWN.Event()
        child = SPAWN.Process(target=CW.block_on_empty_table,
                              args=(server.name, "t", ready, go, acks, SPAWN.RawValue("q", 0)))
        child.start()
        try:
            assert ready.wait(60)
            go.set()
            deadline = time.monotonic() + 30
            while not blocked() and time.monotonic() < deadline:
                time.sleep(0.005)
            assert blocked(), "the child never blocked"
        finally:
            child.kill()
            child.join(10)
        _prefill(client, 4)
        _assert_healthy_queue(client)
        client.close()


def test_checkpoint_killed_while_holding_the_lock(buffer_name, tmp_path):
    with shmreplay.Server([_table("prioritized")], name=buffer_name) as server:
        client = server.localhost_client()
        before = _prefill(client, 100)
        Victim(server, CW.stop_inside_checkpoint, str(tmp_path / "c.ckpt"))
        assert _visible(client) == before
        _assert_healthy(client)
        assert not (tmp_path / "c.ckpt").exists()
        client.checkpoint(str(tmp_path / "c.ckpt"))  # removes the dead one's temporary
        assert os.listdir(tmp_path) == ["c.ckpt"]
        client.close()


def test_random_sigkill_storm_while_a_learner_samples_and_updates(buffer_name):
    """Actors SIGKILLed and replaced every 20-80 ms for 20 s while the learner samples
    and updates priorities: nothing torn is ever sampled, every acknowledged insert
    survives, the table verifies, and no call of the learner waits long."""
    seconds = 20.0
    table = shmreplay.Table("t", selectors.Prioritized(0.6), selectors.Fifo(), 400_000,
                            rate_limiters.MinSize(1), signature=CW.ITEM)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        _prefill(client, 64, start=-1_000)
        # The learner's calls once before timing them: the first call of a kernel in a
        # process loads (or compiles) it, which is no wait on a dead process.
        warm = client.sample_batch("t", 64, timeout=2)
        client.update_priorities("t", warm.info.key, np.ones(64))
        counts = SPAWN.RawArray("q", 20_000)
        incarnations = SPAWN.RawValue("q", 0)
        started, done = SPAWN.Event(), SPAWN.Event()
        controller = SPAWN.Process(target=CW.storm, args=(server.name, seconds, 3, 4321, counts,
                                                          incarnations, started, done))
        controller.start()
        rng = np.random.default_rng(0)
        slowest = samples = slowest_at = 0
        try:
            assert started.wait(60)
            while not done.is_set():
                t0 = time.monotonic()
                batch = client.sample_batch("t", 64, timeout=2)
                x, v = batch.data["x"], batch.data["v"]
                assert (x == v[:, None]).all(), f"torn items sampled: {v[(x != v[:, None]).any(1)]}"
                client.update_priorities("t", batch.info.key, rng.uniform(0.1, 3.0, len(v)))
                took = time.monotonic() - t0
                if took > slowest:
                    slowest, slowest_at = took, samples // len(v)
                samples += len(v)
            controller.join(30)
        finally:
            if controller.is_alive():
                controller.kill()
                controller.join(10)
        assert controller.exitcode == 0
        killed = incarnations.value
        assert killed > 10 * seconds, f"only {killed} actors ran"  # about 25 per second
        visible = _visible(client)
        missing = [k for k in range(killed)
                   if not {k * CW.STORM_STRIDE + i for i in range(counts[k])} <= visible]
        assert not missing, f"acknowledged inserts lost by incarnations {missing[:10]}"
        assert client.verify("t") == []
        assert slowest < 1.0, f"learner call {slowest_at} took {slowest:.2f} s"
        # Some died holding the lock (every tenth actor is armed to; others by chance).
        assert int(client._engine("t").ctrl[L.C_RECOVERIES]) >= 10
        _assert_healthy(client)
        print(f"storm: {killed} actors killed, {len(visible)} items, {samples} sampled, "
              f"slowest learner call {slowest * 1e3:.0f} ms, "
              f"{int(client._engine('t').ctrl[L.C_RECOVERIES])} lock recoveries")
        client.close()

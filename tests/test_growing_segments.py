"""Data segments whose stores are reserved as the table fills (``shmreplay._engine.growth``).

A large ``max_size`` costs nothing until used, as in Reverb, and still no write can
meet a full /dev/shm (SIGBUS): a growth /dev/shm cannot hold is a typed error that
changes nothing. Growth is shared by every process of the buffer, survives a process
killed half-way through it, and a checkpoint restores only what it holds.
"""

import errno
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import _growth_workers as GW
import _names
import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay._engine import growth
from shmreplay._shm import crash_points as _crash_points
from shmreplay._shm import layout as L
from shmreplay._shm.kernels import codes

SPAWN = multiprocessing.get_context("spawn")
FRAME = shmreplay.TensorSpec((8192,), np.float64)  # 64 KiB
SMALL = shmreplay.TensorSpec((GW.WIDTH,), np.float64)  # 4 KiB
STEP = 256 << 10  # growth steps of the tests that cross many growths


def _free() -> int:
    stat = os.statvfs("/dev/shm")
    return stat.f_bavail * stat.f_frsize


def _data_file(server) -> str:
    (entry,) = [e for e in os.listdir("/dev/shm")
                if e.startswith(L.data_segment_prefix(server.name))]
    return os.path.join("/dev/shm", entry)


def _uniform(name, max_size, signature=None):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1), signature=signature)


@pytest.fixture
def small_steps(monkeypatch):
    """Growth in steps of ``STEP`` bytes in this process (the workers set their own)."""
    monkeypatch.setattr(growth, "STEP", STEP)
    monkeypatch.setattr(growth, "WHOLE", STEP)


def _drain(client, table, count):
    """Every item of a queue, in order (``count`` of them)."""
    out = []
    while len(out) < count:
        batch = client.sample_batch(table, count - len(out), timeout=5)
        out.extend(batch.data)
    return np.array(out)


def test_a_table_larger_than_dev_shm_is_made_at_once_and_takes_items(buffer_name):
    free = _free()
    max_size = 2 * free // FRAME.dtype.itemsize // 8192  # stores twice /dev/shm's space
    start = time.monotonic()
    with shmreplay.Server([_uniform("big", max_size, FRAME)], name=buffer_name) as server:
        made = time.monotonic() - start
        assert made < 15, made  # (0.3 s here: the header segment; no store is zeroed)
        client = shmreplay.Client(server.name)
        for i in range(24):
            client.insert(np.full(8192, i, np.float64), {"big": 1.0}, timeout=5)
        client.insert_batch(np.repeat(np.arange(24, 32.0)[:, None], 8192, axis=1),
                            {"big": np.ones(8)}, timeout=5)
        batch = client.sample_batch("big", 64, timeout=5).data
        assert (batch == batch[:, :1]).all() and set(batch[:, 0]) <= set(range(32))
        path = _data_file(server)
        info = os.stat(path)
        assert info.st_size > free  # the whole table would not fit
        assert info.st_blocks * 512 < 3 * growth.STEP  # what it reserved: one step or two
        engine = client._engine("big")
        assert 32 <= engine.ctrl[L.C_SLOT_LIMIT] < engine.capacity
        assert client.verify("big") == []
        client.close()


def test_a_large_table_of_steps_grows_its_rows(buffer_name, small_steps):
    free = _free()
    max_size = free // FRAME.dtype.itemsize // 8192  # two rows per item: twice /dev/shm
    signature = {"obs": shmreplay.TensorSpec((2, 8192), np.float64)}
    with shmreplay.Server([_uniform("steps", max_size, signature)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        with client.trajectory_writer(num_keep_alive_refs=2) as writer:
            for i in range(40):  # 2.5 MiB of steps
                writer.append({"obs": np.full(8192, i, np.float64)})
                if i:
                    writer.create_item("steps", 1.0, {"obs": writer.history["obs"][-2:]})
            writer.flush()
        engine = client._engine("steps")
        assert engine.ctrl[L.C_ROW_FRESH] == 40
        limit = int(engine.ctrl[L.C_ROW_LIMIT])
        assert 40 <= limit < engine.ctrl[L.C_ROW_CAPACITY]
        assert limit * 8 * 8192 <= 4 * 40 * 8 * 8192  # grown as it filled, not to the end
        for sample in client.sample("steps", 16, emit_timesteps=False):
            (obs,) = sample.data
            assert obs.shape == (2, 8192) and (obs[1] == obs[0] + 1).all()
        assert os.stat(_data_file(server)).st_size > free
        assert client.verify("steps") == []
        client.close()


def _words(engine):
    return {name: int(engine.ctrl[getattr(L, name)])
            for name in ("C_SIZE", "C_INSERTS", "C_PENDING", "C_FRESH", "C_FREE_TOP",
                         "C_SLOT_LIMIT", "C_NEXT_ID", "C_TOTAL_INSERTED", "C_RESERVES",
                         "C_ROW_FRESH", "C_ROW_LIMIT", "C_ROWS_LIVE")}


def _no_space(monkeypatch):
    def fallocate(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", fallocate)


def test_a_full_dev_shm_at_growth_is_a_typed_error_and_changes_nothing(
        buffer_name, small_steps, monkeypatch):
    table = shmreplay.Table.queue("q", 1000, signature=SMALL)  # 4 MiB of stores
    with shmreplay.Server([table], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        engine = client._engine("q")
        client.insert(GW.tagged(0, 0), {"q": 1.0}, timeout=5)
        reserved = int(engine.ctrl[L.C_SLOT_LIMIT])
        assert reserved == STEP // (GW.WIDTH * 8)  # one step of 64 rows
        for i in range(1, reserved):
            client.insert(GW.tagged(0, i), {"q": 1.0}, timeout=5)
        before = _words(engine)
        real = os.posix_fallocate
        _no_space(monkeypatch)
        message = (r"(?s)Table 'q'.*cannot grow from 64 to 128 of its 2000 item slots.*"
                   r"needs 0.25 MiB more.*full table needs 7.81 MiB.*Nothing was inserted")
        with pytest.raises(errors.SharedMemoryFullError, match=message):
            client.insert(GW.tagged(0, reserved), {"q": 1.0}, timeout=5)
        with pytest.raises(errors.SharedMemoryFullError, match=message):
            client.insert_batch(np.stack([GW.tagged(1, i) for i in range(3)]),
                                {"q": np.ones(3)}, timeout=5)
        with pytest.raises(errors.SharedMemoryFullError, match=message):
            with client.trajectory_writer(num_keep_alive_refs=1) as writer:
                writer.append(GW.tagged(2, 0))
                writer.create_item("q", 1.0, writer.history[-1])
        assert _words(engine) == before
        assert client.verify("q") == []
        monkeypatch.setattr(os, "posix_fallocate", real)
        client.insert(GW.tagged(0, reserved), {"q": 1.0}, timeout=5)
        assert engine.ctrl[L.C_SLOT_LIMIT] == 2 * reserved
        items = _drain(client, "q", reserved + 1)
        assert (items == np.stack([GW.tagged(0, i) for i in range(reserved + 1)])).all()
        client.close()


def test_a_full_dev_shm_at_growth_of_step_rows_changes_nothing(
        buffer_name, small_steps, monkeypatch):
    signature = {"x": shmreplay.TensorSpec((1, GW.WIDTH), np.float64)}
    with shmreplay.Server([_uniform("s", 1000, signature)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        engine = client._engine("s")
        with client.trajectory_writer(num_keep_alive_refs=1) as writer:
            i = 0
            while i == 0 or engine.ctrl[L.C_ROW_FRESH] < engine.ctrl[L.C_ROW_LIMIT]:
                writer.append({"x": GW.tagged(0, i)})
                writer.create_item("s", 1.0, {"x": writer.history["x"][-1:]})
                writer.flush()
                i += 1
        reserved = int(engine.ctrl[L.C_ROW_LIMIT])
        assert reserved == i == 64
        before = _words(engine)
        assert before["C_ROW_FRESH"] == before["C_ROW_LIMIT"] == reserved
        _no_space(monkeypatch)
        with pytest.raises(errors.SharedMemoryFullError, match=r"Table 's'.*step rows"):
            with client.trajectory_writer(num_keep_alive_refs=2) as writer:
                writer.append({"x": GW.tagged(1, 0)})
                writer.create_item("s", 1.0, {"x": writer.history["x"][-1:]})
        assert _words(engine) == before
        assert client.verify("s") == []
        client.close()


def test_two_processes_insert_across_growths_by_name(buffer_name, small_steps):
    table = shmreplay.Table.queue("q", 2000, signature=SMALL)  # 8 MiB: 64 rows, then x2
    count = 600
    with shmreplay.Server([table], name=buffer_name) as server:
        queue, start = SPAWN.Queue(), SPAWN.Event()
        workers = [SPAWN.Process(target=GW.insert_tagged,
                                 args=(server.name, "q", tag, count, STEP, start, queue))
                   for tag in (1, 2)]
        for worker in workers:
            worker.start()
        try:
            for _ in workers:
                assert queue.get(timeout=120)[0] == "ready"
            start.set()
            for _ in workers:
                message = queue.get(timeout=120)
                assert message[0] == "done", message
        finally:
            for worker in workers:
                worker.join(30)
                if worker.is_alive():
                    worker.kill()
        client = shmreplay.Client(server.name)
        engine = client._engine("q")
        assert engine.ctrl[L.C_SLOT_LIMIT] >= 2 * count > 16 * 64  # grew several times
        assert client.verify("q") == []
        items = _drain(client, "q", 2 * count)
        assert (items == items[:, :1]).all()  # no torn item
        values = items[:, 0].astype(np.int64)
        for tag in (1, 2):
            mine = values[values // 1_000_000 == tag] % 1_000_000
            assert mine.tolist() == list(range(count))  # all there, in each one's order
        client.close()


@pytest.mark.parametrize("in_kernel", [False, True], ids=["reserved", "lock-held"])
def test_a_process_killed_while_growing_leaves_the_table_usable(
        buffer_name, small_steps, in_kernel):
    table = shmreplay.Table.queue("q", 5000, signature=SMALL)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        engine = client._engine("q")
        queue = SPAWN.Queue()
        child = SPAWN.Process(target=GW.die_while_growing,
                              args=(server.name, "q", STEP, in_kernel, queue))
        child.start()
        try:
            message = queue.get(timeout=120)
            assert message[0] == "ready", message
            if in_kernel:
                _crash_points.arm(engine, codes.STOP_GROW, child.pid)
            assert _crash_points.wait_stopped(child.pid, 60), "it never grew the table"
            _crash_points.disarm(engine)
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
            assert child.exitcode == -signal.SIGKILL
        finally:
            if child.is_alive():
                child.kill()
                child.join(10)
        inserted = int(engine.ctrl[L.C_SIZE])
        assert inserted == 64  # the first step's rows, all the child had
        assert engine.ctrl[L.C_SLOT_LIMIT] == (128 if in_kernel else 64)
        start = time.monotonic()
        for i in range(300):  # across the growths the child began, and more
            client.insert(GW.tagged(3, i), {"q": 1.0}, timeout=1)
        assert time.monotonic() - start < 30
        assert client.verify("q") == []
        items = _drain(client, "q", inserted + 300)
        assert (items == items[:, :1]).all()
        assert (items[:inserted, 0] == [9_000_000 + i for i in range(inserted)]).all()
        assert (items[inserted:, 0] == [3_000_000 + i for i in range(300)]).all()
        client.close()


def test_a_checkpoint_restores_into_a_table_larger_than_dev_shm(buffer_name, tmp_path):
    free = _free()
    max_size = 2 * free // (8 * 8192)
    path = str(tmp_path / "big.ckpt")
    table = shmreplay.Table.queue("big", max_size, signature=FRAME)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert_batch(np.repeat(np.arange(20.0)[:, None], 8192, axis=1),
                            {"big": np.ones(20)}, timeout=5)
        client.checkpoint(path)
        client.close()
    with shmreplay.Server(name=_names.unique("restored"), checkpoint=path) as server:
        info = os.stat(_data_file(server))
        assert info.st_size > free and info.st_blocks * 512 < 3 * growth.STEP
        with shmreplay.Client(server.name) as client:
            items = _drain(client, "big", 20)
            assert (items == np.arange(20.0)[:, None]).all()
            client.insert(np.zeros(8192), {"big": 1.0}, timeout=5)
            assert client.verify("big") == []


def test_a_forgotten_layout_starts_its_slots_again(buffer_name, small_steps):
    with shmreplay.Server([_uniform("t", 1000)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for i in range(100):
            client.insert(GW.tagged(0, i), {"t": 1.0}, timeout=5)
        client.reset("t")  # no signature: the next item may have another shape
        engine = client._engine("t")
        assert engine.ctrl[L.C_FRESH] == 0 and engine.ctrl[L.C_SLOT_LIMIT] == 0
        for i in range(300):
            client.insert(np.full(2 * GW.WIDTH, i, np.float32), {"t": 1.0}, timeout=5)
        assert engine.ctrl[L.C_FRESH] <= engine.ctrl[L.C_SLOT_LIMIT] < 1000
        assert client.verify("t") == []
        client.close()


def test_verify_reports_a_slot_past_the_reserved_stores(buffer_name, small_steps):
    table = shmreplay.Table.queue("q", 1000, signature=SMALL)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for i in range(10):
            client.insert(GW.tagged(0, i), {"q": 1.0}, timeout=5)
        engine = client._engine("q")
        limit = int(engine.ctrl[L.C_SLOT_LIMIT])
        engine.ctrl[L.C_SLOT_LIMIT] = 5
        assert client.verify("q") == [
            "a slot or step row in use lies past the data segment's reserved memory"]
        engine.ctrl[L.C_SLOT_LIMIT] = limit
        assert client.verify("q") == []
        client.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare to mount a small private /dev/shm")
def test_a_really_full_dev_shm_at_growth_is_a_typed_error_not_sigbus():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.environ.get("PYTHONPATH", ""), here]).strip(os.pathsep))
    script = (f"mount -t tmpfs -o size=48m tmpfs /dev/shm && exec {sys.executable} "
              f"{os.path.join(here, '_growth_workers.py')}")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    cases = json.loads(result.stdout.strip().splitlines()[-1])
    assert cases["full"]["result"] == "SharedMemoryFullError", cases["full"]
    assert "Table 'q'" in cases["full"]["message"]
    assert "cannot grow" in cases["full"]["message"]
    assert 1000 < cases["inserted"] == cases["size"] == cases["fresh"] <= cases["limit"]
    assert cases["batch"]["result"] == "SharedMemoryFullError", cases["batch"]
    assert cases["verify"] == []
    assert cases["first"] == list(range(100)) and cases["whole"]
    assert cases["left"] == []


def test_growth_doubles_between_its_least_and_its_most(buffer_name, small_steps, monkeypatch):
    monkeypatch.setattr(growth, "MOST", 2 * STEP)  # 128 rows of 4 KiB
    table = shmreplay.Table.queue("q", 5000, signature=SMALL)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        engine = client._engine("q")
        limits = []
        for i in range(600):
            client.insert(GW.tagged(0, i), {"q": 1.0}, timeout=5)
            if not limits or limits[-1] != engine.ctrl[L.C_SLOT_LIMIT]:
                limits.append(int(engine.ctrl[L.C_SLOT_LIMIT]))
        assert limits == [64, 128, 256, 384, 512, 640]  # doubling, then 128 at a time
        blocks = os.stat(_data_file(server)).st_blocks * 512
        assert 640 * 4096 <= blocks < 640 * 4096 + (1 << 20)  # (+ the segment's other parts)
        client.close()

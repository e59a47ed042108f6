"""Processes that share /dev/shm but not a pid namespace (the containers of one pod).

A pid recorded by a process of another namespace means nothing here: such writers and
owners are never judged dead (their slots are not reclaimed, their buffers not
collected). And a writer whose slot was freed anyway gets ``ReservationLostError`` at
its commit, never a corrupt table.

The cross-namespace tests run the other side under ``unshare --pid --fork
--mount-proc`` (root, or a kernel that lets this user make namespaces) and skip where
that is refused. Its process takes a pid that no process has here, so that today's
pid check would call it dead.
"""

import functools
import json
import os
import select
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import shmreplay
from shmreplay import errors
from shmreplay._shm import layout as L
from shmreplay._shm import procs as _procs
from shmreplay._shm.kernels import codes
from shmreplay._shm.kernels import table as kernels

WORKER = os.path.join(os.path.dirname(__file__), "_pidns_workers.py")
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


@functools.lru_cache(maxsize=None)
def _unshare_refused():
    """Why ``unshare --pid`` cannot run here, or None if it can."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    try:
        done = subprocess.run(UNSHARE + ["true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if done.returncode != 0:
        return f"unshare --pid refused (needs root or user namespaces): {done.stderr.strip()}"
    return None


needs_unshare = pytest.mark.skipif("_unshare_refused() is not None",
                                   reason="unshare --pid is not allowed here")


def _free_pid():
    """A pid no process has in this namespace now (that of a process that just ended:
    pids are handed out in increasing order, so it stays free for a long while)."""
    child = subprocess.Popen(["true"])
    child.wait(timeout=30)
    return child.pid


class Inner:
    """A role of ``_pidns_workers`` in a new pid namespace, where its pid is ``pid``."""

    def __init__(self, role, name):
        self.name = name
        self.pid = _free_pid()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (os.path.dirname(os.path.dirname(shmreplay.__file__)),
                        os.environ.get("PYTHONPATH")) if p))
        self.process = subprocess.Popen(
            UNSHARE + [sys.executable, WORKER, str(self.pid), role, name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)

    def read(self, timeout=60):
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"no answer from the inner process within {timeout} s")
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the inner process ended: {self.process.stderr.read()}")
        return json.loads(line)

    def tell(self, word):
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def finish(self, timeout=60):
        try:
            assert self.process.wait(timeout=timeout) == 0, self.process.stderr.read()
        finally:
            self.close()

    def close(self):
        if self.process.poll() is None:
            self.process.kill()  # --kill-child: the namespace's processes go with it
            self.process.wait(timeout=30)
            # A killed owner could not remove its buffer (the test failed already).
            for entry in os.listdir("/dev/shm"):
                if entry.startswith(f"shmreplay.{self.name}"):
                    os.unlink(os.path.join("/dev/shm", entry))
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            stream.close()


def _cli(*args, only=None):
    """``shmreplay ARGS``; with ``only``, seeing only the buffers whose names start so
    (``gc`` must not remove another test run's dead owner's buffer, as test_cli says)."""
    code = ("import sys\n"
            "from shmreplay import cli\n"
            "from shmreplay._shm import peek as _peek\n"
            "every = _peek.segments\n"
            "if sys.argv[1]:\n"
            "    _peek.segments = lambda: {n: e for n, e in every().items()\n"
            "                              if n.startswith(sys.argv[1])}\n"
            "sys.exit(cli.main(sys.argv[2:]))\n")
    done = subprocess.run([sys.executable, "-c", code, only or "", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_unshare
def test_a_writer_in_another_pid_namespace_is_never_reclaimed(buffer_name):
    """The actor (another namespace) holds a reservation while this process verifies
    and is refused an insert (both look for dead writers): its slot stays reserved, and
    all its acknowledged items arrive."""
    with shmreplay.Server([shmreplay.Table.queue("q", 4)], name=buffer_name):
        client = shmreplay.Client(buffer_name)
        engine = client._engine("q")
        inner = Inner("actor", buffer_name)
        try:
            held = inner.read()
            assert held["pid"] == inner.pid
            slot = held["slot"]
            assert client.verify("q") == []  # (reclaims dead writers first)
            assert engine.meta[slot, L.M_STATE] == codes.WRITING
            assert _procs.writer_alive(held["stamp"]) is None  # not judged from here
            client.insert({"id": np.int64(100)}, {"q": 1.0}, timeout=5)  # 2 + 1 held + 1
            started = time.monotonic()
            with pytest.raises(errors.DeadlineExceededError):
                client.insert({"id": np.int64(101)}, {"q": 1.0}, timeout=0.6)
            assert time.monotonic() - started < 5
            assert engine.meta[slot, L.M_STATE] == codes.WRITING
            inner.tell("commit")
            committed = inner.read()
            assert "key" in committed, committed
            inner.finish()
        finally:
            inner.close()
        assert client.verify("q") == []
        ids = sorted(client.sample_batch("q", 4, timeout=5).data["id"].tolist())
        assert ids == [0, 1, 2, 100]
        client.close()


@needs_unshare
def test_a_buffer_owned_in_another_pid_namespace_is_not_collected(buffer_name):
    """``ls`` says its owner cannot be judged from here, ``gc`` and a Server of the same
    name leave it alone, and the owner goes on using it."""
    inner = Inner("owner", buffer_name)
    try:
        assert inner.read()["pid"] == inner.pid
        line = next(line for line in _cli("ls").splitlines()
                    if line.startswith(buffer_name + " "))
        assert line.split()[1:3] == [str(inner.pid), "other-ns"]
        collected = _cli("gc", only=buffer_name)
        assert f"{buffer_name}: left alone" in collected
        assert os.path.exists(f"/dev/shm/shmreplay.{buffer_name}")
        with pytest.raises(errors.BufferExistsError, match="another pid namespace"):
            shmreplay.Server([shmreplay.Table.queue("q", 4)], name=buffer_name)
        assert "another pid namespace" in _cli("info", buffer_name)
        inner.tell("check")
        checked = inner.read()
        assert checked["key"] > 0 and checked["problems"] == []
        inner.finish()
    finally:
        inner.close()
    assert not os.path.exists(f"/dev/shm/shmreplay.{buffer_name}")


def _freed_under(engine, slots):
    """Frees ``slots`` as a reclaimer that wrongly judged this process dead."""
    slots = np.asarray(slots, np.int64)
    stamps = engine.meta[slots, L.M_WRITER].copy()
    assert kernels.cancel(*engine.arrays, slots, stamps) == len(slots)


def _raises_lost():
    """``ReservationLostError``, checked by name: also a ``BufferBrokenError``."""
    return pytest.raises(errors.BufferBrokenError, match="insert it again")


@pytest.mark.parametrize("path", ["commit", "commit_one", "commit_whole"])
def test_a_commit_of_a_slot_freed_under_its_writer_is_refused(buffer_name, path):
    """A wrong reclaim costs the writer its item (a typed error), never the table: a
    batch publishes none of its items, and the slots it still held are freed."""
    with shmreplay.Server([shmreplay.Table.queue("q", 8)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"id": np.int64(0)}, {"q": 1.0}, timeout=5)  # defines the columns
        engine = client._engine("q")
        n = 1 if path == "commit_one" else 3
        work = np.empty(5 * n + 1, np.int64)
        if path == "commit_whole":
            status = kernels.reserve_whole(engine._header_bytes, engine._table_offsets, n,
                                           np.ones(n), engine.max_priority,
                                           _procs.STAMP[0], work, np.zeros(2, np.int64))
            assert status == n
            slots = work[:n].copy()
        else:
            slots = engine.reserve(n, timeout=5)
        engine.write(slots, [np.arange(1, n + 1)], True)
        _freed_under(engine, slots[n // 2:n // 2 + 1])
        if path == "commit_one":
            status = kernels.commit_one(*engine.arrays, int(slots[0]), 1.0, np.empty(2),
                                        _procs.STAMP[0], 0)
            assert status == codes.LOST
            with _raises_lost() as raised:
                engine._raise_status(status)
        elif path == "commit":
            with _raises_lost() as raised:
                engine.commit(slots, np.ones(n))
        else:
            status = kernels.commit_whole(engine._header_bytes, engine._table_offsets, work,
                                          n, np.ones(n), np.empty(n, np.uint64),
                                          np.empty(2), _procs.STAMP[0])
            assert status == codes.LOST
        if path != "commit_whole":
            assert type(raised.value).__name__ == "ReservationLostError"
            assert "'q'" in str(raised.value)
        assert client.verify("q") == []
        info = client.server_info()["q"]
        assert info.current_size == 1
        assert int(engine.counters()[L.C_PENDING]) == 0
        client.insert({"id": np.int64(9)}, {"q": 1.0}, timeout=5)  # inserting again works
        assert sorted(client.sample_batch("q", 2, timeout=5).data["id"].tolist()) == [0, 9]
        client.close()


def test_a_trajectory_writer_whose_slot_was_freed_raises_and_can_go_on(buffer_name,
                                                                        monkeypatch):
    from shmreplay._writers import writing as _writing
    with shmreplay.Server([shmreplay.Table.queue("q", 8)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        engine = client._engine("q")
        real = _writing.kernels.commit_one
        lose = {"next": True}

        def commit_one(*args):  # args: the 7 arrays, slot, priority, io, stamp
            if lose["next"]:
                lose["next"] = False
                _freed_under(engine, [args[7]])
            return real(*args)

        monkeypatch.setattr(_writing.kernels, "commit_one", commit_one)
        with client.trajectory_writer(num_keep_alive_refs=2) as writer:
            writer.append({"x": np.float32(1)})
            with _raises_lost() as raised:
                writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
            assert type(raised.value).__name__ == "ReservationLostError"
            writer.append({"x": np.float32(2)})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
            writer.flush()
        assert client.verify("q") == []
        assert client.sample_batch("q", 1, timeout=5).data["x"].tolist() == [[2.0]]
        client.close()


@needs_unshare
def test_a_process_whose_proc_shows_another_namespace_judges_nobody():
    """``unshare --pid`` without ``--mount-proc``: ``/proc`` still shows this namespace's
    pids, so the inner process's namespace is unknown (0), and its stamps are judged by
    nobody."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(shmreplay.__file__)))
    done = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c",
         "import os; from shmreplay._shm import procs as _procs; "
         "print(os.getpid(), _procs.NS[0], _procs.STAMP[0], _procs.judge(os.getpid(), 0))"],
        capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    pid, namespace, stamp, judged = done.stdout.split()
    assert (pid, namespace, stamp, judged) == ("1", "0", "1", "None")
    assert _procs.writer_alive(int(stamp)) is None  # pid 1 runs here, but is not judged


def test_stamps_carry_the_namespace_and_foreign_ones_are_not_judged():
    pid, namespace = _procs.split_stamp(_procs.STAMP[0])
    assert pid == os.getpid() and namespace == _procs.NS[0]
    assert _procs.NS[0] == os.stat("/proc/self/ns/pid").st_ino & 0x7FFFFFFF
    assert _procs.writer_alive(_procs.STAMP[0]) is True
    assert _procs.writer_alive(_procs.stamp_of(_free_pid(), _procs.NS[0])) is False
    other = _procs.NS[0] ^ 1
    assert _procs.writer_alive(_procs.stamp_of(_free_pid(), other)) is None
    assert _procs.writer_alive(_procs.stamp_of(_free_pid(), 0)) is None  # unknown
    assert _procs.judge(os.getpid(), 0) is None

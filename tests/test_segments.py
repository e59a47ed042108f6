"""Segment names and creation (issue 18, points 2, 4, 5 and 10; docs/design.md "Segment
names and creation"): no two buffers' segments can share a name; a table's data
segment is created by one process, which others wait for while it lives and replace
only once it is dead; a file someone else put in /dev/shm is a typed error at once;
a /dev/shm too small for a segment is a typed error at its creation, never a SIGBUS.
"""

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

import _mp_workers as W
import _segment_workers as SW
import shmreplay
from shmreplay._shm import layout as L
from shmreplay import cli, errors
from shmreplay._shm import peek as _peek

SPAWN = multiprocessing.get_context("spawn")
NOBODY = 65534


def _shm(entry):
    return os.path.join(_peek.SHM_DIR, entry)


def _queue_server(name):
    return shmreplay.Server([shmreplay.Table.queue("q", 10)], name=name)


def _cli(*args):
    import io
    out = io.StringIO()
    status = cli.main(list(args), out=out)
    return status, out.getvalue()


# --- point 5: names -----------------------------------------------------------------------

def _pairs(base):
    """Pairs of valid buffer names whose segments the old ``NAME.tI`` scheme mixed up."""
    return [(base, f"{base}.t0"), (base, f"{base}.t10"), (f"{base}.t0", f"{base}.t0.t1"),
            (base, f"{base}.t0.t0"), ("port-41234", "port-41234.t0")]


def test_parsing_gives_each_segment_to_one_buffer(buffer_name):
    for first, second in _pairs(buffer_name):
        for name in (first, second):
            assert L.parse_segment(L.header_segment_name(name)[1:]) == (name, None)
            for index in (0, 1, 10):
                entry = L.data_segment_name(name, index, L.new_token())[1:]
                assert L.parse_segment(entry) == (name, index)
                assert entry.startswith(L.data_segment_prefix(name))
                other = second if name == first else first
                assert not entry.startswith(L.data_segment_prefix(other))
                assert entry != L.header_segment_name(other)[1:]
    for foreign in ("shmreplay.", "other.x", "shmreplay.x:t0", "shmreplay.x:t0:12",
                    "shmreplay.x:q0:0123456789abcdef", "shmreplay.:t0:0123456789abcdef"):
        assert L.parse_segment(foreign) is None


@pytest.mark.parametrize("pair", range(5))
def test_buffers_with_colliding_old_names_live_side_by_side(buffer_name, pair):
    first, second = _pairs(buffer_name)[pair]
    with _queue_server(first) as a, _queue_server(second) as b:
        ca, cb = shmreplay.Client(a.name), shmreplay.Client(b.name)
        cb.insert(np.full(3, 2.0), {"q": 1.0}, timeout=5)
        ca.insert(np.full(3, 1.0), {"q": 1.0}, timeout=5)  # a's first insert keeps b's data
        listed = _peek.segments()
        assert listed[first] and listed[second]
        assert not set(listed[first]) & set(listed[second])
        assert set(_peek.segments_of(first)) == set(listed[first])
        assert set(_peek.segments_of(second)) == set(listed[second])
        ca.close()
        a.stop()  # stopping a removes nothing of b
        assert _peek.segments_of(first) == []
        np.testing.assert_array_equal(cb.sample_batch("q", 1, timeout=5).data, [[2.0] * 3])
        cb.insert(np.full(3, 3.0), {"q": 1.0}, timeout=5)
        cb.close()
    with _queue_server(second) as b, _queue_server(first) as a:
        cb = shmreplay.Client(b.name)
        cb.insert(np.full(3, 2.0), {"q": 1.0}, timeout=5)
        a.stop()
        np.testing.assert_array_equal(cb.sample_batch("q", 1, timeout=5).data, [[2.0] * 3])
        cb.close()


@pytest.mark.parametrize("pair", range(5))
@pytest.mark.parametrize("dead_one, command", [(0, "rm"), (1, "gc")])
def test_rm_gc_and_ls_of_a_dead_buffer_leave_its_neighbours_alone(buffer_name, pair,
                                                                    dead_one, command):
    names = _pairs(buffer_name)[pair]
    dead, live = names[dead_one], names[1 - dead_one]
    queue = SPAWN.Queue()
    owner = SPAWN.Process(target=SW.dying_owner, args=(dead, queue))
    with _queue_server(live) as server, W.processes(owner):
        client = shmreplay.Client(server.name)
        client.insert(np.full(3, 5.0), {"q": 1.0}, timeout=5)
        W.get(queue, 60, "ready")
        W.kill_and_reap(owner)
        assert len(_peek.segments_of(dead)) == len(_peek.segments_of(live)) == 2
        _, text = _cli("ls")
        listed = {line.split()[0] for line in text.splitlines()[1:] if line.strip()}
        assert {dead, live} <= listed
        status, text = _cli(command, dead) if command == "rm" else _cli(command)
        assert f"{dead}: " in text and f"{live}: " not in text
        assert _peek.segments_of(dead) == []
        assert len(_peek.segments_of(live)) == 2
        np.testing.assert_array_equal(client.sample_batch("q", 1, timeout=5).data, [[5.0] * 3])
        client.close()


# --- point 4: a slow creator ----------------------------------------------------------------

def _state(pid):
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()[0]


def _creator(name, queue):
    created = SPAWN.Event()
    creator = SPAWN.Process(target=SW.stopping_creator, args=(name, "q", 7.0, created, queue))
    creator.created = created
    return creator


def _stopped(creator, name):
    """The name of the data segment ``creator`` made, once it has stopped itself."""
    assert creator.created.wait(60)
    assert W.wait_until(lambda: _state(creator.pid) == b"T", 10)
    header = L.SEGMENT_PREFIX + name
    data = [e for e in os.listdir(_peek.SHM_DIR) if e.startswith(header) and e != header]
    assert len(data) == 1
    return "/" + data[0]


def test_others_wait_for_a_stopped_creator_and_get_its_items(buffer_name):
    queue = SPAWN.Queue()
    with _queue_server(buffer_name) as server:
        client = shmreplay.Client(server.name)
        creator = _creator(server.name, queue)
        with W.processes(creator):
            data_name = _stopped(creator, server.name)
            start = time.monotonic()
            with pytest.raises(errors.DeadlineExceededError,
                               match=rf"pid {creator.pid} \(stopped"):
                client.insert(np.full(16, 1.0), {"q": 1.0}, timeout=0.3)
            assert time.monotonic() - start < 1.5  # within its timeout, not forever
            # Longer than any delay once guessed to mean "dead": still waits.
            with pytest.raises(errors.DeadlineExceededError):
                client.insert(np.full(16, 1.0), {"q": 1.0}, timeout=2.5)
            assert os.path.exists("/dev/shm" + data_name)  # nobody replaced it
            os.kill(creator.pid, signal.SIGCONT)
            key = W.get(queue, 30, "inserted")["q"]
            creator.join(10)
            assert creator.exitcode == 0
        client.insert(np.full(16, 1.0), {"q": 1.0}, timeout=5)
        sample = client.sample_batch("q", 2, timeout=5)
        assert int(sample.info.key[0]) == key
        np.testing.assert_array_equal(sample.data[0], np.full(16, 7.0))  # not zeros
        assert client.verify("q") == []
        assert _peek.segments_of(server.name) == [L.SEGMENT_PREFIX + server.name,
                                                  data_name[1:]]
        client.close()


def test_a_killed_creator_is_taken_over_and_its_file_removed(buffer_name):
    queue = SPAWN.Queue()
    with _queue_server(buffer_name) as server:
        client = shmreplay.Client(server.name)
        creator = _creator(server.name, queue)
        with W.processes(creator):
            data_name = _stopped(creator, server.name)
            W.kill_and_reap(creator)
        start = time.monotonic()
        key = client.insert(np.full(16, 3.0), {"q": 1.0}, timeout=30)["q"]
        assert time.monotonic() - start < 10  # took over at once, not at its timeout
        assert not os.path.exists("/dev/shm" + data_name)
        sample = client.sample_batch("q", 1, timeout=5)
        assert int(sample.info.key[0]) == key
        np.testing.assert_array_equal(sample.data[0], np.full(16, 3.0))
        assert len(_peek.segments_of(server.name)) == 2
        client.close()


# --- point 2: squatters ------------------------------------------------------------------

def _squat(path):
    with open(path, "wb") as squatted:
        squatted.write(b"not yours")
    os.chown(path, NOBODY, NOBODY)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create another uid's file")
def test_a_squatted_predictable_name_does_not_matter(buffer_name):
    with _queue_server(buffer_name) as server:
        squats = [_shm(f"shmreplay.{buffer_name}{tail}") for tail in (".t0", ":t0")]
        for path in squats:
            _squat(path)
        try:
            client = shmreplay.Client(server.name)
            start = time.monotonic()
            client.insert(np.full(4, 1.0), {"q": 1.0}, timeout=30)
            assert time.monotonic() - start < 10  # at once, not at its timeout
            assert all(os.stat(path).st_uid == NOBODY for path in squats)  # untouched
            client.close()
        finally:
            for path in squats:
                os.unlink(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create another uid's file")
def test_a_squatted_segment_name_is_a_typed_error_at_once(buffer_name, monkeypatch):
    with _queue_server(buffer_name) as server:
        client = shmreplay.Client(server.name)
        path = _shm(L.data_segment_name(buffer_name, 0, 0x5eed)[1:])
        _squat(path)
        try:
            monkeypatch.setattr(L, "new_token", lambda: 0x5eed)  # as if it were guessed
            start = time.monotonic()
            with pytest.raises(errors.SegmentSquattedError,
                               match=rf"{path} already exists and belongs to uid {NOBODY}"):
                client.insert(np.full(4, 1.0), {"q": 1.0}, timeout=30)
            assert time.monotonic() - start < 10  # at once, not at its timeout (30 s)
            monkeypatch.undo()
            client.insert(np.full(4, 1.0), {"q": 1.0}, timeout=1)  # the claim was released
            assert os.stat(path).st_uid == NOBODY
        finally:
            os.unlink(path)
        client.close()
    header = _shm(L.SEGMENT_PREFIX + buffer_name)
    _squat(header)
    try:
        with pytest.raises(errors.SegmentSquattedError, match=f"belongs to uid {NOBODY}"):
            _queue_server(buffer_name)
    finally:
        os.unlink(header)


# --- point 10: a full /dev/shm ---------------------------------------------------------------

def test_a_table_larger_than_dev_shm_is_refused_at_creation(buffer_name):
    start = time.monotonic()
    with pytest.raises(errors.SharedMemoryFullError, match=r"(?s)needs .* GiB.* free.*max_size"):
        shmreplay.Server([shmreplay.Table.queue("huge", 10**11)], name=buffer_name)
    assert time.monotonic() - start < 10  # refused before reserving anything
    assert _peek.segments_of(buffer_name) == []
    # (A data segment's stores are reserved as the table fills: a table of 10^6 items of
    # 1 MiB takes its first items; tests/test_growing_segments.py.)


def test_segments_reserve_their_memory_when_created(buffer_name):
    with _queue_server(buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(np.zeros(1000), {"q": 1.0}, timeout=5)
        for entry in _peek.segments_of(server.name):
            info = os.stat(_shm(entry))
            assert info.st_blocks * 512 >= info.st_size  # every page allocated
        client.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare to mount a small private /dev/shm")
def test_a_full_dev_shm_is_a_typed_error_not_sigbus():
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.environ.get("PYTHONPATH", ""), here]).strip(os.pathsep))
    script = (f"mount -t tmpfs -o size=48m tmpfs /dev/shm && exec {sys.executable} "
              f"{os.path.join(here, '_segment_workers.py')}")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    cases = json.loads(result.stdout.strip().splitlines()[-1])
    for case in ("first insert, checked", "first insert, unchecked", "Server, checked",
                 "Server, unchecked"):
        assert cases[case]["result"] == "SharedMemoryFullError", (case, cases[case])
        assert "MiB" in cases[case]["message"] or "GiB" in cases[case]["message"]
    assert cases["a small first insert then"]["result"] == "ok"
    assert cases["left in /dev/shm"] == []


# --- a restore reserves its stores in a second thread -------------------------------------

def _checkpoint_with_frames(name, path):
    table = shmreplay.Table.queue("frames", 64)
    with shmreplay.Server([table], name=name) as server:
        client = shmreplay.Client(server.name)
        client.insert_batch(np.arange(40 * 4096, dtype=np.uint8).reshape(40, 4096),
                            {"frames": np.ones(40)}, timeout=5)
        client.checkpoint(path)
        client.close()


def _in_the_reserving_thread(monkeypatch, action):
    """Runs ``action()`` before each ``posix_fallocate`` of a restore's second thread."""
    import threading
    fallocate = os.posix_fallocate

    def patched(fd, offset, length):
        if threading.current_thread().name == "shmreplay-reserve":
            action()
        return fallocate(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", patched)


def test_a_restored_table_is_served_only_once_every_page_is_reserved(
        buffer_name, tmp_path, monkeypatch):
    path = str(tmp_path / "frames.ckpt")
    _checkpoint_with_frames(buffer_name, path)
    # A Server that did not wait would be served before these sleeps end.
    _in_the_reserving_thread(monkeypatch, lambda: time.sleep(0.5))
    with shmreplay.Server(name=buffer_name + "-r", checkpoint=path) as server:
        for entry in _peek.segments_of(server.name):
            info = os.stat(_shm(entry))
            assert info.st_blocks * 512 >= info.st_size, entry  # every page allocated
        with shmreplay.Client(server.name) as client:
            data = client.sample_batch("frames", 40, timeout=5).data
            assert sorted(data[:, 1].tolist()) == sorted(
                (np.arange(40 * 4096).reshape(40, 4096)[:, 1] % 256).tolist())


def test_dev_shm_filling_up_during_a_restore_is_a_typed_error(
        buffer_name, tmp_path, monkeypatch):
    import errno
    path = str(tmp_path / "frames.ckpt")
    _checkpoint_with_frames(buffer_name, path)

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    _in_the_reserving_thread(monkeypatch, full)
    with pytest.raises(errors.SharedMemoryFullError, match="data segment of table 'frames'"):
        shmreplay.Server(name=buffer_name + "-r", checkpoint=path)
    assert _peek.segments_of(buffer_name + "-r") == []

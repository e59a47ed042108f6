"""Reverb's addresses and lazy connection: ``Server(tables, port)``, ``server.port``,
``Client(f"localhost:{port}")`` from other processes, and Clients made before their
buffer exists. See docs/design.md (addresses) and docs/guide.md (connecting)."""

import io
import logging
import multiprocessing
import os
import pickle
import random
import socket

import numpy as np
import posix_ipc
import pytest

import _address_workers as workers
import _names
import shmreplay
from shmreplay import cli, errors
from shmreplay._client import address as _address
from shmreplay._client import connect as _connect
from shmreplay._shm import peek as _peek

SPAWN = multiprocessing.get_context("spawn")


def free_port():
    """A port number no buffer on this machine has (tests may run side by side)."""
    while True:
        port = random.randint(20000, 29999)
        if not _peek.peek(f"port-{port}", tables=False).exists:
            return port


def queue():
    return [shmreplay.Table.queue("q", 10)]


def join(proc):
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


# --- ports and addresses -------------------------------------------------------------------


def test_server_picks_a_port_and_a_spawned_process_reaches_it_at_localhost():
    with shmreplay.Server(queue()) as server:
        assert type(server.port) is int and 1 <= server.port <= 65535
        assert server.name == f"port-{server.port}"
        result = SPAWN.Queue()
        proc = SPAWN.Process(target=workers.insert_at,
                             args=(f"localhost:{server.port}", 3.0, result))
        proc.start()
        status, key = result.get(timeout=60)
        join(proc)
        assert status == "ok", key
        with shmreplay.Client(server.name) as client:  # the name reaches it too
            sample = client.sample_batch("q", 1, timeout=5)
        assert int(sample.info.key[0]) == key
        np.testing.assert_array_equal(sample.data["x"][0], [3.0, 3.0])


@pytest.mark.parametrize("form", ["localhost:{}", "127.0.0.1:{}", "127.1.2.3:{}", "[::1]:{}",
                                  "dns:///localhost:{}", "dns:localhost:{}",
                                  "ipv4:127.0.0.1:{}", "ipv6:[::1]:{}", "0.0.0.0:{}",
                                  "HOST:{}"])
def test_a_given_port_is_honoured_in_every_address_form(form):
    port = free_port()
    with shmreplay.Server(queue(), port) as server:  # Reverb's positional port
        assert server.port == port
        address = form.format(port).replace("HOST", socket.gethostname())
        with shmreplay.Client(address) as client:
            client.insert({"x": np.zeros(2, np.float32)}, {"q": 1.0}, timeout=5)
            assert client.server_info(timeout=5)["q"].current_size == 1
            assert client.server_address == address  # as given, as Reverb's


def test_a_port_is_taken_once_and_port_none_skips_taken_ones(monkeypatch):
    port, other = free_port(), free_port()
    with shmreplay.Server(queue(), port=port):
        with pytest.raises(errors.BufferExistsError, match=all_of(f"Server(port={port})", f"'port-{port}'",
                                                                "already running")):
            shmreplay.Server(queue(), port=port)
        monkeypatch.setattr(_address, "free_port_candidates", lambda: [port, other])
        with shmreplay.Server(queue()) as second:
            assert second.port == other


@pytest.mark.parametrize("port, error", [(0, ValueError), (65536, ValueError),
                                         (8000.0, TypeError), ("8000", TypeError)])
def test_a_bad_port_is_refused(port, error):
    with pytest.raises(error, match="port"):
        shmreplay.Server(queue(), port=port)


# --- squatting and stale buffers ------------------------------------------------------------


def _squat(name, mode, uid=None, data=b"not a buffer" * 100):
    """Puts a segment named like buffer ``name`` in /dev/shm, as a squatter would."""
    shm = posix_ipc.SharedMemory("/shmreplay." + name, posix_ipc.O_CREX, mode=mode,
                                 size=len(data))
    try:
        os.fchmod(shm.fd, mode)
        os.pwrite(shm.fd, data, 0)
        if uid is not None:
            os.fchown(shm.fd, uid, -1)
    finally:
        shm.close_fd()


@pytest.mark.parametrize("mode, text", [(0o666, "wider"), (0o600, "not a shmreplay buffer")])
def test_a_squatted_port_is_refused_by_client_and_server(mode, text):
    port = free_port()
    _squat(f"port-{port}", mode)
    try:
        with pytest.raises(errors.LayoutMismatchError, match=text):
            shmreplay.Client(f"localhost:{port}")
        with pytest.raises(errors.BufferExistsError, match=f"port-{port}"):
            shmreplay.Server(queue(), port=port)  # never replaced: nothing says it is dead
    finally:
        posix_ipc.unlink_shared_memory(f"/shmreplay.port-{port}")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a segment to another uid needs root")
def test_another_users_port_buffer_is_refused():
    port = free_port()
    _squat(f"port-{port}", 0o600, uid=65534)
    try:
        with pytest.raises(errors.LayoutMismatchError, match="belongs to uid 65534"):
            shmreplay.Client(f"localhost:{port}")
    finally:
        posix_ipc.unlink_shared_memory(f"/shmreplay.port-{port}")


def test_a_dead_owners_port_is_free_again_and_its_clients_are_told():
    port = free_port()
    ready = SPAWN.Queue()
    proc = SPAWN.Process(target=workers.own_and_hang, args=(port, ready))
    proc.start()
    try:
        name, pid = ready.get(timeout=60)
        stale = shmreplay.Client(f"localhost:{port}")  # attached while the owner lived
        stale.insert({"x": np.zeros(2, np.float32)}, {"q": 1.0}, timeout=5)
    finally:
        proc.kill()
        join(proc)
    out = io.StringIO()
    cli.main(["ls"], out=out)
    assert f"port-{port} (localhost:{port})" in out.getvalue()
    assert "dead" in [line for line in out.getvalue().splitlines() if name in line][0]
    # A new Client does not attach to the dead buffer: it waits for a live one.
    with pytest.raises(errors.BufferNotReadyError, match=f"port-{port}"):
        shmreplay.Client(f"localhost:{port}").server_info(timeout=0.2)
    with shmreplay.Server(queue(), port=port) as server:  # replaces the dead one
        with pytest.raises(errors.BufferBrokenError):
            stale.insert({"x": np.zeros(2, np.float32)}, {"q": 1.0}, timeout=5)
        with shmreplay.Client(f"localhost:{port}") as client:
            assert client.server_info(timeout=5)["q"].current_size == 0
        assert server.port == port
    stale.close()


def test_gc_removes_a_dead_owners_port_buffer():
    port = free_port()
    ready = SPAWN.Queue()
    proc = SPAWN.Process(target=workers.own_and_hang, args=(port, ready))
    proc.start()
    try:
        name, _ = ready.get(timeout=60)
    finally:
        proc.kill()
        join(proc)
    out = io.StringIO()
    cli.main(["gc"], out=out)
    assert f"{name}: owner" in out.getvalue()
    assert not _peek.peek(name, tables=False).exists


# --- lazy connection ------------------------------------------------------------------------


def test_a_client_made_before_its_buffer_waits_and_connects():
    port = free_port()
    client = shmreplay.Client(f"localhost:{port}")  # nothing there yet: no error
    ready, stop = SPAWN.Queue(), SPAWN.Event()
    owner = SPAWN.Process(target=workers.own, args=(port, 0.5, ready, stop))
    owner.start()
    try:
        sample = client.sample_batch("q", 1, timeout=60)  # waits for the owner's item
        np.testing.assert_array_equal(sample.data["x"][0], [7.0, 7.0])
        assert ready.get(timeout=10) == f"port-{port}"
    finally:
        client.close()
        stop.set()
        join(owner)


def test_a_pickled_lazy_client_connects_in_a_spawned_worker():
    name = _names.unique("lazy")
    client = shmreplay.Client(name)
    result = SPAWN.Queue()
    worker = SPAWN.Process(target=workers.insert_with, args=(client, 5.0, result))
    worker.start()  # before the buffer exists
    try:
        with shmreplay.Server(queue(), name=name) as server:
            status, key = result.get(timeout=60)
            assert status == "ok", key
            with shmreplay.Client(server.name) as reader:
                assert int(reader.sample_batch("q", 1, timeout=5).info.key[0]) == key
    finally:
        join(worker)
    assert pickle.loads(pickle.dumps(shmreplay.Client("localhost:8000"))).server_address \
        == "localhost:8000"


def test_a_lazy_client_inherited_by_a_forked_child_connects_there():
    # (fork on purpose: the child inherits the unconnected Client object itself)
    name = _names.unique("forked")
    client = shmreplay.Client(name)
    result = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(
        target=workers.insert_with, args=(client, 4.0, result))
    child.start()
    try:
        with shmreplay.Server(queue(), name=name):
            status, key = result.get(timeout=60)
            assert status == "ok", key
            sample = client.sample_batch("q", 1, timeout=5)  # the parent's own connection
            assert int(sample.info.key[0]) == key
    finally:
        join(child)
        client.close()


def test_the_timeout_error_names_the_buffer_and_those_that_exist():
    name = _names.unique("other")
    with shmreplay.Server(queue(), name=name):
        client = shmreplay.Client(name + "x")  # misspelled
        with pytest.raises(errors.DeadlineExceededError,
                           match=all_of(repr(name + "x"), "timeout of 0.2 s",
                                        repr(name), "shmreplay ls")) as info:
            client.server_info(timeout=0.2)
        assert isinstance(info.value, errors.BufferNotFoundError)
        with pytest.raises(errors.DeadlineExceededError, match=repr(name + "x")):
            client.insert({"x": np.zeros(2, np.float32)}, {"q": 1.0}, timeout=0.1)
        with pytest.raises(errors.DeadlineExceededError, match=repr(name + "x")):
            next(client.sample("q", timeout=0.1))


def test_a_long_wait_says_what_it_waits_for(monkeypatch, caplog):
    monkeypatch.setattr(_connect, "WARN_AFTER", 0.05)
    name = _names.unique("other")
    with shmreplay.Server(queue(), name=name):
        client = shmreplay.Client(name + "-typo")
        with caplog.at_level(logging.WARNING, logger="shmreplay"):
            with pytest.raises(errors.BufferNotReadyError):
                client.sample_batch("q", 1, timeout=0.5)
    warned = [r.getMessage() for r in caplog.records if r.name == "shmreplay"]
    assert warned and all_of(repr(name + "-typo"), "still waiting", repr(name))(warned[0])


def test_a_lazy_client_sees_its_buffer_replaced():
    name = _names.unique("replaced")
    client = shmreplay.Client(name)
    with shmreplay.Server(queue(), name=name):
        client.insert({"x": np.zeros(2, np.float32)}, {"q": 1.0}, timeout=5)
    with shmreplay.Server(queue(), name=name):  # a new buffer of the same name
        with pytest.raises(errors.BufferBrokenError):
            client.insert({"x": np.zeros(2, np.float32)}, {"q": 1.0}, timeout=5)
        with shmreplay.Client(name) as fresh:
            assert fresh.server_info(timeout=5)["q"].current_size == 0
    client.close()
    with pytest.raises(errors.ClosedError):
        client.server_info(timeout=0)


def all_of(*parts):
    """A check (and a ``match`` pattern) that every part occurs, in any order."""
    import re
    pattern = "".join(f"(?=[\\s\\S]*{re.escape(p)})" for p in parts)

    class _Pattern(str):
        def __call__(self, text):
            return re.search(pattern, text) is not None
    return _Pattern(pattern)


def test_a_client_attaching_while_the_header_is_still_zero_waits_for_it(monkeypatch):
    """A Server's header segment exists, zero-filled, while its memory is reserved and
    before the magic is written: a Client attaching then waits instead of calling it
    "not a shmreplay buffer" (a race that a forked lazy Client hit under load)."""
    import threading
    import time
    from shmreplay._shm import segment as _segment
    name = _names.unique("zeros")
    created = _segment.Segment.create.__func__
    header_exists = threading.Event()

    def slow_create(cls, segment_name, *args, **kwargs):
        made = created(cls, segment_name, *args, **kwargs)
        if ":" not in segment_name:  # the header segment: hold it zero for a while
            header_exists.set()
            time.sleep(0.3)
        return made

    monkeypatch.setattr(_segment.Segment, "create", classmethod(slow_create))
    result = []
    owner = threading.Thread(target=lambda: result.append(shmreplay.Server(queue(), name=name)))
    owner.start()
    try:
        assert header_exists.wait(10)
        with shmreplay.Client(name) as client:
            assert set(client.server_info(timeout=5)) == {"q"}
    finally:
        owner.join(10)
        for server in result:
            server.stop()

"""Processes for tests/test_segments.py: a creator that stops half-way through making a
table's data segment, an owner that dies, and a program run on a small private
/dev/shm (``full_shm``, started under ``unshare --mount``)."""

import json
import os
import signal
import sys
import time

import numpy as np

from _mp_workers import _guard


@_guard
def stopping_creator(name, table, value, created, queue):
    """Inserts ``value`` as the table's first item, stopping itself (SIGSTOP) once its
    data segment exists and before it is published (``created`` is set then: an event,
    as a queue's feeder thread would stop too); reports the key once it resumes."""
    import shmreplay
    from shmreplay._engine import data_segment as _data_segment
    create = _data_segment.create

    def create_then_stop(*args):
        made = create(*args)
        created.set()
        os.kill(os.getpid(), signal.SIGSTOP)
        return made

    _data_segment.create = create_then_stop
    client = shmreplay.Client(name)
    key = client.insert(np.full(16, value, np.float64), {table: 1.0}, timeout=60)
    queue.put(("inserted", key))
    client.close()


@_guard
def dying_owner(name, queue):
    """A Server with one item, that never stops it (the test SIGKILLs this process)."""
    import shmreplay
    server = shmreplay.Server([shmreplay.Table.queue("q", 10)], name=name)
    server.localhost_client().insert(np.arange(3.0), {"q": 1.0})
    queue.put(("ready", os.getpid()))
    time.sleep(600)


def _outcome(call):
    start = time.monotonic()
    try:
        call()
        return {"result": "ok", "seconds": time.monotonic() - start}
    except Exception as exc:  # reported to the test, which checks the type and text
        return {"result": type(exc).__name__, "message": str(exc),
                "seconds": time.monotonic() - start}


def full_shm():
    """On a private, small /dev/shm: fills it, then creates a Server and inserts a
    table's first item, with and without the free-space check (so that the reservation
    itself meets ENOSPC). Prints one JSON line per case; exits 0 if nothing died."""
    import shmreplay
    from shmreplay._shm import segment as _segment
    free = _segment.free_bytes()
    filler = os.open("/dev/shm/filler", os.O_CREAT | os.O_RDWR, 0o600)
    small = shmreplay.Server([shmreplay.Table.queue("q", 1000)], name="small")
    client = shmreplay.Client("small")
    os.posix_fallocate(filler, 0, _segment.free_bytes() - 2 * 2**20)  # 2 MiB left
    cases = {}
    checked = _segment.check_free_space
    for check in ("checked", "unchecked"):
        if check == "unchecked":  # as if the space went between the check and the creation
            _segment.check_free_space = lambda *args: None
        cases[f"first insert, {check}"] = _outcome(lambda: client.insert(
            np.zeros(2048, np.float64), {"q": 1.0}, timeout=5))  # 16 MiB of data
        cases[f"Server, {check}"] = _outcome(lambda: shmreplay.Server(
            [shmreplay.Table.queue("big", 100_000)], name="big"))
    _segment.check_free_space = checked
    cases["a small first insert then"] = _outcome(lambda: client.insert(
        np.zeros(2, np.float64), {"q": 1.0}, timeout=5))
    client.close()
    small.stop()
    os.close(filler)
    os.unlink("/dev/shm/filler")
    cases["left in /dev/shm"] = sorted(os.listdir("/dev/shm"))
    cases["free at start"] = free
    print(json.dumps(cases))
    sys.stdout.flush()


if __name__ == "__main__":
    full_shm()

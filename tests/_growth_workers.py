"""Processes for tests/test_growing_segments.py: inserters that cross the growth of a
table's stores by name, one that dies half-way through a growth, and a program run on
a small private /dev/shm (``small_shm``, started under ``unshare --mount``)."""

import json
import os
import signal
import sys

import numpy as np

from _mp_workers import _guard

WIDTH = 512  # float64 per item: 4 KiB


def small_steps(step: int):
    """Makes this process grow stores by ``step`` bytes (and reserve whole only stores
    no larger), so that a few MiB of items cross several growths."""
    from shmreplay._engine import growth
    growth.STEP = step
    growth.WHOLE = step


def tagged(tag: int, i: int) -> np.ndarray:
    return np.full(WIDTH, tag * 1_000_000 + i, np.float64)


@_guard
def insert_tagged(name, table, tag, count, step, start, queue):
    """Inserts ``count`` items ``tagged(tag, i)`` one by one (a batch every 7th), once
    ``start`` is set."""
    import shmreplay
    small_steps(step)
    client = shmreplay.Client(name)
    queue.put(("ready", tag))
    start.wait(60)
    i = 0
    while i < count:
        if i % 7 == 3 and i + 4 <= count:
            client.insert_batch(np.stack([tagged(tag, i + j) for j in range(4)]),
                                {table: np.ones(4)}, timeout=30)
            i += 4
        else:
            client.insert(tagged(tag, i), {table: 1.0}, timeout=30)
            i += 1
    queue.put(("done", tag))
    client.close()


@_guard
def die_while_growing(name, table, step, in_kernel, queue):
    """Inserts until its process grows the table, and stops itself there (SIGSTOP):
    after reserving the pages and before raising the watermark, or (``in_kernel``)
    inside the growth's locked kernel, where the test armed a crash point."""
    import shmreplay
    from shmreplay._shm import segment as _segment
    small_steps(step)
    if not in_kernel:
        reserve = _segment.Segment.reserve

        def reserve_then_stop(self, *args):
            reserve(self, *args)
            os.kill(os.getpid(), signal.SIGSTOP)

        _segment.Segment.reserve = reserve_then_stop
    client = shmreplay.Client(name)
    queue.put(("ready", os.getpid()))
    for i in range(100_000):
        client.insert(tagged(9, i), {table: 1.0}, timeout=30)


def _outcome(call):
    try:
        return {"result": "ok", "value": call()}
    except Exception as exc:  # reported to the test, which checks the type and text
        return {"result": type(exc).__name__, "message": str(exc)}


def small_shm():
    """On a private /dev/shm of 48 MiB: a table whose stores would take 156 MiB takes
    items (growing by 1 MiB, then doubling) until /dev/shm is full, then refuses the
    next one with a typed error (no SIGBUS), and stays whole. Prints one JSON line;
    exits 0 if nothing died."""
    import shmreplay
    from shmreplay._shm import layout as L
    small_steps(1 << 20)
    table = shmreplay.Table.queue("q", 20_000)
    cases = {}
    with shmreplay.Server([table], name="grow-small") as server:
        client = shmreplay.Client(server.name)
        inserted = 0
        frame = np.zeros(WIDTH, np.float64)
        try:
            while inserted < 20_000:
                frame[:] = inserted
                client.insert(frame, {"q": 1.0}, timeout=5)
                inserted += 1
            cases["full"] = {"result": "ok"}
        except Exception as exc:
            cases["full"] = {"result": type(exc).__name__, "message": str(exc)}
        engine = client._engine("q")
        cases["inserted"] = inserted
        cases["size"] = int(engine.ctrl[L.C_SIZE])
        cases["fresh"] = int(engine.ctrl[L.C_FRESH])
        cases["limit"] = int(engine.ctrl[L.C_SLOT_LIMIT])
        cases["batch"] = _outcome(lambda: client.insert_batch(
            np.zeros((64, WIDTH)), {"q": np.ones(64)}, timeout=5).tolist())
        cases["verify"] = client.verify("q")
        batch = client.sample_batch("q", 100, timeout=5)
        cases["first"] = batch.data[:, 0].tolist()
        cases["whole"] = bool((batch.data == batch.data[:, :1]).all())
        client.close()
    cases["left"] = sorted(n for n in os.listdir("/dev/shm") if "grow-small" in n)
    print(json.dumps(cases))
    sys.stdout.flush()


if __name__ == "__main__":
    small_shm()

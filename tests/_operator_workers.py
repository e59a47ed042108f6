"""Processes for test_operator_faults: run as ``python tests/_operator_workers.py WHAT ...``
(a real process, so that a crash fails the test instead of killing pytest)."""

import json
import sys

import numpy as np

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay._shm import layout as L

HUGE = 2**40

# (table, where, word or (field, row), value): every corruption verify must report.
CORRUPTIONS = [
    *[("p", "ctrl", word, value) for word in (L.C_FRESH, L.C_HEAD, L.C_SIZE, L.C_TREE_LEAVES)
      for value in (HUGE, -7)],
    ("p", "meta", (L.M_NEXT, "head"), HUGE), ("p", "meta", (L.M_LIVE_POS, "head"), HUGE),
    ("p", "meta", (L.M_LIVE_POS, "head"), -HUGE),
    *[("h", "ctrl", word, value) for word in (L.C_HEAP_N0, L.C_FRESH) for value in (HUGE, -7)],
    ("h", "meta", (L.M_HEAP0, 0), HUGE), ("h", "meta", (L.M_HEAP0, 1), -HUGE),
    *[("s", "ctrl", word, value) for word in (L.C_FRESH, L.C_ROW_FRESH, L.C_ROW_FREE_HEAD)
      for value in (HUGE, -7)],
]


def _fill(name):
    """A Server with a prioritized table, a heap table and a table of shared steps."""
    tables = [shmreplay.Table("p", selectors.Prioritized(0.8), selectors.Fifo(), 16,
                              rate_limiters.MinSize(1)),
              shmreplay.Table("h", selectors.MinHeap(), selectors.Fifo(), 16,
                              rate_limiters.MinSize(1)),
              shmreplay.Table("s", selectors.Uniform(), selectors.Fifo(), 16,
                              rate_limiters.MinSize(1))]
    server = shmreplay.Server(tables, name=name)
    client = shmreplay.Client(name)
    for i in range(6):
        client.insert({"x": np.full(2, i, np.float32)}, {"p": 1.0 + i, "h": 5.0 - i})
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for i in range(6):
            writer.append({"x": np.full(2, i, np.float32)})
            if i >= 2:
                writer.create_item("s", 1.0, {"x": writer.history["x"][-3:]})
    return server, client


def corrupt_and_verify(name):
    """Damages one word at a time, runs verify, puts the word back; prints what verify
    said about each damage (JSON), then ``shmreplay verify`` on one more."""
    server, client = _fill(name)
    results = []
    try:
        assert all(not client.verify(t) for t in ("p", "h", "s")), "not clean to begin with"
        for table, where, place, value in CORRUPTIONS:
            engine = client._engine(table)
            if where == "ctrl":
                array, index = engine.ctrl, place
            else:
                field, row = place
                row = int(engine.ctrl[L.C_HEAD]) if row == "head" else row
                array, index = engine.meta, (row, field)
            saved = int(array[index])
            array[index] = value
            try:
                results.append([table, where, str(place), value, client.verify(table)])
            finally:
                array[index] = saved
            assert not client.verify(table), f"{table} {place}: not clean after restoring"
        print(json.dumps(results), flush=True)
        client._engine("p").ctrl[L.C_HEAD] = HUGE  # for the command line, in the test
        print("corrupt", flush=True)
        sys.stdin.readline()
    finally:
        client.close()
        server.stop()


def own(name):
    """Owns a buffer with one item, then sleeps until killed."""
    server = shmreplay.Server([shmreplay.Table.queue("t", 100)], name=name)
    shmreplay.Client(name).insert({"x": np.zeros(2, np.float32)}, {"t": 1.0})
    print("ready", flush=True)
    sys.stdin.readline()
    server.stop()


def attached(name):
    """A Client attached by name that runs one call per line read: ``insert``,
    ``sample`` (of what is there) or ``wait`` (a sample that blocks up to 10 s); answers
    ``ok`` or the error's type name."""
    client = shmreplay.Client(name)
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            if line.strip() == "insert":
                client.insert({"x": np.ones(2, np.float32)}, {"t": 1.0})
            elif line.strip() == "sample":
                client.sample_batch("t", 1, timeout=1.0)
            elif line.strip() == "wait":
                client.sample_batch("t", 1, timeout=10.0)
            else:
                break
            print("ok", flush=True)
        except Exception as exc:  # the test reads which
            print(type(exc).__name__, flush=True)
    client.close()


def storm(prefix, seconds):
    """Creates and stops Servers named ``prefix<n>`` for ``seconds``; prints how many,
    and how many lost their header segment while alive (removed under them)."""
    import os
    import time
    shmreplay.Server([shmreplay.Table.queue("t", 4)], name=f"{prefix}first").stop()
    created = lost = 0
    end = time.monotonic() + float(seconds)  # from the first Server on (kernels loaded)
    print("ready", flush=True)
    while time.monotonic() < end:
        name = f"{prefix}{created}"
        server = shmreplay.Server([shmreplay.Table.queue("t", 4)], name=name)
        created += 1
        lost += not os.path.exists(f"/dev/shm/shmreplay.{name}")
        server.stop()
    print(created, lost, flush=True)


if __name__ == "__main__":
    {"corrupt_and_verify": corrupt_and_verify, "own": own, "attached": attached,
     "storm": storm}[sys.argv[1]](*sys.argv[2:])

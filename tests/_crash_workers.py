"""Workers of the crash-point tests (importable, for ``spawn``).

Each worker attaches by name, says it is ready, waits for ``go`` and then repeats one
operation until it is stopped (the test armed a crash point, or the worker stops itself
at a Python-level point) and SIGKILLed. Inserts it saw return are acknowledged in
shared memory (``acks``/``count``), which a SIGKILL cannot leave half-written.
"""

import os
import signal

import numpy as np

import shmreplay
from shmreplay.specs import TensorSpec

ITEM = {"x": TensorSpec((8,), np.float64), "v": TensorSpec((), np.int64)}


def items(values):
    values = np.asarray(values, np.int64)
    return {"x": np.repeat(values[:, None].astype(np.float64), 8, axis=1), "v": values}


def _ack(acks, count, values):
    for value in values:
        acks[count.value] = int(value)  # the value first, then the count that covers it
        count.value += 1


def repeat(name, table, op, ready, go, acks, count):
    client = shmreplay.Client(name)
    base = (os.getpid() % 1000) * 1_000_000
    ready.set()
    go.wait(60)
    i = 0
    while True:
        if op == "insert_batch":
            values = np.arange(base + i, base + i + 8)
            client.insert_batch(items(values), {table: np.linspace(1.0, 2.0, 8)})
            _ack(acks, count, values)
            i += 8
        elif op == "insert":
            client.insert({"x": np.full(8, float(base + i)), "v": np.int64(base + i)}, {table: 1.5})
            _ack(acks, count, [base + i])
            i += 1
        elif op == "sample":
            client.sample_batch(table, 4)
        elif op == "mutate":
            batch = client.sample_batch(table, 4)
            keys = [int(k) for k in batch.info.key]
            client.mutate_priorities(table, updates={k: 0.5 + j for j, k in enumerate(keys)},
                                     deletes=keys[:1])
        elif op == "writer_any_length":  # items of 1..5 steps into a None-time table
            with client.trajectory_writer(5) as writer:
                for t in range(6):
                    value = base + i + t
                    writer.append({"x": np.full(8, float(value)), "v": np.int64(value)})
                    length = 1 + (i + t) % 5
                    if t + 1 >= length:
                        writer.create_item(table, 1.0, {"x": writer.history["x"][-length:],
                                                        "v": writer.history["v"][-length:]})
            i += 6
        elif op == "writer":
            with client.trajectory_writer(3) as writer:
                for t in range(6):
                    value = base + i + t
                    writer.append({"x": np.full(8, float(value)), "v": np.int64(value)})
                    if t >= 2:
                        writer.create_item(table, 1.0, {"x": writer.history["x"][-3:],
                                                        "v": writer.history["v"][-3:]})
            i += 6


def stop_halfway_through_copying(name, table, ready, go, acks, count):
    """Reserves a slot, writes one of the item's two columns, and stops (no lock held)."""
    client = shmreplay.Client(name)
    engine = client._engine(table)
    engine.has_columns()
    ready.set()
    go.wait(60)
    slot = engine.reserve(1, None)[0]
    engine.columns[1][slot] = np.full(8, -7.0)  # "x" written, "v" not: a torn item
    os.kill(os.getpid(), signal.SIGSTOP)


def stop_while_copying_a_sample(name, table, ready, go, acks, count):
    """Samples (deleting the items: a queue), and stops before copying them out."""
    from shmreplay._engine.kinds import whole_items

    def gather_then_stop(kind, slots):
        os.kill(os.getpid(), signal.SIGSTOP)

    # The engine binds its storage kind's gather when it maps the table.
    whole_items.WholeItems.gather = gather_then_stop
    client = shmreplay.Client(name)
    engine = client._engine(table)
    engine.has_columns()  # (mapped: its gather is the one above)
    # The general path, which copies in Python after the draw (the one-call kernel of
    # small batches draws and copies in native code, where nothing can stop it).
    engine._results = None
    ready.set()
    go.wait(60)
    client.sample_batch(table, 4)


def block_on_empty_table(name, table, ready, go, acks, count):
    client = shmreplay.Client(name)
    ready.set()
    go.wait(60)
    client.sample_batch(table, 1)  # blocks: the table is empty


def stop_inside_checkpoint(name, table, ready, go, acks, count, path):
    """Starts a checkpoint and stops while it holds the table's lock copying items."""
    from shmreplay._engine import snapshot as _snapshot
    client = shmreplay.Client(name)

    def copy_then_stop(*args):
        os.kill(os.getpid(), signal.SIGSTOP)

    _snapshot._copy_held = copy_then_stop
    ready.set()
    go.wait(60)
    client.checkpoint(path)


# --- the randomized storm -----------------------------------------------------------------

STORM_STRIDE = 1_000_000  # incarnation k inserts the values k * STRIDE + 0, 1, 2, ...


def storm(name, seconds, actors, seed, counts, incarnations, started, done):
    """Keeps ``actors`` inserting processes alive for ``seconds``, SIGKILLing each one
    20-80 ms after it starts and forking a replacement (spawn would take too long).
    Every tenth actor is also armed to stop inside a commit (with the table's lock
    held) and is killed there, so the storm always includes dead lock holders.

    Incarnation ``k`` acknowledges in ``counts[k]`` how many of its values
    (``k * STORM_STRIDE + i``) were inserted by calls that returned.
    """
    import random
    import time
    from shmreplay._shm import crash_points as _crash_points
    from shmreplay._shm.kernels import codes
    rng = random.Random(seed)
    client = shmreplay.Client(name)
    engine = client._engine("t")
    armed = None
    # Load the insert kernels (and map the columns) once, here: each forked actor would
    # otherwise spend its short life loading them from numba's cache.
    client.insert({"x": np.full(8, -5000.0), "v": np.int64(-5000)}, {"t": 1.0})
    client.insert_batch(items([-5001, -5002]), {"t": np.ones(2)})
    live = {}
    next_incarnation = 0
    started.set()
    end = time.monotonic() + seconds
    while time.monotonic() < end and next_incarnation < len(counts):
        now = time.monotonic()
        for actor in range(actors):
            if actor not in live:
                k = next_incarnation
                next_incarnation += 1
                pid = os.fork()
                if pid == 0:
                    try:
                        _storm_actor(client, k, counts, random.Random(seed * 7919 + k))
                    finally:
                        os._exit(0)
                lifetime = rng.uniform(0.02, 0.08)
                if armed is None and k % 10 == 5:
                    point = rng.choice([codes.STOP_COMMIT_HALF, codes.STOP_COMMIT_ONE])
                    _crash_points.arm(engine, point, pid)
                    armed, lifetime = pid, 2.0  # until it stops at the point
                live[actor] = (pid, now + lifetime)
            elif now >= live[actor][1] or (live[actor][0] == armed
                                           and _crash_points.is_stopped(armed)):
                pid = live.pop(actor)[0]
                if pid == armed:
                    _crash_points.disarm(engine)
                    armed = None
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        time.sleep(0.002)
    _crash_points.disarm(engine)
    for pid, _ in live.values():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    incarnations.value = next_incarnation
    done.set()


def _storm_actor(client, k, counts, rng):
    import time
    base = k * STORM_STRIDE
    i = 0
    while True:
        if rng.random() < 0.5:
            client.insert({"x": np.full(8, float(base + i)), "v": np.int64(base + i)},
                          {"t": rng.uniform(0.1, 2.0)})
            i += 1
        else:
            n = rng.randint(2, 6)
            client.insert_batch(items(np.arange(base + i, base + i + n)),
                                {"t": np.full(n, rng.uniform(0.1, 2.0))})
            i += n
        counts[k] = i
        time.sleep(0.0002)

"""Workers of the general-store tests (importable, for ``spawn``)."""

import os
import signal

import numpy as np

import shmreplay


def heterogeneous(index: int):
    """The ``index``-th of a cycle of items of different structures, dtypes and shapes."""
    kind = index % 4
    if kind == 0:
        return np.float32(index)
    if kind == 1:
        return np.full((2, index % 5 + 1), index, np.int64)
    if kind == 2:
        return {"name": f"item-{index}".encode(), "values": np.arange(index % 3 + 1.0)}
    return [np.array([b"a" * (index % 7), b"b"], object), np.int16(index)]


def insert_heterogeneous(name, table, count):
    with shmreplay.Client(name) as client:
        for index in range(count):
            client.insert(heterogeneous(index), {table: 1.0})


def insert_arena_items_until_killed(name, table, ready, go, stop_mid_write):
    """Inserts arena items in a loop; with ``stop_mid_write``, stops itself (SIGSTOP)
    half way through copying an item's bytes into the arena, so that the test can
    SIGKILL it there."""
    from shmreplay._engine.kinds import general
    if stop_mid_write:
        def write(self, slots, blobs):
            slot = int(slots[0])
            start = int(self.extents[slot, 0]) * 256
            half = len(blobs[0]) // 2
            self.data[start:start + half] = np.frombuffer(blobs[0][:half], np.uint8)
            self.data[start + half:start + len(blobs[0])] = 0xEE
            os.kill(os.getpid(), signal.SIGSTOP)
        general.Arena.write = write
    client = shmreplay.Client(name)
    ready.set()
    go.wait(60)
    index = 0
    while True:
        client.insert({"name": b"torn?", "values": np.full(300, 7.0)}, {table: 1.0})
        index += 1


def insert_open_shapes(name, table, sizes):
    """Inserts one float32 vector of each size in ``sizes`` (a table whose signature
    leaves the size open: the first settles the columns, others go to its arena)."""
    with shmreplay.Client(name) as client:
        for size in sizes:
            client.insert(np.full(size, size, np.float32), {table: 1.0}, timeout=10)


def write_items_of_two_shapes(name, table):
    """A TrajectoryWriter's items of two shapes (the second in the general store) and a
    legacy Writer's items of strings."""
    with shmreplay.Client(name) as client:
        with client.trajectory_writer(3) as writer:
            for step in range(3):
                writer.append({"x": np.full(2, step, np.float32)})
            writer.create_item(table, 1.0, {"x": writer.history["x"][-2:]})
        with client.trajectory_writer(3) as writer:
            writer.append({"x": np.full((2, 2), 7, np.int64)})
            writer.create_item(table, 1.0, {"x": writer.history["x"][-1:]})
        with client.writer(2) as writer:
            writer.append({"x": b"one"})
            writer.append({"x": b"two"})
            writer.create_item(table, 2, 1.0)


def sample_first_items(name, table, count, out):
    """A fresh process's first samples of a table whose items are in its general store:
    puts their data (as lists) on ``out``."""
    with shmreplay.Client(name) as client:
        first = client.sample_batch(table, 1, timeout=10)
        rest = [s.data for s in client.sample(table, count - 1, emit_timesteps=False,
                                              timeout=10)]
        out.put([specs_free(first.data)] + [specs_free(d) for d in rest])


def specs_free(data):
    """``data`` with arrays as lists (picklable, comparable)."""
    import optree
    return optree.tree_map(lambda leaf: np.asarray(leaf).tolist(), data)

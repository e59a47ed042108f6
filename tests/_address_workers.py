"""Workers for tests/test_addresses.py, started with ``spawn`` (importable by name)."""

import os
import time

import numpy as np

import shmreplay


def insert_at(address, value, result):
    """Attaches by ``address`` (waiting for the buffer) and inserts one item."""
    try:
        client = shmreplay.Client(address)
        keys = client.insert({"x": np.full(2, value, np.float32)}, {"q": 1.0}, timeout=30)
        result.put(("ok", keys["q"]))
    except BaseException as exc:  # the test reads what went wrong
        result.put(("error", f"{type(exc).__name__}: {exc}"))


def insert_with(client, value, result):
    """Inserts one item through a pickled (possibly lazy) Client."""
    try:
        keys = client.insert({"x": np.full(2, value, np.float32)}, {"q": 1.0}, timeout=30)
        result.put(("ok", keys["q"]))
    except BaseException as exc:
        result.put(("error", f"{type(exc).__name__}: {exc}"))


def own(port, delay, ready, stop, name=None):
    """Creates a Server for ``port`` (or ``name``) after ``delay`` s, inserts one item,
    and serves until ``stop`` is set (at most 60 s)."""
    time.sleep(delay)
    kwargs = {"name": name} if name is not None else {"port": port}
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], **kwargs) as server:
        with shmreplay.Client(server.name) as client:
            client.insert({"x": np.full(2, 7.0, np.float32)}, {"q": 1.0}, timeout=10)
        ready.put(server.name)
        stop.wait(60)


def own_and_hang(port, ready):
    """Creates a Server for ``port`` and waits to be killed (SIGKILL: no cleanup)."""
    server = shmreplay.Server([shmreplay.Table.queue("q", 10)], port=port)
    ready.put((server.name, os.getpid()))
    time.sleep(120)


def write_episode(name, steps, result):
    """Writes one TrajectoryWriter episode of ``steps`` one-step items into table "t",
    with Python's ``random`` seeded as every actor of a run might be."""
    import random
    random.seed(0)
    np.random.seed(0)
    try:
        with shmreplay.Client(name) as client:
            with client.trajectory_writer(1) as writer:
                for step in range(steps):
                    writer.append({"x": np.full(2, step, np.float32)})
                    writer.create_item("t", 1.0, {"x": writer.history["x"][-1]})
                writer.end_episode()
        result.put("ok")
    except BaseException as exc:
        result.put(f"{type(exc).__name__}: {exc}")

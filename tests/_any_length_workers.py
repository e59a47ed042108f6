"""Spawned processes for test_any_length.py: actors writing items of any length."""

import numpy as np

import shmreplay

SIGNATURE = {"obs": shmreplay.TensorSpec((None, 4), np.float32),
             "step": shmreplay.TensorSpec((None,), np.int64)}


def write_episodes(client, table, lengths, base, priority=1.0):
    """One item per episode: the whole episode, whose steps count up from ``base``.
    ``obs`` repeats each step's value, so a sampled item checks itself."""
    with client.trajectory_writer(num_keep_alive_refs=max(lengths)) as writer:
        value = base
        for length in lengths:
            for _ in range(length):
                writer.append({"obs": np.full(4, value, np.float32), "step": np.int64(value)})
                value += 1
            writer.create_item(table, priority, {"obs": writer.history["obs"][-length:],
                                                 "step": writer.history["step"][-length:]})
            writer.end_episode()
    return value


def actor(name, table, lengths, base, done):
    client = shmreplay.Client(name)
    write_episodes(client, table, lengths, base)
    client.close()
    done.set()


def overwriter(name, table, seed, ready, stop):
    """Writes items of random lengths until ``stop``: a small table's items are evicted
    and their rows and blocks reused while others sample them."""
    client = shmreplay.Client(name)
    rng = np.random.default_rng(seed)
    base = seed * 1_000_000  # (float32 holds these exactly)
    ready.set()
    while not stop.is_set():
        base = write_episodes(client, table, rng.integers(1, 9, size=16).tolist(), base)
    client.close()


def storm(name, seconds, actors, seed, counts, incarnations, started, done):
    """Keeps ``actors`` writer processes of items of any length alive for ``seconds``,
    SIGKILLing each 20-80 ms after it starts and forking a replacement; every tenth is
    armed to stop inside ``reserve_item`` (the table's lock held) and killed there.
    Incarnation ``k`` acknowledges in ``counts[k]`` the items whose ``create_item``
    returned."""
    import os
    import random
    import signal
    import time
    from shmreplay._shm import crash_points as _crash_points
    from shmreplay._shm.kernels import codes
    rng = random.Random(seed)
    client = shmreplay.Client(name)
    engine = client._engine("eps")
    write_episodes(client, "eps", [2], base=-100)  # (kernels loaded before forking)
    live, armed, next_incarnation = {}, None, 0
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
                    _crash_points.arm(engine, codes.STOP_RESERVE_ITEM, pid)
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


STORM_STRIDE = 2_000  # (values stay below 2**24: float32 holds them exactly)


def _storm_actor(client, k, counts, rng):
    value = k * STORM_STRIDE
    with client.trajectory_writer(num_keep_alive_refs=12) as writer:
        while value + 12 < (k + 1) * STORM_STRIDE:
            length = rng.randint(1, 12)
            for _ in range(length):
                writer.append({"obs": np.full(4, value, np.float32), "step": np.int64(value)})
                value += 1
            writer.create_item("eps", 1.0, {"obs": writer.history["obs"][-length:],
                                            "step": writer.history["step"][-length:]})
            counts[k] += 1

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

"""Spawned writers for tests/test_deleted_episodes.py (importable by name in a child)."""

import numpy as np

import shmreplay


def write_episodes(name, writer_id, episodes, steps, result):
    """Writes ``episodes`` TrajectoryWriter episodes of ``steps`` one-step items into
    table ``t``, each item ``{"x": [writer_id, episode]}``; puts "ok" (or the error) on
    ``result``."""
    try:
        with shmreplay.Client(name) as client:
            with client.trajectory_writer(1) as writer:
                for episode in range(episodes):
                    for step in range(steps):
                        writer.append({"x": np.array([writer_id, episode], np.float32)})
                        writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
                        writer.flush(timeout_ms=30_000)
                    writer.end_episode(timeout_ms=30_000)
        result.put("ok")
    except BaseException as error:  # (reported to the test, which fails with it)
        result.put(("error", repr(error)))

"""Worker functions for ``test_structured_writer.py`` (importable, for ``spawn``).

A worker reports ``(tag, payload)`` on a ``multiprocessing`` queue (its last argument);
an exception is reported as ``("error", traceback)`` (``_mp_workers._guard``).
"""

import numpy as np

from _mp_workers import _guard

OBS = 3


def step(episode: int, t: int):
    """A step that says where it came from: obs = [episode, t, episode * 100 + t]."""
    return {"obs": np.array([episode, t, episode * 100 + t], np.float32), "t": np.int64(t)}


def configs(sequences: str, transitions: str):
    """3-step sequences every 2 steps (from the 3rd step on), and (obs, next obs) pairs."""
    from shmreplay import structured_writer as sw
    ref = sw.create_reference_step(step(0, 0))
    return [
        sw.create_config({"obs": ref["obs"][-3:], "t": ref["t"][-3:]}, sequences,
                         conditions=[sw.Condition.step_index() >= 2,
                                     sw.Condition.step_index() % 2 == 0]),
        sw.create_config({"obs": ref["obs"][-2], "next_obs": ref["obs"][-1]}, transitions),
    ]


@_guard
def write_episodes(name, sequences, transitions, episodes, length, queue):
    """Attaches to buffer ``name`` and writes ``episodes`` episodes of ``length`` steps."""
    import shmreplay
    client = shmreplay.Client(name)
    with client.structured_writer(configs(sequences, transitions)) as writer:
        for episode in range(episodes):
            for t in range(length):
                writer.append(step(episode, t))
            writer.end_episode(timeout_ms=20_000)
    client.close()
    queue.put(("done", episodes * length))

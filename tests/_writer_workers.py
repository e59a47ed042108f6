"""Worker functions for the writer multi-process tests (``test_writer_multiprocess.py``).

Workers live in an importable module so that ``multiprocessing``'s ``spawn`` start
method can find them. As in ``_mp_workers``, each reports ``(tag, payload)`` tuples on a
``multiprocessing`` queue (its last argument); an exception is reported as
``("error", traceback)``.

Every step a writer appends encodes where it came from::

    {"ids": int64 [writer_id, episode, t], "obs": float64 [OBS] = base + arange(OBS) / OBS}
    base = writer_id * 1_000_000 + episode * 1_000 + t          (t < 1000)

so a sampled item shows exactly which steps it references (``malformed_items``).
"""

import time

import numpy as np

from _mp_workers import _guard

OBS = 16
SEQ = 4            # TrajectoryWriter items: the last SEQ steps of an episode
LEGACY_SEQ = 3     # legacy Writer items (a table of their own): the last 3 steps
MAX_EPISODE = 40   # steps per episode (t < 1000 keeps the encoding unique)


# --------------------------------------------------------------------------------------
# encoding and checking (both sides)
# --------------------------------------------------------------------------------------

def obs_of(writer_id, episode, t):
    base = float(writer_id * 1_000_000 + episode * 1_000 + t)
    return base + np.arange(OBS, dtype=np.float64) / OBS


def step(writer_id, episode, t):
    return {"ids": np.array([writer_id, episode, t], np.int64),
            "obs": obs_of(writer_id, episode, t)}


def expected_obs(ids):
    """The ``obs`` the steps ``ids`` ([..., 3]) must carry."""
    ids = np.asarray(ids)
    base = (ids[..., 0] * 1_000_000 + ids[..., 1] * 1_000 + ids[..., 2]).astype(np.float64)
    return base[..., None] + np.arange(OBS, dtype=np.float64) / OBS


def malformed_items(data, length):
    """Indices of sampled items that are not ``length`` consecutive steps of one episode
    of one writer, or whose ``obs`` does not match their ids (torn)."""
    ids = np.asarray(data["ids"])
    obs = np.asarray(data["obs"])
    batch = ids.shape[0]
    assert ids.shape == (batch, length, 3), ids.shape
    assert obs.shape == (batch, length, OBS), obs.shape
    same_writer = np.all(ids[:, :, 0] == ids[:, :1, 0], axis=1)
    same_episode = np.all(ids[:, :, 1] == ids[:, :1, 1], axis=1)
    consecutive = np.all(ids[:, :, 2] == ids[:, :1, 2] + np.arange(length), axis=1)
    in_range = (ids[:, 0, 2] >= 0) & (ids[:, -1, 2] < MAX_EPISODE) & (ids[:, 0, 1] >= 0)
    obs_ok = np.all(obs == expected_obs(ids), axis=(1, 2))
    good = same_writer & same_episode & consecutive & in_range & obs_ok
    return np.flatnonzero(~good)


def describe(data, bad):
    ids = np.asarray(data["ids"])
    obs = np.asarray(data["obs"])
    return [(ids[i].tolist(), obs[i][:, 0].tolist()) for i in bad[:3]]


# --------------------------------------------------------------------------------------
# writers
# --------------------------------------------------------------------------------------

class _Streamer:
    """Appends episodes of random length (1..MAX_EPISODE-1 steps) with one writer kind.

    ``trajectory``: a TrajectoryWriter; once an episode has SEQ steps, every step makes
    an item of its last SEQ steps in each of ``seq_tables``; ``end_episode`` between
    episodes (clearing the history or not, at random).
    ``legacy``: a legacy Writer; items of the last SEQ steps in ``seq_tables`` and of
    the last LEGACY_SEQ steps in ``legacy_tables``, only from steps of the current
    episode (the writer itself knows no episodes).
    """

    def __init__(self, client, kind, writer_id, seed, seq_tables, legacy_tables=()):
        self.kind = kind
        self.writer_id = writer_id
        self.rng = np.random.default_rng(seed)
        self.seq_tables = list(seq_tables)
        self.legacy_tables = list(legacy_tables)
        self.created = {t: 0 for t in self.seq_tables + self.legacy_tables}
        self.episode = 0
        self.steps = 0
        if kind == "trajectory":
            assert not legacy_tables
            self.writer = client.trajectory_writer(SEQ)
        else:
            self.writer = client.writer(max(SEQ, LEGACY_SEQ), max_in_flight_items=8)

    def episode_length(self):
        return int(self.rng.integers(1, MAX_EPISODE))

    def run_episode(self, stop=None):
        """Appends one episode; returns False if ``stop`` was set part-way."""
        writer = self.writer
        for t in range(self.episode_length()):
            if stop is not None and stop.is_set():
                return False
            writer.append(step(self.writer_id, self.episode, t))
            self.steps += 1
            if self.kind == "trajectory":
                if writer.episode_steps >= SEQ:
                    history = writer.history
                    for table in self.seq_tables:
                        writer.create_item(table, 1.0, {"ids": history["ids"][-SEQ:],
                                                        "obs": history["obs"][-SEQ:]})
                        self.created[table] += 1
            else:
                if t + 1 >= SEQ:
                    for table in self.seq_tables:
                        writer.create_item(table, SEQ, 1.0)
                        self.created[table] += 1
                if t + 1 >= LEGACY_SEQ:
                    for table in self.legacy_tables:
                        writer.create_item(table, LEGACY_SEQ, 1.0)
                        self.created[table] += 1
        if self.kind == "trajectory":
            writer.end_episode(clear_buffers=bool(self.rng.integers(2)), timeout_ms=10_000)
        self.episode += 1
        return True

    def finish(self):
        if self.kind == "trajectory":
            self.writer.flush(timeout_ms=10_000)
        else:
            self.writer.flush(timeout=10)
        self.writer.close()


@_guard
def stream_episodes(name, kind, writer_id, seed, seq_tables, legacy_tables, ready, go, stop,
                    queue):
    """Streams episodes until ``stop``; reports ``("created", {table: items})``."""
    import shmreplay
    with shmreplay.Client(name) as client:
        streamer = _Streamer(client, kind, writer_id, seed, seq_tables, legacy_tables)
        client.server_info()
        ready.set()
        if not go.wait(30):
            raise RuntimeError("never told to go")
        while streamer.run_episode(stop):
            pass
        streamer.finish()
        queue.put(("created", (writer_id, streamer.created, streamer.episode, streamer.steps)))


@_guard
def stream_until_killed(name, kind, writer_id, seed, seq_tables, go, progress_after, queue):
    """After ``go``, streams episodes forever; reports ``("progress", items)`` once it
    has created ``progress_after`` items (the test SIGKILLs it some time later)."""
    import shmreplay
    client = shmreplay.Client(name)
    streamer = _Streamer(client, kind, writer_id, seed, seq_tables)
    client.server_info()
    if not go.wait(60):
        raise RuntimeError("never told to go")
    reported = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        streamer.run_episode()
        if not reported and sum(streamer.created.values()) >= progress_after:
            queue.put(("progress", sum(streamer.created.values())))
            reported = True
    queue.put(("timeout", None))


# --------------------------------------------------------------------------------------
# queue feeders
# --------------------------------------------------------------------------------------

def queue_item(i):
    """What ``insert`` puts in the queue as item ``i`` (the shape writer items have)."""
    return {"v": np.int64(i), "pair": np.array([i, i + 1], np.int64),
            "x": np.full(OBS, float(i))}


@_guard
def feed_queue(name, table, kind, count, ready, go, queue):
    """Puts items 0..count-1 into the queue ``table``, in order; reports ``("done", n)``.

    Item ``i`` is ``{"v": i, "pair": [i, i + 1], "x": [i] * OBS}``:
    ``insert``: given whole; ``writer``: a legacy Writer's items of 2 steps (v_i, v_i+1)
    seen as ``{"v": [i, i+1], ...}`` (so ``v[0] == i``); ``trajectory``: a
    TrajectoryWriter item whose ``v`` is step i squeezed, ``pair`` steps i and i+1 of the
    same column (one store, shared rows), ``x`` step i.
    """
    import shmreplay
    with shmreplay.Client(name) as client:
        client.server_info()
        ready.set()
        if not go.wait(30):
            raise RuntimeError("never told to go")
        if kind == "insert":
            for i in range(count):
                client.insert(queue_item(i), priorities={table: 1.0}, timeout=20)
        elif kind == "writer":
            # max_in_flight_items=2: create_item blocks on the full queue most of the time.
            with client.writer(2, max_in_flight_items=2) as writer:
                writer.append({"v": np.int64(0), "x": np.full(OBS, 0.0)})
                for i in range(count):
                    writer.append({"v": np.int64(i + 1), "x": np.full(OBS, float(i + 1))})
                    writer.create_item(table, 2, 1.0)
                writer.flush(timeout=20)
        elif kind == "trajectory":
            writer = client.trajectory_writer(2)
            writer.append({"v": np.int64(0), "x": np.full(OBS, 0.0)})
            for i in range(count):
                writer.append({"v": np.int64(i + 1), "x": np.full(OBS, float(i + 1))})
                history = writer.history
                # Never blocks: items wait in the writer while the queue is full.
                writer.create_item(table, 1.0, {"v": history["v"][-2],
                                                "pair": history["v"][-2:],
                                                "x": history["x"][-2]})
                if i % 50 == 49:
                    writer.flush(block_until_num_items=10, timeout_ms=20_000)
            writer.flush(timeout_ms=20_000)
            writer.close()
        else:
            raise ValueError(kind)
    queue.put(("done", count))


# --------------------------------------------------------------------------------------
# crash between reserve and commit
# --------------------------------------------------------------------------------------

@_guard
def hang_before_commit(name, table, kind, commits_before_hang, queue):
    """Streams one writer's items into ``table``; the item after ``commits_before_hang``
    committed ones is reserved and written, then the process reports
    ``("hanging", (slot, committed_ids))`` and sleeps before committing it (until the
    test SIGKILLs it)."""
    import shmreplay
    from shmreplay._writers import writing as _writing

    real_commit = _writing.kernels.commit_one
    state = {"commits": 0}

    def commit_one(*args):
        if state["commits"] == commits_before_hang:
            # args: the table's 7 arrays, then slot, priority, io
            queue.put(("hanging", int(args[7])))
            queue.close()
            queue.join_thread()  # the message is in the pipe before we are killed
            time.sleep(60)
            raise RuntimeError("was not killed while hanging before commit")
        key = real_commit(*args)
        state["commits"] += 1
        return key

    client = shmreplay.Client(name)
    client.server_info()
    _writing.kernels.commit_one = commit_one
    streamer = _Streamer(client, kind, 7, 1234, [table])
    streamer.episode_length = lambda: MAX_EPISODE - 1
    for _ in range(10):
        streamer.run_episode()
        if kind == "legacy":
            streamer.writer.flush(timeout=10)
    raise RuntimeError("never reached the hanging commit")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit("helper module for the tests")

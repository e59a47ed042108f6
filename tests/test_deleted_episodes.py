"""``TableInfo.num_deleted_episodes`` as Reverb counts it: an episode is deleted each time
the last item of it in the table goes (evicted, deleted, expired), and may come back
with a later item and go again; ``reset`` sets the count to 0; checkpoints keep it.

The reference is a model of Reverb's per-episode reference counts (``ReverbModel``),
driven through the same operations as the table.
"""

import collections
import multiprocessing
import random

import numpy as np
import pytest

import _episode_workers as workers
import shmreplay
from shmreplay import rate_limiters, selectors


def _table(max_size, name="t", remover=selectors.Fifo):
    return shmreplay.Table(name, sampler=selectors.Uniform(), remover=remover(),
                           max_size=max_size, rate_limiter=rate_limiters.MinSize(1))


def _counts(client, table="t"):
    info = client.server_info(timeout=5)[table]
    return info.num_episodes, info.num_deleted_episodes


class ReverbModel:
    """Reverb's bookkeeping: items in insertion order, each with its episode; references
    per episode; an episode whose count drops to 0 is deleted (and counted)."""

    def __init__(self, max_size):
        self.max_size = max_size
        self.items = collections.OrderedDict()  # item number -> episode
        self.refs = collections.Counter()
        self.deleted = 0

    def add(self, number, episode):
        self.items[number] = episode
        self.refs[episode] += 1
        while len(self.items) > self.max_size:  # FIFO eviction
            self.remove(next(iter(self.items)))

    def remove(self, number):
        episode = self.items.pop(number)
        self.refs[episode] -= 1
        if not self.refs[episode]:
            del self.refs[episode]
            self.deleted += 1

    def reset(self):
        self.items.clear()
        self.refs.clear()
        self.deleted = 0

    def counts(self):
        return len(self.refs), self.deleted


def _keys_by_number(client, expected):
    """The key of each live item, by the item number in its data (uniform draws: 400 of
    at most 8 items miss one with p < 1e-22)."""
    sample = client.sample_batch("t", 400, timeout=5)
    found = {int(np.ravel(x)[0]): int(key) for x, key in zip(sample.data["x"], sample.info.key)}
    assert set(found) == set(expected)
    return found


def test_counts_follow_reverbs_model_through_random_operations(buffer_name):
    rng = random.Random(20261127)
    model = ReverbModel(max_size=6)
    with shmreplay.Server([_table(6)], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            writers = {w: client.trajectory_writer(1) for w in "AB"}
            episode_of = {"A": 0, "B": 0}
            number = 0
            for _ in range(300):
                op = rng.choices(["insert", "step", "end", "delete", "reset"],
                                 [3, 10, 2, 3, 0.3])[0]
                if op == "insert":
                    number += 1
                    client.insert({"x": np.array([number, 0], np.float32)}, {"t": 1.0},
                                  timeout=5)
                    model.add(number, ("insert", number))
                elif op == "step":
                    w = rng.choice("AB")
                    number += 1
                    writer = writers[w]
                    writer.append({"x": np.array([number, 0], np.float32)})
                    writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
                    writer.flush(timeout_ms=5000)
                    model.add(number, (w, episode_of[w]))
                elif op == "end":
                    w = rng.choice("AB")
                    writers[w].end_episode(timeout_ms=5000)
                    episode_of[w] += 1
                elif op == "delete" and model.items:
                    victim = rng.choice(list(model.items))
                    keys = _keys_by_number(client, model.items)
                    client.mutate_priorities("t", deletes=[keys[victim]])
                    model.remove(victim)
                elif op == "reset":
                    client.reset("t")
                    model.reset()
                assert _counts(client) == model.counts(), op
            assert model.deleted > 10  # (the sequence exercised it)
            for writer in writers.values():
                writer.close()


def test_an_episode_that_comes_back_is_deleted_again(buffer_name):
    with shmreplay.Server([_table(100)], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            with client.trajectory_writer(1) as writer:
                for number in (1, 2):
                    writer.append({"x": np.array([number, 0], np.float32)})
                    writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
                writer.flush()
                keys = _keys_by_number(client, [1, 2])
                # The newest item goes, the older one stays: the episode is still here.
                client.mutate_priorities("t", deletes=[keys[2]])
                assert _counts(client) == (1, 0)
                writer.append({"x": np.array([3, 0], np.float32)})
                writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
                writer.flush()
                keys = _keys_by_number(client, [1, 3])
                client.mutate_priorities("t", deletes=[keys[1], keys[3]])
                assert _counts(client) == (0, 1)
                # The same episode again: a new stay, deleted again.
                writer.append({"x": np.array([4, 0], np.float32)})
                writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
                writer.flush()
                assert _counts(client) == (1, 1)
                client.mutate_priorities("t", deletes=[_keys_by_number(client, [4])[4]])
                assert _counts(client) == (0, 2)


def test_a_long_episode_in_a_small_table_stays_one_episode(buffer_name):
    # 600 items of one episode through a table of 5: the writer's remembered slots are
    # pruned as they die, and every item continues the episode's stay.
    with shmreplay.Server([_table(5)], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            with client.trajectory_writer(1) as writer:
                for step in range(600):
                    writer.append({"x": np.array([step, 0], np.float32)})
                    writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
                writer.flush()
                assert _counts(client) == (1, 0)
                writer.end_episode()
                for step in range(5):  # the next episode pushes the first one out
                    writer.append({"x": np.array([step, 1], np.float32)})
                    writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
                writer.flush()
                assert _counts(client) == (1, 1)


def test_legacy_writer_items_and_expired_items(buffer_name):
    table = shmreplay.Table("t", sampler=selectors.Fifo(), remover=selectors.Fifo(),
                            max_size=100, max_times_sampled=1,
                            rate_limiter=rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            for episode in range(2):
                with client.writer(2) as writer:  # one episode per legacy Writer
                    for step in range(3):
                        writer.append({"x": np.array([step, episode], np.float32)})
                        writer.create_item("t", 1, 1.0)
            assert _counts(client) == (2, 0)
            client.sample_batch("t", 3, timeout=5)  # each sampled once: expired, in order
            assert _counts(client) == (1, 1)
            client.sample_batch("t", 3, timeout=5)
            assert _counts(client) == (0, 2)


def test_reset_sets_the_count_to_zero_and_checkpoints_keep_it(buffer_name, tmp_path):
    with shmreplay.Server([_table(3)], name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            for number in range(5):
                client.insert({"x": np.array([number, 0], np.float32)}, {"t": 1.0}, timeout=5)
            assert _counts(client) == (3, 2)
            path = client.checkpoint(str(tmp_path / "t.ckpt"))
            client.reset("t")
            assert _counts(client) == (0, 0)
            client.insert({"x": np.zeros(2, np.float32)}, {"t": 1.0}, timeout=5)
            assert _counts(client) == (1, 0)
    with shmreplay.Server(name=buffer_name, checkpoint=path) as server:
        with shmreplay.Client(server.name) as client:
            assert _counts(client) == (3, 2)
            client.insert({"x": np.zeros(2, np.float32)}, {"t": 1.0}, timeout=5)
            assert _counts(client) == (3, 3)


def test_writers_in_spawned_processes_count_in_the_table(buffer_name):
    spawn = multiprocessing.get_context("spawn")
    episodes, steps = 3, 4
    with shmreplay.Server([_table(100)], name=buffer_name) as server:
        result = spawn.Queue()
        procs = [spawn.Process(target=workers.write_episodes,
                               args=(server.name, w, episodes, steps, result))
                 for w in range(2)]
        for proc in procs:
            proc.start()
        outcomes = [result.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(30)
        assert outcomes == ["ok", "ok"]
        with shmreplay.Client(server.name) as client:
            assert _counts(client) == (2 * episodes, 0)
            sample = client.sample_batch("t", 2000, timeout=5)  # all 24 items' keys
            by_episode = collections.defaultdict(set)
            for x, key in zip(sample.data["x"], sample.info.key):
                by_episode[tuple(np.ravel(x)[:2].astype(int))].add(int(key))
            assert sum(map(len, by_episode.values())) == 2 * episodes * steps
            gone = 0
            for keys in by_episode.values():
                keys = sorted(keys)
                client.mutate_priorities("t", deletes=keys[:-1])
                assert _counts(client)[1] == gone  # one item left: not deleted yet
                client.mutate_priorities("t", deletes=keys[-1:])
                gone += 1
                assert _counts(client) == (2 * episodes - gone, gone)

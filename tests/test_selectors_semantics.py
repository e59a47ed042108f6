"""Selector semantics, black-box through ``Server`` / ``Client`` (reference §1.5 and the
``reverb/cc/selectors/*_test.cc`` cases of §2.3).

Items are identified by their data value (an int64 scalar); keys are learned from
sampled ``info.key``.
"""

import contextlib

import numpy as np
import pytest

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay.specs import TensorSpec
import _names

INT = TensorSpec((), np.int64)


@contextlib.contextmanager
def serve(*tables):
    with shmreplay.Server(tables=list(tables), name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield client
        finally:
            client.close()


def make_table(sampler, remover=None, max_size=1000, max_times_sampled=0, name="t"):
    return shmreplay.Table(name=name, sampler=sampler, remover=remover or selectors.Fifo(),
                           max_size=max_size, rate_limiter=rate_limiters.MinSize(1),
                           max_times_sampled=max_times_sampled, signature=INT)


def insert(client, value, priority=1.0, table="t"):
    client.insert(np.int64(value), priorities={table: priority}, timeout=1)


def insert_many(client, values, priorities, table="t"):
    client.insert_batch(np.asarray(values, np.int64),
                        priorities={table: np.asarray(priorities, np.float64)}, timeout=1)


def sample(client, batch_size, table="t"):
    """Returns (values, info) of one sample_batch call."""
    s = client.sample_batch(table, batch_size=batch_size, timeout=2)
    return np.asarray(s.data).reshape(-1), s.info


def pop(client, table="t"):
    """One sampled item: (value, key, probability, times_sampled)."""
    values, info = sample(client, 1, table)
    assert len(values) == 1
    return (int(values[0]), int(info.key[0]), float(info.probability[0]),
            int(info.times_sampled[0]))


def keys_by_value(client, expected_values, table="t", batch_size=4000):
    """Learns the key of every item by sampling (for random samplers only)."""
    found = {}
    for _ in range(20):
        values, info = sample(client, batch_size, table)
        found.update(zip(values.tolist(), info.key.tolist()))
        if set(found) == set(expected_values):
            break
    assert set(found) == set(expected_values), "sampling did not reach every item"
    return found


def current_values(client, table="t", batch_size=3000):
    """The set of values in a uniform-sampled table."""
    values, _ = sample(client, batch_size, table)
    return set(values.tolist())


def size(client, table="t"):
    return client.server_info()[table].current_size


# --------------------------------------------------------------------------------------
# Fifo / Lifo
# --------------------------------------------------------------------------------------

def test_fifo_sampler_order():
    with serve(make_table(selectors.Fifo(), max_times_sampled=1)) as client:
        for i in range(20):
            insert(client, i, priority=20 - i)   # priorities must not reorder Fifo
        got = [pop(client) for _ in range(20)]
        assert [g[0] for g in got] == list(range(20))
        assert all(g[2] == 1.0 for g in got)


def test_fifo_sampler_order_with_deletions():
    with serve(make_table(selectors.Fifo(), max_size=10, max_times_sampled=2)) as client:
        for i in range(15):                      # the remover drops 0..4
            insert(client, i)
        value, key, prob, times = pop(client)
        assert (value, prob, times) == (5, 1.0, 1)
        client.mutate_priorities("t", deletes=[key])   # explicit delete of the head
        value, key6, _, times = pop(client)
        assert (value, times) == (6, 1)
        client.mutate_priorities("t", updates={key6: 0.0})   # Fifo ignores priorities
        value, _, _, times = pop(client)
        assert (value, times) == (6, 2)          # max_times_sampled reached: deleted
        client.mutate_priorities("t", updates={key6: 5.0})   # stale key: ignored
        order = [pop(client)[0] for _ in range(2 * 8 - 1)]
        assert order == [7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14]
        assert size(client) == 1


def test_fifo_sampler_order_with_deletions_in_the_middle():
    # fifo_test.cc::MatchesFifoOrdering: delete every 10th item, the rest come out in
    # insertion order. Keys come from insert's return value ({table: key}).
    with serve(make_table(selectors.Fifo(), max_times_sampled=1)) as client:
        keys = {i: client.insert(np.int64(i), priorities={"t": 1.0}, timeout=1)["t"]
                for i in range(50)}
        assert len(set(keys.values())) == 50
        client.mutate_priorities("t", deletes=[keys[i] for i in range(0, 50, 10)])
        client.mutate_priorities("t", updates={keys[1]: 0.0, keys[49]: 100.0})
        values, info = sample(client, 45)
        assert values.tolist() == [i for i in range(50) if i % 10]
        assert info.key.tolist() == [keys[i] for i in range(50) if i % 10]
        assert (info.probability == 1.0).all()
        assert size(client) == 0


def test_fifo_remover_skips_deleted_items():
    # keys are learned through a uniform sampler; Fifo acts as the remover
    with serve(make_table(selectors.Uniform(), remover=selectors.Fifo(), max_size=30)) as client:
        insert_many(client, range(30), np.ones(30))
        keys = keys_by_value(client, range(30))
        client.mutate_priorities("t", deletes=[keys[v] for v in (0, 10, 20)])
        model = [v for v in range(30) if v % 10]
        for v in range(30, 46):
            insert(client, v)
            model.append(v)
            if len(model) > 30:
                model.pop(0)
        assert size(client) == 30
        assert current_values(client) == set(model)
        assert min(model) == 15


def test_lifo_sampler_order_with_deletions():
    with serve(make_table(selectors.Lifo(), max_times_sampled=2)) as client:
        keys = {}
        for i in range(30):
            insert(client, i)
            value, key, prob, times = pop(client)  # the newest item is the one just added
            assert (value, prob, times) == (i, 1.0, 1)
            keys[i] = key
        client.mutate_priorities("t", deletes=[keys[i] for i in range(0, 30, 10)])
        # priority updates must not reorder a Lifo either
        client.mutate_priorities("t", updates={keys[5]: 100.0, keys[29]: 0.0})
        values, info = sample(client, 27)
        assert values.tolist() == [i for i in range(29, -1, -1) if i % 10]
        assert (info.probability == 1.0).all()
        assert (info.times_sampled == 2).all()
        assert size(client) == 0


# --------------------------------------------------------------------------------------
# Heaps
# --------------------------------------------------------------------------------------

def test_min_heap_lowest_first_ties_by_insertion_order():
    with serve(make_table(selectors.MinHeap(), max_times_sampled=1)) as client:
        for value, priority in [(5, 300), (0, 1), (3, 20), (1, 1), (4, 20), (2, 1)]:
            insert(client, value, priority)
        got = [pop(client) for _ in range(6)]
        assert [g[0] for g in got] == [0, 1, 2, 3, 4, 5]
        assert all(g[2] == 1.0 for g in got)


def test_min_heap_ties_by_update_order():
    with serve(make_table(selectors.MinHeap())) as client:
        for value in range(3):
            insert(client, value, 1.0)
        order = []
        for _ in range(6):
            value, key, prob, _ = pop(client)
            order.append(value)
            assert prob == 1.0
            # an update to the *same* priority still makes it the most recent
            client.mutate_priorities("t", updates={key: 1.0})
        assert order == [0, 1, 2, 0, 1, 2]


def test_min_heap_update_changes_order():
    with serve(make_table(selectors.MinHeap())) as client:
        for value, priority in [(0, 3.0), (1, 1.0), (2, 2.0)]:
            insert(client, value, priority)
        value, key, _, _ = pop(client)
        assert value == 1
        client.mutate_priorities("t", updates={key: 10.0})
        value, key2, _, _ = pop(client)
        assert value == 2
        client.update_priorities("t", keys=np.array([key], np.uint64),
                                 priorities=np.array([0.5]))
        assert pop(client)[0] == 1
        client.mutate_priorities("t", deletes=[key])
        assert pop(client)[0] == 2


def test_max_heap():
    with serve(make_table(selectors.MaxHeap(), max_times_sampled=1)) as client:
        for value, priority in [(0, 1.0), (1, 5.0), (2, 3.0), (3, 5.0), (4, 0.0)]:
            insert(client, value, priority)
        got = [pop(client) for _ in range(5)]
        assert [g[0] for g in got] == [1, 3, 2, 0, 4]
        assert all(g[2] == 1.0 for g in got)


def test_max_heap_ties_by_update_order_and_updates():
    with serve(make_table(selectors.MaxHeap())) as client:
        for value in range(3):
            insert(client, value, 2.0)
        value, key, _, _ = pop(client)
        assert value == 0
        client.mutate_priorities("t", updates={key: 2.0})
        value, key1, _, _ = pop(client)
        assert value == 1
        client.mutate_priorities("t", updates={key1: 9.0})
        assert pop(client)[0] == 1
        client.mutate_priorities("t", updates={key1: 0.0})
        assert pop(client)[0] == 2


# --------------------------------------------------------------------------------------
# Prioritized
# --------------------------------------------------------------------------------------

def check_probabilities(client, priority_of_value, exponent=1.0, n_batches=4, batch=5000):
    """Every sampled row reports p**a / sum; frequencies follow the probabilities."""
    weights = {v: p ** exponent if p > 0 else 0.0 for v, p in priority_of_value.items()}
    total = sum(weights.values())
    counts = {}
    n = 0
    for _ in range(n_batches):
        values, info = sample(client, batch)
        for value, priority, prob in zip(values.tolist(), info.priority.tolist(),
                                         info.probability.tolist()):
            assert priority == priority_of_value[value]
            assert prob == pytest.approx(weights[value] / total, rel=1e-9)
            counts[value] = counts.get(value, 0) + 1
        n += len(values)
    for value, w in weights.items():
        p = w / total
        tolerance = max(0.002, 5 * np.sqrt(p * (1 - p) / n))   # 5 standard deviations
        assert counts.get(value, 0) / n == pytest.approx(p, abs=tolerance), value
    return counts


def test_prioritized_probabilities_after_mixed_operations():
    with serve(make_table(selectors.Prioritized(1.0))) as client:
        insert_many(client, range(100), np.ones(100))
        keys = keys_by_value(client, range(100))
        client.mutate_priorities("t", deletes=[keys[v] for v in range(10)])
        client.mutate_priorities("t", updates={keys[v]: float(v) for v in range(10, 60)})
        client.update_priorities("t", keys=np.array([keys[v] for v in range(60, 100)], np.uint64),
                                 priorities=np.arange(60, 100, dtype=np.float64))
        insert_many(client, range(100, 110), np.arange(100, 110, dtype=np.float64))
        for v in range(110, 115):
            insert(client, v, float(v))
        expected = {v: float(v) for v in range(10, 115)}
        assert size(client) == len(expected)
        check_probabilities(client, expected)
        # delete a few of the newest and change some again
        keys = keys_by_value(client, expected, batch_size=5000)
        client.mutate_priorities("t", updates={keys[11]: 300.0, keys[50]: 0.25},
                                 deletes=[keys[v] for v in range(100, 110, 2)])
        for v in range(100, 110, 2):
            del expected[v]
        expected[11], expected[50] = 300.0, 0.25
        check_probabilities(client, expected)


def test_prioritized_priority_exponent():
    with serve(make_table(selectors.Prioritized(0.5))) as client:
        priorities = {0: 1.0, 1: 4.0, 2: 9.0, 3: 16.0}      # weights 1, 2, 3, 4
        for v, p in priorities.items():
            insert(client, v, p)
        check_probabilities(client, priorities, exponent=0.5, n_batches=2)
        values, info = sample(client, 100)
        np.testing.assert_allclose(info.probability, (values + 1) / 10.0, rtol=1e-9)


def test_prioritized_exponent_zero_keeps_zero_priorities_out():
    # 0 ** a := 0 even for a == 0: exponent 0 is uniform over non-zero priorities.
    with serve(make_table(selectors.Prioritized(0.0))) as client:
        for v, p in enumerate([0.0, 1.0, 2.0, 30.0]):
            insert(client, v, p)
        values, info = sample(client, 6000)
        assert 0 not in set(values.tolist())
        np.testing.assert_allclose(info.probability, 1.0 / 3, rtol=1e-9)
        freq = np.bincount(values, minlength=4)[1:] / len(values)
        np.testing.assert_allclose(freq, 1.0 / 3, atol=0.05)


def test_prioritized_all_zero_priorities_sample_uniformly():
    with serve(make_table(selectors.Prioritized(1.0))) as client:
        insert_many(client, range(100), np.zeros(100))
        values, info = sample(client, 3000)
        assert (info.probability == 1.0 / 100).all()       # exactly 1/N
        assert set(values.tolist()) == set(range(100))
        keys = dict(zip(values.tolist(), info.key.tolist()))
        client.mutate_priorities("t", updates={keys[42]: 0.5})
        values, info = sample(client, 200)
        assert set(values.tolist()) == {42}
        assert (info.probability == 1.0).all()


def test_prioritized_rounding_errors():
    # A tiny priority next to many large ones that are then deleted: the tiny item must
    # still be sampleable (no negative or stale sums left in the tree).
    with serve(make_table(selectors.Prioritized(1.0), max_size=20_000)) as client:
        insert(client, 0, 1e-15)
        n = 10_000
        insert_many(client, range(1, n + 1), np.full(n, 0.3))
        for _ in range(50):
            if size(client) == 1:
                break
            values, info = sample(client, 8192)
            doomed = np.unique(info.key[values != 0])
            client.mutate_priorities("t", deletes=doomed.tolist())
        assert size(client) == 1
        values, info = sample(client, 16)
        assert values.tolist() == [0] * 16
        assert (info.priority == 1e-15).all()
        np.testing.assert_allclose(info.probability, 1.0, rtol=1e-6)


def test_prioritized_large_priority_spread():
    with serve(make_table(selectors.Prioritized(1.0))) as client:
        priorities = {0: 1e-6, 1: 1.0, 2: 1e6}
        for v, p in priorities.items():
            insert(client, v, p)
        values, info = sample(client, 500)
        assert set(values.tolist()) <= {1, 2}
        for v, prob in zip(values.tolist(), info.probability.tolist()):
            assert prob == pytest.approx(priorities[v] / sum(priorities.values()), rel=1e-9)


# --------------------------------------------------------------------------------------
# Uniform
# --------------------------------------------------------------------------------------

def test_uniform_probability_is_exactly_one_over_n():
    with serve(make_table(selectors.Uniform())) as client:
        for v in range(7):
            insert(client, v, priority=float(v))           # priorities are ignored
        values, info = sample(client, 10_000)
        assert (info.probability == 1.0 / 7).all()
        freq = np.bincount(values, minlength=7) / len(values)
        np.testing.assert_allclose(freq, 1.0 / 7, atol=0.05)
        keys = dict(zip(values.tolist(), info.key.tolist()))
        client.mutate_priorities("t", deletes=[keys[3]])
        values, info = sample(client, 3000)
        assert (info.probability == 1.0 / 6).all()
        assert set(values.tolist()) == {0, 1, 2, 4, 5, 6}


# --------------------------------------------------------------------------------------
# Removers that may evict the item just inserted
# --------------------------------------------------------------------------------------

def test_lifo_remover_evicts_the_item_just_inserted():
    with serve(make_table(selectors.Uniform(), remover=selectors.Lifo(), max_size=3)) as client:
        for v in range(4):
            insert(client, v)
        info = client.server_info()["t"]
        assert info.current_size == 3
        assert info.num_deleted == 1
        assert current_values(client) == {0, 1, 2}


def test_min_heap_remover_may_evict_the_item_just_inserted():
    with serve(make_table(selectors.Uniform(), remover=selectors.MinHeap(), max_size=3)) as client:
        for v, p in [(0, 5.0), (1, 6.0), (2, 7.0)]:
            insert(client, v, p)
        insert(client, 3, 1.0)                  # the lowest priority: evicted at once
        assert current_values(client) == {0, 1, 2}
        insert(client, 4, 10.0)                 # evicts 0 (priority 5)
        assert current_values(client) == {1, 2, 4}
        assert client.server_info()["t"].num_deleted == 2


def test_max_heap_remover_evicts_the_highest_priority():
    with serve(make_table(selectors.Uniform(), remover=selectors.MaxHeap(), max_size=3)) as client:
        for v, p in [(0, 5.0), (1, 6.0), (2, 7.0)]:
            insert(client, v, p)
        insert(client, 3, 100.0)                # the highest: evicted at once
        assert current_values(client) == {0, 1, 2}
        insert(client, 4, 1.0)                  # evicts 2 (priority 7)
        assert current_values(client) == {0, 1, 4}


# --------------------------------------------------------------------------------------
# Updates: duplicates, exponent; random operation sequences against a plain model
# --------------------------------------------------------------------------------------

def test_update_priorities_with_duplicate_keys_last_one_wins():
    with serve(make_table(selectors.Prioritized(1.0))) as client:
        keys = [client.insert(np.int64(v), priorities={"t": 1.0}, timeout=1)["t"]
                for v in range(4)]
        client.update_priorities("t", keys=np.array([keys[0], keys[0], keys[1], keys[0]],
                                                    np.uint64),
                                 priorities=np.array([5.0, 9.0, 2.0, 4.0]))
        check_probabilities(client, {0: 4.0, 1: 2.0, 2: 1.0, 3: 1.0}, n_batches=2)


@pytest.mark.parametrize("remover", [selectors.Fifo(), selectors.Prioritized(0.3)],
                         ids=["fifo-remover", "prioritized-remover"])
def test_large_updates_with_duplicates_and_stale_keys(remover):
    # From 32 keys on, update_priorities computes the sampler's weights before it takes
    # the lock; duplicates (the last wins) and stale keys must come out as for small ones.
    with serve(make_table(selectors.Prioritized(0.7), remover=remover)) as client:
        insert_many(client, range(40), np.ones(40))
        keys = keys_by_value(client, range(40))
        client.mutate_priorities("t", deletes=[keys[v] for v in (3, 7)])
        rng = np.random.default_rng(5)
        values = rng.integers(0, 40, 96)
        prios = rng.uniform(0.1, 9.0, 96)
        prios[::11] = 0.0
        expected = {v: 1.0 for v in range(40) if v not in (3, 7)}
        for value, priority in zip(values.tolist(), prios.tolist()):
            if value in expected:
                expected[value] = priority  # the last of duplicates wins; 3 and 7 are gone
        strided = np.repeat(prios, 2)[::2]  # a view that is not contiguous, as users pass
        updated = client.update_priorities(
            "t", keys=np.array([keys[v] for v in values], np.uint64), priorities=strided)
        assert updated == sum(1 for v in values.tolist() if v not in (3, 7))
        assert client.verify("t") == []
        check_probabilities(client, expected, exponent=0.7, n_batches=2)


def test_large_updates_keep_a_prioritized_remover_tree_sound():
    # A Uniform sampler keeps no tree: the weights are then computed under the lock,
    # for the remover's tree only.
    with serve(make_table(selectors.Uniform(), remover=selectors.Prioritized(0.5))) as client:
        insert_many(client, range(40), np.ones(40))
        keys = keys_by_value(client, range(40))
        rng = np.random.default_rng(6)
        values = rng.integers(0, 40, 64)
        updated = client.update_priorities(
            "t", keys=np.array([keys[v] for v in values], np.uint64),
            priorities=rng.uniform(0.1, 5.0, 64))
        assert updated == 64
        assert client.verify("t") == []


def test_priority_exponent_applies_to_updates():
    with serve(make_table(selectors.Prioritized(2.0))) as client:
        keys = [client.insert(np.int64(v), priorities={"t": 1.0}, timeout=1)["t"]
                for v in range(3)]
        client.mutate_priorities("t", updates={keys[1]: 2.0})
        client.update_priorities("t", keys=np.array([keys[2]], np.uint64),
                                 priorities=np.array([3.0]))
        check_probabilities(client, {0: 1.0, 1: 2.0, 2: 3.0}, exponent=2.0, n_batches=2)


class DeterministicModel:
    """A plain-Python Fifo/Lifo/MinHeap/MaxHeap over live items."""

    def __init__(self):
        self.items = {}      # key -> [value, priority, insert_seq, touch_seq]
        self.seq = 0

    def insert(self, key, value, priority):
        self.seq += 1
        self.items[key] = [value, priority, self.seq, self.seq]

    def update(self, key, priority):
        if key in self.items:
            self.seq += 1
            self.items[key][1] = priority
            self.items[key][3] = self.seq

    def pick(self, kind):
        entries = self.items.items()
        if kind == "Fifo":
            return min(entries, key=lambda e: e[1][2])[0]
        if kind == "Lifo":
            return max(entries, key=lambda e: e[1][2])[0]
        if kind == "MinHeap":
            return min(entries, key=lambda e: (e[1][1], e[1][3]))[0]
        return min(entries, key=lambda e: (-e[1][1], e[1][3]))[0]          # MaxHeap


@pytest.mark.parametrize("sampler, remover", [
    ("Fifo", "Fifo"), ("Lifo", "Lifo"), ("MinHeap", "MinHeap"), ("MaxHeap", "MaxHeap"),
    ("MinHeap", "Fifo"), ("Fifo", "MaxHeap"), ("MaxHeap", "Lifo"), ("Lifo", "MinHeap")])
def test_deterministic_selectors_follow_the_model(sampler, remover):
    rng = np.random.default_rng(sum(map(ord, sampler + remover)))
    table = make_table(getattr(selectors, sampler)(), remover=getattr(selectors, remover)(),
                       max_size=8)
    model = DeterministicModel()
    with serve(table) as client:
        for step in range(400):
            op = rng.choice(["insert", "insert", "update", "delete", "sample"])
            if op == "insert" or not model.items:
                priority = float(rng.integers(0, 4))
                key = client.insert(np.int64(step), priorities={"t": priority}, timeout=1)["t"]
                model.insert(key, step, priority)
                if len(model.items) > 8:
                    del model.items[model.pick(remover)]
            elif op == "update":
                key = int(rng.choice(list(model.items)))
                priority = float(rng.integers(0, 4))
                if rng.random() < 0.5:
                    client.mutate_priorities("t", updates={key: priority})
                else:
                    client.update_priorities("t", keys=np.array([key], np.uint64),
                                             priorities=np.array([priority]))
                model.update(key, priority)
            elif op == "delete":
                key = int(rng.choice(list(model.items)))
                client.mutate_priorities("t", deletes=[key])
                del model.items[key]
            else:
                value, key, prob, _ = pop(client)
                expected = model.pick(sampler)
                assert (value, key) == (model.items[expected][0], expected), step
                assert prob == 1.0
            assert size(client) == len(model.items), step


def test_prioritized_follows_the_model():
    rng = np.random.default_rng(7)
    exponent = 0.6
    table = make_table(selectors.Prioritized(exponent), max_size=16)
    live = {}                         # key -> (value, priority), insertion ordered (Fifo)
    with serve(table) as client:
        for step in range(400):
            op = rng.choice(["insert", "insert", "update", "delete"])
            priority = float(rng.choice([0.0, 0.0, rng.random(), rng.random() * 1e3, 1e-9]))
            if op == "insert" or not live:
                key = client.insert(np.int64(step), priorities={"t": priority}, timeout=1)["t"]
                live[key] = (step, priority)
                if len(live) > 16:
                    del live[next(iter(live))]
            elif op == "update":
                key = int(rng.choice(list(live)))
                client.update_priorities("t", keys=np.array([key], np.uint64),
                                         priorities=np.array([priority]))
                live[key] = (live[key][0], priority)
            else:
                key = int(rng.choice(list(live)))
                client.mutate_priorities("t", deletes=[key])
                del live[key]
            if not live:
                continue
            weights = {k: (p ** exponent if p > 0 else 0.0) for k, (_, p) in live.items()}
            total = sum(weights.values())
            s = client.sample_batch("t", batch_size=8, timeout=1)
            for key, value, prob, prio in zip(s.info.key.tolist(), np.asarray(s.data).tolist(),
                                              s.info.probability.tolist(),
                                              s.info.priority.tolist()):
                assert live[key] == (value, prio), step
                if total > 0:
                    assert weights[key] > 0, step
                    assert prob == pytest.approx(weights[key] / total, rel=1e-9), step
                else:
                    assert prob == 1.0 / len(live), step


# --------------------------------------------------------------------------------------
# Every row of a batch is its own draw (Reverb samples a flexible batch by calling the
# sampler once per item, so each row is distributed as its reported probability says)
# --------------------------------------------------------------------------------------

def test_prioritized_batch_rows_are_identically_distributed():
    # Four equal priorities: each row of a batch of 4 must be each item with p = 1/4,
    # whatever its position in the batch (users split batches across devices or
    # minibatches, and info.probability[j] describes row j).
    with serve(make_table(selectors.Prioritized(1.0))) as client:
        insert_many(client, range(4), np.ones(4))
        first_rows = []
        for _ in range(1000):
            values, info = sample(client, 4)
            first_rows.append(int(values[0]))
            assert (info.probability == 0.25).all()
        freq = np.bincount(first_rows, minlength=4) / len(first_rows)
        np.testing.assert_allclose(freq, 0.25, atol=0.1)


def test_prioritized_batch_rows_are_independent():
    # Two equal priorities, batches of 2: with independent draws (Reverb) both rows are
    # the same item half of the time.
    with serve(make_table(selectors.Prioritized(1.0))) as client:
        insert_many(client, range(2), np.ones(2))
        same = 0
        for _ in range(1000):
            values, _ = sample(client, 2)
            same += int(values[0] == values[1])
        assert same / 1000 == pytest.approx(0.5, abs=0.1)


def test_uniform_batch_rows_are_identically_distributed_and_independent():
    with serve(make_table(selectors.Uniform())) as client:
        insert_many(client, range(2), np.ones(2))
        first_rows, same = [], 0
        for _ in range(1000):
            values, _ = sample(client, 2)
            first_rows.append(int(values[0]))
            same += int(values[0] == values[1])
        assert np.mean(first_rows) == pytest.approx(0.5, abs=0.1)
        assert same / 1000 == pytest.approx(0.5, abs=0.1)

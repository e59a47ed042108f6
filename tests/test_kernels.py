"""The numba kernels on plain numpy arrays, against pure-Python references.

Equivalence tests in the flashbax manner: every property is checked over awkward
capacities (1, 2, 7, 50, 100, 1000: not only powers of two, so the padding leaves of the
sum-tree and the ragged last level of the heaps are exercised) as well as powers of two.

* ``sumtree``: structure (every internal node is exactly the sum of its children),
  equivalence of incremental ``set_leaf`` with a fresh ``rebuild`` (no drift, however
  often one slot is rewritten), batched ``set_leaves`` == a loop of ``set_leaf``
  (duplicates included), ``find`` against ``np.searchsorted`` on the cumulative
  sums (boundaries included), and ``draw_one`` / ``draw_batch``: never a zero-weight
  leaf, even with 1e-300 beside 1e300 or subnormal totals, and frequencies that match
  ``weight / total`` (chi-square, seeded through ``shmreplay._shm.kernels.table.seed``).
* ``heap``: ``push`` / ``remove`` / ``fix`` against a sorted-list model, min and max,
  ties broken by the ``M_UPDATE`` field (``meta[slot, M_*]``, the layout of ``_layout``).
* ``items`` / ``verify``: incremental bookkeeping keeps ``verify.check`` clean and equals
  what ``items.rebuild`` recomputes from the slot states (free list included).
* ``table.mutate``: one call updating several keys == one call per key (heaps and
  sum-trees). Tables for these live in a private ``bytearray`` laid out by
  ``_layout.plan_table`` and initialized by ``TableEngine.initialize``: no shared memory.
"""

import math
import os

import numpy as np
import pytest
from scipy import stats

import shmreplay
from shmreplay._shm import layout as L
from shmreplay import rate_limiters, selectors
from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes, heap, items, sumtree, verify
from shmreplay._shm.kernels import table as table_kernels
from shmreplay._engine.table_engine import TableEngine

AWKWARD = [1, 2, 3, 7, 50, 100, 1000]
POWERS_OF_TWO = [4, 8, 64, 128, 1024]
CAPACITIES = AWKWARD + POWERS_OF_TWO
EPS = np.finfo(np.float64).eps
TINY = 1e-300
HUGE = 1e300
SUBNORMAL = 5e-324  # the smallest positive float64


def seed(value):
    """Seeds numba's RNG (the one the kernels draw from), not numpy's."""
    table_kernels.seed(value)


def col(meta, field):
    """Column ``field`` of a ``meta`` array: one value per slot (or per position for
    ``M_LIVE`` / ``M_HEAP*``). The only place these tests know meta's orientation."""
    return meta[:, field]


def new_meta(capacity):
    return np.zeros((capacity, L.META_FIELDS), np.int64)


def make_tree(capacity):
    leaves = L.tree_leaves(capacity)
    return np.zeros(2 * leaves, np.float64), leaves


def tree_from(weights):
    """A tree built by ``set_leaf`` of every slot, in order."""
    weights = np.asarray(weights, np.float64)
    tree, leaves = make_tree(len(weights))
    for slot, value in enumerate(weights):
        sumtree.set_leaf(tree, leaves, slot, value)
    return tree, leaves


def reference_nodes(leaf_values, leaves):
    """Pure-Python tree: each node is the recursive sum of the leaves below it."""
    values = list(leaf_values) + [0.0] * (leaves - len(leaf_values))
    nodes = [0.0] * (2 * leaves)

    def total(node):
        if node >= leaves:
            nodes[node] = values[node - leaves]
        else:
            nodes[node] = total(2 * node) + total(2 * node + 1)
        return nodes[node]

    total(1)
    return nodes


def assert_tree_sound(tree, leaves, weights):
    """Structure and totals of a tree whose first ``len(weights)`` leaves are ``weights``."""
    capacity = len(weights)
    assert np.array_equal(tree[leaves:leaves + capacity], np.asarray(weights, np.float64))
    assert not tree[leaves + capacity:].any(), "padding leaves must stay zero"
    for node in range(1, leaves):
        assert tree[node] == tree[2 * node] + tree[2 * node + 1], (
            f"node {node}: {tree[node]!r} != {tree[2 * node]!r} + {tree[2 * node + 1]!r}")
    exact = math.fsum(weights)
    # Pairwise summation of non-negative terms: relative error <= depth * eps.
    depth = max(1, int(leaves).bit_length())
    assert abs(tree[1] - exact) <= depth * EPS * exact, (tree[1], exact)


def mixed_weights(rng, capacity):
    """Weights spanning the float64 range, with zeros, tiny, huge and ordinary values."""
    kinds = rng.integers(0, 5, capacity)
    ordinary = rng.random(capacity) * 10.0 ** rng.integers(-5, 6, capacity)
    return np.select([kinds == 0, kinds == 1, kinds == 2], [0.0, TINY, HUGE], ordinary)


# --------------------------------------------------------------------------------------
# sumtree: structure, rebuild, drift
# --------------------------------------------------------------------------------------

def test_tree_leaves_is_the_next_power_of_two():
    for capacity in CAPACITIES + [2**16 + 1]:
        leaves = L.tree_leaves(capacity)
        assert leaves >= capacity and leaves & (leaves - 1) == 0
        assert leaves == 1 or leaves // 2 < capacity


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_rebuild_matches_python_reference(capacity):
    rng = np.random.default_rng(capacity)
    weights = mixed_weights(rng, capacity)
    tree, leaves = make_tree(capacity)
    tree[leaves:leaves + capacity] = weights
    tree[1:leaves] = np.nan  # rebuild must overwrite every internal node
    sumtree.rebuild(tree, leaves)
    reference = reference_nodes(weights, leaves)
    assert tree[1:].tolist() == reference[1:]
    assert_tree_sound(tree, leaves, weights)


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_set_leaf_equals_rebuild_after_every_update(capacity):
    rng = np.random.default_rng(1000 + capacity)
    tree, leaves = make_tree(capacity)
    weights = np.zeros(capacity)
    fresh = np.empty_like(tree)
    # Hot slots are rewritten many times, the rest occasionally.
    hot = rng.integers(0, capacity, 3)
    steps = 400 if capacity <= 128 else 2000
    for step in range(steps):
        slot = int(hot[step % 3]) if step % 2 else int(rng.integers(capacity))
        value = float(mixed_weights(rng, 1)[0])
        sumtree.set_leaf(tree, leaves, slot, value)
        weights[slot] = value
        if capacity <= 128 or step % 97 == 0:
            fresh[:] = 0.0
            fresh[leaves:leaves + capacity] = weights
            sumtree.rebuild(fresh, leaves)
            assert np.array_equal(tree[1:], fresh[1:]), f"step {step}: set_leaf != rebuild"
    assert_tree_sound(tree, leaves, weights)


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_rewriting_one_slot_leaves_no_drift(capacity):
    """1e300 -> 1.0 -> ... : a delta-updating tree would keep garbage; this one may not."""
    rng = np.random.default_rng(7 * capacity)
    weights = rng.random(capacity)
    tree, leaves = tree_from(weights)
    slot = capacity // 2
    values = [HUGE, 1.0, TINY, 0.1, 0.0, 3.0, HUGE, SUBNORMAL, 0.3, 1e-17, 1e17]
    for _ in range(500):
        for value in values:
            sumtree.set_leaf(tree, leaves, slot, value)
    weights[slot] = values[-1]
    fresh, _ = make_tree(capacity)
    fresh[leaves:leaves + capacity] = weights
    sumtree.rebuild(fresh, leaves)
    assert np.array_equal(tree, fresh)
    assert_tree_sound(tree, leaves, weights)
    # Back to zero everywhere: the total is exactly zero again, not a rounding residue.
    for slot in rng.permutation(capacity):
        sumtree.set_leaf(tree, leaves, int(slot), 0.0)
    assert not tree.any()


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("exponent", [0.0, 0.6, 1.0, 1.7])
def test_set_leaves_equals_loop_of_set_leaf(capacity, exponent):
    """flashbax's batched-update equivalence: ``set_leaves`` == a loop of ``set_leaf``,
    for random slots with duplicates, ascending and descending runs, sorted repeats.
    Slots that are not READY get a zero leaf. ``set_leaves_to`` with the same weights,
    given in another order through ``positions``, makes the same tree."""
    rng = np.random.default_rng(capacity + int(exponent * 10))
    priorities = mixed_weights(rng, capacity)
    priorities[priorities == HUGE] = 1e100  # 1e300 ** 1.7 would overflow
    states = np.full(capacity, codes.READY, np.int64)
    batched, leaves = make_tree(capacity)
    looped = batched.copy()
    given = batched.copy()
    expected = np.zeros(capacity)
    for round_ in range(24):
        count = int(rng.integers(1, 2 * capacity + 2))
        start = int(rng.integers(capacity))
        pattern = round_ % 4
        if pattern == 0:
            slots = rng.integers(0, capacity, count)  # duplicates when count > 1
        elif pattern == 1:
            slots = (start + np.arange(count)) % capacity  # a run, wrapping around
        elif pattern == 2:
            slots = ((start - np.arange(count)) % capacity)  # a descending run
        else:
            slots = np.sort(rng.integers(0, capacity, count))  # sorted, repeated
        slots = slots.astype(np.int64)
        priorities[slots] = np.where(rng.random(count) < 0.2, 0.0,
                                     priorities[slots] * rng.random(count) * 4)
        states[slots] = np.where(rng.random(count) < 0.15, codes.FREE, codes.READY)
        nodes = np.full(count, -1, np.int64)
        sumtree.set_leaves(batched, leaves, slots, count, priorities, exponent, states, nodes)
        values = np.empty(count)
        for b, slot in enumerate(slots):
            value = items.weight(priorities[slot], exponent) if states[slot] == codes.READY else 0.0
            sumtree.set_leaf(looped, leaves, int(slot), value)
            expected[slot] = value
            values[b] = value
        assert np.array_equal(batched, looped), f"round {round_}: set_leaves != loop of set_leaf"
        # set_leaves_to (weights given, read through positions that double as scratch)
        # builds the same tree from the same leaves, the last of repeated slots winning.
        order = rng.permutation(count).astype(np.int64)
        shuffled = np.empty(count)
        shuffled[order] = values
        sumtree.set_leaves_to(given, leaves, slots, count, shuffled, order, order)
        assert np.array_equal(given, looped), f"round {round_}: set_leaves_to != set_leaves"
    assert_tree_sound(batched, leaves, expected)


# --------------------------------------------------------------------------------------
# sumtree.find
# --------------------------------------------------------------------------------------

def expected_slot(weights, mass):
    """The slot whose cumulative range [cumsum[s-1], cumsum[s]) holds ``mass``."""
    return int(np.searchsorted(np.cumsum(weights), mass, side="right"))


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_find_matches_searchsorted_exactly_on_integer_weights(capacity):
    """Integer weights make every partial sum exact, so boundaries are checked exactly."""
    rng = np.random.default_rng(capacity + 17)
    weights = rng.integers(1, 1000, capacity).astype(np.float64)
    weights[rng.random(capacity) < 0.3] = 0.0  # zero leaves, including runs of them
    if capacity > 3:
        weights[:2] = 0.0  # a leading run of zeros
        weights[-2:] = 0.0  # a trailing run before the padding
    if not weights.any():
        weights[capacity // 2] = 5.0
    tree, leaves = tree_from(weights)
    total = tree[1]
    cumsum = np.cumsum(weights)
    assert total == cumsum[-1]
    masses = [0.0, total - 0.5, float(np.nextafter(total, 0.0))]
    for boundary in np.unique(cumsum[cumsum < total]):
        masses += [boundary, boundary - 0.5, float(np.nextafter(boundary, 0.0)),
                   float(np.nextafter(boundary, np.inf))]
    masses += list(rng.random(200) * total)
    for mass in masses:
        if not 0.0 <= mass < total:
            continue
        slot = sumtree.find(tree, leaves, mass)
        assert slot == expected_slot(weights, mass), (mass, slot)
        assert weights[slot] > 0.0, f"find landed on a zero leaf at mass {mass!r}"


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_find_matches_searchsorted_on_float_weights(capacity):
    """With rounding, a result may differ from searchsorted only next to a boundary."""
    rng = np.random.default_rng(capacity + 23)
    weights = rng.random(capacity) * 10.0 ** rng.integers(-3, 4, capacity)
    weights[rng.random(capacity) < 0.2] = 0.0
    if not weights.any():
        weights[0] = 1.0
    tree, leaves = tree_from(weights)
    total = tree[1]
    cumsum = np.cumsum(weights)
    masses = np.concatenate([rng.random(2000) * total, cumsum[cumsum < total]])
    for mass in masses:
        slot = sumtree.find(tree, leaves, float(mass))
        assert 0 <= slot < leaves
        expected = expected_slot(weights, mass)
        if slot != expected:
            lo, hi = min(slot, expected), max(slot, expected)
            gaps = np.abs(cumsum[lo:min(hi, capacity)] - mass)
            assert gaps.size and gaps.max() <= 64 * EPS * total, (
                f"mass {mass!r}: find -> {slot}, searchsorted -> {expected}, far from a boundary")


def test_find_single_leaf_tree():
    tree, leaves = tree_from([2.5])
    assert leaves == 1 and tree[1] == 2.5
    for mass in (0.0, 1.0, 2.4999):
        assert sumtree.find(tree, leaves, mass) == 0


# --------------------------------------------------------------------------------------
# sumtree.draw_one / draw_batch
# --------------------------------------------------------------------------------------

def adversarial_weight_sets(capacity):
    """Trees where rounding pushes masses onto zero leaves, or tiny leaves hide by huge ones."""
    rng = np.random.default_rng(capacity + 99)
    sets = {}
    w = np.zeros(capacity)
    w[0::3] = TINY
    w[1::3] = HUGE
    sets["tiny-huge-zero"] = w
    w = np.zeros(capacity)
    w[0] = HUGE
    w[-1] = TINY
    sets["huge-first-tiny-last"] = w
    w = np.zeros(capacity)
    w[-1] = 1.0
    sets["only-last"] = w
    w = np.zeros(capacity)
    w[0] = 1.0
    sets["only-first"] = w
    # Subnormal totals: r * total often rounds up to total itself, so the descent runs
    # past the last non-empty leaf into the zero padding and must be redrawn.
    w = np.zeros(capacity)
    w[rng.choice(capacity, max(1, capacity // 10), replace=False)] = SUBNORMAL
    sets["subnormal"] = w
    w = np.zeros(capacity)
    w[-1] = 2 * SUBNORMAL
    w[0] = SUBNORMAL
    sets["subnormal-ends"] = w
    # 1 + x rounds up when x is just over half an ulp of 1: the total exceeds the exact sum.
    w = np.zeros(capacity)
    w[0] = 1.0
    w[-1] = 0.75 * EPS
    sets["round-up-total"] = w
    w = mixed_weights(rng, capacity)
    if not w.any():
        w[0] = 1.0
    sets["mixed"] = w
    return sets


def draw_batch(tree, leaves, count):
    out = np.full(count, -7, np.int64)
    scratch = np.empty(count, np.float64)
    sumtree.draw_batch(tree, leaves, count, out, scratch)
    return out


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_draws_never_return_a_zero_weight_leaf(capacity):
    seed(capacity)
    for name, weights in adversarial_weight_sets(capacity).items():
        tree, leaves = tree_from(weights)
        assert tree[1] > 0.0, name
        slots = draw_batch(tree, leaves, 20000)
        assert slots.min() >= 0 and slots.max() < capacity, name
        drawn = weights[slots]
        assert (drawn > 0.0).all(), (
            f"{name}: draw_batch returned zero-weight slots {np.unique(slots[drawn == 0.0])}")
        singles = np.array([sumtree.draw_one(tree, leaves) for _ in range(1000)])
        assert singles.min() >= 0 and singles.max() < capacity, name
        zero = weights[singles] == 0.0
        assert not zero.any(), f"{name}: draw_one drew zero-weight slots {np.unique(singles[zero])}"
        if (weights == HUGE).any():
            # A 1e-300 leaf next to 1e300 ones has probability ~1e-600 / capacity.
            assert (drawn >= 1.0).all() and (weights[singles] >= 1.0).all(), name


def chi_square_pvalue(counts, probabilities):
    """p-value of observed ``counts`` against ``probabilities``; rare bins are pooled."""
    total = counts.sum()
    expected = probabilities * total
    common = expected >= 5.0
    obs = list(counts[common])
    exp = list(expected[common])
    rare = (~common) & (expected > 0.0)  # zero-probability bins are checked separately
    if rare.any() and expected[rare].sum() > 0.0:
        obs.append(counts[rare].sum())
        exp.append(expected[rare].sum())
    obs, exp = np.array(obs, float), np.array(exp, float)
    exp *= obs.sum() / exp.sum()
    if len(obs) < 2:
        return 1.0
    return stats.chisquare(obs, exp).pvalue


def frequency_weight_sets(capacity):
    rng = np.random.default_rng(capacity + 5)
    sets = {"uniform": np.ones(capacity)}
    w = rng.random(capacity) ** 3 * 100.0
    w[rng.random(capacity) < 0.25] = 0.0
    if not w.any():
        w[0] = 1.0
    sets["random-with-zeros"] = w
    w = rng.random(capacity) * 10.0 ** rng.integers(-2, 3, capacity)
    w[::4] = TINY
    w[1::4] = HUGE * rng.random(len(w[1::4]))
    sets["huge-and-tiny"] = w
    return sets


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_draw_frequencies_match_weights(capacity):
    seed(10_000 + capacity)
    draws = 200_000
    for name, weights in frequency_weight_sets(capacity).items():
        tree, leaves = tree_from(weights)
        probabilities = weights / weights.sum()
        counts = np.bincount(draw_batch(tree, leaves, draws), minlength=capacity)
        assert counts.size == capacity, name
        assert counts[weights == 0.0].sum() == 0, name
        # Slots whose expected count is far below one are never drawn.
        assert counts[probabilities * draws < 1e-9].sum() == 0, name
        pvalue = chi_square_pvalue(counts, probabilities)
        assert pvalue > 1e-6, f"{name}: draw_batch frequencies off (p={pvalue:.2e})"
        singles = np.array([sumtree.draw_one(tree, leaves) for _ in range(20_000)])
        counts = np.bincount(singles, minlength=capacity)
        pvalue = chi_square_pvalue(counts, probabilities)
        assert pvalue > 1e-6, f"{name}: draw_one frequencies off (p={pvalue:.2e})"


def test_draw_frequencies_with_a_rounding_total():
    """Total 1 + eps (from 1 + 0.75 eps): the tiny leaf must still be (almost) never drawn."""
    seed(3)
    weights = np.array([1.0, 0.0, 0.75 * EPS, 0.0, 0.0])
    tree, leaves = tree_from(weights)
    slots = draw_batch(tree, leaves, 100_000)
    assert set(np.unique(slots)) <= {0, 2}
    assert (slots == 2).sum() <= 1


def test_seed_makes_draws_reproducible():
    weights = np.arange(1.0, 51.0)
    tree, leaves = tree_from(weights)
    seed(42)
    first = draw_batch(tree, leaves, 1000)
    ones = [sumtree.draw_one(tree, leaves) for _ in range(100)]
    seed(42)
    assert np.array_equal(first, draw_batch(tree, leaves, 1000))
    assert ones == [sumtree.draw_one(tree, leaves) for _ in range(100)]


def test_draw_batch_rows_are_independent():
    """Two equal leaves, batches of two: both orders and both repeats occur (~1/4 each)."""
    seed(11)
    tree, leaves = tree_from([1.0, 1.0])
    pairs = np.array([draw_batch(tree, leaves, 2) for _ in range(4000)])
    outcomes = pairs[:, 0] * 2 + pairs[:, 1]
    counts = np.bincount(outcomes, minlength=4)
    assert stats.chisquare(counts).pvalue > 1e-6, counts


# --------------------------------------------------------------------------------------
# heap: push / remove / fix against a sorted-list model
# --------------------------------------------------------------------------------------

class HeapModel:
    """Live slots with (priority, update number); the heap order as a sort key."""

    def __init__(self, is_min):
        self.is_min = is_min
        self.items = {}

    def key(self, slot):
        priority, update = self.items[slot]
        return (priority if self.is_min else -priority, update)

    def ordered(self):
        return sorted(self.items, key=self.key)


class HeapUnderTest:
    """One heap in a ``meta`` array of the table's layout, plus a float64 ``prio``."""

    HEAP = L.M_HEAP0
    POS = L.M_HEAP_POS0

    def __init__(self, capacity, is_min):
        self.meta = new_meta(capacity)
        col(self.meta, self.HEAP)[:] = -1
        self.prio = np.zeros(capacity, np.float64)
        self.n = 0
        self.is_min = is_min
        self.seq = 0

    def _stamp(self, slot, priority):
        self.prio[slot] = priority
        col(self.meta, L.M_UPDATE)[slot] = self.seq
        self.seq += 1

    def push(self, slot, priority):
        self._stamp(slot, priority)
        heap.push(self.meta, self.prio, self.HEAP, self.POS, self.n, slot, self.is_min)
        self.n += 1

    def remove(self, slot):
        heap.remove(self.meta, self.prio, self.HEAP, self.POS, self.n, slot, self.is_min)
        self.n -= 1

    def update(self, slot, priority):
        self._stamp(slot, priority)
        heap.fix(self.meta, self.prio, self.HEAP, self.POS, self.n, slot, self.is_min)

    def top(self):
        return int(col(self.meta, self.HEAP)[0])

    def check(self, model):
        heap_slots = col(self.meta, self.HEAP)[:self.n]
        positions = col(self.meta, self.POS)
        assert sorted(heap_slots.tolist()) == sorted(model.items)
        for pos, slot in enumerate(heap_slots):
            assert positions[slot] == pos, f"slot {slot}: stale position"
            if pos:
                parent = heap_slots[(pos - 1) // 2]
                assert model.key(parent) <= model.key(slot), f"heap order broken at {pos}"
                # The kernel's comparator agrees with the model's strict total order.
                assert heap.before(self.meta, self.prio, parent, slot, self.is_min)


PRIORITY_CHOICES = np.array([0.0, 0.5, 1.0, 1.0, 2.0, 1e-300, 1e300])


def random_priority(rng):
    if rng.random() < 0.7:  # ties are the interesting case
        return float(PRIORITY_CHOICES[rng.integers(len(PRIORITY_CHOICES))])
    return float(rng.random() * 10.0)


@pytest.mark.parametrize("is_min", [True, False], ids=["min", "max"])
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_heap_matches_sorted_list_model(capacity, is_min):
    rng = np.random.default_rng(capacity * 2 + is_min)
    under_test = HeapUnderTest(capacity, is_min)
    model = HeapModel(is_min)
    free = list(range(capacity))
    steps = 3 * capacity + 60 if capacity <= 100 else 1500
    for step in range(steps):
        op = rng.random()
        if model.items and (not free or op < 0.3):
            live = list(model.items)
            if rng.random() < 0.3:
                slot = model.ordered()[0]  # the remover's case: take the top
            else:
                slot = live[rng.integers(len(live))]
            under_test.remove(slot)
            del model.items[slot]
            free.append(slot)
        elif model.items and op < 0.55:
            live = list(model.items)
            slot = live[rng.integers(len(live))]
            # Same priority again still counts as the most recent update (tie order).
            priority = model.items[slot][0] if rng.random() < 0.3 else random_priority(rng)
            model.items[slot] = (priority, under_test.seq)
            under_test.update(slot, priority)
        elif free:
            slot = free.pop(rng.integers(len(free)))
            priority = random_priority(rng)
            model.items[slot] = (priority, under_test.seq)
            under_test.push(slot, priority)
        if model.items:
            assert under_test.top() == model.ordered()[0], f"step {step}: wrong top"
        if capacity <= 100 or step % 50 == 0:
            under_test.check(model)
    under_test.check(model)
    # Draining by the top gives exactly the model's order.
    expected = model.ordered()
    drained = []
    while under_test.n:
        slot = under_test.top()
        drained.append(slot)
        under_test.remove(slot)
    assert drained == expected


@pytest.mark.parametrize("is_min", [True, False], ids=["min", "max"])
def test_heap_ties_go_to_the_least_recently_updated(is_min):
    """Reverb's heap_test BreakTiesByUpdateOrder, on the kernels."""
    under_test = HeapUnderTest(8, is_min)
    for slot in range(6):
        under_test.push(slot, 1.0)
    assert under_test.top() == 0
    under_test.update(0, 1.0)  # same priority, newer update: slot 1 is now oldest
    assert under_test.top() == 1
    under_test.update(1, 1.0)
    under_test.update(2, 1.0)
    assert under_test.top() == 3
    order = []
    while under_test.n:
        order.append(under_test.top())
        under_test.remove(order[-1])
    assert order == [3, 4, 5, 0, 1, 2]


def test_heap_reverb_insertion_example():
    """heap_test.cc: (key, priority) (5,300),(0,1),(3,20),(1,1),(4,20),(2,1) pop keys 0..5."""
    under_test = HeapUnderTest(6, True)
    for slot, priority in [(5, 300.0), (0, 1.0), (3, 20.0), (1, 1.0), (4, 20.0), (2, 1.0)]:
        under_test.push(slot, priority)
    order = []
    while under_test.n:
        order.append(under_test.top())
        under_test.remove(order[-1])
    assert order == [0, 1, 2, 3, 4, 5]


# --------------------------------------------------------------------------------------
# items / verify: incremental bookkeeping == rebuild from slot states
# --------------------------------------------------------------------------------------

def test_weight_zero_to_the_zero_is_zero():
    assert items.weight(0.0, 0.0) == 0.0
    assert items.weight(0.0, 1.7) == 0.0
    assert items.weight(3.0, 0.0) == 1.0
    assert items.weight(2.0, 1.7) == 2.0 ** 1.7
    assert items.weight(1e-300, 1.7) == (1e-300) ** 1.7


class ItemArrays:
    """One table's arrays on private memory (a bytearray), laid out by
    ``_layout.plan_table`` / ``table_views`` and initialized by ``TableEngine``, driven
    through the locked entry points of ``shmreplay._shm.kernels.table``."""

    def __init__(self, max_size, sampler, remover, _buf=None):
        self.config = shmreplay.Table(name="k", sampler=sampler, remover=remover,
                                      max_size=max_size, rate_limiter=rate_limiters.MinSize(1))
        self.region = L.plan_table(0, self.config)
        self.capacity = self.region.capacity
        self.buf = bytearray(self.region.end) if _buf is None else _buf
        engine = TableEngine("kernel-test", 0, self.config, self.region, self.buf)
        if _buf is None:
            engine.initialize()
            # No data segment here, so no stores to grow: every slot may be handed out
            # (a table's own watermark is set when its stores are made).
            engine.ctrl[L.C_SLOT_LIMIT] = engine.ctrl[L.C_CAPACITY]
        else:
            _sync.init_robust_mutex(engine.ctrl)
        (self.ctrl, self.fctrl, self.meta, self.prio, self.trees, self.refs,
         self.rows) = engine.arrays

    @property
    def arrays(self):
        return self.ctrl, self.fctrl, self.meta, self.prio, self.trees, self.refs, self.rows

    def insert(self, priority):
        """reserve + commit of one item (evicts with the remover); returns its key."""
        slot = table_kernels.reserve_one(*self.arrays, os.getpid())
        assert slot >= 0, f"reserve_one -> {slot}"
        key = table_kernels.commit_one(*self.arrays, slot, float(priority), np.empty(2),
                                       os.getpid(), 0)
        assert key > 0, f"commit_one -> {key}"
        return int(key)

    def mutate(self, deletes=(), update_keys=(), priorities=()):
        """One ``table.mutate`` call; returns (deleted, updated)."""
        io = np.zeros(2, np.int64)
        scratch = np.zeros((2, len(update_keys)), np.int64)
        deleted = table_kernels.mutate(
            *self.arrays, np.asarray(deletes, np.int64).reshape(-1),
            np.asarray(update_keys, np.int64).reshape(-1),
            np.asarray(priorities, np.float64).reshape(-1), io, scratch)
        assert deleted >= 0, f"mutate -> {deleted}"
        return int(deleted), int(io[0])

    def check(self):
        return verify.check(*self.arrays)

    def live_keys_in_order(self):
        keys, slot = [], int(self.ctrl[L.C_HEAD])
        while slot >= 0 and len(keys) <= self.capacity:
            keys.append(int(col(self.meta, L.M_KEY)[slot]))
            slot = int(col(self.meta, L.M_NEXT)[slot])
        return keys

    def heap_top(self, role):
        return int(col(self.meta, L.M_HEAP0 + role)[0])

    def copy(self):
        return ItemArrays(self.config.max_size, self.config.sampler, self.config.remover,
                          _buf=bytearray(self.buf))


HEAPS = (codes.MIN_HEAP, codes.MAX_HEAP)
KIND_PAIRS = [
    (selectors.Prioritized(0.6), selectors.Fifo()),
    (selectors.Prioritized(0.6), selectors.MinHeap()),
    (selectors.MinHeap(), selectors.Prioritized(1.3)),
    (selectors.MaxHeap(), selectors.Lifo()),
    (selectors.Uniform(), selectors.MaxHeap()),
]


def kinds_id(pair):
    return "-".join(type(selector).__name__ for selector in pair)


def finite_weight_priority(rng):
    """A priority whose ``priority ** 1.3`` stays finite (1e300 ** 1.3 overflows)."""
    return min(random_priority(rng), 1e100)


def fill(t, rng, count):
    """Inserts ``count`` items; returns every key (live or evicted)."""
    return [t.insert(finite_weight_priority(rng)) for _ in range(count)]


@pytest.mark.parametrize("max_size", [1, 2, 7, 50, 100])
@pytest.mark.parametrize("kinds", KIND_PAIRS, ids=kinds_id)
def test_items_incremental_equals_rebuild(kinds, max_size):
    """Insert / evict / delete / single-key updates keep ``verify.check`` clean, and
    ``items.rebuild`` (the crash-recovery path) recomputes the same structures."""
    t = ItemArrays(max_size, *kinds)
    seed(max_size)  # after the engine: a process's first engine reseeds from the OS
    rng = np.random.default_rng([max_size, kinds[0].kind, kinds[1].kind])
    keys = []
    for step in range(6 * max_size + 40):
        live = [k for k in keys if items.lookup(t.ctrl, t.meta, k) >= 0]
        op = rng.random()
        if live and op < 0.2:
            key = live[rng.integers(len(live))]
            assert t.mutate(deletes=[key]) == (1, 0)
            assert items.lookup(t.ctrl, t.meta, key) == -1, "a deleted key still resolves"
        elif live and op < 0.45:
            key = live[rng.integers(len(live))]
            assert t.mutate(update_keys=[key], priorities=[finite_weight_priority(rng)]) == (0, 1)
        else:
            keys.append(t.insert(finite_weight_priority(rng)))
        assert t.check() == 0, f"step {step}: verify bits {t.check()}"
        assert t.ctrl[L.C_SIZE] == len(t.live_keys_in_order()) <= max_size
    copy = t.copy()
    # Scramble everything rebuild must recompute from the slot states.
    copy.trees[...] = 0.0
    for field in (L.M_LIVE, L.M_LIVE_POS, L.M_PREV, L.M_NEXT, L.M_HEAP0, L.M_HEAP1,
                  L.M_HEAP_POS0, L.M_HEAP_POS1):
        col(copy.meta, field)[:] = -1
    for word in (L.C_SIZE, L.C_FREE_TOP):
        copy.ctrl[word] = 0
    copy.ctrl[L.C_HEAD] = copy.ctrl[L.C_TAIL] = copy.ctrl[L.C_FREE_HEAD] = -1
    items.rebuild(*copy.arrays)
    assert copy.check() == 0
    assert copy.ctrl[L.C_SIZE] == t.ctrl[L.C_SIZE]
    assert items.free_count(copy.ctrl) == items.free_count(t.ctrl)
    assert copy.live_keys_in_order() == t.live_keys_in_order()
    assert np.array_equal(copy.trees, t.trees), "incremental sum-tree != rebuilt sum-tree"
    for role in range(2):
        if kinds[role].kind in HEAPS and t.ctrl[L.C_SIZE]:
            assert copy.heap_top(role) == t.heap_top(role)
    # The rebuilt free list hands out every free slot exactly once.
    before = set(copy.live_keys_in_order())
    new_keys = [copy.insert(1.0) for _ in range(max_size + 5)]
    assert copy.check() == 0
    assert len(set(new_keys)) == len(new_keys) and not before & set(new_keys)


@pytest.mark.parametrize("max_size", [2, 7, 50, 100])
@pytest.mark.parametrize("kinds", KIND_PAIRS, ids=kinds_id)
def test_mutate_batch_equals_one_call_per_key(kinds, max_size):
    """flashbax's equivalence on the locked entry point: ``mutate`` with B keys (some
    stale, some repeated) == B calls of one key. Same priorities, same update order, same
    sum-trees bit for bit, same heap tops, and a heap that still verifies."""
    batched = ItemArrays(max_size, *kinds)
    seed(max_size + 1)
    rng = np.random.default_rng([max_size, kinds[0].kind, kinds[1].kind, 1])
    keys = fill(batched, rng, max_size + 3)
    for round_ in range(8):
        looped = batched.copy()
        count = int(rng.integers(2, 2 * max_size + 2))
        chosen = [keys[i] for i in rng.integers(0, len(keys), count)]  # stale and repeated
        priorities = [finite_weight_priority(rng) for _ in chosen]
        _, updated = batched.mutate(update_keys=chosen, priorities=priorities)
        singles = sum(looped.mutate(update_keys=[k], priorities=[p])[1]
                      for k, p in zip(chosen, priorities))
        assert updated == singles
        assert np.array_equal(batched.prio, looped.prio)
        assert np.array_equal(col(batched.meta, L.M_UPDATE), col(looped.meta, L.M_UPDATE))
        assert np.array_equal(batched.trees, looped.trees), "batched sum-tree update differs"
        assert looped.check() == 0
        assert batched.check() == 0, (
            f"round {round_}: after one mutate of {count} keys verify reports bits "
            f"{batched.check()} (HEAP={verify.HEAP}, TREE={verify.TREE})")
        for role in range(2):
            if kinds[role].kind in HEAPS:
                assert batched.heap_top(role) == looped.heap_top(role), f"role {role} top"


def test_verify_check_flags_corruption():
    t = ItemArrays(10, selectors.Prioritized(1.0), selectors.MinHeap())
    for priority in [1.0, 2.0, 3.0, 0.5, 0.0]:
        t.insert(priority)
    assert t.check() == 0
    leaves = t.ctrl[L.C_TREE_LEAVES]
    t.trees[0, leaves // 2] += 1.0  # an internal node off by one
    assert t.check() & verify.TREE
    sumtree.rebuild(t.trees[0], leaves)
    assert t.check() == 0
    slot = 1
    t.trees[0, leaves + slot] = 7.0  # a leaf that is not priority ** exponent
    sumtree.rebuild(t.trees[0], leaves)
    assert t.check() & verify.TREE
    sumtree.set_leaf(t.trees[0], leaves, slot, items.weight(t.prio[slot], 1.0))
    assert t.check() == 0
    heap_column = col(t.meta, L.M_HEAP1)
    heap_column[0], heap_column[1] = heap_column[1], heap_column[0]
    assert t.check() & verify.HEAP


@pytest.mark.parametrize("error_buffer", [1e6, 1e19, 1e299])
def test_sample_credit_grants_the_whole_batch_under_huge_error_buffers(error_buffer):
    # A credit beyond int64 once overflowed to a negative count: the batch then went one
    # item per kernel call (correct, but 100x slower).
    t = ItemArrays(10, selectors.Uniform(), selectors.Fifo())
    limiter = rate_limiters.SampleToInsertRatio(1.0, 1, error_buffer)
    t.fctrl[L.F_SAMPLES_PER_INSERT] = limiter.samples_per_insert
    t.fctrl[L.F_MIN_DIFF] = limiter.min_diff
    t.ctrl[L.C_INSERTS] = 5
    assert items.sample_credit(t.ctrl, t.fctrl, 256) == 256
    t.fctrl[L.F_MIN_DIFF] = -2.5  # a small credit still limits: 5 - 0 + 2.5 -> 7
    assert items.sample_credit(t.ctrl, t.fctrl, 256) == 7

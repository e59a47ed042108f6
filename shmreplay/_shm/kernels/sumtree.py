"""A float64 sum-tree over slots, stored as a flat 1-indexed array.

``tree`` has ``2 * leaves`` entries (``leaves`` a power of two). Node ``i`` has children
``2i`` and ``2i + 1``; slot ``s`` is leaf ``leaves + s``; ``tree[1]`` is the total and
``tree[0]`` is unused. Updates recompute each ancestor from its two children instead of
adding a delta: no drift accumulates, and repeated updates of the same slot are safe.
float64 everywhere: float32 trees are known to draw zero-priority leaves.
"""

import numpy as np

from shmreplay._shm.kernels import kernel
from shmreplay._shm.kernels.codes import READY as _READY


@kernel
def weight(priority, exponent):
    """A leaf's value: ``priority ** exponent``, with ``0 ** a == 0`` even for ``a == 0``."""
    if priority == 0.0:
        return 0.0
    return priority ** exponent


@kernel
def set_leaves(tree, leaves, slots, count, priorities, exponent, live, nodes):
    """Sets the leaves of ``slots[:count]`` and recomputes their ancestors.

    A slot's leaf becomes ``weight(priorities[slot])`` if ``live[slot]`` is READY, else 0.
    ``nodes`` is int64 scratch of at least ``count`` (see ``_recompute_ancestors``).
    """
    for b in range(count):
        slot = slots[b]
        value = 0.0
        if live[slot] == _READY:
            value = weight(priorities[slot], exponent)
        tree[leaves + slot] = value
        nodes[b] = (leaves + slot) >> 1
    _recompute_ancestors(tree, nodes, count)


@kernel
def set_leaves_to(tree, leaves, slots, count, values, positions, nodes):
    """Sets leaf ``slots[b]`` to ``values[positions[b]]`` for ``b < count`` (weights
    computed by the caller, e.g. before taking a lock) and recomputes the ancestors.

    Entries are applied in order, so the last of a repeated slot wins. ``nodes`` is
    int64 scratch of at least ``count``; it may be ``positions`` itself (each position
    is read before its entry is overwritten).
    """
    for b in range(count):
        slot = slots[b]
        tree[leaves + slot] = values[positions[b]]
        nodes[b] = (leaves + slot) >> 1
    _recompute_ancestors(tree, nodes, count)


@kernel
def _recompute_ancestors(tree, nodes, count):
    """Recomputes the nodes ``nodes[:count]`` (parents of just-set leaves), then theirs,
    up to the root.

    One level at a time for all entries together (every leaf is at the same depth),
    which overlaps the cache misses of the paths on large trees, and a parent shared by
    neighbouring entries is recomputed once: a batch written to a run of slots touches
    a few hundred nodes instead of ``count * depth``.
    """
    active = _unique_neighbours(nodes, count)
    while active > 0 and nodes[0] >= 1:
        for b in range(active):
            i = nodes[b]
            tree[i] = tree[2 * i] + tree[2 * i + 1]
            nodes[b] = i >> 1
        active = _unique_neighbours(nodes, active)


@kernel
def _unique_neighbours(nodes, count):
    """Drops entries equal to their predecessor, in place; returns the new count."""
    kept = 0
    for b in range(count):
        if kept == 0 or nodes[b] != nodes[kept - 1]:
            nodes[kept] = nodes[b]
            kept += 1
    return kept


@kernel
def set_leaf(tree, leaves, slot, value):
    """Sets slot's leaf to ``value`` and recomputes its ancestors. O(log leaves)."""
    i = leaves + slot
    tree[i] = value
    i >>= 1
    while i >= 1:
        tree[i] = tree[2 * i] + tree[2 * i + 1]
        i >>= 1


@kernel
def rebuild(tree, leaves):
    """Recomputes every internal node from the leaves. O(leaves)."""
    for i in range(leaves - 1, 0, -1):
        tree[i] = tree[2 * i] + tree[2 * i + 1]


@kernel
def find(tree, leaves, mass):
    """The slot whose cumulative range holds ``mass`` (``0 <= mass < tree[1]``)."""
    i = 1
    while i < leaves:
        left = tree[2 * i]
        right = mass >= left
        i = 2 * i + right
        mass -= left * right
    return i - leaves


@kernel
def draw_one(tree, leaves):
    """Draws a slot with probability leaf / total. The total must be > 0 and finite."""
    total = tree[1]
    for _ in range(64):
        slot = find(tree, leaves, np.random.random() * total)
        # Rounding can push a mass past the last non-empty leaf: draw again.
        if tree[leaves + slot] > 0.0:
            return slot
    # Unreachable with finite weights (callers cap priorities so the total stays finite);
    # never spin while holding the table lock: take the last non-empty leaf.
    for slot in range(leaves - 1, -1, -1):
        if tree[leaves + slot] > 0.0:
            return slot
    return 0


@kernel
def draw_batch(tree, leaves, count, out_slots, scratch):
    """Draws ``count`` independent slots, each with probability leaf / total.

    All queries descend the tree together, level by level: on trees larger than the
    cache this overlaps the memory latency of the B descents (3-5x faster than one
    descent after another). The total must be > 0. ``scratch``: float64, length >= count.
    """
    total = tree[1]
    node = out_slots
    mass = scratch
    # Independent draws, as Reverb's sampler makes (stratified masses would correlate
    # the rows of a batch: with two equal items a batch of two would never repeat one).
    for b in range(count):
        node[b] = 1
        mass[b] = np.random.random() * total
    width = 1
    while width < leaves:
        for b in range(count):
            # Branch-free step: which child is random, so a branch would mispredict half
            # the time (this runs 3-4x faster than the if/else form).
            i = node[b]
            m = mass[b]
            left = tree[2 * i]
            right = m >= left
            node[b] = 2 * i + right
            mass[b] = m - left * right
        width *= 2
    for b in range(count):
        if tree[node[b]] <= 0.0:
            node[b] = leaves + draw_one(tree, leaves)
        out_slots[b] = node[b] - leaves

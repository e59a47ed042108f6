"""A float64 sum-tree over slots, stored as a flat 1-indexed array.

``tree`` has ``2 * leaves`` entries (``leaves`` a power of two). Node ``i`` has children
``2i`` and ``2i + 1``; slot ``s`` is leaf ``leaves + s``; ``tree[1]`` is the total and
``tree[0]`` is unused. Updates recompute each ancestor from its two children instead of
adding a delta: no drift accumulates, and repeated updates of the same slot are safe.
float64 everywhere: float32 trees are known to draw zero-priority leaves.
"""

import numpy as np

from shmreplay._kernels import kernel


@kernel
def weight(priority, exponent):
    """A leaf's value: ``priority ** exponent``, with ``0 ** a == 0`` even for ``a == 0``."""
    if priority == 0.0:
        return 0.0
    return priority ** exponent


@kernel
def set_leaves(tree, leaves, slots, count, priorities, exponent, nodes):
    """Sets the leaves of ``slots[:count]`` from ``priorities[slot]`` and fixes ancestors.

    Ancestors are recomputed one level at a time for all slots together (every leaf is
    at the same depth), which overlaps the cache misses of the B paths on large trees.
    A parent shared by several slots is recomputed more than once, harmlessly.
    """
    for b in range(count):
        slot = slots[b]
        tree[leaves + slot] = weight(priorities[slot], exponent)
        nodes[b] = (leaves + slot) >> 1
    level = leaves >> 1
    while level >= 1:
        for b in range(count):
            i = nodes[b]
            tree[i] = tree[2 * i] + tree[2 * i + 1]
            nodes[b] = i >> 1
        level >>= 1


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
        if mass < left:
            i = 2 * i
        else:
            mass -= left
            i = 2 * i + 1
    return i - leaves


@kernel
def draw_one(tree, leaves):
    """Draws a slot with probability leaf / total. The total must be > 0."""
    total = tree[1]
    while True:
        slot = find(tree, leaves, np.random.random() * total)
        # Rounding can push a mass past the last non-empty leaf: draw again.
        if tree[leaves + slot] > 0.0:
            return slot


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
            i = node[b]
            left = tree[2 * i]
            if mass[b] < left:
                node[b] = 2 * i
            else:
                mass[b] -= left
                node[b] = 2 * i + 1
        width *= 2
    for b in range(count):
        if tree[node[b]] <= 0.0:
            node[b] = leaves + draw_one(tree, leaves)
        out_slots[b] = node[b] - leaves

"""Changing priorities and deleting items (``mutate``, ``update_whole``).

Duplicate keys: the last one wins. Sum-trees are fixed once per batch, heaps after each
change. ``first_invalid_priority`` checks priorities before anything is locked.
"""

import numpy as np

from shmreplay._shm.kernels import codes, items, kernel, sumtree
from shmreplay._shm.kernels.locking import (
    BROKEN, _bump, _lock_open, _stop_point, _unlock, _unlock_and_wake)
from shmreplay._shm.kernels.views import (
    TABLE_LARGEST, TABLE_SCRATCH, TABLE_SCRATCH_KEYS, _table_arrays)
from shmreplay._shm.layout import (
    C_UPDATE_SEQ, C_SAMPLER_KIND, C_SPACE_SEQ, C_TREE_LEAVES, F_EXPONENT0, M_STATE, M_UPDATE)

@kernel
def _apply_updates(ctrl, fctrl, meta, prio, trees, slots, count, values, positions, weights0):
    # In call order, so the last of duplicate keys wins. A heap is repaired after each
    # change (its sift assumes every other entry is in order); sum-trees are fixed once
    # for the whole set at the end. ``weights0``: each value's sampler weight, computed
    # by the caller before locking, or empty.
    for j in range(count):
        slot = slots[j]
        prio[slot] = values[positions[j]]
        meta[slot, M_UPDATE] = ctrl[C_UPDATE_SEQ]
        ctrl[C_UPDATE_SEQ] += 1
        for role in range(2):
            kind = ctrl[C_SAMPLER_KIND + role]
            if kind == codes.MIN_HEAP or kind == codes.MAX_HEAP:
                items.fix_role(ctrl, fctrl, meta, prio, trees, role, slot)
    leaves = ctrl[C_TREE_LEAVES]
    for role in range(2):
        if ctrl[C_SAMPLER_KIND + role] != codes.PRIORITIZED:
            continue
        if role == 0 and weights0.shape[0] > 0:
            # (uses up ``positions``: the remover's tree below needs them only as scratch)
            sumtree.set_leaves_to(trees[0], leaves, slots, count, weights0, positions,
                                  positions)
        else:
            sumtree.set_leaves(trees[role], leaves, slots, count, prio,
                               fctrl[F_EXPONENT0 + role], meta[:, M_STATE], positions)


@kernel
def mutate(ctrl, fctrl, meta, prio, trees, refs, rows, delete_keys, update_keys, update_priorities, io,
           scratch):
    """Deletes, then updates, items by key; unknown or stale keys are ignored.

    Returns the number of deleted items; ``io[0]`` receives the number updated.
    ``scratch`` is int64 ``[2, len(update_keys)]``. When a key appears twice, the last
    priority wins.
    """
    status = _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    deleted = 0
    for i in range(delete_keys.shape[0]):
        slot = items.lookup(ctrl, meta, delete_keys[i])
        if slot >= 0:
            items.remove(ctrl, meta, prio, trees, refs, rows, slot, True)
            deleted += 1
    _stop_point(ctrl, codes.STOP_MUTATE_HALF)
    io[0] = _update_by_keys(ctrl, fctrl, meta, prio, trees, update_keys, update_priorities,
                            scratch, update_priorities[:0])
    if deleted:
        _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, False, deleted > 0)
    return deleted


@kernel
def update_whole(segment, table, keys, priorities):
    """Sets priorities by key in a whole-item table: the learner's update in one call.

    ``keys`` are uint64 (as sampled), ``priorities`` float64 of the same length,
    checked before the lock is taken: if one is not in ``[0, largest]`` (the table's,
    in ``table[TABLE_LARGEST]``), nothing changes and ``INVALID_PRIORITY`` is returned.
    Unknown or stale keys are ignored; the last of duplicate keys wins. The scratch is
    ``table``'s own (``TABLE_SCRATCH``: any number of keys, 64 at a time). Returns the
    number of keys updated, or a status. (Four arguments: each array passed costs
    about 100 ns.)
    """
    if (priorities.shape[0] != keys.shape[0]
            or table.shape[0] < TABLE_SCRATCH + 2 * TABLE_SCRATCH_KEYS):
        return BROKEN
    largest = table[TABLE_LARGEST:TABLE_LARGEST + 1].view(np.float64)[0]
    if first_invalid_priority(priorities, largest) >= 0:
        return codes.INVALID_PRIORITY
    scratch = table[TABLE_SCRATCH:TABLE_SCRATCH + 2 * TABLE_SCRATCH_KEYS].reshape(
        (2, TABLE_SCRATCH_KEYS))
    return _update_locked(segment, table, keys, priorities, scratch, priorities[:0])


@kernel
def update_whole_weighed(segment, table, keys, priorities, largest, scratch, work):
    """``update_whole`` for a Prioritized sampler, with the sum-tree weights
    (``priority ** exponent``, tens of ns each) computed before the lock is taken: that
    shortens the learner's hold of the lock that actors wait for.

    ``work`` is float64 ``[2 * len(keys)]``: the priorities are copied into its first
    half, checked there and weighed into its second half, so the priorities and the
    weights applied come from one read of ``priorities`` even if the caller changes it
    meanwhile.
    """
    n = keys.shape[0]
    if scratch.shape[1] < n or priorities.shape[0] != n or work.shape[0] != 2 * n:
        return BROKEN
    values = work[:n]
    weights = work[n:]
    for i in range(n):
        values[i] = priorities[i]
    if first_invalid_priority(values, largest) >= 0:
        return codes.INVALID_PRIORITY
    ctrl, fctrl, meta, prio, trees, refs, rows = _table_arrays(segment, table)
    if ctrl[C_SAMPLER_KIND] != codes.PRIORITIZED:  # (fixed when the table was made)
        return BROKEN
    exponent = fctrl[F_EXPONENT0]
    for i in range(n):
        weights[i] = sumtree.weight(values[i], exponent)
    return _update_locked(segment, table, keys, values, scratch, weights)


@kernel
def _update_locked(segment, table, keys, priorities, scratch, weights0):
    """The locked part of ``update_whole``: the table's arrays from ``segment``."""
    ctrl, fctrl, meta, prio, trees, refs, rows = _table_arrays(segment, table)
    status = _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    updated = _update_by_keys(ctrl, fctrl, meta, prio, trees, keys, priorities, scratch,
                              weights0)
    _unlock(ctrl)
    return updated


@kernel
def _update_by_keys(ctrl, fctrl, meta, prio, trees, keys, priorities, scratch, weights0):
    """Sets the priorities of the live items among ``keys`` (int64 or uint64), with the
    lock held; returns how many were live. ``scratch``: int64 ``[2, width]``: the keys
    go ``width`` at a time, in order (so the last of duplicate keys still wins);
    ``weights0``: as in ``_apply_updates`` (one per key, or empty)."""
    updated = 0
    slots = scratch[0]
    width = scratch.shape[1]
    n = keys.shape[0]
    for start in range(0, n, max(width, 1)):
        found = 0
        for i in range(start, min(n, start + width)):
            slot = items.lookup(ctrl, meta, np.int64(keys[i]))  # (uint64: the same 64 bits)
            if slot >= 0:
                slots[found] = slot
                scratch[1, found] = i
                found += 1
        _apply_updates(ctrl, fctrl, meta, prio, trees, slots, found, priorities, scratch[1],
                       weights0)
        updated += found
    return updated


@kernel
def first_invalid_priority(priorities, largest):
    """Index of the first priority that is negative, NaN or above ``largest``, or -1."""
    for i in range(priorities.shape[0]):
        p = priorities[i]
        if not (p >= 0.0 and p <= largest):
            return i
    return -1

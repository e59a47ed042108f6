"""Inserting: reserve slots, commit them after the copy, or give them back.

``reserve``/``commit`` serve batches and writers' items (``reserve_item`` also claims
step rows); ``reserve_one``/``commit_one`` and ``insert_staged`` a single item;
``reserve_whole``/``commit_whole`` the whole-item batch fast path. A slot is committed
only by the writer that still owns it (``_owns``); ``cancel`` and ``release_drained``
give slots back.
"""

import numpy as np

from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes, items, kernel, refpool, sumtree, rows as step_rows
from shmreplay._shm.kernels.locking import (
    BROKEN, _block, _bump, _lock_items, _lock_open, _stop_point, _unlock, _unlock_and_wake)
from shmreplay._shm.kernels.views import TABLE_CAPACITY, _copies_fit, _table_arrays
from shmreplay._shm.kernels.priorities import first_invalid_priority
from shmreplay._shm.layout import (
    C_CLOSED, C_INSERTS, C_ITEMS_SEQ, C_MAX_SIZE, C_PENDING, C_REMOVER_KIND, C_SAMPLER_KIND,
    C_SIZE, C_RESERVES, C_SPACE_SEQ, C_SPACE_WAITERS, C_TOTAL_INSERTED, C_TREE_LEAVES,
    C_COMMIT_MARK, C_EPISODE_REPEATS, C_ORDER_SEQ, C_REF_COLUMNS, F_EXPONENT0, M_STATE, M_VERSION, M_WRITER, R_COUNT)

@kernel
def _enter_insert(ctrl, fctrl, meta, prio, trees, refs, rows, n, was_waiting, register, io):
    """Locks for reserving ``n`` items: 0 with the lock held if the rate limiter and the
    free slots allow them now; else unlocked, CLOSED, BLOCKED (registered if asked) or
    GROW (a slot past the reserved ones would be needed: nothing changed)."""
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if was_waiting and ctrl[C_SPACE_WAITERS] > 0:
        ctrl[C_SPACE_WAITERS] -= 1
    if ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    if not items.can_insert(ctrl, fctrl, n) or items.free_count(ctrl) < n:
        return _block(ctrl, C_SPACE_WAITERS, C_SPACE_SEQ, register, io)
    if items.beyond_reserved(ctrl, n):
        _unlock(ctrl)
        return codes.GROW
    return 0


@kernel
def reserve(ctrl, fctrl, meta, prio, trees, refs, rows, n, pid, was_waiting, register, out_slots, io):
    """Reserves ``n`` slots for writing if the rate limiter allows ``n`` inserts now."""
    status = _enter_insert(ctrl, fctrl, meta, prio, trees, refs, rows, n, was_waiting, register,
                           io)
    if status != 0:
        return status
    ctrl[C_RESERVES] += 1
    items.pop_free_block(ctrl, meta, n, out_slots)
    for i in range(n):
        slot = out_slots[i]
        meta[slot, M_VERSION] += 1
        meta[slot, M_WRITER] = pid
        meta[slot, M_STATE] = codes.WRITING
        out_slots[i] = slot
    ctrl[C_PENDING] += n
    _unlock(ctrl)
    return n


@kernel
def commit(ctrl, fctrl, meta, prio, trees, refs, rows, slots, priorities, out_keys, io, touched,
           stamp, repeats):
    """Publishes written slots as items, then evicts with the remover while over max_size.

    ``touched`` is int64 scratch ``[2, 2 * len(slots)]``: when only the sampler is
    Prioritized, its sum-tree is updated once for all added and evicted slots.
    ``stamp`` is the caller's writer stamp: if a slot is no longer WRITING for it (it
    was freed as a dead writer's), nothing is published, the caller's other slots are
    freed, and ``LOST`` is returned. ``CLOSED`` (nothing published) once the buffer was
    stopped or removed: an insert into a buffer nobody will read again must fail, not be
    acknowledged. ``repeats``: how many of the items continue an episode that has a live
    item in the table (``C_EPISODE_REPEATS``; 0 for inserts, each its own episode).
    """
    status = _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    n = slots.shape[0]
    for i in range(n):
        if not _owns(meta, slots[i], stamp):
            return _drop_lost(ctrl, meta, refs, rows, slots, stamp)
    batch_tree = (ctrl[C_SAMPLER_KIND] == codes.PRIORITIZED
                  and ctrl[C_REMOVER_KIND] != codes.PRIORITIZED)
    ctrl[C_COMMIT_MARK] = ctrl[C_ORDER_SEQ] + 1  # a crash before the end rolls it back
    for i in range(n):
        out_keys[i] = items.add(ctrl, fctrl, meta, prio, trees, slots[i], priorities[i],
                                not batch_tree)
        touched[0, i] = slots[i]
        if i == n // 2:
            _stop_point(ctrl, codes.STOP_COMMIT_HALF)
    ctrl[C_PENDING] -= n
    ctrl[C_INSERTS] += n
    ctrl[C_TOTAL_INSERTED] += n
    ctrl[C_EPISODE_REPEATS] += repeats
    # The batch is in: from here a crash keeps it (rebuild then finishes the evictions).
    ctrl[C_COMMIT_MARK] = 0
    evicted = 0
    while ctrl[C_SIZE] > ctrl[C_MAX_SIZE]:
        victim = items.select(ctrl, fctrl, meta, trees, 1, io)
        items.remove(ctrl, meta, prio, trees, refs, rows, victim, not batch_tree)
        touched[0, n + evicted] = victim
        evicted += 1
        _stop_point(ctrl, codes.STOP_COMMIT_EVICT)
    if batch_tree:
        sumtree.set_leaves(trees[0], ctrl[C_TREE_LEAVES], touched[0], n + evicted, prio,
                           fctrl[F_EXPONENT0], meta[:, M_STATE], touched[1])
    _bump(ctrl, C_ITEMS_SEQ)
    if evicted:
        _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, True, evicted > 0)
    return evicted


@kernel
def _owns(meta, slot, stamp):
    """Whether ``slot`` is still reserved by the writer ``stamp`` (under the lock)."""
    return meta[slot, M_STATE] == codes.WRITING and meta[slot, M_WRITER] == stamp


@kernel
def _drop_lost(ctrl, meta, refs, rows, slots, stamp):
    """A commit found a slot it no longer owns: frees the batch's slots it still owns
    (nothing of the batch is published), unlocks; returns ``LOST``."""
    freed = 0
    for i in range(slots.shape[0]):
        slot = slots[i]
        if _owns(meta, slot, stamp):
            meta[slot, M_STATE] = codes.FREE
            items.free_slot(ctrl, meta, refs, rows, slot)
            ctrl[C_PENDING] -= 1
            freed += 1
    if freed:
        _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, False, freed > 0)
    return codes.LOST


@kernel
def reserve_one(ctrl, fctrl, meta, prio, trees, refs, rows, pid):
    """``reserve`` of one slot without waiting: the slot, or BLOCKED (the insert fast path)."""
    status = _enter_insert_one(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    slot = _reserve_one_locked(ctrl, meta, pid)
    _unlock(ctrl)
    return slot


@kernel
def _enter_insert_one(ctrl, fctrl, meta, prio, trees, refs, rows):
    """Locks for one insert that does not wait: 0 with the lock held; else unlocked and
    CLOSED, BLOCKED (nobody registered as a waiter), GROW or the lock's status."""
    status = _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if not items.can_insert(ctrl, fctrl, 1) or items.free_count(ctrl) < 1:
        _unlock(ctrl)
        return codes.BLOCKED
    if items.beyond_reserved(ctrl, 1):
        _unlock(ctrl)
        return codes.GROW
    return 0


@kernel
def _reserve_one_locked(ctrl, meta, pid):
    ctrl[C_RESERVES] += 1
    slot = items.pop_free(ctrl, meta)
    meta[slot, M_VERSION] += 1
    meta[slot, M_WRITER] = pid
    meta[slot, M_STATE] = codes.WRITING
    ctrl[C_PENDING] += 1
    return slot


@kernel
def reserve_item(ctrl, fctrl, meta, prio, trees, refs, rows, known_rows, known_gens, ref_steps,
                 pid, was_waiting, register, out_rows, out_fresh, io):
    """Reserves a slot for one item of step storage, and the rows of its steps.

    ``known_rows[d]``/``known_gens[d]``: where the writer stored the item's ``d``-th
    distinct step in this table before (row -1: never). A row that still holds it is
    referenced again (``out_fresh[d] = 0``); otherwise a free row is taken
    (``out_fresh[d] = 1``: the caller writes the step there). ``ref_steps[j]`` is the
    distinct step of the item's ``j``-th reference; the references go to ``refs[slot]``
    before the slot turns WRITING, so a crash at any point leaves the counts rebuildable.

    In a table of items of any length (``refpool``), ``ref_steps`` starts with the
    item's column lengths, and its references take blocks of the pool.

    If the rows (or blocks) run out (items referencing more distinct steps than the
    row space was sized for), the remover evicts items until they fit; ``NO_ROWS`` if
    even an empty table could not hold the item; ``GROW`` (nothing changed) if fresh rows
    past the reserved ones would be needed. Returns the slot, or a negative status.
    """
    status = _enter_insert(ctrl, fctrl, meta, prio, trees, refs, rows, 1, was_waiting, register,
                           io)
    if status != 0:
        return status
    distinct = known_rows.shape[0]
    if step_rows.growing(ctrl):  # (a table whose rows are all reserved skips this)
        need = 0
        for d in range(distinct):
            if not step_rows.is_live(rows, known_rows[d], known_gens[d]):
                need += 1
        if step_rows.beyond_reserved(ctrl, need):
            _unlock(ctrl)
            return codes.GROW
    need = 0
    for d in range(distinct):
        row = known_rows[d]
        if step_rows.is_live(rows, row, known_gens[d]):
            rows[row, R_COUNT] += 1  # pinned: evictions below must not free it
            out_fresh[d] = 0
        else:
            out_fresh[d] = 1
            need += 1
    pooled = refpool.pooled(meta, refs)
    blocks = 0
    if pooled:
        columns = ctrl[C_REF_COLUMNS]
        blocks = refpool.blocks_for(ref_steps.shape[0] - columns, refs.shape[1],
                                    refpool.inline(refs, columns))
    evicted = 0
    while ((step_rows.free_rows(ctrl) < need
            or (pooled and refpool.free_blocks(ctrl, meta, refs) < blocks))
           and ctrl[C_SIZE] > 0):
        victim = items.select(ctrl, fctrl, meta, trees, 1, io)
        items.remove(ctrl, meta, prio, trees, refs, rows, victim, True)
        evicted += 1
    _stop_point(ctrl, codes.STOP_RESERVE_ITEM)
    if (step_rows.free_rows(ctrl) < need
            or (pooled and refpool.free_blocks(ctrl, meta, refs) < blocks)):
        for d in range(distinct):
            if out_fresh[d] == 0:
                row = known_rows[d]
                rows[row, R_COUNT] -= 1
                if rows[row, R_COUNT] == 0:
                    step_rows.push_row(ctrl, rows, row)
        _unlock_and_wake(ctrl, False, evicted > 0)
        return codes.NO_ROWS
    ctrl[C_RESERVES] += 1
    slot = items.pop_free(ctrl, meta)
    for d in range(distinct):
        if out_fresh[d] == 0:
            out_rows[d] = known_rows[d]
            rows[known_rows[d], R_COUNT] -= 1  # the pin becomes the references below
        else:
            out_rows[d] = step_rows.pop_row(ctrl, rows)
    if pooled:
        refpool.write_item(ctrl, meta, refs, rows, slot, out_rows, ref_steps)
    else:
        for j in range(ref_steps.shape[0]):
            row = out_rows[ref_steps[j]]
            refs[slot, j] = row
            rows[row, R_COUNT] += 1
    meta[slot, M_VERSION] += 1
    meta[slot, M_WRITER] = pid
    meta[slot, M_STATE] = codes.WRITING
    ctrl[C_PENDING] += 1
    if evicted:
        _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, False, evicted > 0)
    return slot


@kernel
def commit_one(ctrl, fctrl, meta, prio, trees, refs, rows, slot, priority, io, stamp, repeats):
    """``commit`` of one slot: returns the new key (> 0), or a negative status (``LOST``
    if the slot is no longer WRITING for ``stamp``; ``CLOSED`` once the buffer was
    stopped or removed). ``repeats``, as for ``commit``: 1 if the item continues an
    episode that has a live item in the table, else 0."""
    status = _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if not _owns(meta, slot, stamp):
        _unlock(ctrl)
        return codes.LOST
    ctrl[C_EPISODE_REPEATS] += repeats
    return _commit_one_locked(ctrl, fctrl, meta, prio, trees, refs, rows, slot, priority, io)


@kernel
def _commit_one_locked(ctrl, fctrl, meta, prio, trees, refs, rows, slot, priority, io):
    """``commit_one`` with the lock held; unlocks."""
    key = items.add(ctrl, fctrl, meta, prio, trees, slot, priority, True)
    _stop_point(ctrl, codes.STOP_COMMIT_ONE)
    ctrl[C_PENDING] -= 1
    ctrl[C_INSERTS] += 1
    ctrl[C_TOTAL_INSERTED] += 1
    evicted = 0
    while ctrl[C_SIZE] > ctrl[C_MAX_SIZE]:
        items.remove(ctrl, meta, prio, trees, refs, rows, items.select(ctrl, fctrl, meta, trees, 1, io), True)
        evicted += 1
    _bump(ctrl, C_ITEMS_SEQ)
    if evicted:
        _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, True, evicted > 0)
    return key


@kernel
def insert_staged(segment, table, data, staging, layout, priority, pid, io):
    """Inserts one small whole item with one lock hold: the actor's fast path.

    Reserves a slot, copies the item into it from ``staging`` and publishes it, then
    evicts as ``commit_one`` does. ``layout`` holds three entries per column: the row's
    start in ``staging``, the store's start in ``data`` (the data segment's bytes) and
    the row's bytes. The copy happens under the lock, unlike other inserts: for items of
    a few KiB it takes tens of nanoseconds, less than a second lock round trip, and a
    contended lock is what limits an actor while a learner runs. Arguments as for
    ``sample_gather`` (the table's arrays made here from the header ``segment``).

    Returns the new key (> 0); ``BLOCKED`` if the rate limiter or the free slots do not
    allow the insert now, ``GROW`` if the slot's rows are not reserved yet (nothing
    changed: the caller takes the general way); ``BROKEN``
    if ``layout`` does not fit the arrays; or another status.
    """
    ctrl, fctrl, meta, prio, trees, refs, rows = _table_arrays(segment, table)
    if not _copies_fit(layout, 0, 1, staging, data, table[TABLE_CAPACITY]):
        return BROKEN
    status = _enter_insert_one(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    slot = _reserve_one_locked(ctrl, meta, pid)
    data_base = data.ctypes.data
    staging_base = staging.ctypes.data
    for c in range(0, layout.shape[0], 3):
        size = layout[c + 2]
        _sync.memcpy(data_base + layout[c + 1] + slot * size, staging_base + layout[c], size)
    return _commit_one_locked(ctrl, fctrl, meta, prio, trees, refs, rows, slot, priority, io)


@kernel
def cancel(ctrl, fctrl, meta, prio, trees, refs, rows, slots, pids):
    """Frees reserved slots that were never committed (a failed insert, or a dead writer).

    A slot is freed only if it is still WRITING for the same writer stamp (``pids``:
    ``shmreplay._shm.procs.STAMP``). Also frees DRAINING slots of that stamp (a sampler that
    died while copying them).
    """
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    freed = 0
    for i in range(slots.shape[0]):
        slot = slots[i]
        state = meta[slot, M_STATE]
        if (state == codes.WRITING or state == codes.DRAINING) and meta[slot, M_WRITER] == pids[i]:
            meta[slot, M_STATE] = codes.FREE
            items.free_slot(ctrl, meta, refs, rows, slot)
            if state == codes.WRITING:
                ctrl[C_PENDING] -= 1
            freed += 1
    if freed:
        _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, False, freed > 0)
    return freed


@kernel
def release_drained(ctrl, fctrl, meta, prio, trees, refs, rows, slots, versions, pid):
    """Frees the slots a ``sample`` call by ``pid`` left DRAINING, once their data is
    copied. A slot is freed only if it is still DRAINING for ``pid`` at that version."""
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    freed = 0
    for i in range(slots.shape[0]):
        slot = slots[i]
        if (meta[slot, M_STATE] == codes.DRAINING and meta[slot, M_WRITER] == pid
                and meta[slot, M_VERSION] == versions[i]):
            meta[slot, M_STATE] = codes.FREE
            items.free_slot(ctrl, meta, refs, rows, slot)
            freed += 1
    if freed:
        _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, False, freed > 0)
    return freed


@kernel
def reserve_whole(segment, table, n, priorities, largest, pid, work, io):
    """``reserve`` of ``n`` slots in a whole-item table, without waiting: the first half
    of ``insert_batch``'s fast path (arguments as for ``sample_gather``).

    The ``n`` float64 ``priorities`` are checked first: if one is not in
    ``[0, largest]``, nothing changes and ``INVALID_PRIORITY`` is returned (the caller
    finds which one and says why). ``work`` is int64 of at least ``5 * n + 1``: the
    slots go to ``work[:n]``, and ``work[n]`` receives the first slot if they are one
    ascending run (the caller then copies each column with one slice), else -1. The
    rest is ``commit_whole``'s scratch. Returns ``n``, or a status: ``BLOCKED`` or
    ``GROW`` (nothing reserved), ``BROKEN`` if the arrays do not have those sizes.
    """
    if n < 1 or work.shape[0] < 5 * n + 1 or priorities.shape[0] != n:
        return BROKEN
    if first_invalid_priority(priorities, largest) >= 0:
        return codes.INVALID_PRIORITY
    ctrl, fctrl, meta, prio, trees, refs, rows = _table_arrays(segment, table)
    slots = work[:n]
    status = reserve(ctrl, fctrl, meta, prio, trees, refs, rows, n, pid, 0, 0, slots, io)
    if status < 0:
        return status
    work[n] = slots[0] if ascending_run(slots) else -1
    return n


@kernel
def commit_whole(segment, table, work, n, priorities, out_keys, io, stamp):
    """``commit`` of the slots ``reserve_whole`` put in ``work[:n]``, after the caller
    wrote them; ``out_keys`` (uint64) receives the keys. Returns the evicted count or a
    status (``LOST``: see ``commit``)."""
    ctrl, fctrl, meta, prio, trees, refs, rows = _table_arrays(segment, table)
    if n < 1 or work.shape[0] < 5 * n + 1 or out_keys.shape[0] < n or priorities.shape[0] < n:
        return BROKEN
    touched = work[n + 1:5 * n + 1].reshape((2, 2 * n))
    return commit(ctrl, fctrl, meta, prio, trees, refs, rows, work[:n], priorities,
                  out_keys[:n].view(np.int64), io, touched, stamp, 0)


@kernel
def ascending_run(slots):
    """True if ``slots`` is ``[s, s + 1, ..., s + n - 1]`` (so a slice can replace fancy indexing)."""
    for i in range(1, slots.shape[0]):
        if slots[i] != slots[i - 1] + 1:
            return False
    return True

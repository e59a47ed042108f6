"""Locked entry points: one native call per table operation (protocol: ``shmreplay._shm.sync``).

Each function takes the table's arrays ``(ctrl, fctrl, meta, prio, trees, refs, rows)`` first,
locks the table's robust mutex (repairing the table if the previous holder died),
does the whole operation, unlocks, then wakes waiters if it changed something they wait
for. Return values >= 0 are counts; negative values are ``codes`` statuses. When a call
returns ``BLOCKED`` it has registered the caller as a waiter (if asked) and stored the
futex sequence value to wait on in ``io[0]``.
"""

import numpy as np

from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes, items, kernel, rows as step_rows, sumtree
from shmreplay._shm.kernels import verify as verify_kernels
from shmreplay._shm.layout import (
    CTRL_WORDS, F_WORDS, META_FIELDS, M_PRIO, ROW_FIELDS,
    C_CLOSED, C_DELETES, C_INSERTS, C_UPDATE_SEQ, C_ITEMS_SEQ, C_ITEMS_WAITERS, C_MAX_SIZE, C_MAX_TIMES_SAMPLED,
    C_NUM_UNIQUE, C_PENDING, C_RECOVERIES, C_REMOVER_KIND, C_SAMPLER_KIND, C_SAMPLES, C_SIZE,
    C_RESERVES, C_ROWS_DIRTY, C_SPACE_SEQ, C_SPACE_WAITERS, C_TOTAL_DELETED, C_TOTAL_INSERTED,
    C_TOTAL_SAMPLED, C_TREE_LEAVES, C_LAYOUT_GEN, C_SCHEMA_READY, C_DATA_TOKEN,
    C_COMMIT_MARK, C_FRESH, C_HEAD, C_ORDER_SEQ, C_STOP_PID, C_STOP_POINT, F_EXPONENT0, M_KEY, M_LIVE, M_NEXT, M_ORDER, M_STATE, M_TIMES, M_UPDATE, M_VERSION,
    M_WRITER, R_COUNT, R_GEN)

# Rows of the int64 output block of ``sample``.
OUT_SLOT, OUT_KEY, OUT_TABLE_SIZE, OUT_TIMES, OUT_VERSION = range(5)
OUT_INT_ROWS = 5
# Rows of its float64 output block.
OUT_PROBABILITY, OUT_PRIORITY = range(2)
OUT_FLOAT_ROWS = 2

BROKEN = -4  # the mutex is unrecoverable (cannot happen unless memory was corrupted)


@kernel
def _lock(ctrl, fctrl, meta, prio, trees, refs, rows):
    address = ctrl.ctypes.data
    result = _sync.mutex_trylock(address)
    spins = 0
    while result == _sync.EBUSY and spins < _sync.LOCK_SPINS:
        result = _sync.mutex_trylock(address)
        spins += 1
    if result == _sync.EBUSY:
        result = _sync.timed_lock(address, _sync.LOCK_SLICE_NS)
        if result == _sync.ETIMEDOUT:
            return codes.LOCK_BUSY
    if result == _sync.EOWNERDEAD:
        items.rebuild(ctrl, fctrl, meta, prio, trees, refs, rows)
        ctrl[C_RECOVERIES] += 1
        _sync.mutex_consistent(ctrl.ctypes.data)
        result = 0
    if result != 0:
        return BROKEN
    if ctrl[C_ROWS_DIRTY] != 0 and refs.shape[1] > 0 and step_rows.mapped(ctrl, refs, rows):
        step_rows.rebuild(ctrl, meta, refs, rows)
    return 0


@kernel
def _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows):
    """``_lock`` for calls that may add or remove items.

    Removing an item releases its step rows, so a process that has not mapped the
    table's step storage yet (placeholder arrays) must not: it gets ``UNMAPPED``, maps
    the storage and calls again.
    """
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if not step_rows.mapped(ctrl, refs, rows):
        _unlock(ctrl)
        return codes.UNMAPPED
    return 0


@kernel
def _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows):
    """``_lock_items``, then ``CLOSED`` (unlocked) if the buffer was stopped."""
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status == 0 and ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    return status


@kernel
def _unlock(ctrl):
    _sync.mutex_unlock(ctrl.ctypes.data)


@kernel
def _unlock_and_wake(ctrl, wake_items, wake_space):
    wake_items = wake_items and ctrl[C_ITEMS_WAITERS] > 0
    wake_space = wake_space and ctrl[C_SPACE_WAITERS] > 0
    _sync.mutex_unlock(ctrl.ctypes.data)
    if wake_items:
        _sync.futex_wake_all(ctrl, C_ITEMS_SEQ)
    if wake_space:
        _sync.futex_wake_all(ctrl, C_SPACE_SEQ)


@kernel
def _stop_point(ctrl, point):
    """A crash point: stops this process here if a test armed ``point`` for it."""
    if ctrl[C_STOP_POINT] == point:
        _sync.stop_self_if(ctrl[C_STOP_PID])


@kernel
def _bump(ctrl, word):
    ctrl[word] = (ctrl[word] + 1) & 0xFFFFFFFF


@kernel
def _block(ctrl, waiters, word, register, io):
    if register:
        ctrl[waiters] += 1
    io[0] = ctrl[word]
    _unlock(ctrl)
    return codes.BLOCKED


@kernel
def _enter_insert(ctrl, fctrl, meta, prio, trees, refs, rows, n, was_waiting, register, io):
    """Locks for reserving ``n`` items: 0 with the lock held if the rate limiter and the
    free slots allow them now; else unlocked, CLOSED or BLOCKED (registered if asked)."""
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
           stamp):
    """Publishes written slots as items, then evicts with the remover while over max_size.

    ``touched`` is int64 scratch ``[2, 2 * len(slots)]``: when only the sampler is
    Prioritized, its sum-tree is updated once for all added and evicted slots.
    ``stamp`` is the caller's writer stamp: if a slot is no longer WRITING for it (it
    was freed as a dead writer's), nothing is published, the caller's other slots are
    freed, and ``LOST`` is returned. ``CLOSED`` (nothing published) once the buffer was
    stopped or removed: an insert into a buffer nobody will read again must fail, not be
    acknowledged.
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
    CLOSED, BLOCKED (nobody registered as a waiter) or the lock's status."""
    status = _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if not items.can_insert(ctrl, fctrl, 1) or items.free_count(ctrl) < 1:
        _unlock(ctrl)
        return codes.BLOCKED
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

    If the rows run out (items referencing more distinct steps than the row space was
    sized for), the remover evicts items until they fit; ``NO_ROWS`` if even an empty
    table could not hold the item. Returns the slot, or a negative status.
    """
    status = _enter_insert(ctrl, fctrl, meta, prio, trees, refs, rows, 1, was_waiting, register,
                           io)
    if status != 0:
        return status
    distinct = known_rows.shape[0]
    need = 0
    for d in range(distinct):
        row = known_rows[d]
        if step_rows.is_live(rows, row, known_gens[d]):
            rows[row, R_COUNT] += 1  # pinned: evictions below must not free it
            out_fresh[d] = 0
        else:
            out_fresh[d] = 1
            need += 1
    evicted = 0
    while step_rows.free_rows(ctrl) < need and ctrl[C_SIZE] > 0:
        victim = items.select(ctrl, fctrl, meta, trees, 1, io)
        items.remove(ctrl, meta, prio, trees, refs, rows, victim, True)
        evicted += 1
    _stop_point(ctrl, codes.STOP_RESERVE_ITEM)
    if step_rows.free_rows(ctrl) < need:
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
def commit_one(ctrl, fctrl, meta, prio, trees, refs, rows, slot, priority, io, stamp):
    """``commit`` of one slot: returns the new key (> 0), or a negative status (``LOST``
    if the slot is no longer WRITING for ``stamp``; ``CLOSED`` once the buffer was
    stopped or removed)."""
    status = _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if not _owns(meta, slot, stamp):
        _unlock(ctrl)
        return codes.LOST
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
    allow the insert now (nothing changed: the caller waits the general way); ``BROKEN``
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
def _record(ctrl, meta, prio, slot, probability, out_i, out_f, j):
    times = meta[slot, M_TIMES] + 1
    meta[slot, M_TIMES] = times
    if times == 1:
        ctrl[C_NUM_UNIQUE] += 1
    out_i[OUT_SLOT, j] = slot
    out_i[OUT_KEY, j] = meta[slot, M_KEY]
    out_i[OUT_TABLE_SIZE, j] = ctrl[C_SIZE]
    out_i[OUT_TIMES, j] = times
    out_i[OUT_VERSION, j] = meta[slot, M_VERSION]
    out_f[OUT_PROBABILITY, j] = probability
    out_f[OUT_PRIORITY, j] = prio[slot]
    return times


@kernel
def _record_batch(ctrl, meta, prio, tree, leaves, total, count, out_i, out_f):
    """``_record`` for the ``count`` slots drawn into ``out_i[OUT_SLOT]``: each one's
    probability is its leaf / ``total``, or uniform if ``total`` is 0.

    Two passes: the first only reads (an item's metadata, priority and leaf), so the
    loads of different items overlap; the second counts the samples. Uniform batches of
    256 take about 1 us less this way than item by item.
    """
    size = ctrl[C_SIZE]
    for j in range(count):
        slot = out_i[OUT_SLOT, j]
        if total > 0.0:
            out_f[OUT_PROBABILITY, j] = tree[leaves + slot] / total
        else:
            out_f[OUT_PROBABILITY, j] = 1.0 / size
        out_i[OUT_KEY, j] = meta[slot, M_KEY]
        out_i[OUT_VERSION, j] = meta[slot, M_VERSION]
        out_i[OUT_TIMES, j] = meta[slot, M_TIMES]
        out_f[OUT_PRIORITY, j] = prio[slot]
        out_i[OUT_TABLE_SIZE, j] = size
    for j in range(count):
        slot = out_i[OUT_SLOT, j]
        times = meta[slot, M_TIMES] + 1
        meta[slot, M_TIMES] = times
        out_i[OUT_TIMES, j] = times
        if times == 1:
            ctrl[C_NUM_UNIQUE] += 1


@kernel
def sample(ctrl, fctrl, meta, prio, trees, refs, rows, batch, pid, was_waiting, register, out_i,
           out_f, out_gens, io):
    """Samples up to ``batch`` items: at least one, as many as the rate limiter allows
    now (Reverb's flexible batch; the engine waits and calls again to fill a batch),
    counting each as one sample.

    ``out_gens`` (int32 ``[batch, width]``) receives the generation of every row the
    drawn items reference. Items that reach ``max_times_sampled`` are deleted, but their
    slots stay DRAINING (for ``pid``), so nobody overwrites them while the caller copies
    them; ``io[2]`` counts them, and ``release_drained`` frees them afterwards.
    On success ``io[0]`` receives the table size left (0: the batch stopped because
    ``max_times_sampled`` emptied the table) and ``io[1]`` the reserve counter.
    """
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if was_waiting and ctrl[C_ITEMS_WAITERS] > 0:
        ctrl[C_ITEMS_WAITERS] -= 1
    if ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    if ctrl[C_SIZE] == 0 or not items.can_sample(ctrl, fctrl, 1):
        return _block(ctrl, C_ITEMS_WAITERS, C_ITEMS_SEQ, register, io)
    kind = ctrl[C_SAMPLER_KIND]
    max_times = ctrl[C_MAX_TIMES_SAMPLED]
    count = 0
    drained = 0
    if max_times == 0 and (kind == codes.UNIFORM or kind == codes.PRIORITIZED):
        # Nothing is deleted while sampling: draw the whole batch at once.
        count = items.sample_credit(ctrl, fctrl, batch)
        size = ctrl[C_SIZE]
        tree = trees[0]
        leaves = ctrl[C_TREE_LEAVES]
        total = tree[1] if kind == codes.PRIORITIZED else 0.0  # no tree otherwise
        slots = out_i[OUT_SLOT]
        if total > 0.0:
            sumtree.draw_batch(tree, leaves, count, slots, out_f[OUT_PROBABILITY])
        else:
            for j in range(count):
                slots[j] = meta[np.random.randint(0, size), M_LIVE]
        _record_batch(ctrl, meta, prio, tree, leaves, total, count, out_i, out_f)
        ctrl[C_SAMPLES] += count
    else:
        while count < batch and ctrl[C_SIZE] > 0 and items.can_sample(ctrl, fctrl, 1):
            probability = out_f[OUT_PROBABILITY, count:count + 1]
            slot = items.select(ctrl, fctrl, meta, trees, 0, probability)
            times = _record(ctrl, meta, prio, slot, probability[0], out_i, out_f, count)
            ctrl[C_SAMPLES] += 1
            if max_times > 0 and times >= max_times:
                items.unlink(ctrl, meta, prio, trees, slot, True, codes.DRAINING)
                meta[slot, M_WRITER] = pid
                drained += 1
            count += 1
    ctrl[C_TOTAL_SAMPLED] += count
    _stop_point(ctrl, codes.STOP_SAMPLE_DRAWN)
    if refs.shape[1] > 0:
        # Row generations, for the seqlock re-check of step storage: a row can be handed
        # to another writer (once no item references it) while its slot is unused.
        for j in range(count):
            slot = out_i[OUT_SLOT, j]
            for k in range(refs.shape[1]):
                out_gens[j, k] = rows[refs[slot, k], R_GEN]
    io[0] = ctrl[C_SIZE]
    # Seqlock: if C_RESERVES still equals this after the copy, no drawn slot was reused.
    io[1] = ctrl[C_RESERVES]
    io[2] = drained
    # More samples (and any deletes) can unblock inserts.
    _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, False, True)
    return count


# ``sample_gather``'s ``table``: where a table's arrays are in its header segment.
(TABLE_CTRL, TABLE_FCTRL, TABLE_META, TABLE_TREES, TABLE_CAPACITY, TABLE_TREE_LENGTH,
 TABLE_STAMP) = range(7)
TABLE_FIELDS = 6
# Its ``layout``: where each output is in its byte block ``out``, then three entries per
# column (output start, store start in the data segment, row bytes).
LAYOUT_OUT_I, LAYOUT_OUT_F, LAYOUT_TIMES, LAYOUT_TORN, LAYOUT_IO = range(5)
LAYOUT_COLUMNS = 5
# Its ``io``: ``sample``'s three entries, the rows drawn, and how many may be torn.
GATHER_COUNT, GATHER_TORN = 3, 4
GATHER_IO = 5


@kernel
def _table_arrays(segment, table):
    """The arrays the locked kernels take, made from the header segment's bytes
    (whole-item tables: no step rows)."""
    capacity = table[TABLE_CAPACITY]
    start = table[TABLE_CTRL]
    ctrl = segment[start:start + CTRL_WORDS * 8].view(np.int64)
    start = table[TABLE_FCTRL]
    fctrl = segment[start:start + F_WORDS * 8].view(np.float64)
    start = table[TABLE_META]
    meta_bytes = segment[start:start + capacity * META_FIELDS * 8]
    meta = meta_bytes.view(np.int64).reshape((capacity, META_FIELDS))
    prio = meta_bytes.view(np.float64)[M_PRIO::META_FIELDS]
    start = table[TABLE_TREES]
    length = table[TABLE_TREE_LENGTH]
    trees = segment[start:start + 2 * length * 8].view(np.float64).reshape((2, length))
    no_refs = segment[0:0].view(np.int32).reshape((0, 0))
    # The stamp record of the layout the caller mapped: the low half of ``TABLE_STAMP``.
    stamp = table[TABLE_STAMP:TABLE_STAMP + 1].view(np.int32)[:ROW_FIELDS]
    return ctrl, fctrl, meta, prio, trees, no_refs, stamp.reshape((1, ROW_FIELDS))


@kernel
def _copies_fit(layout, first, count, buffer, data, capacity):
    """Whether the row copies that ``layout[first:]`` describes stay inside their arrays:
    per column, ``count`` rows at a start in ``buffer``, a store of ``capacity`` rows at
    a start in ``data``, and the row's bytes. Kernels that copy with raw addresses
    (memcpy) check this before anything else."""
    for c in range(first, layout.shape[0], 3):
        at, start, size = layout[c], layout[c + 1], layout[c + 2]
        if (min(at, start, size) < 0 or at + count * size > buffer.shape[0]
                or start + capacity * size > data.shape[0]):
            return False
    return True


@kernel
def sample_gather(segment, table, batch, pid, data, out, layout):
    """``sample`` of whole items, their rows copied and re-checked, in one native call.

    The small-batch fast path. The draw takes the lock; the copy and the seqlock
    re-check run after it is released, as in the engine's general path. Arguments are
    few on purpose (passing an array costs about 70 ns): the table's arrays are made
    here from its header ``segment`` at the offsets in ``table``; every output lives
    in the byte block ``out`` at the offsets in ``layout``: ``sample``'s ``out_i`` and
    ``out_f``, ``times_sampled`` as int32, the torn rows, ``io``, and each column
    ``[batch, ...]`` (rows copied from ``data``, the data segment's bytes).

    Returns ``batch`` when the whole batch was drawn, copied and found clean;
    ``BROKEN`` if ``layout`` does not fit the arrays (nothing drawn). Otherwise returns
    ``UNFINISHED`` with ``sample``'s result in ``io[GATHER_COUNT]``
    (a status, or the rows drawn and copied) and ``io[GATHER_TORN]`` the rows that may
    be torn (listed in the torn rows); the caller finishes the general way.
    """
    ctrl, fctrl, meta, prio, trees, refs, rows = _table_arrays(segment, table)
    if not _copies_fit(layout, LAYOUT_COLUMNS, batch, out, data, table[TABLE_CAPACITY]):
        return BROKEN
    out_i = out[layout[LAYOUT_OUT_I]:layout[LAYOUT_OUT_I] + OUT_INT_ROWS * batch * 8].view(
        np.int64).reshape((OUT_INT_ROWS, batch))
    out_f = out[layout[LAYOUT_OUT_F]:layout[LAYOUT_OUT_F] + OUT_FLOAT_ROWS * batch * 8].view(
        np.float64).reshape((OUT_FLOAT_ROWS, batch))
    times = out[layout[LAYOUT_TIMES]:layout[LAYOUT_TIMES] + batch * 4].view(np.int32)
    torn = out[layout[LAYOUT_TORN]:layout[LAYOUT_TORN] + batch * 8].view(np.int64)
    io = out[layout[LAYOUT_IO]:layout[LAYOUT_IO] + GATHER_IO * 8].view(np.int64)
    gens = refs[:batch]  # whole items reference no rows: never indexed
    io[GATHER_TORN] = 0
    count = sample(ctrl, fctrl, meta, prio, trees, refs, rows, batch, pid, 0, 0, out_i, out_f,
                   gens, io)
    io[GATHER_COUNT] = count
    if count <= 0:
        return codes.UNFINISHED
    slots = out_i[OUT_SLOT]
    for j in range(count):
        times[j] = out_i[OUT_TIMES, j]
    # One memcpy per row and column: a copy loop here ran 3x slower than numpy's take,
    # and memcpy is faster than either for rows of tens of bytes.
    source_base = data.ctypes.data
    out_base = out.ctypes.data
    for c in range(LAYOUT_COLUMNS, layout.shape[0], 3):
        into, start, size = layout[c], layout[c + 1], layout[c + 2]
        for j in range(count):
            _sync.memcpy(out_base + into, source_base + start + slots[j] * size, size)
            into += size
    _sync.fence()
    if ctrl[C_RESERVES] != io[1]:  # some slot was reserved again: check ours
        io[GATHER_TORN] = torn_rows(meta, refs, rows, slots[:count], out_i[OUT_VERSION, :count],
                                    gens, torn)
    if count == batch and io[2] == 0 and io[GATHER_TORN] == 0:
        return count
    return codes.UNFINISHED


@kernel
def reserve_whole(segment, table, n, priorities, largest, pid, work, io):
    """``reserve`` of ``n`` slots in a whole-item table, without waiting: the first half
    of ``insert_batch``'s fast path (arguments as for ``sample_gather``).

    The ``n`` float64 ``priorities`` are checked first: if one is not in
    ``[0, largest]``, nothing changes and ``INVALID_PRIORITY`` is returned (the caller
    finds which one and says why). ``work`` is int64 of at least ``5 * n + 1``: the
    slots go to ``work[:n]``, and ``work[n]`` receives the first slot if they are one
    ascending run (the caller then copies each column with one slice), else -1. The
    rest is ``commit_whole``'s scratch. Returns ``n``, or a status: ``BLOCKED`` (nothing
    reserved), ``BROKEN`` if the arrays do not have those sizes.
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
                  out_keys[:n].view(np.int64), io, touched, stamp)


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
def update_whole(segment, table, keys, priorities, largest, scratch):
    """Sets priorities by key in a whole-item table: the learner's update in one call.

    ``keys`` are uint64 (as sampled), ``priorities`` float64 of the same length,
    checked before the lock is taken: if one is not in ``[0, largest]``, nothing
    changes and ``INVALID_PRIORITY`` is returned. Unknown or stale keys are ignored;
    the last of duplicate keys wins. ``scratch`` is int64 ``[2, >= len(keys)]``, used
    only with the lock held (so a handle's threads can share one). Returns the number
    of keys updated, or a status.
    """
    n = keys.shape[0]
    if scratch.shape[1] < n or priorities.shape[0] != n:
        return BROKEN
    if first_invalid_priority(priorities, largest) >= 0:
        return codes.INVALID_PRIORITY
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
    lock held; returns how many were live. ``scratch``: int64 ``[2, >= len(keys)]``;
    ``weights0``: as in ``_apply_updates`` (one per key, or empty)."""
    updated = 0
    slots = scratch[0]
    for i in range(keys.shape[0]):
        slot = items.lookup(ctrl, meta, np.int64(keys[i]))  # (uint64: the same 64 bits)
        if slot >= 0:
            slots[updated] = slot
            scratch[1, updated] = i
            updated += 1
    _apply_updates(ctrl, fctrl, meta, prio, trees, slots, updated, priorities, scratch[1],
                   weights0)
    return updated


@kernel
def reset(ctrl, fctrl, meta, prio, trees, refs, rows, forget, out):
    """Removes every item and zeroes the rate limiter's counters; keys are not reused.

    With ``forget``, also forgets the table's layout if no slot is being written (a
    writer's data would go to the forgotten layout): the stored layout is dropped and
    the layout generation bumped, so that every process's arrays are stale (``UNMAPPED``)
    and the next item defines a new layout. ``out[0]`` receives 1 if it was forgotten,
    ``out[1]`` the token of the forgotten layout's data segment (whose name to unlink).
    """
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    removed = ctrl[C_SIZE]
    items.clear(ctrl, meta, prio, trees, refs, rows)
    ctrl[C_INSERTS] = 0
    ctrl[C_SAMPLES] = 0
    ctrl[C_DELETES] = 0
    ctrl[C_NUM_UNIQUE] = 0
    out[0] = 0
    if forget and ctrl[C_SCHEMA_READY] != 0 and not _slots_in_use(ctrl, meta):
        step_rows.forget(ctrl)
        ctrl[C_SCHEMA_READY] = 0
        ctrl[C_LAYOUT_GEN] += 1
        out[0] = 1
        out[1] = ctrl[C_DATA_TOKEN]
    _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, False, True)
    return removed


@kernel
def _slots_in_use(ctrl, meta):
    """Whether a slot is being written or read outside the lock (WRITING, DRAINING):
    its process uses the arrays of the layout it mapped until it is done."""
    for slot in range(ctrl[C_FRESH]):
        state = meta[slot, M_STATE]
        if state == codes.WRITING or state == codes.DRAINING:
            return True
    return False


@kernel
def close(ctrl, fctrl, meta, prio, trees, refs, rows):
    """Marks the table closed and wakes every waiter (they will see it closed)."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    ctrl[C_CLOSED] = 1
    _bump(ctrl, C_ITEMS_SEQ)
    _bump(ctrl, C_SPACE_SEQ)
    _unlock(ctrl)
    _sync.futex_wake_all(ctrl, C_ITEMS_SEQ)
    _sync.futex_wake_all(ctrl, C_SPACE_SEQ)
    return 0


@kernel
def wake_all(ctrl):
    """Bumps both futex words and wakes every waiter, without the lock (``stop`` when a
    stopped process holds it: waiters then see ``C_CLOSED``)."""
    _bump(ctrl, C_ITEMS_SEQ)
    _bump(ctrl, C_SPACE_SEQ)
    _sync.futex_wake_all(ctrl, C_ITEMS_SEQ)
    _sync.futex_wake_all(ctrl, C_SPACE_SEQ)


@kernel
def rate_check(ctrl, fctrl, meta, prio, trees, refs, rows, n, inserting):
    """``can_insert(n)`` if ``inserting`` else ``can_sample(n)``, under the lock."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if inserting:
        allowed = items.can_insert(ctrl, fctrl, n)
    else:
        allowed = items.can_sample(ctrl, fctrl, n)
    _unlock(ctrl)
    return 1 if allowed else 0


@kernel
def snapshot(ctrl, fctrl, meta, prio, trees, refs, rows, out):
    """Copies the control words into ``out`` under the lock (a consistent view)."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    for i in range(out.shape[0]):
        out[i] = ctrl[i]
    _unlock(ctrl)
    return 0


@kernel
def hold_items(ctrl, fctrl, meta, prio, trees, refs, rows, out_slots, out_fields, out_prio):
    """Locks the table and lists its live items in insertion order.

    Fills ``out_slots[j]``, ``out_fields[:, j]`` (key, order, update number, times
    sampled) and ``out_prio[j]`` for each item ``j``. Returns the count WITH THE LOCK
    HELD, or a negative status (unlocked), or ``-(count + 1000)`` (unlocked) when the
    outputs are too small for the count. The caller copies the items' data, then calls
    ``release_hold``. Only checkpoints use this: the one consistent view of all items.
    """
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    size = ctrl[C_SIZE]
    if size > out_slots.shape[0]:
        _unlock(ctrl)
        return -(size + 1000)
    count = 0
    slot = ctrl[C_HEAD]
    while slot >= 0:
        out_slots[count] = slot
        out_fields[0, count] = meta[slot, M_KEY]
        out_fields[1, count] = meta[slot, M_ORDER]
        out_fields[2, count] = meta[slot, M_UPDATE]
        out_fields[3, count] = meta[slot, M_TIMES]
        out_prio[count] = prio[slot]
        count += 1
        slot = meta[slot, M_NEXT]
    return count


@kernel
def release_hold(ctrl):
    _unlock(ctrl)


@kernel
def restore_items(ctrl, fctrl, meta, prio, trees, refs, rows, slots, keys, orders, updates,
                  times, priorities, fresh, io):
    """Makes restored items live in a table no other process uses yet (a new Server).

    The caller has written the items' data (and references) and the counters; this
    writes each slot's record, lets ``rebuild`` derive every structure from the slot
    states (order list, sum-trees, heaps, free stacks, row counts), then evicts with
    the remover while the table holds more than ``max_size``. Returns the evictions.
    """
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    for i in range(slots.shape[0]):
        slot = slots[i]
        meta[slot, M_KEY] = keys[i]
        meta[slot, M_ORDER] = orders[i]
        meta[slot, M_UPDATE] = updates[i]
        meta[slot, M_TIMES] = times[i]
        meta[slot, M_VERSION] += 1
        prio[slot] = priorities[i]
        meta[slot, M_STATE] = codes.READY
    ctrl[C_FRESH] = fresh
    deleted = ctrl[C_TOTAL_DELETED]
    items.rebuild(ctrl, fctrl, meta, prio, trees, refs, rows)  # evicts what does not fit
    _unlock(ctrl)
    return ctrl[C_TOTAL_DELETED] - deleted


@kernel
def writing_slots(ctrl, fctrl, meta, prio, trees, refs, rows, out_slots, out_pids):
    """Lists the WRITING and DRAINING slots and their processes' writer stamps (to find
    dead ones)."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    count = 0
    capacity = out_slots.shape[0]
    for slot in range(capacity):
        state = meta[slot, M_STATE]
        if state == codes.WRITING or state == codes.DRAINING:
            out_slots[count] = slot
            out_pids[count] = meta[slot, M_WRITER]
            count += 1
    _unlock(ctrl)
    return count


@kernel
def seed(value):
    np.random.seed(value)


@kernel
def wait(ctrl, word, expected, timeout_ns, timespec):
    """Sleeps on a futex word until it changes or ``timeout_ns`` passes."""
    return _sync.futex_wait(ctrl, word, expected, timeout_ns, timespec)


@kernel
def unwait(ctrl, fctrl, meta, prio, trees, refs, rows, waiters_word):
    """Withdraws a waiter registration (the caller gave up: timeout)."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if ctrl[waiters_word] > 0:
        ctrl[waiters_word] -= 1
    _unlock(ctrl)
    return 0


@kernel
def wait_for_items(ctrl, fctrl, meta, prio, trees, refs, rows, was_waiting, register, io):
    """Returns the table size once it is non-zero (BLOCKED while empty); takes nothing."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if was_waiting and ctrl[C_ITEMS_WAITERS] > 0:
        ctrl[C_ITEMS_WAITERS] -= 1
    if ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    size = ctrl[C_SIZE]
    if size == 0:
        return _block(ctrl, C_ITEMS_WAITERS, C_ITEMS_SEQ, register, io)
    _unlock(ctrl)
    return size


# --- lock-free helpers of the Python layer --------------------------------------------


@kernel
def ascending_run(slots):
    """True if ``slots`` is ``[s, s + 1, ..., s + n - 1]`` (so a slice can replace fancy indexing)."""
    for i in range(1, slots.shape[0]):
        if slots[i] != slots[i - 1] + 1:
            return False
    return True


@kernel
def first_invalid_priority(priorities, largest):
    """Index of the first priority that is negative, NaN or above ``largest``, or -1."""
    for i in range(priorities.shape[0]):
        p = priorities[i]
        if not (p >= 0.0 and p <= largest):
            return i
    return -1


@kernel
def torn_rows(meta, refs, rows, slots, versions, gens, out_rows):
    """Batch rows to redraw because their data may have been overwritten while copied
    (the seqlock re-check): the slot was reserved again, or a step row it references
    was handed out again."""
    count = 0
    for i in range(slots.shape[0]):
        slot = slots[i]
        torn = meta[slot, M_VERSION] != versions[i]
        for k in range(refs.shape[1]):
            torn = torn or rows[refs[slot, k], R_GEN] != gens[i, k]
        if torn:
            out_rows[count] = i
            count += 1
    return count


@kernel
def verify(ctrl, fctrl, meta, prio, trees, refs, rows):
    """Checks the table's invariants under the lock; returns a bit mask of problems."""
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    problems = verify_kernels.check(ctrl, fctrl, meta, prio, trees, refs, rows)
    _unlock(ctrl)
    return problems


@kernel
def importance_weights(probability, table_size, beta, normalize, out):
    """``(table_size * probability) ** -beta`` into ``out``, divided by its max if asked."""
    largest = 0.0
    for i in range(probability.shape[0]):
        weight = (table_size[i] * probability[i]) ** -beta
        out[i] = weight
        largest = max(largest, weight)
    if normalize and largest > 0.0:
        for i in range(probability.shape[0]):
            out[i] = out[i] / largest

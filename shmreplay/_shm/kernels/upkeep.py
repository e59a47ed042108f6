"""A table's upkeep: reset, close, the lock held for snapshots and restores, the slots
being written (for dead-writer checks), and ``verify``.
"""

from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes, items, kernel, rows as step_rows, verify as verify_kernels
from shmreplay._shm.kernels.locking import _bump, _lock, _lock_items, _unlock, _unlock_and_wake
from shmreplay._shm.layout import (
    C_ARENA_ITEMS, C_ARENA_ROVER,
    C_CLOSED, C_DELETES, C_EPISODE_REPEATS, C_INSERTS, C_ITEMS_SEQ, C_NUM_UNIQUE, C_SAMPLES, C_SIZE, C_SPACE_SEQ,
    C_TOTAL_DELETED, C_TOTAL_INSERTED, C_LAYOUT_GEN, C_SCHEMA_READY, C_DATA_TOKEN, C_FRESH, C_HEAD, C_FREE_TOP, C_FREE_HEAD, C_SLOT_LIMIT, M_KEY, M_NEXT,
    M_ORDER, M_STATE, M_TIMES, M_UPDATE, M_VERSION, M_WRITER)

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
    ctrl[C_EPISODE_REPEATS] = ctrl[C_TOTAL_INSERTED]  # no episode came since: none left
    out[0] = 0
    if forget and ctrl[C_SCHEMA_READY] != 0 and not _slots_in_use(ctrl, meta):
        step_rows.forget(ctrl)
        # Every slot is free: the next layout's segment hands them out from 0 again, as
        # far as its own reserved stores go (``C_SLOT_LIMIT``, set when it is made).
        ctrl[C_FREE_TOP] = 0
        ctrl[C_FREE_HEAD] = -1
        ctrl[C_FRESH] = 0
        ctrl[C_SLOT_LIMIT] = 0
        ctrl[C_ARENA_ITEMS] = 0
        ctrl[C_ARENA_ROVER] = 0
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
def verify(ctrl, fctrl, meta, prio, trees, refs, rows):
    """Checks the table's invariants under the lock; returns a bit mask of problems."""
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    problems = verify_kernels.check(ctrl, fctrl, meta, prio, trees, refs, rows)
    _unlock(ctrl)
    return problems

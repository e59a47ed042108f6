"""Locked steps of a data segment's creation (protocol: ``shmreplay._engine.data_segment``).

A table's data segment is created by one process at a time: the one that *claims* the
creation under the table's lock (``C_CREATOR_PID``, ``C_CREATOR_START``, and the random
``C_DATA_TOKEN`` its segment's name will carry). Another process takes the claim over
only from a claimant it found dead (the pid and start time it passes as ``dead_*``).
``grow`` raises how much of a made segment's stores is reserved (``shmreplay._engine.growth``).
"""

from shmreplay._shm.kernels import codes, kernel
from shmreplay._shm.kernels.locking import _lock, _stop_point, _unlock
from shmreplay._shm.layout import (C_CLOSED, C_CREATOR_PID, C_CREATOR_START, C_DATA_TOKEN,
                               C_REFS_WIDTH, C_ROW_CAPACITY, C_SCHEMA_READY, C_REF_COLUMNS, C_BLOCK_FREE_HEAD,
                               C_BLOCK_FREE_TOP, C_BLOCK_FRESH, C_CAPACITY, C_LAYOUT_GEN,
                               C_SLOT_LIMIT, C_ROW_LIMIT)

TAKEN = 0     # another process holds the claim: ``out`` = its (pid, start, token)
CLAIMED = 1   # the caller holds it now: ``out`` = the previous (pid, start, token)
READY = 2     # the segment exists already: nothing to create


@kernel
def claim(ctrl, fctrl, meta, prio, trees, refs, rows, pid, start, token, dead_pid,
          dead_start, out):
    """Claims the creation for ``(pid, start, token)`` if nobody holds it, or if the
    holder is ``(dead_pid, dead_start)`` (found dead by the caller)."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    if ctrl[C_SCHEMA_READY] != 0:
        _unlock(ctrl)
        return READY
    holder, holder_start = ctrl[C_CREATOR_PID], ctrl[C_CREATOR_START]
    out[0] = holder
    out[1] = holder_start
    out[2] = ctrl[C_DATA_TOKEN]
    if holder != 0 and not (holder == dead_pid and holder_start == dead_start):
        _unlock(ctrl)
        return TAKEN
    ctrl[C_CREATOR_PID] = pid
    ctrl[C_CREATOR_START] = start
    ctrl[C_DATA_TOKEN] = token
    _unlock(ctrl)
    return CLAIMED


@kernel
def finish(ctrl, fctrl, meta, prio, trees, refs, rows, token, steps, row_capacity, width,
           ref_columns, reserved):
    """Publishes the segment of claim ``token``: 1, or 0 if the claim was taken over
    (its segment is not the table's), or CLOSED. ``ref_columns``: the item columns of
    a table of items of any length (``refpool``), else 0. ``reserved``: the store rows
    the creator reserved (slots of whole items, else step rows)."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    if ctrl[C_DATA_TOKEN] != token or ctrl[C_SCHEMA_READY] != 0:
        _unlock(ctrl)
        return 0
    if steps != 0:
        ctrl[C_ROW_CAPACITY] = row_capacity
        ctrl[C_REFS_WIDTH] = width
        ctrl[C_REF_COLUMNS] = ref_columns
        ctrl[C_BLOCK_FREE_HEAD] = -1
        ctrl[C_BLOCK_FREE_TOP] = 0
        ctrl[C_BLOCK_FRESH] = 0
        ctrl[C_ROW_LIMIT] = min(max(reserved, 0), row_capacity)
        ctrl[C_SLOT_LIMIT] = ctrl[C_CAPACITY]
    else:
        ctrl[C_ROW_LIMIT] = 0
        ctrl[C_SLOT_LIMIT] = min(max(reserved, 0), ctrl[C_CAPACITY])
    ctrl[C_SCHEMA_READY] = 1
    ctrl[C_CREATOR_PID] = 0
    ctrl[C_CREATOR_START] = 0
    _unlock(ctrl)
    return 1


@kernel
def release(ctrl, fctrl, meta, prio, trees, refs, rows, token):
    """Gives up the claim ``token`` (a creation that failed): others may claim again."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if ctrl[C_DATA_TOKEN] == token and ctrl[C_SCHEMA_READY] == 0:
        ctrl[C_CREATOR_PID] = 0
        ctrl[C_CREATOR_START] = 0
    _unlock(ctrl)
    return 0


@kernel
def grow(ctrl, fctrl, meta, prio, trees, refs, rows, generation, slots, step_rows):
    """Raises the reserved watermarks (``C_SLOT_LIMIT``, ``C_ROW_LIMIT``) to ``slots``
    and ``step_rows`` (never lowers them, never past the capacities), once the caller
    reserved that much of the stores of the layout ``generation``: 1, or 0 if that
    layout is not the table's any more (nothing changed), or CLOSED."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    if ctrl[C_LAYOUT_GEN] != generation or ctrl[C_SCHEMA_READY] == 0:
        _unlock(ctrl)
        return 0
    ctrl[C_SLOT_LIMIT] = max(ctrl[C_SLOT_LIMIT], min(slots, ctrl[C_CAPACITY]))
    ctrl[C_ROW_LIMIT] = max(ctrl[C_ROW_LIMIT], min(step_rows, ctrl[C_ROW_CAPACITY]))
    _stop_point(ctrl, codes.STOP_GROW)
    _unlock(ctrl)
    return 1

"""Step rows of tables that store steps (sequence items), without locks.

A row is one stored step, shared by every item that references it. ``rows[row, R_COUNT]``
counts the references from items that are live or being written; a row whose count
drops to zero goes back on a free stack linked through the same field (``-2 - next``).
``rows[row, R_GEN]`` changes each time a row is handed out, so a writer may re-use a row
it wrote only while the row still holds its step (same generation, count > 0).

Each slot's references are ``refs[slot, :]`` (``C_REFS_WIDTH`` of them), or, for items of
any length, a chain of blocks in a pool after the slots (``refpool``). Tables that store
whole items have width 0 and never reach this module's loops.
"""

from shmreplay._shm.kernels import codes, kernel, refpool
from shmreplay._shm.layout import (
    C_BLOCK_FREE_HEAD, C_BLOCK_FREE_TOP, C_BLOCK_FRESH, C_REF_COLUMNS, C_FRESH, C_LAYOUT_GEN, C_REFS_WIDTH, C_ROW_CAPACITY, C_ROW_FREE_HEAD, C_ROW_FREE_TOP,
    C_ROW_FRESH, C_ROWS_DIRTY, C_ROWS_LIVE, M_STATE, R_COUNT, R_GEN, C_ROW_LIMIT)


@kernel
def forget(ctrl):
    """Drops the step storage's words (``reset`` forgetting the layout; the table holds
    no items and no slot is being written)."""
    ctrl[C_REFS_WIDTH] = 0
    ctrl[C_ROW_CAPACITY] = 0
    ctrl[C_ROW_FREE_HEAD] = -1
    ctrl[C_ROW_FREE_TOP] = 0
    ctrl[C_ROW_FRESH] = 0
    ctrl[C_ROW_LIMIT] = 0
    ctrl[C_ROWS_LIVE] = 0
    ctrl[C_ROWS_DIRTY] = 0
    ctrl[C_REF_COLUMNS] = 0
    ctrl[C_BLOCK_FREE_HEAD] = -1
    ctrl[C_BLOCK_FREE_TOP] = 0
    ctrl[C_BLOCK_FRESH] = 0


@kernel
def free_rows(ctrl):
    return ctrl[C_ROW_FREE_TOP] + ctrl[C_ROW_CAPACITY] - ctrl[C_ROW_FRESH]


@kernel
def growing(ctrl):
    """Whether some step rows are not reserved yet (``C_ROW_LIMIT``). Once every row
    is, a lack of rows is the remover's to solve."""
    return ctrl[C_ROW_LIMIT] < ctrl[C_ROW_CAPACITY]


@kernel
def beyond_reserved(ctrl, need):
    """Whether taking ``need`` free rows would take a fresh one past the reserved rows
    (``C_ROW_LIMIT``; the caller checked ``growing``): the call returns ``GROW`` before
    it changes anything."""
    return ctrl[C_ROW_FRESH] + need - ctrl[C_ROW_FREE_TOP] > ctrl[C_ROW_LIMIT]


@kernel
def pop_row(ctrl, rows):
    """A free row with a new generation and one reference, or -1. Recently freed first."""
    if ctrl[C_ROW_FREE_TOP] > 0:
        row = ctrl[C_ROW_FREE_HEAD]
        ctrl[C_ROW_FREE_HEAD] = -2 - rows[row, R_COUNT]
        ctrl[C_ROW_FREE_TOP] -= 1
    elif ctrl[C_ROW_FRESH] < ctrl[C_ROW_CAPACITY]:
        row = ctrl[C_ROW_FRESH]
        ctrl[C_ROW_FRESH] = row + 1
    else:
        return -1
    rows[row, R_GEN] += 1
    rows[row, R_COUNT] = 0
    ctrl[C_ROWS_LIVE] += 1
    return row


@kernel
def push_row(ctrl, rows, row):
    rows[row, R_COUNT] = -2 - ctrl[C_ROW_FREE_HEAD]
    ctrl[C_ROW_FREE_HEAD] = row
    ctrl[C_ROW_FREE_TOP] += 1
    ctrl[C_ROWS_LIVE] -= 1


@kernel
def is_live(rows, row, gen):
    """Whether ``row`` still holds the step a writer stored there at generation ``gen``."""
    # (the last record is the layout stamp, never a step's row)
    return 0 <= row < rows.shape[0] - 1 and rows[row, R_COUNT] > 0 and rows[row, R_GEN] == gen


@kernel
def release(ctrl, meta, refs, rows, slot):
    """Drops the references of the item in ``slot``; rows nobody references are freed."""
    if refpool.pooled(meta, refs):
        _release_chain(ctrl, meta, refs, rows, slot)
        return
    for j in range(refs.shape[1]):
        row = refs[slot, j]
        count = rows[row, R_COUNT] - 1
        rows[row, R_COUNT] = count
        if count == 0:
            push_row(ctrl, rows, row)


@kernel
def _release_chain(ctrl, meta, refs, rows, slot):
    """``release`` of an item in the block pool: its rows, then its blocks. The head
    is emptied first, so a crash half-way leaves no chain that reaches a freed block."""
    capacity = meta.shape[0]
    per_block = refs.shape[1] - 1
    columns = ctrl[C_REF_COLUMNS]
    base = refpool.HEAD_LENGTHS + columns
    block = refs[slot, refpool.HEAD_FIRST] - 1
    remaining = refs[slot, refpool.HEAD_TOTAL]
    refs[slot, refpool.HEAD_FIRST] = 0
    refs[slot, refpool.HEAD_TOTAL] = 0
    kept = min(remaining, refpool.inline(refs, columns))
    for j in range(kept):  # (the head's references: the total, already 0, covered them)
        row = refs[slot, base + j]
        count = rows[row, R_COUNT] - 1
        rows[row, R_COUNT] = count
        if count == 0:
            push_row(ctrl, rows, row)
    remaining -= kept
    while block >= 0 and remaining > 0:
        record = capacity + block
        for j in range(min(per_block, remaining)):
            row = refs[record, j]
            count = rows[row, R_COUNT] - 1
            rows[row, R_COUNT] = count
            if count == 0:
                push_row(ctrl, rows, row)
        remaining -= per_block
        following = refs[record, per_block] % refpool.MARK - 1
        refpool.push_block(ctrl, meta, refs, block)
        block = following


@kernel
def rebuild(ctrl, meta, refs, rows):
    """Recounts every row's references from the slots that hold items (after a crash)."""
    fresh = ctrl[C_ROW_FRESH]
    for row in range(fresh):
        rows[row, R_COUNT] = 0
    if refpool.pooled(meta, refs):
        refpool.rebuild_blocks(ctrl, meta, refs, rows, ctrl[C_FRESH])
    else:
        for slot in range(ctrl[C_FRESH]):
            state = meta[slot, M_STATE]
            if state == codes.READY or state == codes.WRITING or state == codes.DRAINING:
                for j in range(refs.shape[1]):
                    rows[refs[slot, j], R_COUNT] += 1
    ctrl[C_ROW_FREE_TOP] = 0
    ctrl[C_ROW_FREE_HEAD] = -1
    ctrl[C_ROWS_LIVE] = fresh
    for row in range(fresh - 1, -1, -1):  # so the lowest free row ends on top
        if rows[row, R_COUNT] == 0:
            push_row(ctrl, rows, row)
    ctrl[C_ROWS_DIRTY] = 0


@kernel
def mapped(ctrl, refs, rows):
    """Whether the caller passed this table's current arrays: its step arrays (or
    none, for whole items), stamped with the current layout generation (``rows`` ends
    with the stamp record: see ``shmreplay._shm.layout.stamp_rows``)."""
    return (refs.shape[1] == ctrl[C_REFS_WIDTH] and rows.shape[0] > 0
            and rows[rows.shape[0] - 1, R_COUNT] == ctrl[C_LAYOUT_GEN])

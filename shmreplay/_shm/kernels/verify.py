"""Invariant checks of one table's metadata (``Client.verify``), without locks.

The caller holds the table's lock. Each check that fails sets one bit of the returned
mask; ``shmreplay._engine.table_engine.PROBLEMS`` names the bits.

``verify`` exists to find corruption, so nothing here trusts a word it reads: every
count from the control block is checked against the arrays' real sizes before it bounds
a loop, and every slot, position or row read from the metadata before it indexes an
array (a word out of range is reported, as ``CTRL`` or the structure's bit, never
followed).
"""


from shmreplay._shm.kernels import codes, heap, kernel, refpool
from shmreplay._shm.kernels.sumtree import weight
from shmreplay._shm.layout import (
    C_CAPACITY, C_REFS_WIDTH, C_ROW_CAPACITY, C_ROW_LIMIT, C_SCHEMA_READY, C_SLOT_LIMIT,
    C_DELETES, C_FRESH, C_REF_COLUMNS, C_ROW_FREE_HEAD, C_ROW_FREE_TOP, C_ROW_FRESH, C_ROWS_LIVE, R_COUNT, C_HEAD, C_HEAP_N0, C_INSERTS, C_PENDING, C_SAMPLER_KIND, C_SIZE,
    C_TAIL, C_TREE_LEAVES, F_EXPONENT0, M_HEAP0, M_HEAP_POS0, M_LIVE, M_LIVE_POS, M_NEXT,
    M_ORDER, M_STATE)

SIZE = 1  # size counter != number of READY slots
LIVE = 2  # dense live array inconsistent
LIST = 4  # insertion-order list inconsistent
TREE = 8  # a sum-tree node != sum of its children, or a leaf != priority ** exponent
HEAP = 16  # heap order or positions broken
COUNTERS = 32  # inserts - deletes != size, or pending != WRITING slots
ROWS = 64  # a step row's reference count or the free-row stack is wrong
CTRL = 128  # a control word is outside what the table's arrays allow
RESERVED = 256  # a slot or step row in use past the stores' reserved part (C_*_LIMIT)

NAMES = {SIZE: "size counter != live items",
         LIVE: "live-item index inconsistent",
         LIST: "insertion-order list inconsistent",
         TREE: "sum-tree does not match the priorities",
         HEAP: "heap order or positions broken",
         COUNTERS: "rate-limiter or pending counters inconsistent",
         ROWS: "step rows' reference counts or free list inconsistent",
         CTRL: "a control word is out of range (corrupt control block)",
         RESERVED: "a slot or step row in use lies past the data segment's reserved memory"}


@kernel
def check(ctrl, fctrl, meta, prio, trees, refs, rows):
    problems = 0
    capacity = meta.shape[0]
    fresh = ctrl[C_FRESH]
    size = ctrl[C_SIZE]
    if not (0 <= fresh <= capacity and 0 <= size <= fresh):
        # Check what the arrays hold; the list and heaps below then disagree with size.
        problems |= CTRL
        fresh = min(max(fresh, 0), capacity)
        size = min(max(size, 0), capacity)
    if refs.shape[1] > 0:
        problems |= _check_rows(ctrl, meta, refs, rows, fresh)
    problems |= _check_reserved(ctrl, fresh)
    ready = 0
    writing = 0
    for slot in range(fresh):
        state = meta[slot, M_STATE]
        if state == codes.READY:
            ready += 1
            pos = meta[slot, M_LIVE_POS]
            if pos < 0 or pos >= size or meta[pos, M_LIVE] != slot:
                problems |= LIVE
        elif state == codes.WRITING:
            writing += 1
    if ready != size:
        problems |= SIZE
    if ctrl[C_INSERTS] - ctrl[C_DELETES] != size or ctrl[C_PENDING] != writing:
        problems |= COUNTERS
    # The list visits every live item once, in increasing insertion order.
    count = 0
    slot = ctrl[C_HEAD]
    last_order = -1
    previous = -1
    while slot >= 0 and count <= size:
        if slot >= fresh:  # a link out of the slots ever used
            problems |= LIST
            break
        if meta[slot, M_STATE] != codes.READY or meta[slot, M_ORDER] <= last_order:
            problems |= LIST
        last_order = meta[slot, M_ORDER]
        previous = slot
        slot = meta[slot, M_NEXT]
        count += 1
    if count != size or (size > 0 and previous != ctrl[C_TAIL]):
        problems |= LIST
    leaves = ctrl[C_TREE_LEAVES]
    for role in range(2):
        kind = ctrl[C_SAMPLER_KIND + role]
        if kind == codes.PRIORITIZED:
            tree = trees[role]
            if not (fresh <= leaves and 2 * leaves <= tree.shape[0]):
                problems |= CTRL | TREE
                continue
            for slot in range(fresh):
                expected = 0.0
                if meta[slot, M_STATE] == codes.READY:
                    expected = weight(prio[slot], fctrl[F_EXPONENT0 + role])
                if tree[leaves + slot] != expected:
                    problems |= TREE
            for node in range(1, leaves):
                total = tree[2 * node] + tree[2 * node + 1]
                if not abs(tree[node] - total) <= 1e-9 * max(1.0, abs(total)):
                    problems |= TREE  # also catches inf and NaN
        elif kind == codes.MIN_HEAP or kind == codes.MAX_HEAP:
            n = ctrl[C_HEAP_N0 + role]
            if n != size:
                problems |= HEAP
            if not 0 <= n <= capacity:
                problems |= CTRL
                continue
            is_min = kind == codes.MIN_HEAP
            for pos in range(n):
                slot = meta[pos, M_HEAP0 + role]
                if not 0 <= slot < fresh:
                    problems |= HEAP
                    continue
                if meta[slot, M_HEAP_POS0 + role] != pos or meta[slot, M_STATE] != codes.READY:
                    problems |= HEAP
                if pos > 0:
                    parent = meta[(pos - 1) // 2, M_HEAP0 + role]
                    if 0 <= parent < fresh and heap.before(meta, prio, slot, parent, is_min):
                        problems |= HEAP
    return problems


@kernel
def _check_reserved(ctrl, fresh):
    """Every slot (whole items) or step row ever handed out lies below the reserved
    watermark, which lies within the stores: ``RESERVED`` (or ``CTRL``) otherwise."""
    if ctrl[C_SCHEMA_READY] == 0:
        return 0
    slots, step_rows = ctrl[C_SLOT_LIMIT], ctrl[C_ROW_LIMIT]
    if not (0 <= slots <= ctrl[C_CAPACITY] and 0 <= step_rows <= ctrl[C_ROW_CAPACITY]):
        return CTRL
    if fresh > slots or (ctrl[C_REFS_WIDTH] > 0 and ctrl[C_ROW_FRESH] > step_rows):
        return RESERVED
    return 0


@kernel
def _check_rows(ctrl, meta, refs, rows, fresh):
    """Reference counts must equal the references held by items and reservations, and the
    free stack must hold exactly the other rows.

    Without scratch memory: subtracts each reference from its row's count (every live
    row must reach exactly 0), then adds them all back. ``fresh``: the slots ever used,
    already checked against the arrays.
    """
    fresh_rows = ctrl[C_ROW_FRESH]
    if not 0 <= fresh_rows <= rows.shape[0]:
        return ROWS | CTRL
    if refpool.pooled(meta, refs):
        if not _subtract_chains(ctrl, meta, refs, rows, fresh):
            return ROWS
    else:
        problem = _subtract_refs(meta, refs, rows, fresh, fresh_rows)
        if problem:
            return problem
    live = 0
    exact = True
    for row in range(fresh_rows):
        count = rows[row, R_COUNT]
        if count == 0:
            live += 1
        elif count > 0:
            exact = False  # counted more often than referenced
    if refpool.pooled(meta, refs):
        used = _add_back_chains(ctrl, meta, refs, rows, fresh)
        if not refpool.check_free_blocks(ctrl, meta, refs, used):
            return ROWS
    else:
        _add_refs(meta, refs, rows, fresh, 1)
    if not exact or live != ctrl[C_ROWS_LIVE]:
        return ROWS
    free = 0
    row = ctrl[C_ROW_FREE_HEAD]
    while row >= 0 and free <= fresh_rows:
        if row >= fresh_rows or rows[row, R_COUNT] >= 0:
            return ROWS
        free += 1
        row = -2 - rows[row, R_COUNT]
    if row < -1:  # the stack ends in -1; anything else below 0 is a corrupt link
        return ROWS
    if free != ctrl[C_ROW_FREE_TOP] or free + live != fresh_rows:
        return ROWS
    return 0


@kernel
def _subtract_refs(meta, refs, rows, fresh, fresh_rows):
    """Fixed references: checks each, then subtracts them from their rows' counts."""
    for slot in range(fresh):
        if _holds_refs(meta, slot):
            for j in range(refs.shape[1]):
                row = refs[slot, j]
                if row < 0 or row >= fresh_rows or rows[row, R_COUNT] <= 0:
                    return ROWS  # a reference to a row that is not live
    _add_refs(meta, refs, rows, fresh, -1)
    return 0


@kernel
def _subtract_chains(ctrl, meta, refs, rows, fresh):
    """Pooled references: subtracts each live item's references from their rows' counts,
    marking its blocks; False (everything added back) if a chain or its lengths are
    broken, or a chain reaches a block another chain reached."""
    for slot in range(fresh):
        if _holds_refs(meta, slot):
            broken = 0 if refpool.lengths_ok(ctrl, refs, slot) else 1
            if broken == 0:
                broken = refpool.count_refs(ctrl, meta, refs, rows, slot, -1)
            if broken:
                # (the failing slot's head was counted only if its chain failed)
                _add_back_chains(ctrl, meta, refs, rows, slot + (broken == 2))
                return False
    return True


@kernel
def _add_back_chains(ctrl, meta, refs, rows, fresh):
    """Undoes ``_subtract_chains`` for the first ``fresh`` slots (their heads; their
    chains as far as marked); returns the blocks it unmarked."""
    used = 0
    per_block = refs.shape[1] - 1
    capacity = meta.shape[0]
    columns = ctrl[C_REF_COLUMNS]
    base = refpool.HEAD_LENGTHS + columns
    for slot in range(fresh):
        if not _holds_refs(meta, slot):
            continue
        remaining = refs[slot, refpool.HEAD_TOTAL]
        kept = min(remaining, refpool.inline(refs, columns))
        for j in range(kept):
            rows[refs[slot, base + j], R_COUNT] += 1
        remaining -= kept
        block = refs[slot, refpool.HEAD_FIRST] - 1
        while remaining > 0 and 0 <= block < refs.shape[0] - capacity:
            record = capacity + block
            link = refs[record, per_block]
            if link < refpool.MARK:
                break  # (not reached by the subtraction)
            for j in range(min(per_block, remaining)):
                rows[refs[record, j], R_COUNT] += 1
            refs[record, per_block] = link - refpool.MARK
            used += 1
            remaining -= per_block
            block = link - refpool.MARK - 1
    return used


@kernel
def _holds_refs(meta, slot):
    state = meta[slot, M_STATE]
    return state == codes.READY or state == codes.WRITING or state == codes.DRAINING


@kernel
def _add_refs(meta, refs, rows, fresh, step):
    for slot in range(fresh):
        if _holds_refs(meta, slot):
            for j in range(refs.shape[1]):
                rows[refs[slot, j], R_COUNT] += step

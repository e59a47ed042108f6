"""Item bookkeeping of one table, without locks: the callers in ``table`` hold the lock.

Every function takes the table's arrays ``(ctrl, fctrl, meta, prio, trees)`` (see
``shmreplay._shm.layout``). Structures kept for every live item:

* the dense ``M_LIVE`` array (uniform sampling, size, rebuilds),
* a doubly linked list in insertion order (Fifo: head, Lifo: tail),
* per selector role (0 sampler, 1 remover): a sum-tree (Prioritized) or a heap.

A slot's ``M_STATE`` is written *last* when an item is added and *first* when it is
removed, so after a crash at any instruction the states alone say which items exist,
and ``rebuild`` can recompute everything else from them.
"""

import numpy as np

from shmreplay._shm.kernels import codes, heap, inlined_kernel, kernel, rows as step_rows, sumtree
from shmreplay._shm.kernels.sumtree import weight
from shmreplay._shm.layout import (
    C_CAPACITY, C_DELETES, C_FREE_HEAD, C_FREE_TOP, C_FRESH, C_HEAD, C_HEAP_N0, C_INSERTS, C_MAX_SIZE, C_MIN_SIZE,
    C_NEXT_ID, C_ORDER_SEQ, C_PENDING, C_SAMPLER_KIND, C_SAMPLES, C_SIZE, C_SLOT_BITS,
    C_TAIL, C_TOTAL_DELETED, C_TREE_LEAVES, C_UPDATE_SEQ, F_EXPONENT0, F_MAX_DIFF,
    F_MIN_DIFF, F_SAMPLES_PER_INSERT, F_SCRATCH, M_HEAP0, M_HEAP_POS0, M_KEY, M_LIVE,
    M_LIVE_POS, M_NEXT, M_ORDER, M_PREV, M_STATE, M_TIMES, M_UPDATE, C_COMMIT_MARK, C_ROWS_DIRTY,
    C_SLOT_LIMIT)


@kernel
def can_insert(ctrl, fctrl, n):
    """Reverb's ``CanInsert(n)``; reserved-but-uncommitted items count as inserted."""
    inserts = ctrl[C_INSERTS] + ctrl[C_PENDING]
    if inserts + n - ctrl[C_DELETES] <= ctrl[C_MIN_SIZE]:
        return True
    return (inserts + n) * fctrl[F_SAMPLES_PER_INSERT] - ctrl[C_SAMPLES] <= fctrl[F_MAX_DIFF]


@kernel
def can_sample(ctrl, fctrl, n):
    """Reverb's ``CanSample(n)``."""
    if ctrl[C_INSERTS] - ctrl[C_DELETES] < ctrl[C_MIN_SIZE]:
        return False
    return ctrl[C_INSERTS] * fctrl[F_SAMPLES_PER_INSERT] - ctrl[C_SAMPLES] - n >= fctrl[F_MIN_DIFF]


@kernel
def sample_credit(ctrl, fctrl, wanted):
    """How many of ``wanted`` samples the limiter allows right now (assumes ``can_sample(1)``)."""
    min_diff = fctrl[F_MIN_DIFF]
    if min_diff < -1e300:
        return wanted
    credit = ctrl[C_INSERTS] * fctrl[F_SAMPLES_PER_INSERT] - ctrl[C_SAMPLES] - min_diff
    if credit >= wanted:  # compared as floats: a huge credit must not overflow int64
        return wanted
    return max(1, int(np.floor(credit)))


@kernel
def free_count(ctrl):
    return ctrl[C_FREE_TOP] + ctrl[C_CAPACITY] - ctrl[C_FRESH]


@kernel
def beyond_reserved(ctrl, n):
    """Whether taking ``n`` free slots (the caller checked ``free_count``) would take a
    fresh one whose store rows are not reserved yet (``C_SLOT_LIMIT``): the call then
    returns ``GROW`` before it changes anything."""
    return ctrl[C_FRESH] + n - ctrl[C_FREE_TOP] > ctrl[C_SLOT_LIMIT]


@kernel
def pop_free(ctrl, meta):
    """A free slot, or -1. Recently freed slots first (their pages are warm).

    Freed slots form a linked stack through ``M_NEXT`` (``C_FREE_HEAD``, ``C_FREE_TOP``
    counts them); slots never used yet come from the high-water mark ``C_FRESH``.
    """
    if ctrl[C_FREE_TOP] > 0:
        slot = ctrl[C_FREE_HEAD]
        ctrl[C_FREE_HEAD] = meta[slot, M_NEXT]
        ctrl[C_FREE_TOP] -= 1
        return slot
    fresh = ctrl[C_FRESH]
    if fresh < ctrl[C_CAPACITY]:
        ctrl[C_FRESH] = fresh + 1
        return fresh
    return -1


@kernel
def pop_free_block(ctrl, meta, n, out_slots):
    """Takes ``n`` free slots (the caller checked ``free_count``).

    The stack's top ``n`` come out in push order: slots that a FIFO remover freed in
    ascending order are reused in ascending order, so a batch usually lands in one
    contiguous run of slots (one memcpy per column instead of a scatter).
    """
    from_stack = min(n, ctrl[C_FREE_TOP])
    for i in range(from_stack):
        slot = ctrl[C_FREE_HEAD]
        ctrl[C_FREE_HEAD] = meta[slot, M_NEXT]
        out_slots[from_stack - 1 - i] = slot
    ctrl[C_FREE_TOP] -= from_stack
    fresh = ctrl[C_FRESH]
    for i in range(from_stack, n):
        out_slots[i] = fresh
        fresh += 1
    ctrl[C_FRESH] = fresh


@inlined_kernel
def push_free(ctrl, meta, slot):
    meta[slot, M_NEXT] = ctrl[C_FREE_HEAD]
    ctrl[C_FREE_HEAD] = slot
    ctrl[C_FREE_TOP] += 1


@kernel
def _indexed(ctrl, role):
    """Whether the role's selector keeps an index of the items (a sum-tree or a heap).

    Callers test this before calling ``_role_add``/``_role_remove``: a call passing the
    table's arrays costs tens of nanoseconds, which was most of a Uniform/Fifo insert.
    """
    kind = ctrl[C_SAMPLER_KIND + role]
    return kind == codes.PRIORITIZED or kind == codes.MIN_HEAP or kind == codes.MAX_HEAP


@kernel
def _role_add(ctrl, fctrl, meta, prio, trees, role, slot):
    kind = ctrl[C_SAMPLER_KIND + role]
    if kind == codes.PRIORITIZED:
        sumtree.set_leaf(trees[role], ctrl[C_TREE_LEAVES], slot,
                         weight(prio[slot], fctrl[F_EXPONENT0 + role]))
    elif kind == codes.MIN_HEAP or kind == codes.MAX_HEAP:
        n = ctrl[C_HEAP_N0 + role]
        heap.push(meta, prio, M_HEAP0 + role, M_HEAP_POS0 + role, n, slot, kind == codes.MIN_HEAP)
        ctrl[C_HEAP_N0 + role] = n + 1


@kernel
def _role_remove(ctrl, meta, prio, trees, role, slot):
    kind = ctrl[C_SAMPLER_KIND + role]
    if kind == codes.PRIORITIZED:
        sumtree.set_leaf(trees[role], ctrl[C_TREE_LEAVES], slot, 0.0)
    elif kind == codes.MIN_HEAP or kind == codes.MAX_HEAP:
        n = ctrl[C_HEAP_N0 + role]
        heap.remove(meta, prio, M_HEAP0 + role, M_HEAP_POS0 + role, n, slot, kind == codes.MIN_HEAP)
        ctrl[C_HEAP_N0 + role] = n - 1


@kernel
def fix_role(ctrl, fctrl, meta, prio, trees, role, slot):
    kind = ctrl[C_SAMPLER_KIND + role]
    if kind == codes.PRIORITIZED:
        sumtree.set_leaf(trees[role], ctrl[C_TREE_LEAVES], slot,
                         weight(prio[slot], fctrl[F_EXPONENT0 + role]))
    elif kind == codes.MIN_HEAP or kind == codes.MAX_HEAP:
        heap.fix(meta, prio, M_HEAP0 + role, M_HEAP_POS0 + role, ctrl[C_HEAP_N0 + role], slot,
                 kind == codes.MIN_HEAP)


@inlined_kernel
def add(ctrl, fctrl, meta, prio, trees, slot, priority, tree0):
    """Makes a WRITING slot a live item; returns its new key.

    ``tree0=False`` leaves the sampler's sum-tree to the caller (``sumtree.set_leaves``
    for a whole batch at once).
    """
    item_id = ctrl[C_NEXT_ID]
    ctrl[C_NEXT_ID] = item_id + 1
    key = (item_id << ctrl[C_SLOT_BITS]) | slot
    meta[slot, M_KEY] = key
    meta[slot, M_ORDER] = ctrl[C_ORDER_SEQ]
    ctrl[C_ORDER_SEQ] += 1
    meta[slot, M_UPDATE] = ctrl[C_UPDATE_SEQ]
    ctrl[C_UPDATE_SEQ] += 1
    meta[slot, M_TIMES] = 0
    prio[slot] = priority
    n = ctrl[C_SIZE]
    meta[n, M_LIVE] = slot
    meta[slot, M_LIVE_POS] = n
    ctrl[C_SIZE] = n + 1
    tail = ctrl[C_TAIL]
    meta[slot, M_PREV] = tail
    meta[slot, M_NEXT] = -1
    if tail >= 0:
        meta[tail, M_NEXT] = slot
    else:
        ctrl[C_HEAD] = slot
    ctrl[C_TAIL] = slot
    if _indexed(ctrl, 0) and (tree0 or ctrl[C_SAMPLER_KIND] != codes.PRIORITIZED):
        _role_add(ctrl, fctrl, meta, prio, trees, 0, slot)
    if _indexed(ctrl, 1):
        _role_add(ctrl, fctrl, meta, prio, trees, 1, slot)
    meta[slot, M_STATE] = codes.READY
    return key


@inlined_kernel
def free_slot(ctrl, meta, refs, rows, slot):
    """Returns a slot that is no longer an item (or a reservation) to the free stack;
    with step storage, its rows lose a reference."""
    if refs.shape[1] > 0:
        step_rows.release(ctrl, meta, refs, rows, slot)
    push_free(ctrl, meta, slot)


@inlined_kernel
def remove(ctrl, meta, prio, trees, refs, rows, slot, tree0):
    """Deletes a live item (a rate-limiter delete) and frees its slot (``tree0``: as in add)."""
    unlink(ctrl, meta, prio, trees, slot, tree0, codes.FREE)
    free_slot(ctrl, meta, refs, rows, slot)


@inlined_kernel
def unlink(ctrl, meta, prio, trees, slot, tree0, state):
    """Deletes a live item from every structure, leaving its slot in ``state`` (FREE to
    be freed by the caller, or DRAINING to keep its data until a sampler copied it)."""
    meta[slot, M_STATE] = state
    pos = meta[slot, M_LIVE_POS]
    last_pos = ctrl[C_SIZE] - 1
    last = meta[last_pos, M_LIVE]
    meta[pos, M_LIVE] = last
    meta[last, M_LIVE_POS] = pos
    ctrl[C_SIZE] = last_pos
    prev = meta[slot, M_PREV]
    nxt = meta[slot, M_NEXT]
    if prev >= 0:
        meta[prev, M_NEXT] = nxt
    else:
        ctrl[C_HEAD] = nxt
    if nxt >= 0:
        meta[nxt, M_PREV] = prev
    else:
        ctrl[C_TAIL] = prev
    if _indexed(ctrl, 0) and (tree0 or ctrl[C_SAMPLER_KIND] != codes.PRIORITIZED):
        _role_remove(ctrl, meta, prio, trees, 0, slot)
    if _indexed(ctrl, 1):
        _role_remove(ctrl, meta, prio, trees, 1, slot)
    ctrl[C_DELETES] += 1
    ctrl[C_TOTAL_DELETED] += 1


@kernel
def lookup(ctrl, meta, key):
    """The slot of the live item with ``key``, or -1 (unknown, deleted or stale key)."""
    if key <= 0:
        return -1
    slot = key & ((1 << ctrl[C_SLOT_BITS]) - 1)
    if slot >= ctrl[C_CAPACITY]:
        return -1
    if meta[slot, M_STATE] != codes.READY or meta[slot, M_KEY] != key:
        return -1
    return slot


@inlined_kernel
def select(ctrl, fctrl, meta, trees, role, prob_out):
    """Picks one live item with the role's selector; its probability goes to ``prob_out[0]`` (float64)."""
    kind = ctrl[C_SAMPLER_KIND + role]
    size = ctrl[C_SIZE]
    if kind == codes.FIFO:
        prob_out[0] = 1.0
        return ctrl[C_HEAD]
    if kind == codes.LIFO:
        prob_out[0] = 1.0
        return ctrl[C_TAIL]
    if kind == codes.MIN_HEAP or kind == codes.MAX_HEAP:
        prob_out[0] = 1.0
        return meta[0, M_HEAP0 + role]
    if kind == codes.PRIORITIZED:
        tree = trees[role]
        total = tree[1]
        if total > 0.0:
            leaves = ctrl[C_TREE_LEAVES]
            slot = sumtree.draw_one(tree, leaves)
            prob_out[0] = tree[leaves + slot] / total
            return slot
    prob_out[0] = 1.0 / size
    return meta[np.random.randint(0, size), M_LIVE]


@kernel
def clear(ctrl, meta, prio, trees, refs, rows):
    """Removes every live item without counting deletes (``reset``)."""
    leaves = ctrl[C_TREE_LEAVES]
    for pos in range(ctrl[C_SIZE]):
        slot = meta[pos, M_LIVE]
        meta[slot, M_STATE] = codes.FREE
        for role in range(2):
            if ctrl[C_SAMPLER_KIND + role] == codes.PRIORITIZED:
                sumtree.set_leaf(trees[role], leaves, slot, 0.0)
        free_slot(ctrl, meta, refs, rows, slot)
    ctrl[C_SIZE] = 0
    ctrl[C_HEAD] = -1
    ctrl[C_TAIL] = -1
    ctrl[C_HEAP_N0] = 0
    ctrl[C_HEAP_N0 + 1] = 0


@kernel
def _sort_by_order(ctrl, meta, live, size):
    """Sorts ``live[:size]`` in place by each slot's insertion order.

    Slots usually hold items in insertion order (a restored or FIFO-filled table) and
    ``rebuild`` lists them from the highest slot down: that case is one reversal.
    Otherwise a bottom-up merge sort of ``order << slot_bits | slot`` values, ping-ponging
    between the two heap columns of ``meta`` (free scratch: ``rebuild`` refills the heaps
    afterwards). Its passes are sequential: 300,000 items in random slots sort in 66 ms,
    where a heapsort through the slots took 193 ms.
    """
    descending = True
    for j in range(1, size):
        if meta[live[j], M_ORDER] >= meta[live[j - 1], M_ORDER]:
            descending = False
            break
    if descending:
        for j in range(size // 2):
            live[j], live[size - 1 - j] = live[size - 1 - j], live[j]
        return
    bits = ctrl[C_SLOT_BITS]
    src, dst = M_HEAP0, M_HEAP0 + 1
    for j in range(size):
        slot = live[j]
        meta[j, src] = (meta[slot, M_ORDER] << bits) | slot
    width = 1
    while width < size:
        for lo in range(0, size, 2 * width):
            mid = min(lo + width, size)
            hi = min(lo + 2 * width, size)
            a, b = lo, mid
            for out in range(lo, hi):
                if b >= hi or (a < mid and meta[a, src] <= meta[b, src]):
                    meta[out, dst] = meta[a, src]
                    a += 1
                else:
                    meta[out, dst] = meta[b, src]
                    b += 1
        src, dst = dst, src
        width *= 2
    mask = (1 << bits) - 1
    for j in range(size):
        live[j] = meta[j, src] & mask


@kernel
def rebuild(ctrl, fctrl, meta, prio, trees, refs, rows):
    """Recomputes every derived structure from the slot states (after a holder died).

    Row reference counts need the table's step arrays: a caller that has not mapped
    them (width mismatch) leaves that part to the next caller that has (``C_ROWS_DIRTY``).
    """
    fresh = ctrl[C_FRESH]
    bits = ctrl[C_SLOT_BITS]
    size = 0
    pending = 0
    max_id = 0
    ctrl[C_FREE_TOP] = 0
    ctrl[C_FREE_HEAD] = -1
    # A batch commit that its process did not finish is rolled back: its items (the
    # ones from the mark's insertion order on) are freed, so a batch is all or nothing.
    # The mark is cleared only at the end, so a rebuild that dies half-way is redone.
    rollback_from = ctrl[C_COMMIT_MARK] - 1
    for slot in range(fresh - 1, -1, -1):  # so the lowest free slot ends on top
        state = meta[slot, M_STATE]
        if state == codes.READY and 0 <= rollback_from <= meta[slot, M_ORDER]:
            state = codes.FREE
        if state == codes.READY:
            meta[size, M_LIVE] = slot
            meta[slot, M_LIVE_POS] = size
            size += 1
            max_id = max(max_id, meta[slot, M_KEY] >> bits)
        elif state == codes.WRITING:
            pending += 1
        elif state == codes.DRAINING:
            pass  # a sampler still copies it; it frees the slot (or dies: reclaimed)
        else:
            meta[slot, M_STATE] = codes.FREE
            push_free(ctrl, meta, slot)
    ctrl[C_SIZE] = size
    ctrl[C_PENDING] = pending
    ctrl[C_NEXT_ID] = max(ctrl[C_NEXT_ID], max_id + 1)
    # The size test of the rate limiter must agree with the items that exist.
    ctrl[C_DELETES] = ctrl[C_INSERTS] - size
    live = meta[:, M_LIVE]
    _sort_by_order(ctrl, meta, live, size)
    ctrl[C_HEAD] = -1
    ctrl[C_TAIL] = -1
    max_order = -1
    max_update = -1
    for j in range(size):
        slot = live[j]
        meta[slot, M_LIVE_POS] = j
        tail = ctrl[C_TAIL]
        meta[slot, M_PREV] = tail
        meta[slot, M_NEXT] = -1
        if tail >= 0:
            meta[tail, M_NEXT] = slot
        else:
            ctrl[C_HEAD] = slot
        ctrl[C_TAIL] = slot
        max_order = max(max_order, meta[slot, M_ORDER])
        max_update = max(max_update, meta[slot, M_UPDATE])
    ctrl[C_ORDER_SEQ] = max(ctrl[C_ORDER_SEQ], max_order + 1)
    ctrl[C_UPDATE_SEQ] = max(ctrl[C_UPDATE_SEQ], max_update + 1)
    leaves = ctrl[C_TREE_LEAVES]
    for role in range(2):
        kind = ctrl[C_SAMPLER_KIND + role]
        if kind == codes.PRIORITIZED:
            tree = trees[role]
            tree[leaves:leaves + fresh] = 0.0
            for j in range(size):
                slot = live[j]
                tree[leaves + slot] = weight(prio[slot], fctrl[F_EXPONENT0 + role])
            sumtree.rebuild(tree, leaves)
        elif kind == codes.MIN_HEAP or kind == codes.MAX_HEAP:
            ctrl[C_HEAP_N0 + role] = 0
            for j in range(size):
                _role_add(ctrl, fctrl, meta, prio, trees, role, live[j])
    if step_rows.mapped(ctrl, refs, rows):
        if refs.shape[1] > 0:
            step_rows.rebuild(ctrl, meta, refs, rows)
    else:
        ctrl[C_ROWS_DIRTY] = 1
    # A commit that died during its evictions left the table over max_size: finish them.
    while ctrl[C_SIZE] > ctrl[C_MAX_SIZE]:
        victim = select(ctrl, fctrl, meta, trees, 1, fctrl[F_SCRATCH:F_SCRATCH + 1])
        remove(ctrl, meta, prio, trees, refs, rows, victim, True)
    ctrl[C_COMMIT_MARK] = 0

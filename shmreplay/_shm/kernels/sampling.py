"""Sampling: drawing slots under the lock, and the checks after the lock-free copy.

``sample`` draws a batch and records each row in ``out_i``/``out_f`` (the ``OUT_*``
rows); ``sample_gather`` is the small-batch fast path (draw, copy and re-check in one
call); ``torn_rows`` is the seqlock re-check; ``importance_weights`` and ``seed`` need no
lock.
"""

import numpy as np

from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes, items, kernel, refpool, sumtree
from shmreplay._shm.kernels.locking import (
    BROKEN, _block, _bump, _lock_items, _stop_point, _unlock, _unlock_and_wake)
from shmreplay._shm.kernels.views import (
    TABLE_CAPACITY, TABLE_WEIGH_BETA, TABLE_WEIGH_NORMALIZE, _copies_fit, _table_arrays)
from shmreplay._shm.layout import (
    C_CLOSED, C_ITEMS_SEQ, C_ITEMS_WAITERS, C_MAX_TIMES_SAMPLED, C_NUM_UNIQUE, C_SAMPLER_KIND,
    C_SAMPLES, C_SIZE, C_RESERVES, C_SPACE_SEQ, C_TOTAL_SAMPLED, C_TREE_LEAVES, M_KEY, M_LIVE,
    M_STATE, M_TIMES, M_VERSION, M_WRITER, R_GEN)

# Rows of the int64 output block of ``sample``.
OUT_SLOT, OUT_KEY, OUT_TABLE_SIZE, OUT_TIMES, OUT_VERSION = range(5)


OUT_INT_ROWS = 5


# Rows of its float64 output block.
OUT_PROBABILITY, OUT_PRIORITY = range(2)


OUT_FLOAT_ROWS = 2


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
    if refs.shape[1] > 0 and not refpool.pooled(meta, refs):
        # Row generations, for the seqlock re-check of step storage: a row can be handed
        # to another writer (once no item references it) while its slot is unused.
        # (Pooled items are checked by their slot's state instead: see ``torn_rows``.)
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


# Its ``layout``: where each output is in its byte block ``out`` (the importance weights
# float32 ``[batch]``, and the float64 ``(beta, normalize)`` they were computed with:
# beta NaN if none were), then three entries per column (output start, store start in
# the data segment, row bytes).
(LAYOUT_OUT_I, LAYOUT_OUT_F, LAYOUT_TIMES, LAYOUT_TORN, LAYOUT_IO, LAYOUT_WEIGHTS,
 LAYOUT_WEIGHED) = range(7)


LAYOUT_COLUMNS = 7


# Its ``io``: ``sample``'s three entries, the rows drawn, and how many may be torn.
GATHER_COUNT, GATHER_TORN = 3, 4


GATHER_IO = 5


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

    If the handle asks for importance weights (``table[TABLE_WEIGH_NORMALIZE] >= 0``), a
    finished batch also gets them, as ``importance_weights`` computes them, into its
    weights; its ``(beta, normalize)`` record says with which (beta NaN: none computed).

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
    weighed = out[layout[LAYOUT_WEIGHED]:layout[LAYOUT_WEIGHED] + 16].view(np.float64)
    weighed[0] = np.nan
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
        normalize = table[TABLE_WEIGH_NORMALIZE]
        if normalize >= 0:
            beta = table[TABLE_WEIGH_BETA:TABLE_WEIGH_BETA + 1].view(np.float64)[0]
            weights = out[layout[LAYOUT_WEIGHTS]:layout[LAYOUT_WEIGHTS] + batch * 4].view(
                np.float32)
            importance_weights(out_f[OUT_PROBABILITY], out_i[OUT_TABLE_SIZE], beta,
                               normalize > 0, weights)
            weighed[1] = normalize
            weighed[0] = beta
        return count
    return codes.UNFINISHED


@kernel
def seed(value):
    np.random.seed(value)


@kernel
def torn_rows(meta, refs, rows, slots, versions, gens, out_rows):
    """Batch rows to redraw because their data may have been overwritten while copied
    (the seqlock re-check): the slot was reserved again, or a step row it references
    was handed out again.

    A pooled item (``refpool``) holds its rows and blocks while its slot holds it
    (READY, or DRAINING for the sampler that deleted it); once freed, they may be reused
    at once, so it is torn if its slot was freed at all."""
    count = 0
    pooled = refpool.pooled(meta, refs)
    for i in range(slots.shape[0]):
        slot = slots[i]
        torn = meta[slot, M_VERSION] != versions[i]
        if pooled:
            state = meta[slot, M_STATE]
            torn = torn or not (state == codes.READY or state == codes.DRAINING)
        else:
            for k in range(refs.shape[1]):
                torn = torn or rows[refs[slot, k], R_GEN] != gens[i, k]
        if torn:
            out_rows[count] = i
            count += 1
    return count


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

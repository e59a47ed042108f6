"""Variable-length step references: each item's references in its slot's head and a
chain of pool blocks.

A table whose items have columns of any length (a signature with a ``None`` time
dimension) cannot give every slot a fixed row of references. Its ``refs`` array has
``capacity + P`` records of ``K`` int32 (``K = refs.shape[1]``):

* records ``0 .. capacity-1`` are **slot heads**: ``[first, total, length_0, ..,
  length_{C-1}, ref_0, .., ref_{I-1}]``: the item's first block (encoded as below), how
  many references it holds, each column's length (``C = C_REF_COLUMNS`` columns), and
  its first ``I = K - 2 - C`` references **inline** (``inline``): an item like the
  first one the table took fits its head (``K`` is sized for it), so it costs one record,
  as a fixed-length item does;
* records ``capacity + b`` are **blocks** ``b = 0 .. P-1``: ``K - 1`` references, then a
  link. An item's references are its columns' references one after another: the first
  ``I`` in its head, the rest in its chain.

A block's link (and a head's ``first``) is ``b + 1`` for the next block ``b``, 0 for
none; ``MARK`` is added while a rebuild marks the blocks it reached. A free block's
link is ``-2 - next free`` (-1 ends the stack), as step rows' counts are
(``shmreplay._shm.kernels.rows``): a used link is never negative.

``shmreplay._shm.kernels.rows`` releases an item (it frees rows too). Everything runs
under the table's lock except ``lengths`` and ``gather_rows``, which samplers call
after it; they check every index they read (the item may be removed and its blocks
reused meanwhile: the sampler's version check then redraws it), so a torn read can only
give wrong rows, never a wrong address or an endless walk.

Whether a table uses the pool is in its array shapes: ``refs`` has more records than
the table has slots (``pooled``).
"""

from shmreplay._shm.kernels import codes, kernel
from shmreplay._shm.layout import (
    C_BLOCK_FREE_HEAD, C_BLOCK_FREE_TOP, C_BLOCK_FRESH, C_REF_COLUMNS, M_STATE, R_COUNT)

MARK = 1 << 30  # added to the links of blocks a rebuild reached (blocks < MARK)
HEAD_FIRST, HEAD_TOTAL, HEAD_LENGTHS = 0, 1, 2


@kernel
def pooled(meta, refs):
    return refs.shape[0] > meta.shape[0]


@kernel
def inline(refs, columns):
    """References an item keeps in its slot's head."""
    return refs.shape[1] - HEAD_LENGTHS - columns


@kernel
def blocks_for(total, width, inline_refs):
    """Blocks an item of ``total`` references takes (``width - 1`` per block, after the
    ``inline_refs`` in its head)."""
    return max(0, (total - inline_refs + width - 2) // (width - 1))


@kernel
def free_blocks(ctrl, meta, refs):
    return ctrl[C_BLOCK_FREE_TOP] + (refs.shape[0] - meta.shape[0]) - ctrl[C_BLOCK_FRESH]


@kernel
def _pop_block(ctrl, meta, refs):
    """A free block (the caller checked ``free_blocks``). Recently freed first."""
    capacity = meta.shape[0]
    link = refs.shape[1] - 1
    if ctrl[C_BLOCK_FREE_TOP] > 0:
        block = ctrl[C_BLOCK_FREE_HEAD]
        ctrl[C_BLOCK_FREE_HEAD] = -2 - refs[capacity + block, link]
        ctrl[C_BLOCK_FREE_TOP] -= 1
    else:
        block = ctrl[C_BLOCK_FRESH]
        ctrl[C_BLOCK_FRESH] = block + 1
    return block


@kernel
def push_block(ctrl, meta, refs, block):
    refs[meta.shape[0] + block, refs.shape[1] - 1] = -2 - ctrl[C_BLOCK_FREE_HEAD]
    ctrl[C_BLOCK_FREE_HEAD] = block
    ctrl[C_BLOCK_FREE_TOP] += 1


@kernel
def write_item(ctrl, meta, refs, rows, slot, out_rows, ref_steps):
    """Writes the references of the item in ``slot`` and counts them on their rows.

    ``ref_steps``: the item's column lengths (``C_REF_COLUMNS`` of them), then per
    reference the distinct step it reads (an index into ``out_rows``). The caller
    checked that enough blocks are free. The head's total and first block are written
    last, so a crash before leaves the slot without blocks (a rebuild frees the
    unreached ones; the slot is not WRITING yet, so its rows are not counted).
    """
    columns = ctrl[C_REF_COLUMNS]
    for c in range(columns):
        refs[slot, HEAD_LENGTHS + c] = ref_steps[c]
    _place(ctrl, meta, refs, rows, slot, out_rows, ref_steps[columns:], columns)


@kernel
def _place(ctrl, meta, refs, rows, slot, out_rows, steps, columns):
    """Puts ``out_rows[steps[j]]`` as the item's ``j``-th reference (head, then new
    blocks), counts each on its row, and sets the head's total and first block last.
    ``out_rows`` is None-like when ``steps`` are rows already (``load``: see there)."""
    capacity = meta.shape[0]
    per_block = refs.shape[1] - 1
    total = steps.shape[0]
    kept = min(total, inline(refs, columns))
    base = HEAD_LENGTHS + columns
    for j in range(kept):
        row = out_rows[steps[j]] if out_rows.shape[0] > 0 else steps[j]
        refs[slot, base + j] = row
        rows[row, R_COUNT] += 1
    first = 0
    previous = -1
    for start in range(kept, total, per_block):
        block = _pop_block(ctrl, meta, refs)
        record = capacity + block
        for j in range(min(per_block, total - start)):
            row = out_rows[steps[start + j]] if out_rows.shape[0] > 0 else steps[start + j]
            refs[record, j] = row
            rows[row, R_COUNT] += 1
        refs[record, per_block] = 0
        if previous >= 0:
            refs[capacity + previous, per_block] = block + 1
        else:
            first = block + 1
        previous = block
    refs[slot, HEAD_TOTAL] = total
    refs[slot, HEAD_FIRST] = first


@kernel
def count_refs(ctrl, meta, refs, rows, slot, step):
    """Adds ``step`` to the count of every row the item in ``slot`` references and
    marks its blocks (``verify``; ``unmark`` undoes the marks). Returns 0, or where it
    found the item broken: 1 in its head (nothing changed), 2 in its chain (the head's
    rows counted, the blocks before the failing one counted and marked): a block out of
    range, free or reached twice, a row out of range, or too few blocks for its total."""
    capacity = meta.shape[0]
    per_block = refs.shape[1] - 1
    fresh = ctrl[C_BLOCK_FRESH]
    columns = ctrl[C_REF_COLUMNS]
    base = HEAD_LENGTHS + columns
    remaining = refs[slot, HEAD_TOTAL]
    kept = min(remaining, inline(refs, columns))
    for j in range(kept):
        if not 0 <= refs[slot, base + j] < rows.shape[0] - 1:
            return 1
    for j in range(kept):
        rows[refs[slot, base + j], R_COUNT] += step
    remaining -= kept
    block = refs[slot, HEAD_FIRST] - 1
    while remaining > 0:
        if not 0 <= block < fresh:
            return 2
        record = capacity + block
        link = refs[record, per_block]
        if not 0 <= link < MARK:
            return 2
        for j in range(min(per_block, remaining)):
            if not 0 <= refs[record, j] < rows.shape[0] - 1:
                return 2
        for j in range(min(per_block, remaining)):
            rows[refs[record, j], R_COUNT] += step
        refs[record, per_block] = link + MARK
        remaining -= per_block
        block = link - 1
    return 0


@kernel
def lengths_ok(ctrl, refs, slot):
    total = 0
    for c in range(ctrl[C_REF_COLUMNS]):
        length = refs[slot, HEAD_LENGTHS + c]
        if length < 0:
            return False
        total += length
    return total == refs[slot, HEAD_TOTAL]


@kernel
def rebuild_blocks(ctrl, meta, refs, rows, fresh_slots):
    """Recounts rows from the items of the slots that hold an item or a reservation
    (of the first ``fresh_slots``) and makes every block none of them reaches free
    again.

    Rows' counts must be zero on entry. A rebuild that dies half-way is redone: a
    chain it marked reads the same (links are taken modulo ``MARK``).
    """
    capacity = meta.shape[0]
    per_block = refs.shape[1] - 1
    fresh = ctrl[C_BLOCK_FRESH]
    columns = ctrl[C_REF_COLUMNS]
    base = HEAD_LENGTHS + columns
    for slot in range(fresh_slots):
        state = meta[slot, M_STATE]
        if not (state == codes.READY or state == codes.WRITING or state == codes.DRAINING):
            continue
        remaining = refs[slot, HEAD_TOTAL]
        kept = min(remaining, inline(refs, columns))
        for j in range(kept):
            row = refs[slot, base + j]
            if 0 <= row < rows.shape[0] - 1:
                rows[row, R_COUNT] += 1
        remaining -= kept
        block = refs[slot, HEAD_FIRST] % MARK - 1
        while remaining > 0 and 0 <= block < fresh:
            record = capacity + block
            link = refs[record, per_block]
            for j in range(min(per_block, remaining)):
                row = refs[record, j]
                if 0 <= row < rows.shape[0] - 1:
                    rows[row, R_COUNT] += 1
            if 0 <= link < MARK:
                refs[record, per_block] = link + MARK
            remaining -= per_block
            block = link % MARK - 1 if link >= 0 else -1
    ctrl[C_BLOCK_FREE_TOP] = 0
    ctrl[C_BLOCK_FREE_HEAD] = -1
    for block in range(fresh - 1, -1, -1):  # so the lowest free block ends on top
        record = capacity + block
        if refs[record, per_block] >= MARK:
            refs[record, per_block] -= MARK
        else:
            push_block(ctrl, meta, refs, block)


@kernel
def check_free_blocks(ctrl, meta, refs, used):
    """Whether the free stack holds exactly the ``fresh - used`` blocks no item uses."""
    capacity = meta.shape[0]
    per_block = refs.shape[1] - 1
    fresh = ctrl[C_BLOCK_FRESH]
    if not 0 <= fresh <= refs.shape[0] - capacity:
        return False
    free = 0
    block = ctrl[C_BLOCK_FREE_HEAD]
    while block >= 0 and free <= fresh:
        if block >= fresh or refs[capacity + block, per_block] >= 0:
            return False
        free += 1
        block = -2 - refs[capacity + block, per_block]
    return block == -1 and free == ctrl[C_BLOCK_FREE_TOP] and free + used == fresh


@kernel
def lengths(refs, capacity, columns, slots, out, widths):
    """Each sampled item's column lengths (``out [n, columns]``) and each column's
    longest (``widths``), read without the lock: clamped to ``0 ..`` (a torn read is
    redrawn by the caller). Returns whether every item has the same lengths."""
    same = True
    for c in range(columns):
        widths[c] = 0
    for i in range(slots.shape[0]):
        for c in range(columns):
            length = max(refs[slots[i], HEAD_LENGTHS + c], 0)
            out[i, c] = length
            widths[c] = max(widths[c], length)
            same = same and length == out[0, c]
    return same


@kernel
def gather_rows(refs, capacity, row_count, columns, slots, starts, widths, out):
    """The rows each sampled item's columns read, read without the lock: column ``c``
    of item ``i`` goes to ``out[i, starts[c]:starts[c] + widths[c]]``, padded with -1.

    Every block index and row is checked (blocks ``0 .. P-1``, rows ``0 ..
    row_count-1``, else -1) and the walk visits at most the blocks its total needs, so
    an item torn meanwhile gives wrong rows (redrawn by the caller), never a bad
    address. (Position -1 is the head: its inline references come first.)
    """
    pool = refs.shape[0] - capacity
    per_block = refs.shape[1] - 1
    kept = inline(refs, columns)
    base = HEAD_LENGTHS + columns
    for i in range(slots.shape[0]):
        slot = slots[i]
        record = slot  # the head first
        position = base
        end = base + kept
        link = refs[slot, HEAD_FIRST]
        hops = 0  # (a torn read may meet a cycle: at most ``pool`` blocks are walked)
        for c in range(columns):
            length = refs[slot, HEAD_LENGTHS + c]
            start = starts[c]
            width = widths[c]
            k = 0
            while k < length:
                if position == end:  # on to the next block
                    hops += 1
                    if not 0 < link <= pool or hops > pool:
                        break
                    record = capacity + link - 1
                    position = 0
                    end = per_block
                    link = refs[record, per_block] % MARK
                run = min(length - k, end - position)
                for j in range(min(run, width - k)):
                    row = refs[record, position + j]
                    out[i, start + k + j] = row if 0 <= row < row_count else -1
                position += run
                k += run
            for rest in range(min(k, width), width):
                out[i, start + rest] = -1


@kernel
def copy_padded(store, rows, out):
    """``out[i, k] = store[rows[i, k]]`` (rows of words: ``AnyLength`` views the store
    and ``out`` as the widest unsigned type that divides a row), zeros where ``rows``
    is -1: a column of a padded batch in one pass."""
    size = out.shape[2]
    for i in range(rows.shape[0]):
        for k in range(rows.shape[1]):
            row = rows[i, k]
            if row >= 0:
                for b in range(size):
                    out[i, k, b] = store[row, b]
            else:
                for b in range(size):
                    out[i, k, b] = 0


@kernel
def flatten(refs, capacity, columns, slots, out_lengths, out_refs):
    """Copies the items in ``slots`` out of the pool (a checkpoint, under the lock):
    their column lengths and, one after another, their references. Returns how many
    references were written."""
    per_block = refs.shape[1] - 1
    base = HEAD_LENGTHS + columns
    done = 0
    for i in range(slots.shape[0]):
        slot = slots[i]
        for c in range(columns):
            out_lengths[i, c] = refs[slot, HEAD_LENGTHS + c]
        remaining = refs[slot, HEAD_TOTAL]
        kept = min(remaining, inline(refs, columns))
        for j in range(kept):
            out_refs[done] = refs[slot, base + j]
            done += 1
        remaining -= kept
        block = refs[slot, HEAD_FIRST] % MARK - 1
        while remaining > 0 and block >= 0:
            record = capacity + block
            for j in range(min(per_block, remaining)):
                out_refs[done] = refs[record, j]
                done += 1
            remaining -= per_block
            block = refs[record, per_block] % MARK - 1
    return done


@kernel
def load(ctrl, meta, refs, rows, slots, item_lengths, flat_refs, no_rows):
    """Writes restored items into a new table's pool: ``item_lengths [n, columns]`` and
    their references one after another (``flat_refs``: rows already restored; pass an
    empty ``no_rows``), and counts them on their rows. Runs before the table is served."""
    columns = ctrl[C_REF_COLUMNS]
    start = 0
    for i in range(slots.shape[0]):
        slot = slots[i]
        total = 0
        for c in range(columns):
            refs[slot, HEAD_LENGTHS + c] = item_lengths[i, c]
            total += item_lengths[i, c]
        _place(ctrl, meta, refs, rows, slot, no_rows, flat_refs[start:start + total],
               columns)
        start += total

"""The general store's allocator: runs of arena pages for items of any shape.

An item that the table's fixed columns cannot hold is encoded into a run of pages
(``shmreplay._schema.general_codec``). Its slot's extent ``extents[slot]`` records
``(first page, pages, slot version, bytes)`` and each page of the run records the slot
(``owners[page] = slot + 1``). Nothing counts pages: a page is in use only while the
slot it names is live (WRITING, READY or DRAINING), at the version the slot's extent
records, and the page lies inside that extent. So freeing a slot (eviction, delete,
``max_times_sampled``, cancel, a dead writer's reclaim) frees its pages without a line
here, and after a crash the live slots alone say which pages are used: there is nothing
to rebuild. A slot reserved for a fixed-column item bumps its version, so its stale
extent no longer matches and it is not an arena item.

Nothing read from shared memory is trusted: an owner or extent out of range makes a
page free (the allocator) or a problem (``verify``), never an index.
"""

import numpy as np

from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes, items, kernel
from shmreplay._shm.kernels.inserting import _enter_insert
from shmreplay._shm.kernels.locking import (
    _bump, _lock_items, _stop_point, _unlock, _unlock_and_wake)
from shmreplay._shm.layout import (
    ARENA_PAGE, C_ARENA_ITEMS, C_ARENA_ROVER,
    C_FRESH, C_PENDING, C_RESERVES, C_SIZE, C_SPACE_SEQ, M_KEY, M_STATE,
    M_VERSION, M_WRITER, X_BYTES, X_PAGE, X_PAGES, X_VERSION)

ARENA = 256  # ``verify``'s bit: a live arena item's extent is out of range or not its own


@kernel
def holds(meta, extents, slot):
    """Whether ``slot`` (in range) holds, or is writing, an arena item."""
    state = meta[slot, M_STATE]
    return ((state == codes.READY or state == codes.WRITING or state == codes.DRAINING)
            and extents[slot, X_PAGES] > 0 and extents[slot, X_VERSION] == meta[slot, M_VERSION])


@kernel
def _used_until(meta, extents, owners, page):
    """The page after the live extent that covers ``page``, or -1 if ``page`` is free."""
    slot = owners[page] - 1
    if slot < 0 or slot >= meta.shape[0] or not holds(meta, extents, slot):
        return -1
    first = extents[slot, X_PAGE]
    end = first + extents[slot, X_PAGES]
    if 0 <= first <= page < end <= owners.shape[0]:
        return end
    return -1


@kernel
def _run_between(meta, extents, owners, need, start, stop):
    """The first page of ``need`` free pages in a row within ``[start, stop)``, or -1."""
    page = start
    while page < stop:
        if page - start >= need:
            return start
        end = _used_until(meta, extents, owners, page)
        if end < 0:
            page += 1
        else:
            page = end
            start = end
    return start if stop - start >= need else -1


@kernel
def find_run(ctrl, meta, extents, owners, need):
    """The first page of ``need`` free pages in a row, or -1: next fit from the rover
    (``C_ARENA_ROVER``, where the last run ended), then from the arena's start. The
    rover is a hint: any value of it is safe."""
    total = owners.shape[0]
    rover = ctrl[C_ARENA_ROVER]
    if rover < 0 or rover >= total:
        rover = 0
    first = _run_between(meta, extents, owners, need, rover, total)
    if first < 0 and rover > 0:
        # (a run may straddle the rover: search up to where one could end)
        first = _run_between(meta, extents, owners, need, 0, min(total, rover + need - 1))
    return first


@kernel
def arena_reserve(ctrl, fctrl, meta, prio, trees, refs, rows, extents, owners, need, nbytes, pid,
            was_waiting, register, io):
    """Reserves a slot and ``need`` arena pages for one encoded item of ``nbytes``.

    Waits (BLOCKED) like ``inserting.reserve`` for the rate limiter and a free slot.
    If no run of pages is free, the remover evicts items until one is (as
    ``reserve_item`` does for step rows); ``codes.NO_ARENA`` if even the emptied table has
    none. Returns the slot, or a negative status.
    """
    if need < 1 or need > owners.shape[0] or extents.shape[0] != meta.shape[0]:
        if need > owners.shape[0]:
            return codes.NO_ARENA
        return codes.TOO_BIG
    status = _enter_insert(ctrl, fctrl, meta, prio, trees, refs, rows, 1, was_waiting, register,
                           io)
    if status != 0:
        return status
    first = find_run(ctrl, meta, extents, owners, need)
    evicted = 0
    while first < 0 and ctrl[C_SIZE] > 0:
        victim = items.select(ctrl, fctrl, meta, trees, 1, io)
        items.remove(ctrl, meta, prio, trees, refs, rows, victim, True)
        evicted += 1
        first = find_run(ctrl, meta, extents, owners, need)
    if first < 0:
        if evicted:
            _bump(ctrl, C_SPACE_SEQ)
        _unlock_and_wake(ctrl, False, evicted > 0)
        return codes.NO_ARENA
    ctrl[C_RESERVES] += 1
    slot = items.pop_free(ctrl, meta)
    version = meta[slot, M_VERSION] + 1
    # The extent before the state: a crash anywhere here leaves either a FREE slot
    # (its pages free) or a WRITING one that owns them, which a reclaim frees.
    extents[slot, X_PAGE] = first
    extents[slot, X_PAGES] = need
    extents[slot, X_VERSION] = version
    extents[slot, X_BYTES] = nbytes
    for page in range(first, first + need):
        owners[page] = slot + 1
    ctrl[C_ARENA_ROVER] = first + need
    meta[slot, M_VERSION] = version
    meta[slot, M_WRITER] = pid
    meta[slot, M_STATE] = codes.WRITING
    ctrl[C_PENDING] += 1
    ctrl[C_ARENA_ITEMS] += 1
    _stop_point(ctrl, codes.STOP_ARENA_RESERVED)
    if evicted:
        _bump(ctrl, C_SPACE_SEQ)
    _unlock_and_wake(ctrl, False, evicted > 0)
    return slot


@kernel
def arena_read(ctrl, fctrl, meta, prio, trees, refs, rows, extents, owners, data, slots, out_keys,
         out_starts, out, io):
    """Copies the arena items among ``slots`` (ones the caller drew, READY or DRAINING
    for it) into ``out`` under the lock, so no copy is torn.

    For each ``slots[i]`` holding an arena item: ``out_keys[i]`` its key and
    ``out_starts[i]``/``out_starts[i + 1]`` where its bytes are in ``out``; for others
    ``out_keys[i] = 0``. Returns the bytes copied, or ``TOO_BIG`` (nothing copied) if
    ``out`` is too small (``io[0]`` then says how many bytes it needs).
    """
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    n = slots.shape[0]
    total = 0
    arena_bytes = data.shape[0]
    for i in range(n):
        slot = slots[i]
        if 0 <= slot < meta.shape[0] and holds(meta, extents, slot):
            size = extents[slot, X_BYTES]
            start = extents[slot, X_PAGE] * ARENA_PAGE
            if size > 0 and 0 <= start and start + size <= arena_bytes:
                total += size
    if total > out.shape[0]:
        io[0] = total
        _unlock(ctrl)
        return codes.TOO_BIG
    at = 0
    for i in range(n):
        slot = slots[i]
        out_starts[i] = at
        out_keys[i] = 0
        if 0 <= slot < meta.shape[0] and holds(meta, extents, slot):
            size = extents[slot, X_BYTES]
            start = extents[slot, X_PAGE] * ARENA_PAGE
            if size > 0 and 0 <= start and start + size <= arena_bytes:
                _sync.memcpy(out.ctypes.data + at, data.ctypes.data + start, size)
                out_keys[i] = meta[slot, M_KEY]
                at += size
    out_starts[n] = at
    _unlock(ctrl)
    return at


@kernel
def check(ctrl, meta, extents, owners):
    """``verify``'s arena check (lock held): every live arena item's extent lies in the
    arena, every page of it names the slot, and it holds a byte count that fits."""
    fresh = min(max(ctrl[C_FRESH], 0), meta.shape[0])
    pages = owners.shape[0]
    for slot in range(fresh):
        if not holds(meta, extents, slot):
            continue
        first = extents[slot, X_PAGE]
        count = extents[slot, X_PAGES]
        size = extents[slot, X_BYTES]
        if first < 0 or first + count > pages or size < 1 or size > count * ARENA_PAGE:
            return ARENA
        for page in range(first, first + count):
            if owners[page] != slot + 1:
                return ARENA
    return 0


@kernel
def arena_verify(ctrl, fctrl, meta, prio, trees, refs, rows, extents, owners):
    """``check`` under the table's lock; returns 0 or ``ARENA``."""
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    problems = check(ctrl, meta, extents, owners)
    _unlock(ctrl)
    return problems


def empty_views():
    """Placeholders for a table without an arena."""
    return (np.zeros((0, 4), np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8))

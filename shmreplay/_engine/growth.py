"""A data segment's stores, reserved as the table fills.

tmpfs allocates a page when it is first written, and a write that finds /dev/shm full
kills the writing process with SIGBUS. So no row of a store is written before its pages
are reserved (``posix_fallocate``); but reserving all of them when the table is made
would cost a table its full ``max_size`` from its first item (Reverb's own tests make
a table of a million 81x81 float64 items: 52 GiB).

So the stores are reserved in chunks. The table's control block says how many rows of
each store are reserved: ``C_SLOT_LIMIT`` slots of a whole-item table (whose rows are
slots), ``C_ROW_LIMIT`` step rows of a table of sequence items. The kernels that hand
out a never-used slot or row (the high-water marks ``C_FRESH``, ``C_ROW_FRESH``) never
hand one out at or past that watermark: they return ``GROW`` having changed nothing.
The caller then reserves the next chunk (``grow``: every store's rows from the
watermark to the new one, geometrically: doubling, but at least ``STEP`` and at most
``MOST`` bytes, since the caller waits while the pages are zeroed), raises the
watermark under the table's lock, and calls again. If /dev/shm
cannot hold the chunk, ``SharedMemoryFullError`` names the table and the sizes; nothing
was written, no slot taken.

Any process may grow a table: every process maps the same file, and reserving is
idempotent, so two that grow at once reserve the same pages twice, harmlessly. A
process killed between reserving and raising the watermark leaves reserved pages that
the next growth reserves again. A watermark is raised only for the layout its pages
were reserved in (``kernels.grow`` checks the generation).

Stores of ``WHOLE`` bytes or less are reserved whole when the segment is made, as every
other part of the segment is (slot records, references, the general store's arena).
"""

import numpy as np

from shmreplay import errors
from shmreplay._shm import layout as L
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay._shm import segment as _segment
from shmreplay._shm.kernels import table as kernels

STEP = 64 << 20        # bytes: the least one growth reserves
MOST = 1 << 30         # bytes: the most one growth reserves (it zeroes them, ~0.8 s/GiB)
WHOLE = 64 << 20       # stores this large or smaller are reserved whole at creation


def initial_rows(plan: L.DataPlan, at_least: int = 0) -> int:
    """The store rows reserved when a segment of ``plan`` is made: all of them for
    small stores, else one ``STEP`` (and at least ``at_least``: what a restore fills)."""
    per_row = sum(plan.row_bytes)
    total = plan.row_capacity
    if per_row * total <= WHOLE:
        return total
    return min(total, max(at_least, STEP // per_row, 1))


def creation_ranges(plan: L.DataPlan, rows: int):
    """``(rest, stores)``: the byte ranges reserved when the segment is made: everything
    but the stores, and the first ``rows`` rows of each store."""
    if not plan.stores:
        return [(0, plan.total_bytes)], []
    first, end = plan.stores[0], plan.forms
    rest = [(0, first), (end, plan.total_bytes - end)]
    return rest, L.store_ranges(plan, 0, rows)


def grow(engine, wanted: int):
    """Reserves more of ``engine``'s stores after a kernel returned ``GROW`` for a call
    that takes ``wanted`` slots (rows, for step storage), and raises the watermark.
    Another process may have grown the table meanwhile: the caller simply calls again.

    Raises:
      SharedMemoryFullError: /dev/shm cannot hold the next chunk (nothing changed).
      BufferBrokenError: the buffer was stopped.
    """
    ctrl, plan = engine.ctrl, engine.data_plan
    if plan is None:  # this process has not mapped the table's stores yet
        if engine.has_columns():
            return  # (mapped now: the caller calls again)
        raise errors.SchemaError(
            f"Table '{engine.name}' has no stores yet: its first item defines them, so "
            "nothing can be reserved before an insert or a writer's item maps them.")
    if int(ctrl[L.C_LAYOUT_GEN]) != engine.layout_gen:
        return  # (reset meanwhile: the call again maps the new layout, UNMAPPED)
    steps = bool(engine.storage.steps)
    word, fresh = (L.C_ROW_LIMIT, L.C_ROW_FRESH) if steps else (L.C_SLOT_LIMIT, L.C_FRESH)
    current, total = int(ctrl[word]), plan.row_capacity
    if current >= total:
        return
    per_row = max(sum(plan.row_bytes), 1)
    more = min(max(current, STEP // per_row), max(MOST // per_row, 1))
    target = min(total, max(current + max(more, 1), int(ctrl[fresh]) + max(int(wanted), 1)))

    def full(free):
        have = "an unknown amount" if free is None else _gib(free)
        return errors.SharedMemoryFullError(
            f"Table '{engine.name}': its data segment ({_segment.SHM_DIR}"
            f"{engine.data_segment.name}) cannot grow from {current} to {target} of its "
            f"{total} {'step rows' if steps else 'item slots'}: that needs "
            f"{_gib((target - current) * per_row)} more shared memory (the full table "
            f"needs {_gib(total * per_row)}), and {_segment.SHM_DIR} has {have} free. "
            "Nothing was inserted; the table is unchanged. Free /dev/shm (`shmreplay ls`, "
            "`shmreplay gc`), use a smaller max_size, or give the machine or container a "
            "larger /dev/shm (docker run --shm-size=...).")

    try:
        engine.data_segment.reserve(L.store_ranges(plan, current, target), full)
    except errors.BufferBrokenError:
        if int(ctrl[L.C_LAYOUT_GEN]) != engine.layout_gen:
            return  # (its segment was removed by a reset: as above)
        raise
    args = (target, 0) if not steps else (int(ctrl[L.C_SLOT_LIMIT]), target)
    status = _lock_waits.call(engine, None, None, "insert", kernels.grow,
                              np.int64(engine.layout_gen), *args)
    if status < 0:
        engine._raise_status(status)


def _gib(count: int) -> str:
    if count >= 1 << 30:
        return f"{count / 2**30:.2f} GiB"
    return f"{count / 2**20:.2f} MiB"

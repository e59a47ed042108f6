"""A table's arrays made natively from its header segment's bytes.

The fast paths pass the header segment and a few offsets instead of seven arrays
(passing an array costs about 70 ns); ``_table_arrays`` mirrors
``shmreplay._shm.layout.table_views``. ``_copies_fit`` checks raw-address copies first.
"""

import numpy as np

from shmreplay._shm.kernels import kernel
from shmreplay._shm.layout import CTRL_WORDS, F_WORDS, META_FIELDS, M_PRIO, ROW_FIELDS

# ``sample_gather``'s ``table``: where a table's arrays are in its header segment.
(TABLE_CTRL, TABLE_FCTRL, TABLE_META, TABLE_TREES, TABLE_CAPACITY, TABLE_TREE_LENGTH,
 TABLE_STAMP) = range(7)
# Then the handle's importance weights for ``sample_gather``: the bits of ``beta`` as a
# float64, and ``normalize`` (1 or 0; -1: weigh nothing). Set by
# ``shmreplay._engine.batch_outputs.Weighing``.
TABLE_WEIGH_BETA, TABLE_WEIGH_NORMALIZE = 7, 8
# Then the largest priority the table takes (float64 bits), and ``update_whole``'s
# scratch: int64 ``[2, TABLE_SCRATCH_KEYS]`` from ``TABLE_SCRATCH`` on (used only with
# the table's lock held, so the threads of a handle share it).
TABLE_LARGEST, TABLE_SCRATCH = 9, 10


TABLE_SCRATCH_KEYS = 64


TABLE_FIELDS = 6


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

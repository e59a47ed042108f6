"""Staging rows for small single inserts (``kernels.insert_staged``).

An actor's ``insert`` writes the item's leaves into a process-local staging block, and
one native call reserves a slot, copies the block into it and publishes the item under
a single lock hold. Items larger than ``STAGE_BELOW`` bytes are copied into shared
memory between two lock holds instead, as batches and writers are, so that a large
copy never holds the lock.
"""

import numpy as np

STAGE_BELOW = 8192
ALIGN = 64


def _align(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


class Staging:
    """One item's worth of staging rows.

    Attributes:
      block: the bytes.
      rows: per column, a ``[1, *shape]`` view of the block (``rows[c][0] = leaf``).
      layout: per column, the row's start in ``block``, the store's start in the data
        segment and the row's bytes (``kernels.insert_staged``'s ``layout``).
    """

    __slots__ = ("block", "rows", "layout")

    def __init__(self, column_specs, stores):
        starts, end = [], 0
        for spec in column_specs:
            starts.append(_align(end))
            end = starts[-1] + int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
        self.block = np.empty(end + ALIGN, np.uint8)
        first = -self.block.ctypes.data % ALIGN
        starts = [first + start for start in starts]
        self.rows = [np.ndarray((1,) + tuple(spec.shape), spec.dtype, self.block, start)
                     for spec, start in zip(column_specs, starts)]
        self.layout = np.array([number for start, store in zip(starts, stores)
                                for number in (start, *store)], np.int64)

    @staticmethod
    def fits(column_specs) -> bool:
        """Whether items of these columns are small enough to stage."""
        return sum(int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
                   for spec in column_specs) < STAGE_BELOW

"""Whole items: one row per slot in each column's store (``Client.insert`` first).

The fastest kind for single transitions: the fused kernels (``insert_staged``,
``reserve_whole``/``commit_whole``, ``sample_gather``) copy rows with raw addresses, so
mapping sets what they read on the engine: the data segment's bytes, each store's
``(start, row bytes)``, the reusable small-batch results and the staging rows.
"""

import numpy as np

from shmreplay._engine import batch_outputs as _batch_outputs
from shmreplay._engine import outputs as _outputs
from shmreplay._engine import staging as _staging
from shmreplay._engine.kinds.base import StorageKind, copy_rows
from shmreplay._shm import layout as L


class WholeItems(StorageKind):
    steps = False

    def __init__(self, engine, segment, plan):
        super().__init__(engine, segment, plan)
        engine._data_bytes = np.frombuffer(segment.buf, np.uint8)
        stores = [(start, column[0].nbytes if len(column) else 0)
                  for start, column in zip(plan.stores, engine.columns)]
        engine.whole_items = True
        engine._results = _batch_outputs.ResultPool(
            engine.column_specs, stores, engine._unflatten,
            _batch_outputs.Weighing(engine._table_offsets))
        # Staging rows for single inserts, one per thread inserting at once (None:
        # items too large to copy under the lock).
        engine._stores = stores
        engine._stagings = [] if _staging.Staging.fits(engine.column_specs) else None

    def reserve_items(self, count: int, timeout, arrays):
        return self.engine.reserve(count, timeout), None

    def write_items(self, slots, rows, arrays, batched: bool):
        self.engine.write(slots, arrays, batched)

    def gather(self, slots):
        size = slots.size
        return [column.take(slots, axis=0) if size * column.strides[0] < _outputs.POOL_FROM
                else _outputs.take(column, slots) for column in self.engine.columns]

    def stored(self, counters) -> int:
        return counters[L.C_SIZE] + counters[L.C_PENDING]

    def copy_held(self, out, rows, count: int, stored_rows: int):
        for column, copy in zip(self.engine.columns, out.stores):
            copy_rows(column, rows, copy[:count])

    def export(self, out, count: int) -> dict:
        return {f"store{index}": copy[:count] for index, copy in enumerate(out.stores)}

    def restore(self, saved, rows, count: int):
        for index, column in enumerate(self.engine.columns):
            if isinstance(rows, slice):  # (one run of slots: read straight into it)
                saved.read_into(f"store{index}", column[rows])
            else:  # (a memory write: only once every page is reserved, see _ops.restore)
                self.engine.data_segment.wait_reserved()
                column[rows] = saved.array(f"store{index}")

"""Step references: items reference shared step rows (a writer first).

Each store holds single steps in a row space shared by all stores; an item is, per
column, ``length`` references into it (``shmreplay._schema.storage``), so overlapping
items store a step once. Data given whole (``insert`` into such a table) gets new rows.
"""

import time

import numpy as np

from shmreplay import errors
from shmreplay._engine import outputs as _outputs
from shmreplay._engine.inserts import RECLAIM_EVERY
from shmreplay._engine.kinds.base import StorageKind, copy_rows
from shmreplay._shm import layout as L


class StepRefs(StorageKind):
    steps = True

    def __init__(self, engine, segment, plan):
        super().__init__(engine, segment, plan)
        self._split = None  # see ``_split_plan``

    def reserve_items(self, count: int, timeout, arrays):
        """Each item gets new rows (``_split_for`` says which reference uses which)."""
        engine = self.engine
        ref_steps, distinct = self._split_for(arrays)
        known = np.full(distinct, -1, np.int64)
        gens = np.zeros(distinct, np.int64)
        if count == 1:  # nothing else is held while this one waits
            slot, rows, _ = engine.reserve_item(known, gens, ref_steps, timeout)
            return np.array([slot], np.int64), rows.reshape(1, distinct)
        # Several items, one reservation each: take them all without waiting, or hand
        # back what was taken and wait, holding nothing, until the limiter admits them
        # all (holding some while waiting for the rest blocked other inserters).
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            slots = np.empty(count, np.int64)
            rows = np.empty((count, distinct), np.int64)
            done = 0
            try:
                for i in range(count):
                    slots[i], rows[i], _ = engine.reserve_item(known, gens, ref_steps, 0.0)
                    done += 1
                return slots, rows
            except errors.DeadlineExceededError:
                engine.cancel(slots[:done])
            except BaseException:
                engine.cancel(slots[:done])
                raise
            self._wait_until_insertable(count, deadline, timeout)

    def _wait_until_insertable(self, count: int, deadline, timeout):
        """Polls ``can_insert(count)`` (a rare path: batches into step storage)."""
        engine = self.engine
        pause = 0.0005
        next_reclaim = time.monotonic() + RECLAIM_EVERY
        while not engine.can_insert(count):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise errors.DeadlineExceededError(
                    f"Table '{engine.name}': the rate limiter did not allow {count} inserts "
                    f"within the timeout of {errors.seconds(timeout)}.")
            if now >= next_reclaim:
                engine.reclaim_dead_writers()
                next_reclaim = now + RECLAIM_EVERY
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
            pause = min(2 * pause, 0.01)

    def _split_for(self, arrays):
        """``_split_plan`` for data given whole (the same for every item here)."""
        return self._split_plan()

    def _split_plan(self):
        """How whole item data maps onto new rows: ``(ref_steps, distinct)``.

        Columns stored in different stores share rows (row ``j`` holds each column's
        ``j``-th step); columns sharing a store get rows of their own.
        """
        if self._split is None:
            used = {}
            ref_steps = []
            for column in self.engine.storage.columns:
                base = used.get(column.store, 0)
                ref_steps.extend(range(base, base + column.length))
                used[column.store] = base + column.length
            self._split = (np.array(ref_steps, np.int64), max(used.values()))
        return self._split

    def write_items(self, slots, rows, arrays, batched: bool):
        engine = self.engine
        for column, array, steps in zip(engine.storage.columns, arrays,
                                        self._column_steps(arrays)):
            store = engine.columns[column.store]
            for i in range(len(slots)):
                value = array[i] if batched else array
                if column.squeeze:
                    store[rows[i, steps[0]]] = value
                else:
                    store[rows[i, steps]] = value

    def _column_steps(self, arrays):
        """Per column of data given whole, the item's steps (rows) it is written to."""
        ref_steps, _ = self._split_plan()
        return [ref_steps[column.offset:column.offset + column.length]
                for column in self.engine.storage.columns]

    def gather(self, slots):
        engine = self.engine
        refs = engine.refs.take(slots, axis=0)
        data = []
        for column in engine.storage.columns:
            if column.squeeze:
                rows = refs[:, column.offset]
            else:
                rows = refs[:, column.offset:column.offset + column.length]
            data.append(_outputs.take(engine.columns[column.store], rows))
        return data

    def stored(self, counters) -> int:
        return counters[L.C_ROWS_LIVE]

    def copy_held(self, out, rows, count: int, stored_rows: int):
        engine = self.engine
        copy_rows(engine.refs, rows, out.refs[:count])
        for store, copy in zip(engine.columns, out.stores):
            copy[:stored_rows] = store[:stored_rows]

    def export(self, out, count: int) -> dict:
        used, dense = np.unique(out.refs[:count], return_inverse=True)
        arrays = {"refs": dense.reshape(out.refs[:count].shape).astype(np.int32)}
        for index, copy in enumerate(out.stores):
            arrays[f"store{index}"] = copy[used]  # only the rows items reference, densely
        return arrays

    def restore(self, saved, rows, count: int):
        engine = self.engine
        stored = saved.layout["store0"][2][0]  # (not read: ``read_into`` reads it)
        if stored > int(engine.ctrl[L.C_ROW_CAPACITY]):
            raise ValueError(
                f"Table '{engine.name}': the checkpoint's items reference {stored} distinct "
                f"steps; a table of max_size {engine.config.max_size} stores at most "
                f"{int(engine.ctrl[L.C_ROW_CAPACITY])}.")
        refs = saved.array("refs")
        if count and (refs.min() < 0 or refs.max() >= stored):
            raise errors.CheckpointError(f"Checkpoint {saved.path}: table '{saved.name}' "
                                         "references steps it does not hold.")
        for index, store in enumerate(engine.columns):
            saved.read_into(f"store{index}", store[:stored])
        engine.refs[rows] = refs
        engine.ctrl[L.C_ROW_FRESH] = stored

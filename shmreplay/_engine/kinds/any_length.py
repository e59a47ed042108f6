"""Step references of items of any length: each item's references in pool blocks.

Like ``step_refs`` (items reference shared step rows, so a step is stored once), but
an item's columns may have any length, each its own: its references are a chain of
blocks in a pool (``shmreplay._shm.kernels.refpool``), and its slot's head records each
column's length. A batch comes back padded with zeros to its longest item, per column,
with the lengths (``Gathered.lengths``; ``docs/writers.md`` says why padding).
"""

import numpy as np

from shmreplay import errors
from shmreplay._engine import outputs as _outputs
from shmreplay._engine.kinds.step_refs import StepRefs
from shmreplay._shm import layout as L
from shmreplay._shm.kernels import refpool


class Gathered(list):
    """The columns of a gathered batch (padded), with ``lengths`` ``[n, columns]``;
    ``chained``: read through pool blocks (which a removal changes at once)."""

    lengths = None
    chained = False


class AnyLength(StepRefs):
    steps = True

    def __init__(self, engine, segment, plan):
        super().__init__(engine, segment, plan)
        self._columns = len(engine.storage.columns)
        self._squeezed = np.array([c.squeeze for c in engine.storage.columns])
        self._inline = int(engine.refs.shape[1]) - refpool.HEAD_LENGTHS - self._columns
        # Each store as rows of the widest words that divide a row, for ``copy_padded``.
        self._words = [_as_words(store) for store in engine.columns]

    def gather(self, slots):
        engine = self.engine
        columns = self._columns
        count = len(slots)
        lengths = np.empty((count, columns), np.int64)
        widths = np.empty(columns, np.int64)
        same = refpool.lengths(engine.refs, engine.capacity, columns, slots, lengths, widths)
        widths[self._squeezed] = 1
        starts = np.zeros(columns, np.int64)
        np.cumsum(widths[:-1], out=starts[1:])
        total = int(widths.sum())
        if count and same and total <= self._inline:
            # Every item has the same lengths and fits its head (a batch like the first
            # item): the references are one slice of the heads, and need no padding.
            return self._gather_uniform(slots, lengths, starts, widths, total)
        rows = np.empty((count, total), np.int64)
        refpool.gather_rows(engine.refs, engine.capacity, engine.rows.shape[0] - 1, columns,
                            slots, starts, widths, rows)
        data = Gathered()
        data.chained = True
        for c, column in enumerate(engine.storage.columns):
            store = engine.columns[column.store]
            width = int(widths[c])
            shape = (count,) + ((() if column.squeeze else (width,)) + store.shape[1:])
            values = _outputs.empty(shape, store.dtype)
            if values.size:
                words = self._words[column.store]
                refpool.copy_padded(words, rows[:, starts[c]:starts[c] + width],
                                    values.reshape(count, width, -1).view(words.dtype))
            data.append(values)
        data.lengths = np.minimum(lengths, widths)
        return data

    def _gather_uniform(self, slots, lengths, starts, widths, total):
        """``gather`` of items of one shape that fit their heads: as fixed references."""
        engine = self.engine
        base = refpool.HEAD_LENGTHS + self._columns
        rows = engine.refs.take(slots, axis=0)[:, base:base + total]
        data = Gathered()
        for c, column in enumerate(engine.storage.columns):
            picked = rows[:, starts[c]] if column.squeeze else \
                rows[:, starts[c]:starts[c] + widths[c]]
            data.append(_outputs.take(engine.columns[column.store], picked))
        data.lengths = lengths
        return data

    def put_row(self, data, row: int, values):
        """Puts one redrawn item (``values``: a one-item gather) at ``row`` of ``data``,
        widening a column whose new item is longer than the batch's."""
        for c, (column, value) in enumerate(zip(data, values)):
            if value.ndim > 1 and not self._squeezed[c] and value.shape[1] > column.shape[1]:
                wider = np.zeros((column.shape[0], value.shape[1]) + column.shape[2:],
                                 column.dtype)
                wider[:, :column.shape[1]] = column
                data[c] = column = wider
            if value.ndim > 1 and not self._squeezed[c]:
                column[row] = 0
                column[row, :value.shape[1]] = value[0]
            else:
                column[row] = value[0]
        data.lengths[row] = values.lengths[0]

    def _split_for(self, arrays):
        """Data given whole (``insert``): each column's length is its array's time
        dimension; columns in different stores share rows, as in ``_split_plan``."""
        lengths = self._lengths_of(arrays)
        used, steps = {}, []
        for column, length in zip(self.engine.storage.columns, lengths):
            base = used.get(column.store, 0)
            steps.extend(range(base, base + length))
            used[column.store] = base + length
        return np.array(lengths + steps, np.int64), max(1, max(used.values()))

    def _lengths_of(self, arrays):
        lengths = []
        for column, array in zip(self.engine.storage.columns, arrays):
            cell = self.engine.storage.store_specs[column.store].shape
            lengths.append(1 if column.squeeze else int(array.shape[array.ndim - len(cell) - 1]))
        return lengths

    def _column_steps(self, arrays):
        ref_steps, _ = self._split_for(arrays)
        ends = np.cumsum(ref_steps[:self._columns])
        steps = ref_steps[self._columns:]
        return [steps[end - length:end] for end, length in zip(ends, ref_steps[:self._columns])]

    def copy_held(self, out, rows, count: int, stored_rows: int):
        engine = self.engine
        slots = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        out.lengths = np.empty((count, self._columns), np.int32)
        total = int(engine.refs[slots, refpool.HEAD_TOTAL].sum())
        out.flat_refs = np.empty(total, np.int32)
        refpool.flatten(engine.refs, engine.capacity, self._columns,
                        np.asarray(slots, np.int64), out.lengths, out.flat_refs)
        for store, copy in zip(engine.columns, out.stores):
            copy[:stored_rows] = store[:stored_rows]

    def export(self, out, count: int) -> dict:
        used, dense = np.unique(out.flat_refs, return_inverse=True)
        arrays = {"lengths": out.lengths, "refs": dense.astype(np.int32)}
        for index, copy in enumerate(out.stores):
            arrays[f"store{index}"] = copy[used]
        return arrays

    def restore(self, saved, rows, count: int):
        engine = self.engine
        stored = saved.layout["store0"][2][0]
        if stored > int(engine.storage.row_budget):
            raise ValueError(
                f"Table '{engine.name}': the checkpoint's items reference {stored} distinct "
                f"steps; this table's step budget is {engine.storage.row_budget}.")
        lengths = saved.array("lengths").astype(np.int64)
        refs = saved.array("refs").astype(np.int64)
        if (lengths.shape != (count, self._columns) or (count and lengths.min() < 0)
                or refs.shape != (int(lengths.sum()),)
                or (refs.size and (refs.min() < 0 or refs.max() >= stored))):
            raise errors.CheckpointError(f"Checkpoint {saved.path}: table '{saved.name}' "
                                         "references steps it does not hold.")
        inline = int(refpool.inline(engine.refs, self._columns))
        blocks = sum(int(refpool.blocks_for(int(total), engine.refs.shape[1], inline))
                     for total in lengths.sum(axis=1))
        if blocks > engine.storage.pool_blocks:
            raise ValueError(f"Table '{engine.name}': the checkpoint's items need {blocks} "
                             f"reference blocks; this table has {engine.storage.pool_blocks}.")
        for index, store in enumerate(engine.columns):
            saved.read_into(f"store{index}", store[:stored])
        slots = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        engine.ctrl[L.C_ROW_FRESH] = stored
        refpool.load(engine.ctrl, engine.meta, engine.refs, engine.rows,
                     np.asarray(slots, np.int64), lengths, refs, np.empty(0, np.int64))



def _as_words(store):
    row = store.reshape(store.shape[0], -1).view(np.uint8)
    for word in (np.uint64, np.uint32, np.uint16):
        if row.shape[1] % np.dtype(word).itemsize == 0:
            return row.view(word)
    return row

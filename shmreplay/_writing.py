"""What both writers share: step references, and turning an item into shared memory.

A writer keeps the steps it was given in its own process (a copy: the caller may reuse
its arrays) and writes a step into a table only when an item of that table first
references it. It remembers, per table, the row each step went to; the next item over
the same step references that row again (``kernels.reserve_item`` checks the row still
holds the step), so overlapping items do not store a step twice.

Items the rate limiter does not admit yet wait in the writer, in creation order
(``PendingItems``); they are inserted by later calls and by ``flush``.
"""

import collections
import time
from typing import List, Optional

import numpy as np

from shmreplay import _layout as L
from shmreplay import _storage, errors, specs
from shmreplay._kernels import table as kernels

_SCRATCH_PROB = np.empty(2, np.float64)
_NO_ROW = -1


class StepRef:
    """A reference to one value (one column of one step) appended to a writer.

    ``uid`` numbers the writer's steps (never reused by that writer); ``episode`` is the
    episode it belongs to; ``path`` the column (a tuple path into the appended data).
    """

    __slots__ = ("uid", "episode", "path", "value", "expired", "__weakref__")

    def __init__(self, uid: int, episode: int, path, value: np.ndarray):
        self.uid = uid
        self.episode = episode
        self.path = path
        self.value = value
        self.expired = False

    @property
    def shape(self):
        return self.value.shape

    @property
    def dtype(self):
        return self.value.dtype

    def __repr__(self):
        return f"StepRef(step={self.uid}, path={self.path}{', expired' if self.expired else ''})"


class ItemColumn:
    """One column of an item: the step references it reads, and whether it is squeezed."""

    __slots__ = ("refs", "squeeze")

    def __init__(self, refs: List[StepRef], squeeze: bool):
        self.refs = refs
        self.squeeze = squeeze


def column_source(column: ItemColumn):
    """The writer field every reference of the column reads, or None if they differ."""
    path = column.refs[0].path
    for ref in column.refs:
        if ref.path != path:
            return None
    return path


def check_column(column: ItemColumn, table: str, where: str):
    """Every reference of a column must hold values of one shape and dtype."""
    first = column.refs[0]
    for ref in column.refs:
        if ref.value.dtype != first.value.dtype or ref.value.shape != first.value.shape:
            raise errors.SchemaError(
                f"Table '{table}', column {where}: its steps mix {first.value.dtype}"
                f"{list(first.value.shape)} and {ref.value.dtype}{list(ref.value.shape)}.")


def item_specs(columns: List[ItemColumn]):
    """The TensorSpec each column of the item is sampled with (no batch dimension)."""
    out = []
    for column in columns:
        ref = column.refs[0]
        shape = ref.value.shape if column.squeeze else (len(column.refs),) + ref.value.shape
        out.append(specs.TensorSpec(shape, ref.value.dtype))
    return out


class TableRows:
    """One writer's memory of where its steps went in one table: uid -> [row, gen, mask].

    ``mask`` has bit ``s`` set when store ``s`` of that row holds the step's value.
    """

    def __init__(self, engine):
        self.engine = engine
        self.entries = {}

    def forget_before(self, uid: int):
        """Drops entries of steps older than ``uid`` (no history can reference them)."""
        if self.entries:
            stale = [key for key in self.entries if key < uid]
            for key in stale:
                del self.entries[key]


def validate_item(engine, treedef, columns: List[ItemColumn], paths: List[str]):
    """Checks an item against the table's items; returns the storage to define, or None.

    Raises:
      SchemaError: if the item's structure, shapes or dtypes differ from the table's.
    """
    table = engine.name
    for column, path in zip(columns, paths):
        check_column(column, table, path)
    got = item_specs(columns)
    layout = engine.known_layout()
    if layout is not None:
        expected_treedef, expected_specs, _ = layout
        if treedef != expected_treedef:
            raise errors.SchemaError(
                f"Table '{table}': the item's structure {treedef} does not match the "
                f"table's {expected_treedef}.")
        for spec, want, path in zip(got, expected_specs, paths):
            if spec.shape != want.shape or spec.dtype != want.dtype:
                raise errors.SchemaError(
                    f"Table '{table}', column {path}: the item has {spec.dtype}"
                    f"{list(spec.shape)}, the table's items have {want.dtype}{list(want.shape)}.")
    if engine.has_columns():
        storage = engine.storage
        if storage.steps:
            for column, stored, path in zip(columns, storage.columns, paths):
                if column.squeeze != stored.squeeze:
                    raise errors.SchemaError(
                        f"Table '{table}', column {path}: the table stores it "
                        f"{'squeezed (one step, no time dimension)' if stored.squeeze else 'as a sequence'}"
                        f", the item {'squeezes it' if column.squeeze else 'does not'}.")
        return None
    cells = [specs.TensorSpec(c.refs[0].value.shape, c.refs[0].value.dtype) for c in columns]
    signature = specs.optree.tree_unflatten(treedef, got)
    return _storage.step_storage(signature, cells, [len(c.refs) for c in columns],
                                 [c.squeeze for c in columns],
                                 [column_source(c) for c in columns])


def insert_item(rows: TableRows, columns: List[ItemColumn], priority: float, timeout):
    """Inserts one validated item into ``rows.engine``; returns its key.

    Raises DeadlineExceededError (nothing inserted) if the rate limiter does not admit
    it within ``timeout`` (0: do not wait).
    """
    engine = rows.engine
    storage = engine.storage
    if not storage.steps:
        return _insert_whole(engine, columns, priority, timeout)
    # The item's distinct steps: shared rows where the column's store holds the writer
    # field the column reads, private new rows otherwise.
    keys, ref_steps, where = {}, [], []
    for index, (column, stored) in enumerate(zip(columns, storage.columns)):
        shared = storage.store_sources[stored.store] == column.refs[0].path and \
            column_source(column) is not None
        for position, ref in enumerate(column.refs):
            key = ref.uid if shared else (index, position)
            step = keys.get(key)
            if step is None:
                step = keys[key] = len(keys)
            ref_steps.append(step)
            where.append((stored.store, ref, shared))
    distinct = len(keys)
    known_rows = np.full(distinct, _NO_ROW, np.int64)
    known_gens = np.zeros(distinct, np.int64)
    entries = rows.entries
    for key, step in keys.items():
        if type(key) is int:
            entry = entries.get(key)
            if entry is not None:
                known_rows[step] = entry[0]
                known_gens[step] = entry[1]
    ref_steps = np.array(ref_steps, np.int64)
    slot, got_rows, fresh = engine.reserve_item(known_rows, known_gens, ref_steps, timeout)
    stores = engine.columns
    new_entries = {}
    try:
        written = set()
        for j, (store, ref, shared) in enumerate(where):
            step = ref_steps[j]
            row = int(got_rows[step])
            if shared:
                entry = new_entries.get(ref.uid)
                if entry is None:
                    old = None if fresh[step] else entries.get(ref.uid)
                    entry = new_entries[ref.uid] = [
                        row, int(engine.rows[row, L.R_GEN]), old[2] if old is not None else 0]
                bit = 1 << store
                if not entry[2] & bit:
                    stores[store][row] = ref.value
                    entry[2] |= bit
            elif (store, row) not in written:
                stores[store][row] = ref.value
                written.add((store, row))
    except BaseException:
        engine.cancel(np.array([slot], np.int64))
        raise
    key = kernels.commit_one(*engine.arrays, slot, priority, _SCRATCH_PROB)
    if key < 0:
        engine._raise_status(key)
    entries.update(new_entries)
    return key


def _insert_whole(engine, columns, priority, timeout):
    """An item for a table that stores whole items (its first item came from insert):
    the referenced steps are stacked into the item's columns."""
    arrays = []
    for column in columns:
        if column.squeeze:
            arrays.append(column.refs[0].value)
        else:
            arrays.append(np.stack([ref.value for ref in column.refs]))
    slots, rows = engine.reserve_items(1, timeout)
    try:
        engine.write_items(slots, rows, arrays, False)
    except BaseException:
        engine.cancel(slots)
        raise
    return int(engine.commit(slots, np.array([priority], np.float64))[0])


class PendingItems:
    """Items created but not yet admitted by their table's rate limiter, in order."""

    def __init__(self):
        self.items = collections.deque()

    def __len__(self):
        return len(self.items)

    def add(self, rows: TableRows, columns, priority: float):
        """Inserts the item now if it and every earlier one can go in without waiting;
        otherwise keeps it for later."""
        self.items.append((rows, columns, priority))
        self.drain(0.0)

    def drain(self, timeout: Optional[float], leave: int = 0):
        """Inserts waiting items in order until at most ``leave`` remain.

        ``timeout`` bounds the whole call (None: wait as long as needed, 0: only what
        goes in at once). Returns True when done; False if the time ran out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self.items) > leave:
            rows, columns, priority = self.items[0]
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                insert_item(rows, columns, priority, remaining)
            except errors.DeadlineExceededError:
                return False
            self.items.popleft()
        return True

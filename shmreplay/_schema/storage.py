"""What a table's data segment stores: whole items, or steps that items reference.

A table's storage is fixed by its first item (see ``TableEngine.define_storage``):

* **Whole items** (``Client.insert`` first): one store per column, one row per slot,
  exactly the item's shapes. The fastest path for single transitions.
* **Steps** (a writer first): each store holds single steps (``cell`` shapes), in a row
  space shared by all stores; an item is, per column, a list of ``length`` row
  references (``squeeze``: one reference, no time dimension). Overlapping items
  reference the same rows, so a step is stored once however many items use it.
  Columns that read the same writer field (e.g. ``observation`` at t and at t+n) share
  a store.

* **Steps of items of any length** (a signature with a ``None`` time dimension): as
  steps, but each item's references sit in a chain of blocks of a shared pool
  (``shmreplay._shm.kernels.refpool``), so items of a table may have any length, each
  column its own. The row space and the pool are sized by a budget (``step_budget``):
  an item that does not fit makes the remover evict items, as ``max_size`` does.

The description is pickled into the data segment's header, so every process reads the
same one.
"""

import dataclasses
import logging
import math
from typing import Any, Optional, Tuple

from shmreplay import specs
from shmreplay._shm import segment as _segment


@dataclasses.dataclass(frozen=True)
class ColumnRefs:
    """How one item column is stored in step storage."""

    store: int        # the store holding its steps
    length: int       # how many steps it references (1 when squeezed; 0: any number)
    squeeze: bool     # True: the column is one step, without a time dimension
    offset: int       # where its references start in the item's row of ``refs``


@dataclasses.dataclass(frozen=True)
class Storage:
    signature: Any                    # nest of TensorSpec: the shapes items come back in
    steps: bool                       # False: whole items, one row per slot
    store_specs: Tuple[Any, ...]      # TensorSpec per store (a step's shape for steps)
    store_sources: Tuple[Optional[str], ...] = ()  # the writer field each store holds
    columns: Tuple[ColumnRefs, ...] = ()
    # Items of any length (``refpool``): the rows, the pool's blocks and their width.
    variable: bool = False
    row_budget: int = 0
    pool_blocks: int = 0
    block_width: int = 0
    # Bytes of the general store for items the stores cannot hold (0: none; see
    # ``shmreplay._shm.kernels.arena``). A table without a signature has one by default.
    arena_bytes: int = 0

    @property
    def width(self) -> int:
        """References per item (per pool block when items have any length)."""
        if self.variable:
            return self.block_width
        return sum(c.length for c in self.columns) if self.steps else 0

    @property
    def steps_per_item(self) -> int:
        """The most distinct steps one column references (sizes the row space)."""
        return max(c.length for c in self.columns) if self.steps else 1

    def row_capacity(self, capacity: int) -> int:
        """Rows of each store, for a table of ``capacity`` slots."""
        if self.variable:
            return self.row_budget
        return capacity * self.steps_per_item if self.steps else capacity

    @property
    def column_specs(self):
        """Per item column, the shape and dtype it is sampled with (no batch dimension)."""
        return specs.flatten(self.signature)[0]


def whole_items(signature, arena_bytes: int = 0) -> Storage:
    column_specs = specs.flatten(signature)[0]
    return Storage(signature, False, tuple(column_specs), arena_bytes=int(arena_bytes))


def step_storage(signature, cells, lengths, squeezes, sources) -> Storage:
    """Step storage for item columns with the given step ``cells`` (TensorSpec),
    reference counts, squeeze flags and writer fields (None: not shared)."""
    stores, store_specs, store_sources, columns = {}, [], [], []
    offset = 0
    for cell, length, squeeze, source in zip(cells, lengths, squeezes, sources):
        key = (source, cell.shape, cell.dtype) if source is not None else len(columns)
        if key not in stores:
            stores[key] = len(store_specs)
            store_specs.append(specs.TensorSpec(cell.shape, cell.dtype))
            store_sources.append(source)
        columns.append(ColumnRefs(stores[key], int(length), bool(squeeze), offset))
        offset += int(length)
    return Storage(signature, True, tuple(store_specs), tuple(store_sources), tuple(columns))


_log = logging.getLogger("shmreplay")

MIN_STEPS = 1024  # the least steps a table of items of any length holds by default
FREE_SHARE = 4  # a default step budget takes at most 1/FREE_SHARE of /dev/shm's free space
MAX_POOL = (1 << 30) - 1  # blocks and rows are int32 indices (see ``refpool.MARK``)
INLINE_MAX = 64  # references a slot's head keeps at most (longer items: blocks)


def variable_step_storage(storage: Storage, capacity: int, distinct: int, references: int,
                          max_steps=None, table: str = "") -> Storage:
    """``storage`` (from ``step_storage``, with a length per column) made one of items
    of any length: each column of ``signature`` whose time dimension is ``None`` takes
    any number of steps.

    The budget: ``max_steps`` rows if given, else room for ``capacity`` items twice as
    long as the first one (``distinct`` steps, ``references`` references): about what
    fixed-length items of twice its length would take, so that a small table stays
    small (a container's ``/dev/shm`` is often 64 MiB); but at most what fits in a
    quarter of /dev/shm's free space: a Reverb-sized table (a million items of a hundred
    steps) would otherwise ask for hundreds of GiB that Reverb itself would only use
    as they fill. Such a table then evicts before ``max_size`` once its budget is full,
    and says so in a log warning. A slot's head holds an item
    with as many references as the first (up to ``INLINE_MAX``); the pool's blocks hold
    the rest, as many references per row as the first item has, and a block per slot.
    """
    column_specs = specs.flatten(storage.signature)[0]
    columns = tuple(
        dataclasses.replace(column, length=0, offset=0)
        if (not column.squeeze and spec.shape and spec.shape[0] is None)
        else dataclasses.replace(column, offset=0)
        for column, spec in zip(storage.columns, column_specs))
    distinct = max(1, distinct)
    if max_steps is None:
        wanted = 2 * capacity * distinct
        rows = max(min(wanted, _rows_in_free_share(storage, references / distinct)),
                   MIN_STEPS)
        if rows < wanted:
            _log.warning(
                "shmreplay: table '%s' (items of any length) gets a budget of %d steps, "
                "less than its max_size of items twice as long as its first would take "
                "(%d): that is what a quarter of /dev/shm's free space holds. It evicts "
                "items once the budget is full; pass Table(max_steps=...) to choose.",
                table, rows, wanted)
    else:
        rows = int(max_steps)
    rows = min(rows, MAX_POOL)
    # Slot heads keep an item like the first (up to INLINE_MAX references) inline.
    block_width = max(16, -(-(len(columns) + 2 + min(references, INLINE_MAX)) // 8) * 8)
    per_block = block_width - 1
    references = max(1, references)
    refs = math.ceil(rows * references / distinct)
    blocks = min(capacity + -(-refs // per_block), MAX_POOL - capacity)
    return dataclasses.replace(storage, columns=columns, variable=True, row_budget=rows,
                               pool_blocks=blocks, block_width=block_width)


def _rows_in_free_share(storage: Storage, references_per_row: float) -> int:
    """The most rows (a step in every store, its share of references) that fit in
    1/FREE_SHARE of /dev/shm's free space; unbounded if that cannot be told."""
    free = _segment.free_bytes()
    if free is None:
        return MAX_POOL
    per_row = sum(math.prod(spec.shape) * spec.dtype.itemsize for spec in storage.store_specs)
    per_row += 8 + 8 * references_per_row  # (its live count, its references)
    return int(free // FREE_SHARE // max(per_row, 1))

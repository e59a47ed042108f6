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

The description is pickled into the data segment's header, so every process reads the
same one.
"""

import dataclasses
from typing import Any, Optional, Tuple

from shmreplay import specs


@dataclasses.dataclass(frozen=True)
class ColumnRefs:
    """How one item column is stored in step storage."""

    store: int        # the store holding its steps
    length: int       # how many steps it references (1 when squeezed)
    squeeze: bool     # True: the column is one step, without a time dimension
    offset: int       # where its references start in the item's row of ``refs``


@dataclasses.dataclass(frozen=True)
class Storage:
    signature: Any                    # nest of TensorSpec: the shapes items come back in
    steps: bool                       # False: whole items, one row per slot
    store_specs: Tuple[Any, ...]      # TensorSpec per store (a step's shape for steps)
    store_sources: Tuple[Optional[str], ...] = ()  # the writer field each store holds
    columns: Tuple[ColumnRefs, ...] = ()
    # Bytes of the general store for items the stores cannot hold (0: none; see
    # ``shmreplay._shm.kernels.arena``). A table without a signature has one by default.
    arena_bytes: int = 0

    @property
    def width(self) -> int:
        """References per item."""
        return sum(c.length for c in self.columns) if self.steps else 0

    @property
    def steps_per_item(self) -> int:
        """The most distinct steps one column references (sizes the row space)."""
        return max(c.length for c in self.columns) if self.steps else 1

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

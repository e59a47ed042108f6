"""What a storage kind provides to its table's engine (``kinds.mapped`` makes one)."""

import abc

import numpy as np


class StorageKind(abc.ABC):
    """One table's storage kind, made when the engine maps the data segment.

    The engine binds ``reserve_items``, ``write_items`` and ``gather`` onto itself
    when it maps (``TableEngine._map_columns``), so a call costs what the engine's own
    method did; fast paths that a kind enables read the engine attributes its
    constructor sets. Nothing here takes the table's lock. Every method is abstract:
    a kind that lacks one cannot be made.
    """

    steps = False  # items reference shared step rows (so they count in C_ROWS_LIVE)

    def __init__(self, engine, segment, plan):
        self.engine = engine

    @abc.abstractmethod
    def reserve_items(self, count: int, timeout, arrays):
        """Reserves ``count`` items for data given whole (``insert``; ``arrays``: the
        item's columns, as ``write_items`` will get them): ``(slots, rows)``, ``rows``
        None when items own their rows."""

    @abc.abstractmethod
    def write_items(self, slots, rows, arrays, batched: bool):
        """Copies whole items' columns into what ``reserve_items`` gave, without the lock."""

    @abc.abstractmethod
    def gather(self, slots):
        """Copies the items in ``slots`` out of shared memory, one array per column."""

    def put_row(self, data, row: int, values):
        """Puts a redrawn item (``values``: what ``gather`` gave for its slot alone) at
        ``row`` of a batch's ``data`` (what ``gather`` gave for the batch)."""
        for column, value in zip(data, values):
            column[row] = value[0]

    @abc.abstractmethod
    def stored(self, counters) -> int:
        """What ``TableInfo.num_stored_steps`` reports, from the table's counters."""

    @abc.abstractmethod
    def copy_held(self, out, rows, count: int, stored_rows: int):
        """Copies the data of the ``count`` held items (``rows``: their slots, or a slice)
        into a snapshot's ``out`` (``shmreplay._engine.snapshot``), under the lock."""

    @abc.abstractmethod
    def export(self, out, count: int) -> dict:
        """The snapshot's data arrays by name, from what ``copy_held`` copied."""

    @abc.abstractmethod
    def restore(self, saved, rows, count: int):
        """Writes a checkpoint's data arrays (``saved.array(name)``, what ``export``
        made) into a new table's data segment; ``rows`` are the ``count`` items' slots,
        or a slice. Runs before the table is served.

        Raises:
          CheckpointError, ValueError: if the arrays do not fit this table.
        """


def copy_rows(source, rows, out):
    """``out[...] = source[rows]``; ``rows`` is a slice or valid indices."""
    if isinstance(rows, slice):
        out[...] = source[rows]
    else:
        np.take(source, rows, axis=0, out=out, mode="clip")  # valid slots: clip is a no-op

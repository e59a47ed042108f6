"""The general store: items the table's fixed columns cannot hold (another structure,
dtype or shape, or strings), encoded into the arena of the data segment.

Used by every storage kind whose table has an arena (``Storage.arena_bytes``):
``TableEngine._map_columns`` makes an ``Arena`` and, only for such tables, binds the
sampling calls below over its usual ones, so a table without an arena pays nothing.
Allocation and copies out run in ``shmreplay._shm.kernels.arena`` under the table's
lock; the encoding is ``shmreplay._schema.general_codec``.
"""

import weakref

import numpy as np

from shmreplay import errors, specs
from shmreplay._schema import general_codec as _codec
from shmreplay._schema import item_forms as _item_forms
from shmreplay._schema import open_shapes as _open_shapes
from shmreplay._shm import layout as L
from shmreplay._shm.kernels import table as kernels
from shmreplay._shm.kernels import codes
from shmreplay._shm.procs import STAMP as _STAMP
from shmreplay.replay_sample import PaddedSample

# ``Table(arena_bytes=...)`` unset, for a table without a signature.
DEFAULT_ARENA_BYTES = 1 << 20
_ARENA_ITEMS = L.C_ARENA_ITEMS


def arena_bytes_of(config) -> int:
    """The arena a table's storage gets: its ``arena_bytes``, else the default for a
    table whose items may come in shapes other than its first's (no signature, or one
    with open dimensions), else none."""
    chosen = getattr(config, "arena_bytes", None)
    if chosen is None:
        chosen = DEFAULT_ARENA_BYTES if config.shapes_from_data or config.has_strings else 0
    return int(chosen) // L.ARENA_PAGE * L.ARENA_PAGE


class Arena:
    """One table's arena, mapped for its engine."""

    def __init__(self, engine, views, plain_sample):
        # A weak reference: the engine binds this arena's calls over its own, and a
        # cycle would keep a dropped Client's mappings until the next collection.
        self._engine = weakref.ref(engine)
        self.plain_sample = plain_sample  # the engine's own ``sample`` (unbound)
        self.extents, self.owners, self.data = views
        self.capacity_bytes = self.data.shape[0]
        self.ctrl = engine.ctrl

    @property
    def engine(self):
        return self._engine()

    # --- inserting ---------------------------------------------------------------------

    @staticmethod
    def encode_for(table: str, data, batched: bool):
        """One encoded item per row (``batched``: data has a leading batch dimension)."""
        if not batched:
            return [_codec.encode(data, table)]
        leaves, treedef = specs.flatten(data)
        count = int(np.shape(leaves[0])[0]) if leaves else 0
        return [_codec.encode(specs.optree.tree_unflatten(
            treedef, [leaf[i] for leaf in leaves]), table) for i in range(count)]

    def reserve(self, blobs, timeout):
        """A slot and a run of pages for each encoded item (blocking as inserts do)."""
        engine = self.engine
        slots = np.empty(len(blobs), np.int64)
        stamp = _STAMP[0]
        done = 0
        try:
            for blob in blobs:
                need = -(-len(blob) // L.ARENA_PAGE)
                slots[done] = engine._blocking(
                    kernels.arena_reserve, L.C_SPACE_WAITERS, L.C_SPACE_SEQ, timeout, True,
                    lambda was_waiting, register: (self.extents, self.owners, need, len(blob),
                                                   stamp, was_waiting, register))
                done += 1
        except errors.ArenaFullError:
            if done:
                engine.cancel(slots[:done])
            raise self._full(len(blob)) from None
        except BaseException:
            if done:
                engine.cancel(slots[:done])
            raise
        return slots

    def _full(self, size: int):
        return errors.ArenaFullError(
            f"Table '{self.engine.name}': an item of another shape than the table's "
            f"columns takes {size} bytes encoded, more than its general store (arena, "
            f"{self.capacity_bytes} bytes) can hold even with the table emptied. Give the "
            "table a larger Table(..., arena_bytes=N), or a signature that fits the item.")

    def write(self, slots, blobs):
        """Copies the encoded items into their reserved pages (without the lock)."""
        for slot, blob in zip(slots.tolist(), blobs):
            start = int(self.extents[slot, L.X_PAGE]) * L.ARENA_PAGE
            self.data[start:start + len(blob)] = np.frombuffer(blob, np.uint8)

    # --- sampling ----------------------------------------------------------------------

    def read(self, slots):
        """``{slot: (key, bytes)}`` of the arena items among ``slots``, copied under the lock."""
        engine = self.engine
        slots = np.ascontiguousarray(slots, np.int64)
        keys = np.empty(len(slots), np.int64)
        starts = np.empty(len(slots) + 1, np.int64)
        io = np.zeros(1, np.int64)
        out = np.empty(1 << 16, np.uint8)
        while True:
            got = engine._call(kernels.arena_read, self.extents, self.owners, self.data,
                               slots, keys, starts, out, io)
            if got != codes.TOO_BIG:
                break
            out = np.empty(int(io[0]), np.uint8)
        if got < 0:
            engine._raise_status(got)
        return {int(slot): (int(key), out[starts[i]:starts[i + 1]])
                for i, (slot, key) in enumerate(zip(slots.tolist(), keys.tolist())) if key}

    def sample_items(self, batch_size: int, timeout):
        """``(batch, arena_rows)``: a sample, and ``{row: (nest, leaves, paths)}`` for its
        rows that are arena items."""
        engine = self.engine
        ctrl = engine.ctrl
        if not ctrl[L.C_ARENA_ITEMS]:
            batch = self.plain_sample(engine, batch_size, timeout)
            if not ctrl[L.C_ARENA_ITEMS]:  # (none reserved before or during the draw)
                return batch, {}
            # The first arena item came during the draw: the batch may hold it. Draw
            # again the general way (once per layout).
        found = {}
        kind_gather = engine.kind.gather

        def gather(slots):  # the rows, and (before this call frees any it deleted) the
            data = kind_gather(slots)  # arena items among them, copied under the lock
            found.update(self.read(slots))
            return data

        batch = engine._sample_waiting(batch_size, timeout, None, gather)
        rows = {}
        slot_mask = (1 << int(ctrl[L.C_SLOT_BITS])) - 1
        for row, key in enumerate(batch.info.key.view(np.int64).tolist()):
            hit = found.get(key & slot_mask)
            if hit is not None and hit[0] == key:
                rows[row] = _codec.decode(hit[1], engine.name, key & 0xFFFFFFFFFFFFFFFF)
        return batch, rows

    def sample(self, batch_size: int, timeout):
        """``sample_batch``: the batch stacked if its items agree (see ``stack``)."""
        ctrl = self.ctrl
        if not ctrl[_ARENA_ITEMS]:  # (``sample_items``' first lines, one call less)
            batch = self.plain_sample(self._engine(), batch_size, timeout)
            if not ctrl[_ARENA_ITEMS]:
                return batch
        batch, rows = self.sample_items(batch_size, timeout)
        return stack(self.engine, batch, rows) if rows else batch

    # --- checkpoints -------------------------------------------------------------------

    def copy_held(self, slots):
        """``(lengths, bytes)`` of the held items ``slots`` (the table's lock is held):
        per item its encoded length (0: a fixed-column item), and the encodings."""
        engine = self.engine
        meta, extents = engine.meta[slots], self.extents[slots]
        lengths = np.where(
            np.isin(meta[:, L.M_STATE], (codes.READY, codes.DRAINING))
            & (extents[:, L.X_PAGES] > 0) & (extents[:, L.X_VERSION] == meta[:, L.M_VERSION]),
            extents[:, L.X_BYTES], 0).astype(np.int64)
        starts = extents[:, L.X_PAGE] * L.ARENA_PAGE
        bad = (lengths < 0) | (lengths > 0) & ((starts < 0) | (starts + lengths > self.data.size))
        lengths[bad] = 0  # (``verify`` reports such an extent; it is not copied)
        parts = [self.data[start:start + length]
                 for start, length in zip(starts.tolist(), lengths.tolist()) if length]
        return lengths, (np.concatenate(parts) if parts else np.zeros(0, np.uint8))

    def verify(self) -> int:
        return self.engine._call(kernels.arena_verify, self.extents, self.owners)

    def used_bytes(self) -> int:
        """Bytes of the arena held by live items (approximate: read without the lock)."""
        engine = self.engine
        fresh = min(int(engine.ctrl[L.C_FRESH]), engine.capacity)
        meta, extents = engine.meta[:fresh], self.extents[:fresh]
        live = ((np.isin(meta[:, L.M_STATE], (codes.READY, codes.WRITING, codes.DRAINING)))
                & (extents[:, L.X_PAGES] > 0) & (extents[:, L.X_VERSION] == meta[:, L.M_VERSION]))
        return int(extents[live, L.X_PAGES].sum()) * L.ARENA_PAGE


def restore(engine, slots, lengths, data):
    """Writes a checkpoint's arena items (``lengths`` per restored item, 0 for others,
    and their encodings ``data``) into the new table's arena, page after page, before
    it is served.

    Raises:
      CheckpointError: the lengths do not add up to the data.
      ValueError: the table has no arena, or too small a one.
    """
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) != len(slots) or (lengths < 0).any() or int(lengths.sum()) != len(data):
        raise errors.CheckpointError(
            f"Table '{engine.name}': the checkpoint's arena lengths do not add up to its "
            f"{len(data)} bytes of arena items: the file is damaged.")
    pages = -(-lengths // L.ARENA_PAGE)
    arena = engine.arena
    have = 0 if arena is None else arena.owners.shape[0]
    if int(pages.sum()) > have:
        raise ValueError(
            f"Table '{engine.name}': the checkpoint's items of other shapes need "
            f"{int(pages.sum()) * L.ARENA_PAGE} bytes of general store (arena); the table "
            f"has {have * L.ARENA_PAGE}. Give it Table(..., arena_bytes=N) at least that.")
    page = at = items = 0
    for slot, length, count in zip(np.asarray(slots).tolist(), lengths.tolist(),
                                   pages.tolist()):
        if not length:
            continue
        arena.data[page * L.ARENA_PAGE:page * L.ARENA_PAGE + length] = data[at:at + length]
        arena.extents[slot] = (page, count, engine.meta[slot, L.M_VERSION], length)
        arena.owners[page:page + count] = slot + 1
        page += count
        at += length
        items += 1
    engine.ctrl[L.C_ARENA_ITEMS] = items
    engine.ctrl[L.C_ARENA_ROVER] = page


def sample_parts(engine, batch_size: int, timeout) -> list:
    """A sample for readers of single items (Reverb's per-item datasets): a list of
    batches, either one (as ``sample_batch`` gives it: stacked, or padded where items
    differ only in a time length) or, when the items drawn cannot be stacked, one batch
    per item. Every item drawn is in the result: none is lost to a stacking error."""
    if engine.arena is None and engine.columns is not None:  # mapped: no general store
        return [engine.sample(batch_size, timeout)]
    batch, rows = engine.sample_items(batch_size, timeout)  # (maps the layout first)
    if not rows:
        return [batch]
    try:
        return [stack(engine, batch, rows)]
    except errors.SchemaError:
        pass
    parts = []
    for row in range(len(batch.info.key)):
        one = type(batch)(type(batch.info)(*(field[row:row + 1] for field in batch.info)),
                          specs.optree.tree_map(lambda column: column[row:row + 1],
                                                batch.data, none_is_leaf=False))
        parts.append(stack(engine, one, {0: rows[row]}) if row in rows else one)
    return parts


def stack(engine, batch, arena_rows):
    """``batch`` with its arena items in place, stacked if every item has the same
    structure, dtypes and shapes, or padded (a ``PaddedSample`` with each column's
    lengths) where a column's items differ only in their first (time) dimension.

    Raises:
      SchemaError: two items differ otherwise (naming the table, the column and both).
    """
    count = len(batch.info.key)
    fixed = specs.flatten(batch.data)[0]
    rows = []
    for row in range(count):
        if row in arena_rows:
            nest, leaves, paths = arena_rows[row]
            rows.append((nest, leaves, paths))
        else:
            rows.append((None, [column[row] for column in fixed], engine.paths))
    first_nest, first_leaves, first_paths = rows[0]
    for nest, leaves, paths in rows[1:]:
        if paths != first_paths:
            raise errors.SchemaError(
                f"Table '{engine.name}': sample_batch cannot stack items of different "
                f"structures ({_show(first_paths)} and {_show(paths)}); sample them with "
                "Client.sample, or insert items of one structure into a table.")
    timed = _timed_columns(engine, batch, arena_rows, count, len(first_paths))
    columns, lengths = [], []
    for i, path in enumerate(first_paths):
        column = [leaves[i] for _, leaves, _ in rows]
        columns.append(_stack_column(engine, path, column, lengths, timed[i]))
    if first_nest is None:
        rebuild = engine._unflatten
    else:
        structure = _codec.flatten(first_nest)[0]
        rebuild = lambda leaves: _codec._rebuild(structure, list(leaves), [0], 0)  # noqa: E731
    if not any(n is not None for n in lengths):
        return type(batch)(batch.info, rebuild(columns))
    padded = PaddedSample(batch.info, rebuild(columns))
    padded.lengths = rebuild([np.ones(count, np.int64) if n is None else n for n in lengths])
    return padded


def _timed_columns(engine, batch, arena_rows, count: int, width: int):
    """Per column, whether every item of the batch has a time dimension first there
    (a writer's item, or a signature's column of any length, in the general store):
    only such columns are padded."""
    flags = [count == len(arena_rows)] * width
    signature_timed = _open_shapes.timed_leaves(engine, width)
    for key in batch.info.key.tolist():
        timed = _item_forms.timed_columns(_item_forms.form_of(engine, int(key)), width)
        flags = [f and (t if timed is not None else s)
                 for f, t, s in zip(flags, timed or signature_timed, signature_timed)]
    return flags


def _stack_column(engine, path, items, lengths, timed: bool):
    """One column of the batch: ``items`` stacked, or, where they have a time dimension
    (``timed``) and differ only in its length, padded with zeros to the longest (its
    lengths appended to ``lengths``; None there when stacked)."""
    first = items[0]
    if all(a.shape == first.shape and a.dtype == first.dtype for a in items):
        lengths.append(None)
        return np.stack(items)
    for other in items:
        if other.shape == first.shape and other.dtype == first.dtype:
            continue
        if not timed or other.dtype != first.dtype or other.ndim != first.ndim \
                or other.shape[1:] != first.shape[1:]:
            raise errors.SchemaError(
                f"Table '{engine.name}', column {path}: sample_batch cannot stack an item "
                f"of shape {first.shape} and dtype {first.dtype} with one of shape "
                f"{other.shape} and dtype {other.dtype} (only items that differ in the "
                "length of a time dimension are padded); sample them with Client.sample, "
                "or insert items of one shape into a table.")
    sizes = np.array([len(a) for a in items], np.int64)
    out = np.full((len(items), int(sizes.max())) + first.shape[1:],
                  b"" if first.dtype == object else 0, first.dtype)  # (strings: empty)
    for row, item in enumerate(items):
        out[row, :len(item)] = item
    lengths.append(sizes)
    return out


def _show(paths):
    return "[" + ", ".join(paths[:4]) + (", ..." if len(paths) > 4 else "") + "]"

"""How an item looks to Reverb's own calls (``Client.sample``), whatever form it was
stored in.

Reverb keeps a time dimension on every column that is not squeezed: an ``insert`` item
is a trajectory of one step (``[1, ...]``), as are the legacy ``Writer``'s items and a
``TrajectoryWriter``'s ``[-1:]`` windows; a squeezed ``history[k][-1]`` column has none.
One Reverb table takes all of these. A shmreplay table stores each column in one
layout (its signature's, else its first item's) and ``sample_batch`` and the datasets
return that layout; a one-step column in the other form (a ``[-1:]`` window where the
table squeezes, an ``insert`` where the table keeps ``[1, ...]``) is stored in the
table's layout, and the item's *form* records which columns differ, so that
``Client.sample`` still returns each item as Reverb would.

Per stored column, Reverb's usual view and its one alternative ("flipped"):

============  ===============  ==================  ===================
column        stored as        Reverb's usual view flipped view
============  ===============  ==================  ===================
whole item    ``S``            ``[1, *S]``         ``S``
squeezed      one step ``c``   ``c``               ``[1, *c]``
one step      ``[1, *c]``      ``[1, *c]``         ``c``
sequence      ``[T, *c]``      ``[T, *c]``         (none; of any length: ``c``)
============  ===============  ==================  ===================

A form is a bit mask of flipped columns (the first 62 columns can be flipped), or
``AS_WRITTEN`` for a writer's item in the general store. It is
kept per slot in the data segment as ``(key, mask)``, written just after the item is
committed; an entry whose key is not the slot's current item means "no flips", so
entries of removed items never need clearing.
"""

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors, specs

WHOLE, SQUEEZED, ONE_STEP, SEQUENCE = range(4)
_MAX_FLIPPED = 62
# The form of a writer's item in the general store: its columns are as the writer made
# them, where an inserted item is one timestep; the low bits mark its squeezed columns
# (no time dimension; the others have one).
AS_WRITTEN = 1 << _MAX_FLIPPED


def timed_columns(form: int, count: int):
    """Per column of an ``AS_WRITTEN`` item, whether it has a time dimension; None for
    another form."""
    if not form & AS_WRITTEN:
        return None
    return [not (i < _MAX_FLIPPED and form >> i & 1) for i in range(count)]


def column_kinds(engine):
    """Per item column of ``engine``'s storage: ``(kind, stored shape)``."""
    storage = engine.storage
    shapes = [tuple(spec.shape) for spec in engine.column_specs]
    if not shapes and engine.config.has_strings:
        # No columns: every item is in the general store, in the signature's forms
        # (``open_shapes.signature_item``), which the datasets read as whole items.
        return [(SEQUENCE if specs.varies_in_time(spec) else WHOLE, tuple(spec.shape))
                for spec in engine.config.column_specs]
    if not storage.steps:
        return [(WHOLE, shape) for shape in shapes]
    kinds = []
    for column, shape in zip(storage.columns, shapes):
        if column.squeeze:
            kinds.append((SQUEEZED, shape))
        else:
            kinds.append((ONE_STEP if column.length == 1 else SEQUENCE, shape))
    return kinds


def usual_view(kind, shape):
    return (1,) + shape if kind == WHOLE else shape


def flipped_view(kind, shape):
    """The shape of the column's other form, or None (a sequence has none)."""
    if kind == WHOLE:
        return shape
    if kind == SQUEEZED:
        return (1,) + shape
    if kind == ONE_STEP or (kind == SEQUENCE and shape and shape[0] is None):
        return shape[1:]  # (a column of any length: one step without its time dimension)
    return None


def flip_bit(kind, shape, reverb_shape):
    """0 if a column whose Reverb view is ``reverb_shape`` fits the stored column as
    its usual view, 1 if as the flipped one, None if it does not fit."""
    if tuple(reverb_shape) == usual_view(kind, shape):
        return 0
    if (kind == SEQUENCE and shape[0] is None and len(reverb_shape) == len(shape)
            and tuple(reverb_shape[1:]) == shape[1:]):
        return 0  # a column of any length (``docs/writers.md``)
    if tuple(reverb_shape) == flipped_view(kind, shape):
        return 1
    return None


def mask(bits, table: str, paths) -> int:
    """The form mask of per-column flip ``bits``.

    Raises:
      SchemaError: a column past the 62nd would need flipping.
    """
    value = 0
    for index, bit in enumerate(bits):
        if bit:
            if index >= _MAX_FLIPPED:
                raise errors.SchemaError(
                    f"Table '{table}', column {paths[index]}: an item can store at most its "
                    f"first {_MAX_FLIPPED} columns in the other one-step form (with or "
                    "without a time dimension of 1); give this column the table's form.")
            value |= 1 << index
    return value


def record(engine, keys, form: int):
    """Records the form of the just-committed items ``keys`` (nothing for form 0)."""
    forms = engine.forms
    if not form or forms is None:  # (None: another thread saw the layout forgotten)
        return
    slot_mask = (1 << int(engine.ctrl[L.C_SLOT_BITS])) - 1
    for key in np.atleast_1d(keys).tolist():
        slot = key & slot_mask
        forms[slot, 1] = form
        forms[slot, 0] = np.int64(np.uint64(key))  # last: readers check the key


def forms_of(engine, keys: np.ndarray) -> np.ndarray:
    """The forms of the items ``keys`` (int64, as stored), 0 where none is recorded."""
    keys = np.asarray(keys, np.int64)
    entries = engine.forms[keys & ((1 << int(engine.ctrl[L.C_SLOT_BITS])) - 1)]
    return np.where(entries[:, 0] == keys, entries[:, 1], 0)


def form_of(engine, key: int) -> int:
    forms = engine.forms
    if forms is None:
        return 0
    slot = key & ((1 << int(engine.ctrl[L.C_SLOT_BITS])) - 1)
    stored_key, form = forms[slot].tolist()
    return form if stored_key == int(np.int64(np.uint64(key))) else 0


def reverb_columns(engine, batch) -> list:
    """The flat columns of the one-item ``batch`` sampled from ``engine``, each as
    Reverb would return it."""
    leaves = [leaf[0, ...] for leaf in specs.flatten(batch.data)[0]]
    form = form_of(engine, int(batch.info.key[0]))
    out = []
    for index, (leaf, (kind, _)) in enumerate(zip(leaves, column_kinds(engine))):
        flipped = form >> index & 1
        if kind == WHOLE:
            out.append(leaf if flipped else leaf[None])
        elif kind == SQUEEZED:
            out.append(leaf[None] if flipped else leaf)
        elif kind == ONE_STEP or (flipped and kind == SEQUENCE):
            out.append(leaf[0, ...] if flipped else leaf)
        else:
            out.append(leaf)
    lengths = getattr(batch, "lengths", None)
    if lengths is not None:  # items of any length: each such column at its own length
        out = [column[:int(length[0])]
               if kind == SEQUENCE and stored[0] is None and not form >> index & 1 else column
               for index, (column, length, (kind, stored))
               in enumerate(zip(out, specs.flatten(lengths)[0], column_kinds(engine)))]
    return out


def unflattener(engine):
    """``columns -> nest`` in the table's structure."""
    return engine._unflatten

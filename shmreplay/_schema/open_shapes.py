"""Signatures with open dimensions: a ``None`` after a column's first dimension.

Reverb takes any size there (``tf.TensorSpec([None, None], tf.float32)``). shmreplay's
columns have fixed cells, so such a table's first item settles the open dimensions
(``specs.settled``), as a table without a signature takes its first item's shapes, and
its columns keep the fast path. A later item that fits the signature but not those
shapes goes to the table's general store (``arena_bytes``; such a table has one by
default), kept in the signature's structure and forms. ``reset`` forgets the settled
shapes with the items.
"""

import numpy as np

from shmreplay import errors, specs


def settle_for_insert(column_specs, arrays, batched: bool):
    """The signature's column specs with their open dimensions taken from an insert's
    ``arrays`` (one step without a time dimension, or the whole column). A leaf whose
    rank fits neither form leaves its spec as it is (its check then explains)."""
    settled = []
    for spec, array in zip(column_specs, arrays):
        shape = array.shape[1:] if batched else array.shape
        if specs.has_open_cells(spec):
            if specs.varies_in_time(spec) and len(shape) == len(spec.shape) - 1:
                shape = (1,) + shape  # one step: Reverb's insert adds the time dimension
            if len(shape) == len(spec.shape):
                spec = specs.settled(spec, shape)
        settled.append(spec)
    return settled


def signature_item(engine, leaves, treedef, batched: bool, refused):
    """``leaves`` as an item of the table's signature, in its forms (one step given to a
    column of any length gets its time dimension), for the general store: the data fit
    the signature but not the shapes its first item settled.

    Raises:
      SchemaError: the data do not fit the signature either (``refused``, the columns'
        refusal, if the structure differs; else naming the column and the signature).
    """
    column_specs = engine.config.column_specs
    signature_treedef = specs.flatten(engine.config.signature)[1]
    if not specs.same_structure(treedef, signature_treedef) and not (
            specs.positional(treedef) and len(leaves) == len(column_specs)):
        raise refused
    shaped = []
    for leaf, spec, path in zip(leaves, column_specs, specs.path_strings(signature_treedef)):
        array = np.asarray(leaf)
        if specs.is_string_dtype(spec.dtype) and specs.is_string_dtype(array.dtype):
            array = array.astype(object)  # (tf.string: bytes or str of any length)
        shape = array.shape[1:] if batched else array.shape
        if specs.varies_in_time(spec) and len(shape) == len(spec.shape) - 1:
            array = array[:, None] if batched else array[None]
            shape = (1,) + shape
        if array.dtype != spec.dtype or not specs.compatible(shape, spec.shape):
            raise errors.SchemaError(
                f"Table '{engine.name}', column {path}: the item has {array.dtype}"
                f"{list(shape)}, which does not fit the signature's "
                f"{'string' if specs.is_string_dtype(spec.dtype) else spec.dtype}"
                f"{list(spec.shape)} (None: any size).")
        shaped.append(array)
    return specs.optree.tree_unflatten(signature_treedef, shaped)


def timed_leaves(engine, count: int):
    """Per leaf of a general-store item, whether it has its time dimension already: in
    a signature's column of any length (``signature_item`` gave it one), Reverb's view
    keeps it as it is; another leaf is one timestep, which the view gives a time
    dimension of 1."""
    if engine.config.signature is None or len(engine.config.column_specs) != count:
        return [False] * count
    return [specs.varies_in_time(spec) for spec in engine.config.column_specs]


def signature_unflattener(engine):
    """``columns -> nest`` of the table's signature (its general store's items are
    stored in it: ``signature_item``)."""
    treedef = specs.flatten(engine.config.signature)[1]
    return lambda columns: specs.optree.tree_unflatten(treedef, list(columns))


def explain(engine, path: str, got, want) -> str:
    """A sentence for a refusal in a table whose signature left ``want``'s column open:
    what fixed its shape, and where other shapes go."""
    if engine.config.signature is None:
        return ""
    given = dict(zip(specs.path_strings(specs.flatten(engine.config.signature)[1]),
                     engine.config.column_specs)).get(path)
    if given is None or not specs.has_open_cells(given):
        return ""
    return (f" The signature gives {list(given.shape)}; the table's first item fixed the "
            f"open dimensions to {list(want.shape)} for its columns, and items of other "
            "shapes need its general store, which it does not have (arena_bytes=0).")

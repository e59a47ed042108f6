"""Turning a user's insert data and priorities into checked arrays for one table.

Used by ``Client.insert``/``insert_batch`` (and the writers' priorities). Nothing here
changes a table: every check runs before anything is reserved, so a refused call leaves
the buffer exactly as it was, and every refusal names the table, the column (its key
path), what the table expects and what it got.
"""

import numpy as np

from shmreplay import errors, specs
from shmreplay._schema import item_forms as _item_forms
from shmreplay._schema import open_shapes as _open_shapes
from shmreplay._schema import storage as _storage
from shmreplay._engine.kinds import general as _general
from shmreplay._shm.kernels import table as kernels

_PY_SCALARS = (bool, int, float)


def scalar(value):
    return value.item() if hasattr(value, "item") else value


def to_array(leaf, table, path):
    if type(leaf) is np.ndarray:
        return leaf
    try:
        array = np.asarray(leaf)
    except Exception as exc:
        raise errors.SchemaError(
            f"Table '{table}', column {path}: cannot convert {type(leaf).__name__} to an array.") from exc
    return array


def batch_size(leaves, treedef) -> int:
    sizes = []
    for leaf in leaves:
        shape = np.shape(leaf)
        if not shape:
            raise errors.SchemaError(
                "insert_batch: every leaf needs a leading batch dimension; got a scalar at "
                f"{specs.path_strings(treedef)[len(sizes)]}.")
        sizes.append(shape[0])
    if not sizes:
        raise errors.SchemaError("insert_batch: the data has no leaves.")
    if len(set(sizes)) != 1:
        detail = ", ".join(f"{p}: {s}" for p, s in zip(specs.path_strings(treedef), sizes))
        raise errors.SchemaError(f"insert_batch: leaves have different leading sizes ({detail}).")
    if sizes[0] < 1:
        raise errors.SchemaError("insert_batch: the batch is empty.")
    return int(sizes[0])


def check_batch_fits(engine, count: int):
    if count <= engine.max_batch:
        return
    room = engine.capacity - engine.config.max_size
    if count > room:
        raise ValueError(
            f"Table '{engine.name}': a batch of {count} items is larger than the {room} that "
            "can be written at once; split it.")
    most = engine.config.rate_limiter.max_batch_insert()
    if count > most:
        raise ValueError(
            f"Table '{engine.name}': its rate limiter can never admit {count} inserts at once "
            f"(at most {most:g}); split the batch.")


def prepare_leaves(engine, leaves, treedef, batched: bool):
    """Validates leaves against the table's columns, without side effects.

    An ``insert`` is, as in Reverb, an item of one timestep: a leaf of shape ``s``
    fits a column stored as ``s`` or as ``[1, *s]`` (a declared signature or a writer's
    ``[-1:]`` window), and a squeezed writer column of one step ``s``; the item's form
    (``shmreplay._schema.item_forms``) records which view Reverb's calls return it in. With a
    declared signature, data matches it by its flattened leaves (``insert([0])`` into a
    table whose signature is one scalar), as in Reverb.

    Returns ``(arrays, proposal, form)``: ``arrays`` in the stored shapes; ``proposal``
    is None, or, for a table whose storage is not defined yet, the storage this item
    would define; ``form`` the item's form mask.
    """
    table = engine.name
    if engine.config.has_strings:  # (``arena_items`` takes every item of such a table)
        raise errors.SchemaError(
            f"Table '{table}': its signature has string columns, which only its general "
            "store holds.")
    proposal = None
    layout = engine.known_layout()
    if layout is not None:
        expected_treedef, column_specs, paths = layout
    else:
        _refuse_none_in_first_item(table, treedef)
        paths = specs.path_strings(treedef)
        arrays = [to_array(leaf, table, path) for leaf, path in zip(leaves, paths)]
        proposal = engine.propose_whole_items(treedef, arrays, batched)
        column_specs, expected_treedef = specs.flatten(proposal.signature)
    if not specs.same_structure(treedef, expected_treedef):
        if (engine.config.signature is None or not specs.positional(treedef)
                or len(leaves) != len(column_specs)):
            raise _structure_error(table, treedef, expected_treedef, column_specs)
        try:  # Reverb matches a signature by flattened leaves
            return prepare_leaves(engine, leaves, expected_treedef, batched)
        except errors.SchemaError:  # they do not match either: the structure is the news
            raise _structure_error(table, treedef, expected_treedef, column_specs) from None
    settled = None
    if engine.has_columns():
        kinds = _item_forms.column_kinds(engine)
    else:  # the first item defines whole items of the signature's (or its own) shapes
        # (a signature's None time dimension: steps of any length; see propose_whole_items)
        if engine.config.signature is not None and engine.config.shapes_from_data:
            column_specs = settled = _open_shapes.settle_for_insert(
                column_specs, [to_array(leaf, table, path) for leaf, path in zip(leaves, paths)],
                batched)
        kinds = [(_item_forms.SEQUENCE if specs.varies_in_time(spec) else _item_forms.WHOLE,
                  tuple(spec.shape)) for spec in column_specs]
    arrays, bits = [], []
    for leaf, spec, path, (kind, stored) in zip(leaves, column_specs, paths, kinds):
        array = to_array(leaf, table, path)
        if array.dtype != spec.dtype and array.dtype.kind not in "biufc":
            raise _not_numbers(table, path, leaf, array, spec)  # (say so, not its shape)
        shape = array.shape[1:] if batched else array.shape
        bit = _item_forms.flip_bit(kind, stored, (1,) + shape)
        if stored and stored[0] is None:  # a column of any length (``docs/writers.md``)
            if bit == 0:  # one step, as Reverb's insert makes it: a time dimension of 1
                shape = (1,) + shape
                array = array[:, None] if batched else array[None]
                stored = shape
            elif len(shape) == len(stored) and shape[1:] == stored[1:]:
                bit = 0  # a whole sequence, stored as it is
                stored = shape
        if bit is None:
            if shape != stored:
                raise errors.SchemaError(
                    f"Table '{table}', column {path}: expected shape {spec.shape}"
                    f"{' after the batch dimension' if batched else ''}, got {shape}.")
            bit = 0  # a whole sequence given to insert: stored as it is
        if array.dtype != spec.dtype:
            array = _cast_python_scalar(engine, leaf, array, spec, path)
        if shape != stored:  # a time dimension of 1 added or dropped
            array = np.reshape(array, array.shape[:1] + stored if batched else stored)
        arrays.append(array)
        bits.append(bit)
    form = _item_forms.mask(bits, table, paths)
    if proposal is None and not engine.has_columns():
        proposal = engine.propose_whole_items(expected_treedef, arrays, batched, settled)
    return arrays, proposal, form


def arena_items(engine, data, batched: bool, refused, timeout):
    """The encoded items (one per row) of ``data``, which the table's columns refused
    with ``refused``, for its general store; ``refused`` itself if it has none or the
    data cannot be encoded either. A first item that cannot define columns (strings,
    say, or any item of a signature with string columns) defines a table of no
    columns, so that every item goes to the store."""
    config = engine.config
    arena_bytes = _general.arena_bytes_of(config)
    if not arena_bytes:
        raise refused
    if config.signature is not None:  # (a signature is the items' contract)
        if not (config.shapes_from_data or config.has_strings):
            raise refused
        if not engine.has_columns() and not config.has_strings:
            raise refused  # (its first item settles an open signature's columns)
        data = _open_shapes.signature_item(engine, *specs.flatten(data), batched, refused)
    try:
        blobs = _general.Arena.encode_for(engine.name, data, batched)
    except errors.SchemaError:
        raise refused from None
    if not engine.has_columns():
        engine.define_storage(_storage.whole_items((), arena_bytes), timeout)
    if engine.arena is None:
        raise refused  # (another process defined storage without an arena first)
    return blobs


def _structure_error(table, treedef, expected_treedef, column_specs):
    problems, none_for_column = specs.structure_mismatch(treedef, expected_treedef,
                                                         column_specs)
    error = errors.MissingValueError if none_for_column else errors.SchemaError
    return error(f"Table '{table}': the data does not match the structure of the table's "
                 f"items: {'; '.join(problems)}.")


def _refuse_none_in_first_item(table, treedef):
    """A table's first item fixes its columns: a ``None`` in it would make every later
    item carry ``None`` there too (Reverb refuses it with a ``TypeError``). Runs only
    until the table has columns."""
    where = specs.none_paths(treedef)
    if where:
        raise errors.MissingValueError(
            f"Table '{table}': the first item fixes the table's columns, and its "
            f"{', '.join(where)} {'is' if len(where) == 1 else 'are'} None: a column "
            "needs a value (a number or an array) in every item. Give it one (e.g. "
            "np.float32(0.0)), leave the key out of every item, or give the table a "
            "signature.")


def _not_numbers(table, path, leaf, array, spec):
    shown = repr(leaf) if isinstance(leaf, (str, bytes)) else None
    if shown:
        what = f"the {type(leaf).__name__} {shown[:40]}{'...' if len(shown) > 40 else ''}"
    else:
        kind = "an array" if isinstance(leaf, np.ndarray) else f"a {type(leaf).__name__}"
        what = f"{kind} of dtype {specs.describe_dtype(array.dtype)}"
    return errors.SchemaError(
        f"Table '{table}', column {path}: expected dtype {spec.dtype}, got {what}: a "
        "column holds numbers (or booleans), never strings or Python objects.")


def _cast_python_scalar(engine, leaf, array, spec, path):
    """Python scalars (``1.0``, ``3``, ``True``) may fill a column that stores them without
    changing them (``specs.python_scalar_as``: as the writers do)."""
    table = engine.name
    dtype = np.dtype(spec.dtype)
    if isinstance(leaf, _PY_SCALARS):  # (numpy's float64 scalar is a float too)
        leaf = next(kind(leaf) for kind in _PY_SCALARS if isinstance(leaf, kind))
        value = specs.python_scalar_as(leaf, dtype)
        if value is not None:
            return value
        raise errors.SchemaError(
            f"Table '{table}', column {path}: expected dtype {dtype}, got Python "
            f"{type(leaf).__name__} {leaf!r}: {specs.python_scalar_refusal(leaf, dtype)}.")
    raise errors.SchemaError(
        f"Table '{table}', column {path}: expected dtype {dtype}, got {array.dtype} "
        f"({_kind_of(leaf, array)}). Columns never cast (a cast can round or wrap "
        f"around): convert it, e.g. np.asarray(value, np.{dtype.name})."
        + _fixed_by_first_item(engine, dtype, array.dtype))


def _kind_of(leaf, array) -> str:
    if isinstance(leaf, np.generic):
        return f"a numpy {array.dtype} scalar"
    if isinstance(leaf, np.ndarray):
        return f"an array of {array.dtype}"
    return f"a {type(leaf).__name__} of {array.dtype}"


def _fixed_by_first_item(engine, dtype: np.dtype, got: np.dtype) -> str:
    if engine.config.signature is not None:
        return ""
    made_by = {"float64": "a Python float makes float64", "int64": "a Python int int64",
               "bool": "a Python bool bool"}.get(dtype.name)
    return (" The table has no signature, so its first item fixed this column's dtype"
            + (f" ({made_by})" if made_by else "")
            + f": give the first item the dtype you insert (np.{got.name}(...)), or give "
            "the table a signature.")


def check_priorities(engine, priority, count) -> np.ndarray:
    """Returns ``count`` float64 priorities, or raises InvalidPriorityError."""
    table = engine.name
    if _holds_text(priority):  # numpy would parse "1.5"; a priority is a number
        raise errors.InvalidPriorityError(
            f"Table '{table}': priority must be a number, got {priority!r}.")
    try:
        prios = np.asarray(priority, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidPriorityError(
            f"Table '{table}': priority must be a number, got {priority!r}.") from exc
    if prios.ndim == 0:
        prios = np.full(count, prios)
    elif prios.shape != (count,):
        raise errors.InvalidPriorityError(
            f"Table '{table}': expected {count} priorities, got an array of shape {prios.shape}.")
    bad = kernels.first_invalid_priority(prios, engine.max_priority)
    if bad >= 0:
        value = prios[bad]
        if value > engine.max_priority and np.isfinite(value):
            raise errors.InvalidPriorityError(
                f"Table '{table}': priority {value:g} is too large: at most "
                f"{engine.max_priority:g}, so that the sum-tree total of "
                "priority ** exponent stays finite.")
        raise errors.InvalidPriorityError(
            f"Table '{table}': priorities must be finite and >= 0, got {value}.")
    return prios


def _holds_text(value) -> bool:
    """Whether ``value`` is, or a list/tuple/array of, ``str`` or ``bytes``."""
    if isinstance(value, (str, bytes)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "US"
    return isinstance(value, (list, tuple)) and any(isinstance(v, (str, bytes)) for v in value)


_KEY_LIMIT = 1 << 64


def check_keys(table: str, keys, argument: str) -> np.ndarray:
    """``keys`` (an item key or several) as a 1-D uint64 array.

    Raises:
      TypeError: a key that is not an integer (a bool, a float with a fraction, text).
      ValueError: a key outside 0 .. 2**64 - 1 (no item has one).
    Both name ``argument`` and the table; nothing is changed by a refused call.
    """
    if isinstance(keys, (list, tuple)):
        array = np.asarray(keys, dtype=object)  # Python ints as they are, unconverted
    else:
        array = np.asarray(keys)  # an array, a scalar, a tensor
    array = array.reshape(-1)
    if array.dtype.kind == "u":
        return np.ascontiguousarray(array, np.uint64)
    for key in array.tolist():
        if isinstance(key, np.integer) and not isinstance(key, np.bool_):
            key = int(key)
        if isinstance(key, float) and key.is_integer():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, int):
            raise TypeError(
                f"Table '{table}': {argument} must hold integer item keys (uint64), got "
                f"{type(key).__name__} {key!r}.")
        if not 0 <= key < _KEY_LIMIT:
            raise ValueError(
                f"Table '{table}': {argument} holds key {key}, outside 0 .. 2**64 - 1: "
                "keys are uint64, as sample.info.key gives them.")
    return np.array(array.tolist(), np.uint64) if array.size else np.empty(0, np.uint64)

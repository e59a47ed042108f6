"""Signatures: the fixed shape and dtype of every leaf of a table's items.

A signature is any nest (dicts, lists, tuples, namedtuples) whose leaves describe one
column each: a ``shmreplay.TensorSpec``, a ``tf.TensorSpec`` (when TensorFlow is
installed), a ``jax.ShapeDtypeStruct`` or anything else with ``shape`` and ``dtype``.
Nests are flattened with ``optree`` (dict keys sorted), so every process agrees on the
column order.
"""

import dataclasses
import functools
import math
from typing import Any, List, Tuple

import numpy as np
import optree

from shmreplay import errors


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one column, for users without TensorFlow.

    Args:
      shape: A tuple of non-negative ints (``()`` for a scalar); a table signature's
        leading dimension may be None: items of any length (``docs/writers.md``).
      dtype: Anything ``numpy.dtype`` accepts.
      name: Optional, for display only (not compared).
      from_tf: Whether the user gave a ``tf.TensorSpec`` here (``TableInfo.signature``
        gives one back where TensorFlow is imported). Not compared.
    """

    shape: Tuple[int, ...]
    dtype: Any
    name: Any = dataclasses.field(default=None, compare=False)
    from_tf: bool = dataclasses.field(default=False, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(None if d is None else int(d)
                                                for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))


def _is_leaf_spec(x):
    return hasattr(x, "shape") and hasattr(x, "dtype")


def flatten(nest):
    """Flattens ``nest`` into ``(leaves, treedef)``.

    Only containers (dict, list, tuple, namedtuple, ...) are nodes; arrays, tensors and
    specs are leaves, so no ``is_leaf`` callback is needed (it would cost a Python call
    per node on the insert path).
    """
    return optree.tree_flatten(nest, none_is_leaf=False)


def path_strings(treedef) -> List[str]:
    """Human-readable paths of the leaves of ``treedef`` (``"obs"``, ``"[0]"``, ...)."""
    paths = optree.treespec_paths(treedef)
    return ["".join(_path_part(p) for p in path) or "<root>" for path in paths]


def _path_part(entry):
    return f"[{entry!r}]"


def to_numpy_dtype(dtype) -> np.dtype:
    """Converts a numpy, TensorFlow or JAX dtype to a ``numpy.dtype``."""
    as_numpy = getattr(dtype, "as_numpy_dtype", None)  # tf.DType
    if as_numpy is not None:
        dtype = as_numpy
    return np.dtype(dtype)


def to_shape(shape, where: str, any_dims: bool = False) -> Tuple[int, ...]:
    """Converts a tuple, list or ``tf.TensorShape`` to a tuple of ints.

    ``any_dims``: a dimension may be None (a signature: a first dimension of None takes
    items of any length; another takes any size there, fixed by the table's first item).

    Raises:
      SchemaError: if a dimension is unknown (``None``) where it may not be.
    """
    as_list = getattr(shape, "as_list", None)  # tf.TensorShape
    dims = as_list() if as_list is not None else list(shape)
    if not any_dims and any(d is None for d in dims):
        raise errors.SchemaError(
            f"{where}: shape {tuple(dims)} has an unknown (None) dimension; a shape here "
            "must be fully known.")
    return tuple(None if d is None else int(d) for d in dims)


def varies_in_time(spec) -> bool:
    """Whether a signature spec takes items of any length (its first dimension is None)."""
    return bool(spec.shape) and spec.shape[0] is None


def has_open_cells(spec) -> bool:
    """Whether a signature spec leaves a dimension after the first open (None): any
    size there, which the table's first item fixes for its columns."""
    return any(d is None for d in spec.shape[1:])


def compatible(shape, pattern) -> bool:
    """Whether ``shape`` fits ``pattern``: the same rank, and every dimension equal or
    None in the pattern (``tf.TensorShape.is_compatible_with``, one way)."""
    return len(shape) == len(pattern) and all(
        want is None or want == got for got, want in zip(shape, pattern))


def settled(spec, shape):
    """``spec`` with the open dimensions after the first taken from ``shape`` (of the
    same rank: a compatible item's): the shape a table stores that column in."""
    dims = tuple(spec.shape[:1]) + tuple(
        got if want is None else want for got, want in zip(shape[1:], spec.shape[1:]))
    return TensorSpec(dims, spec.dtype, spec.name, spec.from_tf)


def normalize_signature(signature, table: str):
    """Turns a user signature into ``(nest_of_TensorSpec, treedef, [TensorSpec, ...])``.

    Raises:
      ValueError: if a leaf is not a spec, has an unknown dimension or a non-numeric dtype.
    """
    leaves, treedef = flatten(signature)
    if not leaves:
        raise errors.SchemaError(f"Table '{table}': the signature has no leaves.")
    paths = path_strings(treedef)
    specs = []
    for path, leaf in zip(paths, leaves):
        if not _is_leaf_spec(leaf):
            raise errors.SchemaError(
                f"Table '{table}': unsupported signature spec at {path}: {leaf!r} "
                "(expected a TensorSpec or anything with .shape and .dtype).")
        where = f"Table '{table}', column {path}"
        name = getattr(leaf, "name", None)
        dtype = to_numpy_dtype(leaf.dtype)
        if is_string_dtype(dtype):
            dtype = np.dtype(object)  # (tf.string's: bytes of any length)
        spec = TensorSpec(to_shape(leaf.shape, where, True), dtype,
                          name if isinstance(name, str) else None, _from_tf(leaf))
        if not is_string_dtype(dtype):
            check_storable_dtype(spec.dtype, where)
        specs.append(spec)
    return optree.tree_unflatten(treedef, specs), treedef, specs


def _from_tf(leaf) -> bool:
    if isinstance(leaf, TensorSpec):
        return leaf.from_tf
    return type(leaf).__module__.startswith("tensorflow")


def is_string_dtype(dtype: np.dtype) -> bool:
    """Whether a signature's dtype is a string one (``tf.string``, numpy's bytes, str or
    object): such a column's items go to the table's general store."""
    return dtype.kind in "SUO"


def check_storable_dtype(dtype: np.dtype, where: str):
    """Raises ``SchemaError`` unless ``dtype`` is a fixed-size numeric or boolean type."""
    if dtype.kind not in "biufc" or dtype.hasobject:
        raise errors.SchemaError(
            f"{where}: dtype {describe_dtype(dtype)} cannot be stored; expected a numeric or "
            "boolean dtype.")


def step_value(value: np.ndarray, where: str) -> np.ndarray:
    """A writer's step ``value``, checked: numbers and booleans as they are; strings
    (bytes or str, also an object array of them), which items take to the table's
    general store, as an object array, so that every step of a column has one dtype
    whatever its strings' lengths (as ``tf.string``).

    Raises:
      SchemaError: anything else.
    """
    if value.dtype.kind in "biufc" and not value.dtype.hasobject:
        return value
    if value.dtype.kind in "SU":
        return value.astype(object)
    if value.dtype.kind == "O" and all(isinstance(v, (bytes, str)) for v in value.flat):
        return value
    raise errors.SchemaError(
        f"{where}: dtype {describe_dtype(value.dtype)} cannot be stored; expected numbers, "
        "booleans or strings.")


_DTYPE_KINDS = {"U": "strings", "S": "bytes", "O": "Python objects", "M": "datetimes",
                "m": "time deltas", "V": "raw or structured records"}


def describe_dtype(dtype: np.dtype) -> str:
    """``dtype`` for a message, saying what a non-numeric one holds (``<U5 (strings)``)."""
    kind = _DTYPE_KINDS.get(dtype.kind)
    return f"{dtype} ({kind})" if kind else str(dtype)


# The dtype kinds a Python scalar may be stored as.
_PY_KINDS = {bool: "b", int: "iufc", float: "fc"}


def python_scalar_as(leaf, dtype: np.dtype):
    """``leaf`` (a Python bool, int or float) as a 0-d array of ``dtype``, or None if a
    column of ``dtype`` cannot store it (``python_scalar_refusal`` says why): a bool or
    int must be held exactly; a float may be rounded to a float dtype's precision, never
    overflow it. Every path that stores Python scalars (``insert``, the writers) uses
    this rule, so none casts silently."""
    kind = type(leaf)
    if dtype.kind not in _PY_KINDS[kind]:
        return None
    if (kind is not bool and dtype.kind in "fc" and math.isfinite(leaf)
            and not -float_max(dtype) <= leaf <= float_max(dtype)):
        return None  # would be inf
    if kind is int and dtype.kind in "iu":
        low, high = int_range(dtype)
        if not low <= leaf <= high:
            return None  # (numpy 1.x would wrap it around)
    try:
        value = np.array(leaf, dtype)
    except OverflowError:
        return None
    if kind is int and dtype.kind in "fc" and value.item() != leaf:
        return None  # rounded (2**24 + 1 in float32)
    return value


def python_scalar_refusal(leaf, dtype: np.dtype) -> str:
    """Why ``python_scalar_as`` refused ``leaf`` for a column of ``dtype``."""
    kind = type(leaf)
    if dtype.kind not in _PY_KINDS[kind]:
        return f"a Python {kind.__name__} is never stored in a {dtype} column"
    if kind is float:
        return f"it overflows {dtype}"
    return f"{dtype} cannot hold it exactly"


@functools.lru_cache(maxsize=None)
def float_max(dtype: np.dtype) -> float:
    """The largest finite value of a float (or complex) dtype."""
    return float(np.finfo(dtype).max)


def same_structure(a, b) -> bool:
    """Whether treedefs ``a`` and ``b`` describe the same nest. A namedtuple counts by
    its name and fields, not by its class: a class defined in a script's ``__main__``
    is another class in each process (spawned workers import the script anew; the
    table's own copy is unpickled), yet the items are the same."""
    return a == b or _structure_key(a) == _structure_key(b)


def _structure_key(treedef):
    kind = treedef.kind
    node = treedef.type
    if kind == optree.PyTreeKind.NAMEDTUPLE:
        node = (node.__qualname__, tuple(node._fields))
    elif kind not in (optree.PyTreeKind.CUSTOM,):
        node = None  # dict, list, tuple, None, leaf: the kind says it all
    return (kind, node, tuple(optree.treespec_entries(treedef)),
            tuple(_structure_key(child) for child in treedef.children()))


@functools.lru_cache(maxsize=None)
def int_range(dtype: np.dtype):
    """``(min, max)`` of an integer dtype, as Python ints."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


# --- structure mismatches, in words ----------------------------------------------------------

_K = optree.PyTreeKind
_MAPPINGS = (_K.DICT, _K.ORDEREDDICT, _K.DEFAULTDICT)
_SEQUENCES = (_K.TUPLE, _K.LIST, _K.DEQUE)
_NAMED = (_K.NAMEDTUPLE, _K.STRUCTSEQUENCE)


def structure_mismatch(got, want, want_specs=None, limit: int = 6, against="the table"):
    """How treedef ``got`` (the data) differs from ``want`` (``against``'s), in words.

    Returns ``(problems, none_for_column)``: sentences such as ``['reward'] is missing``
    (at most ``limit``, then how many more), and whether the data has ``None`` where
    the table has a column. ``want_specs`` (the table's column specs, in leaf order)
    describe its columns. Only for error messages: it walks both trees in Python.
    """
    problems, none_for_column = [], [False]

    def describe(node, first):
        kind = node.kind
        if kind == _K.LEAF:
            if want_specs is None or first is None:
                return "a value"
            spec = want_specs[first]
            article = "an" if str(spec.dtype)[0] in "aeio" else "a"  # (a uint8)
            return f"{article} {spec.dtype} column of shape {tuple(spec.shape)}"
        if kind == _K.NONE:
            return "None"
        if kind in _MAPPINGS:
            keys = optree.treespec_entries(node)
            shown = ", ".join(repr(k) for k in keys[:limit])
            more = f", ... ({len(keys)} keys)" if len(keys) > limit else ""
            return (f"a {node.type.__name__} with keys {shown}{more}" if keys
                    else f"an empty {node.type.__name__}")
        if kind in _NAMED:
            fields = getattr(node.type, "_fields", None)
            named = f"{node.type.__qualname__}({', '.join(fields)})" if fields else \
                node.type.__qualname__
            return f"a {named}"
        if kind in _SEQUENCES:
            return f"a {node.type.__name__} of {node.num_children}"
        return f"a {getattr(node.type, '__name__', kind)}"

    def where(path):
        return "".join(path) or "the data"

    def walk(a, b, path, first):
        if same_structure(a, b):
            return
        if b.kind == _K.LEAF and a.kind == _K.NONE:
            none_for_column[0] = True
            problems.append(f"{where(path)} is None, where {against} has "
                            f"{describe(b, first)} (every item needs a value there)")
            return
        starts = _child_starts(b, first)
        if a.kind in _MAPPINGS and b.kind in _MAPPINGS:
            got_keys, want_keys = optree.treespec_entries(a), optree.treespec_entries(b)
            children = dict(zip(got_keys, a.children()))
            for key, child, start in zip(want_keys, b.children(), starts):
                if key not in children:
                    problems.append(f"{where(path + [f'[{key!r}]'])} is missing ({against} "
                                    f"has {describe(child, start)} there)")
            for key in got_keys:
                if key not in want_keys:
                    problems.append(f"{where(path + [f'[{key!r}]'])} is an extra key "
                                    f"({against} has none there)")
            for key, child, start in zip(want_keys, b.children(), starts):
                if key in children:
                    walk(children[key], child, path + [f"[{key!r}]"], start)
            if a.type is not b.type and not problems:
                problems.append(f"{where(path)} is {describe(a, None)}, where {against} "
                                f"has {describe(b, first)}")
            return
        same_kind = a.kind == b.kind and (a.kind not in _NAMED
                                          or _structure_key(a)[1] == _structure_key(b)[1])
        if same_kind and a.num_children == b.num_children and a.kind != _K.CUSTOM:
            for i, (x, y, start) in enumerate(zip(a.children(), b.children(), starts)):
                walk(x, y, path + [f"[{i}]"], start)
            return
        hint = ""
        if b.kind == _K.LEAF and a.kind in _SEQUENCES:
            hint = (f" (a {a.type.__name__} is a nest of columns, not one array: pass "
                    "np.asarray(...))")
        problems.append(f"{where(path)} is {describe(a, None)}, where {against} has "
                        f"{describe(b, first)}{hint}")

    walk(got, want, [], 0)
    if len(problems) > limit:
        problems[limit:] = [f"and {len(problems) - limit} more"]
    if not problems:  # (same shape of tree, but optree still tells them apart)
        problems.append(f"the data is {got}, {against} has {want}")
    return problems, none_for_column[0]


def _child_starts(node, first):
    """The index of the first leaf of each child of ``node`` (whose first leaf is
    ``first``), for ``want_specs``."""
    starts = []
    for child in node.children():
        starts.append(first)
        first += child.num_leaves
    return starts


def none_paths(treedef, limit: int = 6) -> List[str]:
    """Where a nest holds ``None`` (``['reward']``), at most ``limit`` of them."""
    found = []

    def walk(node, path):
        if len(found) >= limit:
            return
        if node.kind == _K.NONE:
            found.append("".join(path) or "the data")
            return
        entries = optree.treespec_entries(node)
        for entry, child in zip(entries, node.children()):
            walk(child, path + [f"[{entry!r}]"])

    walk(treedef, [])
    return found


def positional(treedef) -> bool:
    """Whether a nest names nothing: only lists, tuples and leaves (``[0]``, ``(a, b)``).
    Such data matches a table's signature by its flattened leaves, as in Reverb; data
    with keys or fields must name the table's."""
    if treedef.kind in (_K.LEAF, _K.NONE):
        return True
    return treedef.kind in (_K.TUPLE, _K.LIST) and all(
        positional(child) for child in treedef.children())


_TF_NAMES = {"float16": "half", "float32": "float", "float64": "double"}


def tf_dtype_name(dtype) -> str:
    """A dtype as TensorFlow (and Reverb's messages) name it: ``double``, ``int64``."""
    name = np.dtype(dtype).name
    return _TF_NAMES.get(name, name)


def tf_shape_str(shape) -> str:
    """A shape as TensorFlow prints it in messages: ``[1,2]``."""
    return "[" + ",".join(str(int(d)) for d in shape) + "]"

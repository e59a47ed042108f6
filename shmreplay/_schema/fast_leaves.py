"""The insert fast path's input check: a nest (dicts, tuples, lists, namedtuples) of
arrays and Python scalars that already match a table's columns, recognized in a few
hundred nanoseconds (a flat dict or tuple directly, any other nest by its structure's
flattening plan, ``nest_plans``).

``TableEngine`` takes these methods from ``FastLeaves``; anything they do not accept
takes the general path (``_inputs``), which converts, validates and explains.
"""

import functools

import numpy as np

from shmreplay import specs
from shmreplay._schema import nest_plans as _plans

UNSET = object()  # ``_flat_keys`` before the layout is known


class FastLeaves:
    """``TableEngine``'s fast input checks (see the module docstring)."""

    _nest_plans = None  # (the treedef they are for, nest_plans.PlanCache)

    def fast_leaves(self, data):
        """The leaves of ``data`` if they match the columns exactly, else None.

        Covers the common actor case (a nest of the table's structure, of arrays and
        Python scalars) in a few hundred nanoseconds; anything else takes the general
        path, which converts, validates and explains mismatches.
        """
        leaves = self._flat_leaves(data)
        if leaves is None or self.storage.steps:
            return None
        for leaf, (shape, dtype), (ints, floats) in zip(leaves, self._fast_specs,
                                                         self._fast_scalars):
            kind = type(leaf)
            if kind is np.ndarray:
                if leaf.dtype is not dtype or leaf.shape != shape:
                    return None
            elif kind is float:
                if not (floats is not None and -floats <= leaf <= floats):
                    return None  # (nan and inf take the general path too)
            elif kind is int:
                if not (ints is not None and ints[0] <= leaf <= ints[1]):
                    return None
            elif kind is bool:
                if dtype.kind != "b":
                    return None
            elif isinstance(leaf, np.generic):
                if shape != () or leaf.dtype is not dtype:
                    return None
            else:
                return None
        return leaves

    def fast_batch_leaves(self, data):
        """``(leaves, B)`` if ``data`` is a flat batch of arrays matching the columns, else None."""
        leaves = self._flat_leaves(data)
        if leaves is None or self.storage.steps:
            return None
        first = leaves[0] if leaves else None
        if type(first) is not np.ndarray or first.ndim == 0:
            return None
        count = first.shape[0]
        shapes = self._batch_shapes.get(count)
        if shapes is None:
            if len(self._batch_shapes) > 64:
                self._batch_shapes.clear()
            shapes = self._batch_shapes[count] = [(count,) + shape
                                                  for shape, _ in self._fast_specs]
        for leaf, shape, (_, dtype) in zip(leaves, shapes, self._fast_specs):
            if type(leaf) is not np.ndarray or leaf.dtype is not dtype or leaf.shape != shape:
                return None
        return (leaves, count) if count > 0 else None

    def _flat_leaves(self, data):
        """The leaves of a nest of the table's structure in column order, or None (the
        general path flattens it and explains)."""
        keys = self._flat_keys
        if keys is UNSET:
            if not self.has_columns():
                return None
            keys = self._flat_keys = flat_access(self.treedef)
        kind = type(data)
        if kind is dict and keys:  # a flat dict table: its keys, read directly
            if len(data) != len(keys):
                return None
            try:
                return [data[key] for key in keys]
            except (KeyError, TypeError):
                return None
        if kind is tuple and keys is False and len(data) == len(self.column_specs):
            return list(data)
        plans = self._nest_plans
        if plans is None or plans[0] is not self.treedef:  # (a new layout: new plans)
            if not self.column_specs:
                return None
            plans = self._nest_plans = (self.treedef, _plans.PlanCache())
        found = plans[1].find(data)
        if found is None:
            found = plans[1].learn(data, self._takes_structure)
            if found is None:
                return None
        return found[0] if found[1] else None

    def _takes_structure(self, treedef, leaves) -> bool:
        """Whether the general path reads data of ``treedef`` leaf for leaf as the
        table's columns (``inputs.prepare_leaves``): the table's structure (a namedtuple
        by name and fields), or, for a table with a signature, any list/tuple nest of as
        many leaves (Reverb matches a signature by flattened leaves)."""
        if specs.same_structure(treedef, self.treedef):
            return True
        return (self.config.signature is not None and specs.positional(treedef)
                and len(leaves) == len(self.column_specs))


def fast_scalar_bounds(dtype: np.dtype):
    """``(int range or None, float bound or None)``: the Python ints and floats a column
    of ``dtype`` takes on the fast path (ints stored exactly, floats rounded but
    finite), as ``specs.python_scalar_as`` would."""
    if dtype.kind in "iu":
        return specs.int_range(dtype), None
    if dtype.kind == "f":
        exact = 2 ** (np.finfo(dtype).nmant + 1)  # every int up to it is a float exactly
        return (-exact, exact), specs.float_max(dtype)
    return None, None


def flat_access(treedef):
    """How ``fast_leaves`` reads a flat nest: sorted dict keys, False for a flat tuple,
    None when the nest is deeper (no fast path)."""
    node = specs.optree.treespec_entries(treedef)
    children = treedef.children()
    # A None value is a node without leaves: entries and leaves would not pair up.
    if any(child.num_nodes != 1 or child.num_leaves != 1 for child in children):
        return None
    if treedef.kind == specs.optree.PyTreeKind.DICT:
        return list(node)
    if treedef.kind == specs.optree.PyTreeKind.TUPLE:
        return False
    return None


def unflattener(flat_keys, treedef):
    """``leaves -> nest`` for a table's columns: a dict built directly for a flat dict
    nest (``flat_keys``), the structure's generated builder for other nests
    (``nest_plans.builder_for``), optree otherwise."""
    if flat_keys:
        return lambda leaves: dict(zip(flat_keys, leaves))
    build = _plans.builder_for(treedef)
    return build if build is not None else functools.partial(specs.optree.tree_unflatten,
                                                             treedef)

"""How the per-item datasets (``shmreplay._tf_items``) give each sampled column the shape
their spec asks for, decided from the table's layout, never guessed from the spec.

A table stores each column in one form (``shmreplay._schema.item_forms``): a whole item ``S``
(Reverb's view ``[1, *S]``), a squeezed step ``c``, one step ``[1, *c]`` or a sequence
``[T, *c]``. A one-step column is read with or without its time dimension of 1,
whichever the spec has (Reverb keeps it; shmreplay's own code often leaves it out); a
sequence is read as it is. ``TimestepDataset`` cuts sequence columns into their
timesteps and reads a whole item as one timestep. Anything else is an error naming the
column, the spec's shape and the item's.

A column of any length (a signature's ``None`` time dimension) is a sequence stored as
``(None, *cell)``: a chunk of them comes padded with each item's length
(``PaddedSample``). ``TimestepDataset`` keeps each item's own steps (one boolean mask
for the chunk); ``TrajectoryDataset`` gets the padded columns and the lengths, which
its pipeline uses to cut each item to its length (``shmreplay._tf_items``).
"""

import numpy as np
import tensorflow as tf

from shmreplay import specs
from shmreplay._schema import item_forms as forms

_KEEP, _ADD_TIME, _DROP_TIME = range(3)
_ANY_LENGTH = -1  # (a plan's timestep length) items of any length: each has its own
_SPEC_LENGTH = 3  # a column of any length read at the spec's fixed time dimension


class ItemViews:
    """Turns a sampled chunk (``[k, ...]`` columns) into the dataset's leaves.

    Args:
      table: For error messages.
      flat_spec: The dataset's ``tf.TensorSpec`` leaves (one item or one timestep each).
      timesteps: Cut items into timesteps (``TimestepDataset``).
      any_length: Per column, whether the dataset was made for a column of any length
        (its chunks then end with the lengths of those columns); () for none.
    """

    def __init__(self, table: str, flat_spec, timesteps: bool, any_length=()):
        self._table = table
        self._expected_any = list(any_length)
        self._dtypes = [np.dtype(spec.dtype.as_numpy_dtype) for spec in flat_spec]
        self._shapes = [tf.TensorShape(spec.shape) for spec in flat_spec]
        self._timesteps = timesteps
        self._plans = {}  # the columns' (kind, stored shape) and dtypes: the plan

    def __call__(self, engine, sample):
        """``(info leaves, data leaves)`` of ``sample``, shaped as the spec says.

        Raises:
          ValueError: a column's dtype or shape does not fit the spec, or (timesteps)
            the columns cannot be cut into timesteps.
        """
        leaves = specs.optree.tree_leaves(sample.data)
        kinds = forms.column_kinds(engine)
        if len(leaves) != len(kinds) or any(
                leaf.shape[1:] != stored and not _pads(leaf.shape[1:], stored)
                for leaf, (_, stored) in zip(leaves, kinds)):
            kinds = _item_kinds(engine, sample, leaves)  # items of another shape
        key = (tuple(kinds), tuple(leaf.dtype for leaf in leaves))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(engine, kinds, leaves)
        info = list(sample.info)
        lengths = getattr(sample, "lengths", None)
        if lengths is not None:
            return self._any_length(info, leaves, specs.flatten(lengths)[0], plan)
        if plan[0] is not None:  # timesteps: cut [k, T, ...] into k * T steps
            leaves = [leaf.reshape((-1,) + leaf.shape[2:]) for leaf in leaves]
            info = [np.repeat(field, plan[0]) for field in info]
        out = [leaf if action == _KEEP else leaf[:, None] if action == _ADD_TIME else leaf[:, 0]
               for leaf, (action, _) in zip(leaves, plan[1])]
        if any(self._expected_any):
            # Unpadded items (of another shape, from the general store) in a dataset
            # that cuts items to their lengths: each is as long as it is.
            if any(flag and leaf.ndim < 2 for leaf, flag in zip(out, self._expected_any)):
                self._changed()
            out += [np.full(len(leaf), leaf.shape[1], np.int64)
                    for leaf, flag in zip(out, self._expected_any) if flag]
        return info, out

    def _any_length(self, info, leaves, lengths, plan):
        """A padded chunk of items of any length: its timesteps (each item's own, in one
        boolean mask), or its columns and, at the end, the lengths of those of any
        length (``TrajectoryDataset`` cuts each item to them)."""
        if plan[0] == _ANY_LENGTH:
            first = lengths[0]
            if any((other != first).any() for other in lengths[1:]):
                raise ValueError(
                    f"Table '{self._table}': can't split non timestep trajectory into "
                    "timesteps: a sampled item's columns have different lengths; read the "
                    "items with TrajectoryDataset.")
            steps = [leaf[np.arange(leaf.shape[1]) < first[:, None]] for leaf in leaves]
            return [np.repeat(field, first) for field in info], steps
        flags = [action == _KEEP and stored[:1] == (None,) for action, stored in plan[1]]
        if flags != (self._expected_any or [False] * len(flags)):
            self._changed()
        for index, (n, (action, stored)) in enumerate(zip(lengths, plan[1])):
            if stored[:1] == (None,) and action != _KEEP:  # the spec fixes the length
                want = 1 if action == _DROP_TIME else self._shapes[index][0]
                if (n != want).any():
                    self._wrong_length(index, action, n[n != want][0])
        out = [leaf if action in (_KEEP, _SPEC_LENGTH) else leaf[:, None]
               if action == _ADD_TIME else leaf[:, 0]
               for leaf, (action, _) in zip(leaves, plan[1])]
        return info, out + [n for n, flag in zip(lengths, flags) if flag]

    def _wrong_length(self, index, action, length):
        # Reverb's words (see ``_refuse``): the item's shape against the spec's.
        spec, dtype = self._shapes[index], specs.tf_dtype_name(self._dtypes[index])
        cell = spec.as_list()[1:] if action == _SPEC_LENGTH else spec.as_list()
        raise ValueError(
            f"Table '{self._table}': requested incompatible tensor at flattened index "
            f"{index} (column {self._paths[index]}). Specification has (dtype, shape): "
            f"({dtype}, {_shape_str(spec)}).  Tensor has (dtype, shape): ({dtype}, "
            f"{_shape_str([int(length)] + cell)}). The items are sequences of any length "
            f"(this one of {int(length)} steps): give the spec a None time dimension to read "
            "them all.")

    def _changed(self):
        raise ValueError(
            f"Table '{self._table}': its columns of any length (a None time dimension) are "
            "not those the dataset was made for (the buffer did not exist yet, or a reset "
            "changed the table); make the dataset again.")

    def _plan(self, engine, kinds, leaves):
        """``(timestep length or None, [(action, stored shape)] per column)``."""
        if engine.config.signature is not None:
            self._check_signature(engine.config.column_specs)
        if len(leaves) != len(self._shapes):
            raise ValueError(
                f"Table '{self._table}': the dataset expects {len(self._shapes)} tensors per "
                f"item, the table's items have {len(leaves)}.")
        paths = engine.paths if engine.has_columns() else [str(i) for i in range(len(kinds))]
        self._paths = paths  # (for errors found when items come)
        length = self._timestep_length(kinds) if self._timesteps else None
        actions = []
        for index, (kind, stored) in enumerate(kinds):
            dtype = leaves[index].dtype
            if length is not None:  # one timestep of a step column
                views = {_KEEP: stored[1:]}
            elif kind == forms.SQUEEZED:
                views = {_KEEP: stored} if self._timesteps else {
                    _KEEP: stored, _ADD_TIME: (1,) + stored}
            elif kind == forms.WHOLE:
                # Reverb's view of an inserted item is one timestep, [1, *S]: first, for a
                # spec of unknown rank (which fits both).
                views = {_KEEP: stored} if self._timesteps else {
                    _ADD_TIME: (1,) + stored, _KEEP: stored}
            elif kind == forms.ONE_STEP or stored[:1] == (None,):
                views = {_KEEP: stored, _DROP_TIME: stored[1:]}
            else:
                views = {_KEEP: stored}
            spec_shape = self._shapes[index]
            action = next((a for a, shape in views.items()
                           if spec_shape.is_compatible_with(shape)), None)
            if (length is None and stored[:1] == (None,) and action == _KEEP
                    and spec_shape[0] is not None):
                # Items of any length read at the spec's length, as Reverb checks each
                # item against the spec (one of another length is refused when it comes).
                action = _SPEC_LENGTH
            if action is None or dtype != self._dtypes[index]:
                self._refuse(index, paths[index], dtype, kind, stored, length, views)
            actions.append((action, stored))
        return length, actions

    def _check_signature(self, signature_specs):
        """Refuses a spec that cannot fit the table's signature, as Reverb does when the
        iterator starts (in its words: code and tests match on them), whatever the items
        stored so far. The signature is taken as it is, for timesteps too."""
        if len(signature_specs) != len(self._shapes):
            raise ValueError(
                f"Inconsistent number of tensors requested from table '{self._table}'.  "
                f"Requested {len(self._shapes)} tensors, but table signature shows "
                f"{len(signature_specs)} tensors.")
        for index, (want, dtype, shape) in enumerate(
                zip(signature_specs, self._dtypes, self._shapes)):
            if dtype != want.dtype or not shape.is_compatible_with(want.shape):
                raise ValueError(
                    f"Requested incompatible tensor at flattened index {index} from table "
                    f"'{self._table}'.  Requested (dtype, shape): "
                    f"({specs.tf_dtype_name(dtype)}, {_shape_str(shape)}).  Signature "
                    f"(dtype, shape): ({specs.tf_dtype_name(want.dtype)}, "
                    f"{_shape_str(want.shape)}).")

    def _timestep_length(self, kinds):
        """The items' time dimension when their columns are steps; None for whole items
        (each is one timestep)."""
        if all(kind == forms.WHOLE for kind, _ in kinds):
            return None
        if (all(kind in (forms.ONE_STEP, forms.SEQUENCE) for kind, _ in kinds)
                and any(stored[0] is None for _, stored in kinds)):
            return _ANY_LENGTH  # each item's columns are checked when it comes
        lengths = {stored[0] if kind in (forms.ONE_STEP, forms.SEQUENCE) else None
                   for kind, stored in kinds}
        if len(lengths) != 1 or None in lengths:
            raise ValueError(
                f"Table '{self._table}': can't split non timestep trajectory into timesteps: "
                "every column of the items must have the same time dimension (a squeezed "
                "column has none); read the items with TrajectoryDataset.")
        return lengths.pop()

    def _refuse(self, index, path, dtype, kind, stored, length, views):
        # Worded as Reverb's error (TensorFlow's dtype names, [3,3]), which code and tests
        # match on, then which column it is and what would fit.
        item_shape = views[_KEEP] if length is not None or self._timesteps else \
            forms.usual_view(kind, stored)
        message = (
            f"Table '{self._table}': requested incompatible tensor at flattened index "
            f"{index} (column {path}). Specification has (dtype, shape): "
            f"({specs.tf_dtype_name(self._dtypes[index])}, {_shape_str(self._shapes[index])})."
            f"  Tensor has (dtype, shape): ({specs.tf_dtype_name(dtype)}, "
            f"{_shape_str(item_shape)}).")
        if len(views) > 1:
            message += (" The column is one step: the spec may have it with or without "
                        "its time dimension of 1 (" +
                        " or ".join(_shape_str(s) for _, s in sorted(views.items())) + ").")
        elif kind == forms.SEQUENCE and stored[0] is None and not self._timesteps:
            message += (" The items have any length: give the spec a None time dimension "
                        f"({_shape_str(stored)}).")
        elif kind == forms.SEQUENCE and not self._timesteps:
            message += (f" The items are sequences of {stored[0]} steps: give the spec "
                        "their time dimension, or read timesteps with TimestepDataset.")
        elif length == _ANY_LENGTH:
            message += " (one timestep of items of any length)."
        elif length is not None:
            message += f" (one timestep of items of {length} steps)."
        elif self._timesteps:
            message += " (each item is one timestep, as inserted)."
        raise ValueError(message)


def _item_kinds(engine, sample, leaves):
    """``(kind, stored shape)`` per column of sampled items whose shapes are not the
    columns' (items of another shape, from the general store; a chunk holds such items
    only if they share their shapes): a writer's item has the forms it was written in,
    an item of a signature's table the signature's, an inserted item is whole."""
    timed = forms.timed_columns(forms.form_of(engine, int(sample.info.key[0])), len(leaves))
    column_specs = engine.config.column_specs if engine.config.signature is not None else None
    kinds = []
    for index, leaf in enumerate(leaves):
        shape = tuple(leaf.shape[1:])
        if timed is not None:
            kind = (forms.SQUEEZED if not timed[index] else
                    forms.ONE_STEP if shape[:1] == (1,) else forms.SEQUENCE)
        elif column_specs is not None and index < len(column_specs):
            kind = forms.SEQUENCE if specs.varies_in_time(column_specs[index]) else forms.WHOLE
        else:
            kind = forms.WHOLE
        kinds.append((kind, shape))
    return kinds


def _shape_str(shape) -> str:
    shape = tf.TensorShape(shape)
    if shape.rank is None:
        return "<unknown>"  # (TensorFlow's words for a shape of unknown rank)
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"



def _pads(shape, stored) -> bool:
    """Whether a padded column of ``shape`` fits a column of any length ``stored``."""
    return stored[:1] == (None,) and len(shape) == len(stored) and shape[1:] == stored[1:]

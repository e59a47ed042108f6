"""``Writer``: Reverb's legacy writer. Append steps; an item is the last N of them.

Each step is a nest with the same structure, shapes and dtypes as the first. The writer
keeps the last ``max_sequence_length`` steps in its process; ``create_item`` makes an
item of the last ``num_timesteps`` of them, sampled back as the step nest with every
leaf ``[num_timesteps, ...]``. Steps are copied into a table's shared memory when an
item of that table first references them, once however many of its items do.
"""

import collections
import itertools
from typing import Optional

import numpy as np

from shmreplay import errors, specs
from shmreplay._schema import nest_plans as _nest_plans
from shmreplay._writers import pending as _pending
from shmreplay._writers import writing as _writing


class Writer:
    """Appends steps and creates items of the most recent ones (Reverb's legacy Writer).

    Create it with ``Client.writer(max_sequence_length)``::

        with client.writer(max_sequence_length=3) as writer:
            for step in episode:
                writer.append({"obs": step.obs, "reward": step.reward})
                writer.create_item("transitions", num_timesteps=1, priority=1.0)
                if writer.num_steps >= 3:
                    writer.create_item("sequences", num_timesteps=3, priority=1.0)

    ``create_item`` inserts at once when the table's rate limiter allows it; otherwise
    the item waits in the writer, and ``create_item`` blocks only while
    ``max_in_flight_items`` items wait. ``flush`` and ``close`` insert everything.
    Not thread-safe: one writer per thread.
    """

    def __init__(self, client, max_sequence_length: int, delta_encoded: bool = False,
                 chunk_length: Optional[int] = None, max_in_flight_items: Optional[int] = 25):
        if int(max_sequence_length) != max_sequence_length or max_sequence_length < 1:
            raise ValueError(
                f"max_sequence_length must be an integer >= 1, got {max_sequence_length!r}.")
        if chunk_length is not None and not 1 <= chunk_length <= max_sequence_length:
            raise ValueError(
                f"chunk_length must be None or in [1, max_sequence_length="
                f"{max_sequence_length}], got {chunk_length!r}.")
        if max_in_flight_items is not None and max_in_flight_items < 1:
            raise ValueError(
                f"max_in_flight_items must be None or >= 1, got {max_in_flight_items!r}.")
        # delta_encoded and chunk_length shape Reverb's network chunks; shared memory
        # stores each step as is, so they are accepted and change nothing.
        self._client = client
        self._max_length = int(max_sequence_length)
        self._max_in_flight = max_in_flight_items
        # Each step: (uid, values in field order). StepRefs are made only for items
        # that take the general path (``_columns``).
        self._steps = collections.deque(maxlen=self._max_length)
        self._treedef = None
        self._paths = None
        self._fields = None
        self._step_plan = None      # reads steps of the first step's structure (fast path)
        self._plans = {}            # (table, num_timesteps) -> (TableRows, ItemPlan)
        self._first = None           # the first step's values (fix dtypes and shapes)
        self._uids = itertools.count()
        self._tables = {}
        self._pending = _pending.PendingItems()
        self._appended = 0
        self._closed = False

    @property
    def num_steps(self) -> int:
        """Steps an item can reference now (at most ``max_sequence_length``)."""
        return len(self._steps)

    def append(self, data):
        """Appends one step (a nest of arrays or scalars; copied).

        Raises:
          SchemaError: the step's structure, a leaf's dtype or shape differs from the
            first step's (nothing is appended).
        """
        self._check_open()
        plan = self._step_plan
        leaves = plan(data) if plan is not None else None
        if leaves is not None:
            # A nest of the first step's structure (read by its plan, without
            # flattening): copy each leaf whose dtype and shape match (anything else
            # takes the checked path).
            values = []
            for leaf, first in zip(leaves, self._first):
                kind = type(leaf)
                if kind is np.ndarray and leaf.shape == first.shape and (
                        leaf.dtype is first.dtype or leaf.dtype == first.dtype):
                    values.append(leaf.copy())
                elif (kind in _writing.NUMPY_SCALARS and first.shape == ()
                      and leaf.dtype == first.dtype):
                    values.append(leaf)  # immutable: no copy needed
                elif kind in _PY_SCALARS and first.shape == ():
                    value = specs.python_scalar_as(leaf, first.dtype)
                    if value is None:
                        values = None
                        break
                    values.append(value)
                else:
                    values = None
                    break
            if values is not None:
                self._push(values, self._treedef)
                return
        leaves, treedef = specs.flatten(data)
        values = self._convert(leaves, treedef)
        self._push(values, treedef)

    def append_sequence(self, sequence):
        """Appends ``T`` steps given as one nest whose leaves have a leading dimension ``T``.

        Equivalent to ``append`` of each ``leaf[t]``.

        Raises:
          ValueError: a leaf is a scalar, leaves have different leading sizes, or T is 0.
          SchemaError: the steps do not match the first step's structure or shapes.
        """
        self._check_open()
        leaves, treedef = specs.flatten(sequence)
        arrays = [np.asarray(leaf) for leaf in leaves]
        if not arrays:
            raise ValueError("append_sequence: the sequence has no leaves.")
        paths = specs.path_strings(treedef)
        for array, path in zip(arrays, paths):
            if array.ndim == 0:
                raise ValueError(f"append_sequence: leaf {path} is a scalar; every leaf needs "
                                 "a leading time dimension.")
        lengths = {array.shape[0] for array in arrays}
        if len(lengths) != 1:
            detail = ", ".join(f"{p}: {a.shape[0]}" for p, a in zip(paths, arrays))
            raise ValueError(f"append_sequence: leaves have different lengths ({detail}).")
        length = lengths.pop()
        if length == 0:
            raise ValueError("append_sequence: the sequence is empty.")
        steps = [self._convert([array[t] for array in arrays], treedef)
                 for t in range(length)]
        for values in steps:
            self._push(values, treedef)

    def _convert(self, leaves, treedef):
        """Copies and checks one step's leaves; nothing changes if a check fails."""
        if self._treedef is None:
            paths = specs.path_strings(treedef)
            values = [specs.step_value(np.array(leaf), f"Writer, column {path}")
                      for leaf, path in zip(leaves, paths)]
            if not values:
                raise errors.SchemaError("Writer: a step needs at least one tensor.")
            return values
        if not specs.same_structure(treedef, self._treedef):
            first = [specs.TensorSpec(value.shape, value.dtype) for value in self._first]
            problems, _ = specs.structure_mismatch(treedef, self._treedef, first,
                                                   against="the first step")
            raise errors.SchemaError(
                f"Writer: the step does not match the structure of the first step: "
                f"{'; '.join(problems)} (the number and names of tensors per timestep must "
                "stay the same).")
        values = []
        for leaf, first, path in zip(leaves, self._first, self._paths):
            if type(leaf) in _PY_SCALARS:
                value = specs.python_scalar_as(leaf, first.dtype)
                if value is None:
                    raise errors.SchemaError(
                        f"Writer, column {path}: expected dtype {first.dtype} (as the first "
                        f"step), got Python {type(leaf).__name__} {leaf!r}: "
                        f"{specs.python_scalar_refusal(leaf, first.dtype)}.")
            else:
                value = np.array(leaf)
                if value.dtype.kind not in "biufc":  # (strings: as objects; or refused)
                    value = specs.step_value(value, f"Writer, column {path}")
            if value.dtype != first.dtype:
                raise errors.SchemaError(
                    f"Writer, column {path}: expected dtype {first.dtype} (as the first "
                    f"step), got {value.dtype}.")
            if value.shape != first.shape:
                raise errors.SchemaError(
                    f"Writer, column {path}: expected shape {first.shape} (as the first "
                    f"step), got {value.shape}.")
            values.append(value)
        return values

    def _push(self, values, treedef):
        if self._treedef is None:  # the first step fixes structure, dtypes and shapes
            self._first = values
            self._treedef = treedef
            self._paths = specs.path_strings(treedef)
            # The fields as TrajectoryWriter names them, so that both kinds of writer
            # feeding one table share its stores.
            self._fields = [tuple(p) for p in specs.optree.treespec_paths(treedef)]
            self._step_plan = _nest_plans.plan_for(treedef)
        self._steps.append((next(self._uids), values))
        self._appended += 1
        if self._pending:
            self._pending.drain(0.0)
        if self._appended % 256 == 0:
            self._forget_old_rows()

    def create_item(self, table: str, num_timesteps: int, priority: float):
        """Creates an item of the last ``num_timesteps`` appended steps.

        Raises:
          ValueError: ``num_timesteps`` < 1, > ``max_sequence_length`` or > the steps
            appended.
          InvalidPriorityError: a NaN, infinite or negative priority.
          TableNotFoundError: unknown table.
          SchemaError: the table's items have other shapes.
        """
        self._check_open()
        if int(num_timesteps) != num_timesteps or num_timesteps < 1:
            raise ValueError(f"num_timesteps must be an integer >= 1, got {num_timesteps!r}.")
        if num_timesteps > self._max_length:
            raise ValueError(
                f"num_timesteps ({num_timesteps}) must be <= max_sequence_length "
                f"({self._max_length}).")
        if num_timesteps > len(self._steps):
            raise ValueError(
                f"num_timesteps ({num_timesteps}) is more than the {len(self._steps)} "
                "step(s) appended.")
        num_timesteps = int(num_timesteps)
        steps = list(itertools.islice(self._steps, len(self._steps) - num_timesteps, None))
        planned = self._plans.get((table, num_timesteps))
        if planned is not None and planned[1].generation != planned[0].engine.layout_gen:
            planned = None  # planned for a layout forgotten since (``Client.reset``)
        if planned is None:
            rows = self._rows(table)
            prio = _writing.check_priority(rows.engine, priority)
            columns = self._columns(steps)
            plan = _writing.plan_item(rows, self._treedef, columns, self._paths,
                                      per_step=True)
            self._plans[(table, num_timesteps)] = (rows, plan)
        else:
            rows, plan = planned
            prio = _writing.check_priority(rows.engine, priority)
            if plan.uniform and not self._pending:
                # The usual item: every column over the same steps, nothing waiting ahead
                # of it. Inserted straight from the steps if the rate limiter admits it
                # now; otherwise it waits like any other (below).
                try:
                    _writing.insert_uniform_steps(rows, plan, steps, prio, 0.0)
                    return
                except (errors.DeadlineExceededError, errors.LayoutResetError):
                    pass
            columns = self._columns(steps)
        if self._max_in_flight is not None and len(self._pending) >= self._max_in_flight:
            self._pending.drain(None, leave=self._max_in_flight - 1)  # room for this one
        self._pending.add(rows, plan, columns, prio, [uid for uid, _ in steps])

    def _columns(self, steps):
        """An item's ``ItemColumn``s over ``steps`` (one per field)."""
        return [_writing.ItemColumn([_writing.StepRef(uid, 0, field, values[i])
                                     for uid, values in steps], False, field)
                for i, field in enumerate(self._fields)]

    def _rows(self, table):
        rows = self._tables.get(table)
        if rows is None:
            rows = self._tables[table] = _writing.TableRows(self._client._engine(table))
        return rows

    def _forget_old_rows(self):
        oldest = self._steps[0][0] if self._steps else next(self._uids)
        for _, _, columns, _, _ in self._pending.items:
            oldest = min(oldest, columns[0].refs[0].uid)
        for rows in self._tables.values():
            rows.forget_before(oldest)

    def flush(self, timeout: Optional[float] = None):
        """Inserts every item still waiting for its table's rate limiter.

        Raises:
          DeadlineExceededError: ``timeout`` (seconds) passed first; items keep waiting.
        """
        self._check_open()
        if not self._pending.drain(timeout):
            raise errors.DeadlineExceededError(
                f"Writer.flush: {len(self._pending)} item(s) still wait for their table's "
                f"rate limiter after {errors.seconds(timeout)}.")

    def close(self, retry_on_unavailable: bool = True, timeout: Optional[float] = None):
        """Flushes, then closes the writer.

        Raises:
          ValueError: the writer was closed already.
        """
        del retry_on_unavailable  # no network here
        if self._closed:
            raise ValueError("Writer is already closed.")
        try:
            self.flush(timeout)
        finally:
            self._closed = True
            self._steps.clear()
            self._tables = {}

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    def _check_open(self):
        if self._closed:
            raise errors.ClosedError("Writer was closed.")

    def __enter__(self):
        if self._closed:
            raise ValueError("Cannot enter a closed Writer.")
        return self

    def __exit__(self, *exc):
        if not self._closed:
            self.close()


_PY_SCALARS = (bool, int, float)

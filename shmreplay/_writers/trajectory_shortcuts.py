"""The ``TrajectoryWriter``'s two short paths, for what actors do at every step.

* ``_WholeSteps``: while every step is a whole nest of the same fields (read by its
  structure's plan, ``_schema.nest_plans``), ``append`` checks and copies it field by
  field, without flattening it.
* ``_UsualItem``: a writer's usual item for a table (a flat dict of ``[-n:]`` windows
  over the same steps) is recognised from its keys and inserted without flattening or
  planning it again.

Anything else, or anything these do not recognise, takes the general path, which
checks everything and explains what is wrong.
"""

import numpy as np

from shmreplay import errors
from shmreplay._writers import writing as _writing
from shmreplay._writers.history import TrajectoryColumn

PY_DTYPES = {bool: np.bool_, int: np.int64, float: np.float64}


class _WholeSteps:
    """The writer's fields while every step is a whole nest of all of them (the usual
    actor): ``append`` checks and copies such a step field by field, and pushes it onto
    the columns, without flattening it or looking fields up by path."""

    __slots__ = ("plan", "paths", "columns", "firsts")

    def __init__(self, plan, paths, columns, firsts):
        self.plan = plan          # the steps' nest plan: data -> leaves, or None
        self.paths = paths        # per key, the field's path
        self.columns = columns    # per key, its _ColumnHistory
        self.firsts = firsts      # per key, the field's first value (dtype and shape)

    def push(self, values, uid: int, episode: int):
        """Pushes one step's checked ``values`` onto the fields' histories: what
        ``_ColumnHistory.push`` and ``keep_alive`` do, inlined for the hot path."""
        step_ref = _writing.StepRef
        for path, column, value in zip(self.paths, self.columns, values):
            ref = step_ref(uid, episode, path, value)
            refs = column.refs
            refs.append(ref)
            if len(refs) > column.span:
                refs.popleft()
                column.start += 1
            alive = column.values
            alive.append(ref)
            if len(alive) > column.keep:
                old = alive.popleft()
                old.expired = True
                if column.span > column.keep:
                    column.expire(old)

    def convert(self, leaves):
        """The step's values (arrays copied, Python scalars as the general path converts
        them), or None if a value is not a numpy array or scalar, or a Python scalar, of
        the field's dtype and shape (the general path then converts, or explains)."""
        values = []
        for leaf, first in zip(leaves, self.firsts):
            kind = type(leaf)
            if kind is np.ndarray:
                if leaf.shape != first.shape or not (
                        leaf.dtype is first.dtype or leaf.dtype == first.dtype):
                    return None
                values.append(leaf.copy())  # the caller may reuse its array
            elif (kind in _writing.NUMPY_SCALARS and first.shape == ()
                  and leaf.dtype == first.dtype):
                values.append(leaf)  # immutable: kept as is
            elif kind in PY_DTYPES and first.shape == ():
                value = np.asarray(leaf, PY_DTYPES[kind])
                if value.dtype != first.dtype:
                    return None
                values.append(value)
            else:
                return None
        return values


class _UsualItem:
    """A writer's usual item for one table, recognised from its trajectory's keys: a flat
    dict of history windows (``history[k][-n:]``) of one length over the same steps,
    planned before as a uniform item. ``insert`` checks that this trajectory is one and
    inserts it, skipping the general path's flattening and planning."""

    __slots__ = ("keys", "sources", "length", "rows", "plan")

    def __init__(self, keys, sources, length: int, rows, plan):
        self.keys = keys          # the trajectory's keys, in flattening order
        self.sources = sources    # per key, the history field its window must read
        self.length = length
        self.rows = rows
        self.plan = plan

    def insert(self, trajectory, priority) -> bool:
        """Inserts ``trajectory`` if it is this usual item and the rate limiter admits it
        now; False if not (nothing done: the general path checks and explains)."""
        column_refs = []
        length = self.length
        ends = None
        for key, source in zip(self.keys, self.sources):
            column = trajectory[key]
            if type(column) is not TrajectoryColumn or not column._window:
                return False
            refs = column._refs
            first, last = refs[0], refs[-1]
            # A window holds consecutive steps of one field, oldest first: checking its
            # ends checks it all (as in the general path).
            if len(refs) != length or first.path != source or first.expired:
                return False
            if ends is None:
                ends = (first.uid, last.uid, first.episode)
            elif (first.uid, last.uid, first.episode) != ends:
                return False
            if last.episode != first.episode:
                return False
            column_refs.append(refs)
        rows = self.rows
        prio = _writing.check_priority(rows.engine, priority)
        uids = [ref.uid for ref in column_refs[0]]
        try:
            _writing.insert_uniform_refs(rows, self.plan, column_refs, uids, prio, 0.0)
        except (errors.DeadlineExceededError, errors.LayoutResetError):
            return False
        return True

"""The ``TrajectoryWriter``'s two short paths, for what actors do at every step.

* ``_WholeSteps``: while every step is a whole nest of the same fields (read by its
  structure's plan, ``_schema.nest_plans``), ``append`` checks and copies it field by
  field, without flattening it.
* ``_UsualItem``: a writer's usual item for a table (a nest of ``[-n:]`` windows and
  ``[-1]`` steps, each at a fixed place relative to the others) is recognised by its
  structure's plan and inserted without flattening or planning it again.

Anything else, or anything these do not recognise, takes the general path, which
checks everything and explains what is wrong.
"""

import numpy as np

from shmreplay import errors
from shmreplay._schema import nest_plans as _nest_plans
from shmreplay._shm import layout as L
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
        """``convert_values(leaves, self.firsts)``."""
        return convert_values(leaves, self.firsts)


def convert_values(leaves, firsts):
    """A step's values (arrays copied, Python scalars as the general path converts
    them), or None if a value is not a numpy array or scalar, or a Python scalar, of
    its field's dtype and shape (``firsts``: each field's first value); the general
    path then converts, or explains."""
    values = []
    for leaf, first in zip(leaves, firsts):
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
    """A writer's usual item for one table: a trajectory of one structure (read by its
    nest plan) whose columns are history windows (``history[k][-n:]``) or single steps
    (``history[k][-1]``, squeezed), each at a fixed place relative to the others (the
    same steps, or an n-step transition's ``obs`` at ``[-n-1]``, rewards at ``[-n:]``
    and ``next_obs`` at ``[-1]``), planned before, every column sharing its field's
    store. ``insert`` checks that a trajectory is one and inserts it, skipping the
    general path's flattening, planning and bookkeeping."""

    __slots__ = ("nest_plan", "columns", "rows", "plan", "uniform", "distinct", "ref_steps",
                 "needs", "need_masks", "scratch")

    def __init__(self, nest_plan, columns, rows, plan):
        self.nest_plan = nest_plan  # trajectory -> its columns, or None
        self.columns = columns      # per column: (source field, length, squeeze, offset)
        self.rows = rows
        self.plan = plan
        # The item's distinct steps, as offsets from its first; per column, which of
        # them each reference reads.
        offsets = sorted({offset + i for _, length, _, offset in columns for i in range(length)})
        index = {offset: d for d, offset in enumerate(offsets)}
        self.distinct = offsets
        self.uniform = plan.uniform and all(
            offset == 0 and length == len(offsets) for _, length, _, offset in columns)
        ref_steps = [index[offset + i] for _, length, _, offset in columns
                     for i in range(length)]
        if plan.variable:  # (items of any length: the column lengths come first)
            ref_steps = [length for _, length, _, _ in columns] + ref_steps
        self.ref_steps = np.array(ref_steps, np.int64)
        # Per distinct step, what to copy where: (store, column, position), one per store.
        needs = [dict() for _ in offsets]
        for c, ((store, _), (_, length, _, offset)) in enumerate(zip(plan.columns, columns)):
            for i in range(length):
                needs[index[offset + i]].setdefault(store, (store, c, i))
        self.needs = [list(need.values()) for need in needs]
        self.need_masks = [sum(1 << store for store in need) for need in needs]
        n = len(offsets)
        known = np.empty(2 * n, np.int64)
        out = np.empty(2 * n, np.int64)
        self.scratch = (known[:n], known[n:], out, out[:n], out[n:])

    @staticmethod
    def pattern(leaves):
        """Per column of a trajectory of history windows (``leaves``): its field, length,
        squeeze and first step's offset from the item's first step."""
        base = min(leaf._refs[0].uid for leaf in leaves)
        return [(leaf._refs[0].path, len(leaf._refs), leaf._squeeze, leaf._refs[0].uid - base)
                for leaf in leaves]

    @classmethod
    def of(cls, nest_plan, columns, rows, plan):
        """The usual item of a trajectory of ``columns`` (``pattern``) planned with
        ``plan``, or None if its items cannot take this path."""
        if plan.general or not plan.steps or plan.generation != rows.engine.layout_gen:
            return None
        if not all(shared for _, shared in plan.columns):
            return None
        return cls(nest_plan, columns, rows, plan)

    def insert(self, trajectory, priority) -> bool:
        """Inserts ``trajectory`` if it is this usual item and the rate limiter admits it
        now; False if not (nothing done: the general path checks and explains)."""
        leaves = self.nest_plan(trajectory)
        if leaves is None:
            return False
        column_refs = []
        base = episode = None
        for column, (source, length, squeeze, offset) in zip(leaves, self.columns):
            if (type(column) is not TrajectoryColumn or not column._window
                    or column._squeeze is not squeeze):
                return False
            refs = column._refs
            first, last = refs[0], refs[-1]
            # A window holds consecutive steps of one field, oldest first: checking its
            # ends checks it all (as in the general path).
            if len(refs) != length or first.path != source or first.expired:
                return False
            if base is None:
                base = first.uid - offset
                episode = first.episode
            elif first.uid - offset != base or first.episode != episode:
                return False
            if last.episode != episode or last.uid - first.uid != length - 1:
                return False
            column_refs.append(refs)
        rows = self.rows
        plan = self.plan
        prio = _writing.check_priority(rows.engine, priority)
        try:
            if self.uniform:
                uids = [ref.uid for ref in column_refs[0]]
                _writing.insert_uniform_refs(rows, plan, column_refs, uids, prio, 0.0)
            else:
                self._insert(column_refs, base, episode, prio)
        except (errors.DeadlineExceededError, errors.LayoutResetError):
            return False
        return True

    def _insert(self, column_refs, base: int, episode: int, priority: float):
        """``writing.insert_item`` for this item's pattern of steps, known in advance:
        the rows the writer remembers for them, which stores each still needs."""
        rows = self.rows
        engine = rows.engine
        if self.plan.generation != engine.layout_gen:
            raise errors.LayoutResetError(f"Table '{engine.name}': its layout was forgotten.")
        entries = rows.entries
        uids = [base + offset for offset in self.distinct]
        known_rows, known_gens = self.scratch[:2]
        olds = []
        for d, uid in enumerate(uids):
            entry = entries.get(uid)
            olds.append(entry)
            if entry is None:
                known_rows[d] = known_gens[d] = _writing._NO_ROW
            else:
                known_rows[d] = entry[0]
                known_gens[d] = entry[1]
        n = len(uids)
        slot, got_rows, fresh = _writing.reserve_rows(engine, self.scratch, n, self.ref_steps,
                                                      0.0)
        remember = []
        try:
            stores = engine.columns
            generations = engine.rows
            for d in range(n):
                row = got_rows[d]
                old = olds[d]
                need = self.need_masks[d]
                if fresh[d] or old is None or old[0] != row:
                    have = 0
                else:
                    have = old[2]
                    if have & need == need:
                        continue
                for store, c, i in self.needs[d]:
                    if not have >> store & 1:
                        stores[store][row] = column_refs[c][i].value
                # Read while the reservation holds the row (see ``writing.insert_item``).
                remember.append((uids[d], [row, generations.item(row, L.R_GEN), have | need]))
        except BaseException:
            engine.cancel(np.array([slot], np.int64))
            raise
        return _writing._commit(engine, slot, priority, entries, remember, self.plan.form,
                                rows.stays.at(rows.episode_base + episode), 0.0)


def learn_usual_item(usual_items, table, trajectory, leaves, treedef, rows, plan):
    """Remembers in ``usual_items`` (``(table, trajectory type) -> [_UsualItem]``) the
    usual item of ``trajectory``'s shape (its columns ``leaves``, all history windows,
    planned before with ``plan``), so that the next such items skip the general path."""
    key = (table, type(trajectory))
    generation = rows.engine.layout_gen
    usual = [item for item in usual_items.get(key, ())
             if item.plan.generation == generation]  # (not those of a forgotten layout)
    usual_items[key] = usual
    columns = _UsualItem.pattern(leaves)
    if len(usual) >= 8 or any(item.plan is plan and item.columns == columns
                              for item in usual):
        return
    nest_plan = _nest_plans.checked_plan(trajectory, leaves, treedef)
    item = None if nest_plan is None else _UsualItem.of(nest_plan, columns, rows, plan)
    if item is not None:
        usual.append(item)

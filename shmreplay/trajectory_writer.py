"""``TrajectoryWriter``: append steps column by column, cut items out of the history.

The writer Acme's adders use (Reverb's ``TrajectoryWriter``). Each ``append`` adds one
step; ``history`` references the steps still kept (``num_keep_alive_refs`` per column);
``create_item`` makes an item from any columns of the history, each a
``TrajectoryColumn`` of step references (different columns may have different lengths).
A step is copied into a table's shared memory only when an item of that table first
references it, and only once however many items of that table reference it.

``create_item`` never blocks: when the table's rate limiter refuses, the item waits in
the writer until ``flush`` (or a later call) inserts it.
"""

import itertools
from typing import Optional

import numpy as np

from shmreplay import errors, specs
from shmreplay._schema import nest_plans as _nest_plans
from shmreplay._writers import item_columns as _item_columns
from shmreplay._writers import pending as _pending
from shmreplay._writers import writing as _writing
from shmreplay._writers.history import TrajectoryColumn  # noqa: F401 (Reverb's module has it)
from shmreplay._writers.history import (_AbsentColumn, _build_history, check_value,
                                        _ColumnHistory, _merge_structure, _named_path)
from shmreplay._writers.open_steps import StepParts
from shmreplay._writers.trajectory_shortcuts import (PY_DTYPES, _WholeSteps, convert_values,
                                                     learn_usual_item)

_CONTAINERS = (dict, list, tuple, type(None))  # not leaves (None: a skipped field)


_NO_FLUSH_ON = (errors.DeadlineExceededError, errors.BufferBrokenError, errors.ClosedError)



class TrajectoryWriter:
    """Appends steps and creates items from them (Reverb's ``TrajectoryWriter``).

    Create it with ``Client.trajectory_writer(num_keep_alive_refs)``::

        with client.trajectory_writer(num_keep_alive_refs=3) as writer:
            for step in episode:
                writer.append({"obs": step.obs, "action": step.action})
                if writer.episode_steps >= 3:
                    writer.create_item("replay", priority=1.0, trajectory={
                        "obs": writer.history["obs"][-3:],      # [3, ...]
                        "action": writer.history["action"][-2:],  # [2, ...]
                    })
            writer.end_episode()

    Not thread-safe: one writer per thread (they are cheap).
    """

    def __init__(self, client, num_keep_alive_refs: int, validate_items: bool = True):
        if int(num_keep_alive_refs) != num_keep_alive_refs or num_keep_alive_refs < 1:
            raise ValueError(
                f"num_keep_alive_refs must be an integer >= 1, got {num_keep_alive_refs!r}.")
        self._client = client
        self._keep = int(num_keep_alive_refs)
        self._validate = validate_items
        self._columns = {}            # path -> _ColumnHistory
        self._containers = {}         # path prefix -> container skeleton (for `history`)
        self._root = None
        self._column_keep = {}        # path -> configured num_keep_alive_refs
        self._span = self._keep       # steps a new column's history keeps (the largest keep)
        self._uids = itertools.count()
        self._episode = 0
        self._episode_steps = 0       # completed steps of this episode
        self._history_steps = 0       # completed steps since history was last cleared
        self._specs = {}              # path -> the first value's dtype and shape (no data)
        self._paths_of = {}           # treedef of appended data -> (its leaves' paths, plan)
        self._next_uid = None         # the uid of the step being appended
        self._flat = None             # (plan, paths) of the last step's structure
        self._whole_steps = None      # _WholeSteps while steps are whole nests of every field
        self._parts = StepParts(self)  # plans of partial steps' structures (open_steps)
        self._history = None          # the cached `history` nest
        self._item_layouts = {}       # a flat dict trajectory's keys -> (keys, treedef, paths)
        self._usual_items = {}        # (table, trajectory's type) -> [_UsualItem]
        self._open = None             # the open step's {path: ref} (after a partial append)
        self._tables = {}             # engine name -> _writing.TableRows
        self._pending = _pending.PendingItems()
        self._closed = False

    # --- appending --------------------------------------------------------------------

    def append(self, data, *, partial_step: bool = False):
        """Appends one step (or part of it, with ``partial_step=True``).

        Args:
          data: A nest of arrays, scalars or tensors. New fields may appear in later
            steps (earlier steps read as None for them); a field's dtype and shape are
            fixed by its first value. None leaves are skipped.
          partial_step: Keep the step open: the next ``append`` adds fields to it.

        Raises:
          SchemaError: a field's dtype or shape differs from its first value.
          ValueError: a field is set twice in the same (open) step.
        """
        self._check_open()
        whole = self._whole_steps
        if whole is not None and not partial_step and self._open is None:
            leaves = whole.plan(data)
            values = None if leaves is None else whole.convert(leaves)
            if values is not None:
                self._push_whole(values, whole)
                return
        found = self._parts.find(data) or self._parts.learn(data, self._columns, self._specs)
        if found is not None and found[1] is not None and self._append_part(
                found[1], found[0], partial_step):
            return
        leaves = None
        flat = self._flat
        if flat is not None:
            # A nest of the same structure as last time: read by its plan, not flattened.
            leaves = flat[0](data)
            paths = flat[1]
        if leaves is None:
            leaves, treedef = specs.flatten(data)
            known = self._paths_of.get(treedef)
            if known is None:  # a structure not seen before: it may add fields
                paths = [tuple(p) for p in specs.optree.treespec_paths(treedef)]
                self._root = _merge_structure(self._root, data)
                plan = _nest_plans.checked_plan(data, leaves, treedef)
                known = self._paths_of[treedef] = (paths, plan)
                self._history = None
            paths, plan = known
            self._flat = None if plan is None else (plan, paths)
        step = self._open if self._open is not None else {}
        converted = []
        first_values = self._specs
        for path, leaf in zip(paths, leaves):
            kind = type(leaf)
            if kind in _CONTAINERS:
                # A nested value or None in a dict read without flattening: flatten after
                # all (None is no value: it may name a field the open step has).
                self._flat = None
                return self.append(data, partial_step=partial_step)
            if path in step:
                raise ValueError(
                    f"Field {path} has already been set in the active step by previous "
                    f"(partial) append call and thus must be omitted or set to None but got: "
                    f"{leaf!r}")
            if kind is np.ndarray:
                value = leaf.copy()  # the caller may reuse its array
            elif kind in _writing.NUMPY_SCALARS:
                value = leaf  # immutable: kept as is
            elif kind in PY_DTYPES:
                value = np.asarray(leaf, PY_DTYPES[kind])
            elif isinstance(leaf, _CONTAINERS):  # a subclass (a namedtuple, ...)
                self._flat = None
                return self.append(data, partial_step=partial_step)
            else:
                value = np.array(leaf)
            first = first_values.get(path)
            if (first is None or value.shape != first.shape
                    or (value.dtype is not first.dtype and value.dtype != first.dtype)):
                value = check_value(path, value, first)  # (strings: as objects)
            converted.append((path, value))
        uid = self._next_uid
        if uid is None:
            uid = self._next_uid = next(self._uids)
        columns = self._columns
        opening = self._open is None
        if opening:
            # As in Reverb, a new step (even a partial one) takes a position in every
            # column at once, None until its field is given: ``history[k][-n:]`` reads
            # the same steps for every field while a step is open.
            self._history_steps += 1
        position = self._history_steps - 1  # the step's position in the history
        episode = self._episode
        for path, value in converted:
            column = columns.get(path)
            if column is None:
                # (its dtype and shape, not its data: a big first frame is not kept)
                first_values.setdefault(path, np.broadcast_to(np.zeros((), value.dtype),
                                                              value.shape))
                named = _named_path(data, path)
                keep = self._column_keep.get(path) or self._column_keep.get(named, self._keep)
                column = columns[path] = _ColumnHistory(path, keep, position, self._span)
                column.named = named
                self._root = _merge_structure(self._root, data)
                self._history = None
                self._whole_steps = None
                self._parts.clear()  # (their plans list every field's history)
            ref = _writing.StepRef(uid, episode, path, value)
            if len(column) > position:  # the open step's placeholder
                column.refs[-1] = ref
                column.keep_alive(ref)
            else:
                column.extend_to(position)
                column.push(ref)
            step[path] = ref
        if opening and len(step) < len(columns):  # placeholders for the absent fields
            for column in columns.values():
                if len(column) <= position:
                    column.extend_to(position + 1)
        if partial_step:
            self._open = step
            return
        self._open = None
        self._episode_steps += 1
        self._next_uid = None
        if (len(step) == len(columns) and self._whole_steps is None
                and self._flat is not None and len(self._flat[1]) == len(columns)):
            # A flat dict of every field: the next such steps may take the short path.
            plan, paths = self._flat
            self._whole_steps = _WholeSteps(
                plan, paths, [columns[path] for path in paths],
                [first_values[path] for path in paths])
        self._after_step()

    def _append_part(self, part, leaves, partial_step: bool) -> bool:
        """``append``'s short path for a step or part of a step of a known structure
        whose fields all have a history (``open_steps.StepPart``); False (nothing done)
        if a value needs converting or checking, or a field is already set in the open
        step (the general path converts, or raises)."""
        values = convert_values(leaves, part.firsts)
        if values is None:
            return False
        step = self._open
        opening = step is None
        if opening:
            step = {}
        elif not step.keys().isdisjoint(part.paths):
            return False
        uid = self._next_uid
        if uid is None:
            uid = self._next_uid = next(self._uids)
        if opening:
            self._history_steps += 1
        part.push(values, step, uid, self._episode, opening)
        self._parts.taken += 1
        if partial_step:
            self._open = step
            return True
        self._open = None
        self._next_uid = None
        self._episode_steps += 1
        if opening and not part.others and self._whole_steps is None:
            # A whole step of every field: the next ones may take the whole-step path.
            self._whole_steps = _WholeSteps(part.plan, part.paths, part.columns, part.firsts)
        self._after_step()
        return True

    def _push_whole(self, values, whole):
        """``append``'s end for a whole step of ``whole``'s fields (checked values)."""
        uid = self._next_uid
        if uid is None:
            uid = next(self._uids)
        self._next_uid = None
        whole.push(values, uid, self._episode)
        self._episode_steps += 1
        self._history_steps += 1
        self._after_step()

    def _after_step(self):
        if self._pending:
            self._pending.drain(0.0)
        if self._episode_steps % 256 == 0:
            self._forget_old_rows()

    def _current_uid(self):
        if self._next_uid is None:
            self._next_uid = next(self._uids)
        return self._next_uid

    # --- history ------------------------------------------------------------------------

    @property
    def history(self):
        """The appended data's structure, each field a history indexable by step
        (``int``: one step, squeezed; ``slice``; ``list`` of positions).

        Raises:
          RuntimeError: if nothing was appended yet.
        """
        if self._root is None:
            raise RuntimeError("history is not available before the first append.")
        if self._history is None:
            self._history = _build_history(self._root, (), self._columns,
                                           lambda path: _AbsentColumn(path, self))
        return self._history

    @property
    def episode_steps(self) -> int:
        """Complete (non-partial) steps appended since the last ``end_episode``."""
        return self._episode_steps

    @property
    def step_is_open(self) -> bool:
        """Whether the current step is partial (``append_partial`` since the last ``append``)."""
        return self._open is not None

    def configure(self, path, *, num_keep_alive_refs: int, max_chunk_length: Optional[int] = None):
        """Sets how many references of the column at ``path`` stay alive.

        ``path`` is a tuple of keys and positions into the appended data; a namedtuple's
        field may be named (``('obs',)``, as Reverb's paths name it) or given by
        position. ``max_chunk_length`` is accepted for Reverb compatibility (shared
        memory needs no chunks). Applies when the column first appears if it has not yet.

        Raises:
          ValueError: ``num_keep_alive_refs < 1``, or ``max_chunk_length`` not in
            ``[1, num_keep_alive_refs]``.
        """
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs must be >= 1, got {num_keep_alive_refs}.")
        if max_chunk_length is not None and not 1 <= max_chunk_length <= num_keep_alive_refs:
            raise ValueError(
                f"max_chunk_length must be None or in [1, num_keep_alive_refs="
                f"{num_keep_alive_refs}], got {max_chunk_length}.")
        path = tuple(path) if isinstance(path, (list, tuple)) else (path,)
        self._column_keep[path] = num_keep_alive_refs
        # As in Reverb, history keeps as many steps as the largest keep of the writer,
        # in every column created from now on; each field's values expire by its own.
        self._span = max(self._span, num_keep_alive_refs)
        for column in self._columns.values():
            if path in (column.path, column.named):
                column.set_keep(num_keep_alive_refs, self._span)

    # --- items --------------------------------------------------------------------------

    def create_item(self, table: str, priority: float, trajectory):
        """Creates an item in ``table`` from columns of the history; never blocks.

        Args:
          table: The table's name.
          priority: The item's priority.
          trajectory: A nest whose leaves are ``TrajectoryColumn``; the item is sampled
            back with this structure (a column of n steps as ``[n, ...]``, a squeezed one
            without time dimension).

        Raises:
          TypeError: a leaf is not a TrajectoryColumn.
          ValueError: empty trajectory or column, a reference expired, or the references
            span an episode boundary.
          InvalidPriorityError / TableNotFoundError / SchemaError: as named.
        """
        if self._closed:
            raise errors.ClosedError("TrajectoryWriter was closed.")
        if not self._pending:
            usuals = self._usual_items.get((table, type(trajectory)), ())
            for position, usual in enumerate(usuals):
                if usual.insert(trajectory, priority):
                    if position:  # the last one inserted is tried first next time
                        usuals.insert(0, usuals.pop(position))
                    return
        leaves, treedef, paths = _item_columns.trajectory_columns(self._item_layouts,
                                                                  trajectory)
        column_refs, shape, uids, window_ends = _item_columns.check_columns(leaves, paths)
        rows = self._tables.get(table) or self._rows(table)
        prio = _writing.check_priority(rows.engine, priority)
        plan = rows.plans.get((treedef, tuple(shape)))
        if plan is not None and window_ends is not False and not self._pending:
            learn_usual_item(self._usual_items, table, trajectory, leaves, treedef, rows, plan)
        if plan is not None and plan.uniform and uids and not self._pending:
            # The usual item (planned before, every column over the same steps, nothing
            # waiting ahead of it) goes in without making its ItemColumns, if the rate
            # limiter admits it now; otherwise it waits like any other (below).
            try:
                _writing.insert_uniform_refs(rows, plan, column_refs, uids, prio, 0.0)
                return
            except (errors.DeadlineExceededError, errors.LayoutResetError):
                pass
        columns = [_writing.ItemColumn(refs, squeeze, source)
                   for refs, (source, _, squeeze) in zip(column_refs, shape)]
        if plan is None:
            plan = _writing.plan_item(rows, treedef, columns, paths, (treedef, tuple(shape)))
        self._pending.add(rows, plan, columns, prio, uids or None)

    def _rows(self, table: str):
        rows = self._tables.get(table)
        if rows is None:
            engine = self._client._engine(table)
            rows = self._tables[table] = _writing.TableRows(engine)
        return rows

    def _forget_old_rows(self):
        oldest = None
        for column in self._columns.values():
            if column.values:  # oldest first
                uid = column.values[0].uid
                oldest = uid if oldest is None else min(oldest, uid)
        for _, _, columns, _, _ in self._pending.items:
            for column in columns:
                for ref in column.refs:
                    oldest = ref.uid if oldest is None else min(oldest, ref.uid)
        if oldest is None:
            oldest = self._current_uid()
        for rows in self._tables.values():
            rows.forget_before(oldest)

    # --- flushing and episodes ----------------------------------------------------------

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None):
        """Inserts waiting items until at most ``block_until_num_items`` remain.

        Raises:
          ValueError: ``block_until_num_items < 0``.
          DeadlineExceededError: ``timeout_ms`` passed first (the items keep waiting).
        """
        self._check_open()
        if block_until_num_items < 0:
            raise ValueError(
                f"block_until_num_items must be >= 0, got {block_until_num_items}.")
        timeout = None if timeout_ms is None else timeout_ms / 1000.0
        if not self._pending.drain(timeout, leave=block_until_num_items):
            raise errors.DeadlineExceededError(
                f"flush: {len(self._pending)} item(s) still wait for their table's rate "
                f"limiter after {errors.seconds(timeout_ms, 'ms')}.")

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None):
        """Flushes, then starts a new episode (``episode_steps`` back to 0).

        Args:
          clear_buffers: Also forget the history (its references become unusable).
          timeout_ms: Bounds the flush; on DeadlineExceededError the episode still ends.
        """
        self._check_open()
        try:
            self.flush(0, timeout_ms)
        finally:
            self._episode += 1
            self._episode_steps = 0
            self._open = None
            self._next_uid = None
            if clear_buffers:
                # Like Reverb, `history` keeps its structure, with every column empty.
                for column in self._columns.values():
                    column.expire_all()
                self._columns = {path: column.emptied()
                                 for path, column in self._columns.items()}
                self._whole_steps = None
                self._parts.clear()
                self._history = None
                self._history_steps = 0
            self._forget_old_rows()

    @property
    def num_pending_items(self) -> int:
        """Items created but not yet admitted by their table's rate limiter."""
        return len(self._pending)

    def close(self):
        """Closes the writer; items still waiting are dropped (``flush`` first to keep
        them). Closing twice is allowed."""
        self._closed = True
        self._pending = _pending.PendingItems()
        self._tables = {}

    def _check_open(self):
        if self._closed:
            raise errors.ClosedError("TrajectoryWriter was closed.")

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, exc_type, exc, tb):
        # Like Reverb: flush, unless a call timed out (a flush would block the same way)
        # or the buffer is gone. Bad input (SchemaError, InvalidPriorityError, ...) is no
        # reason to drop the items that wait.
        if exc_type is None or not issubclass(exc_type, _NO_FLUSH_ON):
            if not self._closed:
                self.flush()

    def __del__(self):
        self._closed = True

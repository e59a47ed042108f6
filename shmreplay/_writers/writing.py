"""What both writers share: step references, and turning an item into shared memory.

A writer keeps the steps it was given in its own process (a copy: the caller may reuse
its arrays) and writes a step into a table only when an item of that table first
references it. It remembers, per table, the row each step went to; the next item over
the same step references that row again (``kernels.reserve_item`` checks the row still
holds the step), so overlapping items do not store a step twice.

Items the rate limiter does not admit yet wait in the writer, in creation order
(``shmreplay._writers.pending``); they are inserted by later calls and by ``flush``.
"""

import os
import time
from typing import List

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors, specs
from shmreplay._schema import inputs as _inputs
from shmreplay._schema import item_forms as _item_forms
from shmreplay._writers import general_items as _general_items
from shmreplay._writers import one_item as _one_item
from shmreplay._writers.episode_stays import EpisodeStays
from shmreplay._schema.item_checks import check_rows_fit, item_form, item_specs, validate_item
from shmreplay._shm.kernels import codes
from shmreplay._shm.kernels import table as kernels
from shmreplay._shm.procs import STAMP as _STAMP

_SCRATCH_PROB = np.empty(2, np.float64)
_SCRATCH_IO = np.zeros(3, np.int64)  # only written (the futex value of a BLOCKED call)
_NO_ROW = -1
_UNKNOWN = object()
_LAYOUT_RETRIES = 5
# numpy scalar types: immutable, so a writer keeps such a value without copying it.
NUMPY_SCALARS = frozenset(np.sctypeDict.values())



class StepRef:
    """A reference to one value (one column of one step) appended to a writer.

    ``uid`` numbers the writer's steps (never reused by that writer); ``episode`` is the
    episode it belongs to; ``path`` the column (a tuple path into the appended data).
    """

    __slots__ = ("uid", "episode", "path", "value", "expired")

    def __init__(self, uid: int, episode: int, path, value: np.ndarray):
        self.uid = uid
        self.episode = episode
        self.path = path
        self.value = value
        self.expired = False

    def without_data(self) -> "StepRef":
        """An expired copy that keeps the value's shape and dtype, not its data."""
        ref = StepRef(self.uid, self.episode, self.path,
                      np.broadcast_to(np.zeros((), self.value.dtype), self.value.shape))
        ref.expired = True
        return ref

    @property
    def shape(self):
        return self.value.shape

    @property
    def dtype(self):
        return self.value.dtype

    def __repr__(self):
        return f"StepRef(step={self.uid}, path={self.path}{', expired' if self.expired else ''})"


class ItemColumn:
    """One column of an item: the step references it reads, whether it is squeezed, and
    its source: the writer field all its references read (None if they differ)."""

    __slots__ = ("refs", "squeeze", "source")

    def __init__(self, refs: List[StepRef], squeeze: bool, source=_UNKNOWN):
        self.refs = refs
        self.squeeze = squeeze
        if source is _UNKNOWN:
            source = refs[0].path
            for ref in refs:
                if ref.path != source:
                    source = None
                    break
        self.source = source


class TableRows:
    """One writer's view of one table.

    ``entries`` remembers where the writer's steps went: uid -> [row, gen, mask], where
    bit ``s`` of ``mask`` says store ``s`` of that row holds the step's value.
    ``plans`` caches, per item shape, how items of that shape are stored.
    """

    def __init__(self, engine):
        self.engine = engine
        self.entries = {}
        self.plans = {}
        # This writer's episode ids in this table: the base plus its episode number
        # (``StepRef.episode``), below 2**63. From os.urandom, so no other writer's ids
        # meet these (actors often seed ``random`` alike).
        self.episode_base = int.from_bytes(os.urandom(8), "little") >> 2
        self.stays = EpisodeStays()  # the current episode's items here (TableInfo counts)

    def forget(self):
        """Drops everything remembered: the table's layout was forgotten (``reset``)."""
        self.entries.clear()
        self.plans.clear()

    def forget_before(self, uid: int):
        """Drops entries of steps older than ``uid`` (no history can reference them)."""
        if self.entries:
            stale = [key for key in self.entries if key < uid]
            for key in stale:
                del self.entries[key]


class ItemPlan:
    """How items of one shape go into one table: per column, its store and whether its
    steps are shared with other items (the store holds the field the column reads)."""

    general = False  # (``_general_items.GeneralPlan``: the table's general store)

    __slots__ = ("steps", "columns", "uniform", "full_mask", "stores", "form", "generation",
                 "treedef", "paths", "per_step", "variable", "_uniform_refs", "_scratch")

    def __init__(self, storage, columns: List[ItemColumn], form: int = 0, generation: int = 0):
        self.steps = storage.steps
        # Items of any length: their references start with the column lengths.
        self.variable = storage.variable
        self.form = form  # which one-step columns Reverb's calls see flipped
        self.generation = generation  # the table layout it was planned for
        self.treedef = self.paths = None  # what ``plan_item`` planned it from
        self.per_step = False
        self.columns = []
        if self.steps:
            for column, stored in zip(columns, storage.columns):
                source = column.source
                shared = source is not None and storage.store_sources[stored.store] == source
                self.columns.append((stored.store, shared))
        stores = [store for store, _ in self.columns]
        # Items whose columns all read the same steps, each column from a store of its
        # own, take a shorter path (``insert_uniform_refs``): every column of a step is
        # written at once, and the writer remembers the step as complete.
        self.uniform = (self.steps and all(shared for _, shared in self.columns)
                        and len(set(stores)) == len(stores))
        self.full_mask = sum(1 << store for store in stores)
        self.stores = stores
        self._uniform_refs = {}
        self._scratch = {}

    def uniform_refs(self, length: int) -> np.ndarray:
        """``ref_steps`` of a uniform item of ``length`` steps: each column reads 0..n-1."""
        refs = self._uniform_refs.get(length)
        if refs is None:
            refs = np.tile(np.arange(length, dtype=np.int64), len(self.columns))
            if self.variable:
                refs = np.concatenate([np.full(len(self.columns), length, np.int64), refs])
            self._uniform_refs[length] = refs
        return refs

    def scratch(self, length: int):
        """Arrays a uniform item of ``length`` steps reserves with, reused by every such
        item (a writer is used by one thread): ``(known rows, known generations,
        out, out rows, out fresh)``, where ``out`` is the rows then the fresh flags."""
        arrays = self._scratch.get(length)
        if arrays is None:
            known = np.empty(2 * length, np.int64)
            out = np.empty(2 * length, np.int64)
            arrays = self._scratch[length] = (known[:length], known[length:], out,
                                              out[:length], out[length:])
        return arrays


def plan_key(treedef, columns: List[ItemColumn]):
    """What an item's plan depends on: its structure and, per column, field, length
    and squeeze (a writer fixes each field's dtype and shape at its first value)."""
    return treedef, tuple((c.source, len(c.refs), c.squeeze) for c in columns)


def plan_item(rows: TableRows, treedef, columns: List[ItemColumn], paths: List[str],
              key=None, per_step: bool = False) -> ItemPlan:
    """Validates an item for ``rows.engine`` (defining the table's storage if this is its
    first item) and returns how to store it.

    A writer fixes each field's dtype and shape at its first value, so an item's specs
    follow from its structure and, per column, the field, length and squeeze: checked
    once per such shape.

    ``per_step``: the legacy ``Writer``'s items, which may match a table signature per
    step (``obs: [4]`` for items whose ``obs`` is ``[T, 4]``), as in Reverb.

    Raises:
      SchemaError: if the item's structure, shapes or dtypes differ from the table's.
    """
    if key is None:
        key = plan_key(treedef, columns)
    plan = rows.plans.get(key)
    if plan is not None:
        if plan.generation == rows.engine.layout_gen:
            return plan
        rows.forget()  # planned for a layout forgotten since (``Client.reset``)
    engine = rows.engine
    try:
        proposal = validate_item(engine, treedef, columns, paths, per_step)
    except errors.SchemaError as refused:  # not the table's columns: its general store?
        plan = _general_items.plan(engine, treedef, columns, paths, per_step, refused)
        rows.plans[key] = plan
        return plan
    if proposal is not None:
        check_rows_fit(engine, proposal, columns)
        engine.define_storage(proposal)
        validate_item(engine, treedef, columns, paths, per_step)
    plan = ItemPlan(engine.storage, columns,
                    item_form(engine, columns, item_specs(columns), paths), engine.layout_gen)
    plan.treedef, plan.paths, plan.per_step = treedef, paths, per_step
    if all(c.source is not None for c in columns):  # mixed columns: checked every time
        rows.plans[key] = plan
    return plan


def insert_item(rows: TableRows, plan: ItemPlan, columns: List[ItemColumn], priority: float,
                timeout, uids=None):
    """Inserts one planned item into ``rows.engine``; returns its key.

    ``uids``: the steps every column reads, when the caller knows they all read the same
    ones (None: find out). An item planned for a layout that was forgotten since
    (``Client.reset``) is planned again for the table's current one.

    Raises DeadlineExceededError (nothing inserted) if the rate limiter does not admit
    it within ``timeout`` (0: do not wait).
    """
    for attempt in range(_LAYOUT_RETRIES):
        if plan.generation != rows.engine.layout_gen:
            rows.forget()
            plan = plan_item(rows, plan.treedef, columns, plan.paths, per_step=plan.per_step)
        try:
            return _insert_item(rows, plan, columns, priority, timeout, uids)
        except errors.LayoutResetError:
            if attempt == _LAYOUT_RETRIES - 1:
                raise


def _insert_item(rows: TableRows, plan: ItemPlan, columns: List[ItemColumn], priority: float,
                 timeout, uids):
    engine = rows.engine
    stays = rows.stays.at(rows.episode_base + columns[0].refs[0].episode)
    if plan.general:
        return _general_items.insert(engine, plan, columns, priority, timeout, stays)
    if not plan.steps:
        return _insert_whole(engine, columns, priority, timeout, plan.form, stays)
    if plan.uniform:
        if uids is None:
            uids = [ref.uid for ref in columns[0].refs]
            if not all([r.uid for r in c.refs] == uids for c in columns[1:]):
                uids = False
        if uids:
            return insert_uniform_refs(rows, plan, [column.refs for column in columns], uids,
                                       priority, timeout)
    # The item's distinct steps: a shared column's steps by uid (rows other items may
    # hold already), a private column's steps each on a new row. ``writes`` lists the
    # values to copy if every row the writer remembers still holds its step.
    entries = rows.entries
    steps = {}
    ref_steps = []
    writes = []
    for (store, shared), column in zip(plan.columns, columns):
        if shared:
            bit = 1 << store
            for ref in column.refs:
                uid = ref.uid
                step = steps.get(uid)
                if step is None:
                    step = steps[uid] = len(steps)
                ref_steps.append(step)
                entry = entries.get(uid)
                if entry is None or not entry[2] & bit:
                    writes.append((step, store, ref))
        else:
            for position, ref in enumerate(column.refs):
                step = steps[(id(column), position)] = len(steps)
                ref_steps.append(step)
                writes.append((step, store, ref))
    distinct = len(steps)
    known = [_NO_ROW] * (2 * distinct)  # rows, then generations
    for key, step in steps.items():
        entry = entries.get(key)
        if entry is not None:
            known[step] = entry[0]
            known[distinct + step] = entry[1]
    if plan.variable:
        ref_steps = [len(column.refs) for column in columns] + ref_steps
    slot, got_rows, fresh = _reserve(engine, known, np.array(ref_steps, np.int64), timeout)
    stores = engine.columns
    try:
        if any(fresh[step] for step in range(distinct) if known[step] != _NO_ROW):
            # A remembered row was freed meanwhile (every item over it removed): that
            # step is written again, into every store this item needs it in.
            writes = _all_writes(plan, columns, steps, entries, fresh)
        for step, store, ref in writes:
            stores[store][got_rows[step]] = ref.value
        # What the writer will remember: read while the reservation still holds the
        # rows (after the commit another writer may evict the item and take them).
        remember = {}
        generations = engine.rows
        for step, store, ref in writes:
            uid = ref.uid
            if steps.get(uid) != step:
                continue  # a private copy, never shared
            entry = remember.get(uid)
            if entry is None:
                row = got_rows[step]
                old = entries.get(uid)
                if old is None or old[0] != row or fresh[step]:
                    entry = [row, int(generations[row, L.R_GEN]), 0]
                else:
                    entry = [row, old[1], old[2]]
                remember[uid] = entry
            entry[2] |= 1 << store
    except BaseException:
        engine.cancel(np.array([slot], np.int64))
        raise
    return _commit(engine, slot, priority, entries, remember, plan.form, stays, timeout)


def insert_uniform_steps(rows: TableRows, plan: ItemPlan, steps, priority: float, timeout):
    """``insert_item`` for a uniform item (``ItemPlan.uniform``: every column reads the
    same steps), given the item's steps instead of its columns: ``steps[i]`` is
    ``(uid, values in column order)`` (a legacy ``Writer``'s steps), so no
    ``ItemColumn`` or ``StepRef`` is made for an item that goes in at once."""
    return _insert_uniform(rows, plan, [step[1] for step in steps], True,
                           [step[0] for step in steps], priority, timeout)


def reserve_rows(engine, scratch, n: int, ref_steps, timeout):
    """``(slot, rows, fresh)`` for an item of ``n`` distinct steps: one native call
    reserves a slot and a row per step (the known rows of ``scratch``, a plan's
    ``(known_rows, known_gens, out, out_rows, out_fresh)``, where still valid); if it is
    blocked or the layout is not mapped, the engine waits, maps, or explains."""
    known_rows, known_gens, out, out_rows, out_fresh = scratch
    slot = kernels.reserve_item(*engine.arrays, known_rows, known_gens, ref_steps, _STAMP[0],
                                0, 0, out_rows, out_fresh, _SCRATCH_IO)
    if slot < 0:
        slot, got_rows, fresh = engine.reserve_item(known_rows, known_gens, ref_steps, timeout)
        return slot, got_rows.tolist(), fresh.tolist()
    got = out.tolist()
    return slot, got[:n], got[n:]


def insert_uniform_refs(rows: TableRows, plan: ItemPlan, column_refs, uids,
                        priority: float, timeout):
    """``insert_item`` for a uniform item, given each column's references
    (``column_refs[c][i]``: step ``uids[i]`` of column ``c``). Returns the new key."""
    return _insert_uniform(rows, plan, column_refs, False, uids, priority, timeout)


def _insert_uniform(rows, plan, refs, by_step: bool, uids, priority: float, timeout):
    # ``by_step``: ``refs[i][c]`` is step i's value in column c; otherwise ``refs[c][i]``
    # is step i's reference in column c.
    engine = rows.engine
    if plan.generation != engine.layout_gen:  # (callers fall back to ``insert_item``)
        raise errors.LayoutResetError(f"Table '{engine.name}': its layout was forgotten.")
    entries = rows.entries
    full = plan.full_mask
    n = len(uids)
    # A legacy Writer's steps are all of its one episode; a TrajectoryWriter's refs say.
    stays = rows.stays.at(rows.episode_base if by_step
                          else rows.episode_base + refs[0][0].episode)
    known_rows, known_gens, out, out_rows, out_fresh = plan.scratch(n)
    complete = [False] * n  # the remembered row holds every column of the step
    for i, uid in enumerate(uids):
        entry = entries.get(uid)
        if entry is None:
            known_rows[i] = _NO_ROW
            known_gens[i] = _NO_ROW
        else:
            known_rows[i] = entry[0]
            known_gens[i] = entry[1]
            complete[i] = entry[2] == full
    slot, got_rows, fresh = reserve_rows(engine, (known_rows, known_gens, out, out_rows,
                                                  out_fresh), n, plan.uniform_refs(n), timeout)
    remember = []
    try:
        columns = engine.columns
        generations = engine.rows
        for i in range(n):
            if complete[i] and not fresh[i]:
                continue
            row = got_rows[i]
            if by_step:
                for store, value in zip(plan.stores, refs[i]):
                    columns[store][row] = value
            else:
                for store, column_refs in zip(plan.stores, refs):
                    columns[store][row] = column_refs[i].value
            # Read while the reservation holds the row (see ``insert_item``).
            remember.append((uids[i], [row, generations.item(row, L.R_GEN), full]))
    except BaseException:
        engine.cancel(np.array([slot], np.int64))
        raise
    return _commit(engine, slot, priority, entries, remember, plan.form, stays, timeout)


def _reserve(engine, known, ref_steps, timeout):
    """Reserves a slot and rows for one item: ``known`` lists the remembered rows of its
    distinct steps, then their generations. Returns ``(slot, rows, fresh)`` as lists."""
    distinct = len(known) // 2
    known = np.array(known, np.int64)
    out = np.empty(2 * distinct, np.int64)
    got_rows, fresh = out[:distinct], out[distinct:]
    slot = kernels.reserve_item(*engine.arrays, known[:distinct], known[distinct:], ref_steps,
                                _STAMP[0], 0, 0, got_rows, fresh, _SCRATCH_IO)
    if slot < 0:  # blocked (or not mapped yet): the engine waits, maps, or explains
        slot, got_rows, fresh = engine.reserve_item(known[:distinct], known[distinct:],
                                                    ref_steps, timeout)
    return slot, got_rows.tolist(), fresh.tolist()


def _commit(engine, slot, priority, entries, remember, form: int, stays, timeout):
    """Publishes the item in ``slot``; then the writer remembers where its steps went.

    If the table's lock stays held for ``timeout`` (a stopped process holds it), the
    slot is given up and ``LockTimeoutError`` raised: the item is not in the table, and
    the writer keeps it to insert again, as after a timeout of the rate limiter."""
    repeats = stays.record(engine, slot)
    key = kernels.commit_one(*engine.arrays, slot, priority, _SCRATCH_PROB, _STAMP[0], repeats)
    if key == codes.LOCK_BUSY:  # (its holder is slow or stopped)
        key = engine._commit_when_free(
            lambda: kernels.commit_one(*engine.arrays, slot, priority, _SCRATCH_PROB,
                                       _STAMP[0], repeats),
            np.array([slot], np.int64),
            None if timeout is None else time.monotonic() + max(0.0, timeout), timeout)
    if key < 0:
        engine._raise_status(key)
    stays.committed()
    if form:  # (rare: most items are stored in the table's usual form)
        _item_forms.record(engine, key, form)
    entries.update(remember)
    return key


def _all_writes(plan, columns, steps, entries, fresh):
    """Every value the item needs copied, given which rows are new (``fresh``)."""
    writes = []
    written = set()
    for (store, shared), column in zip(plan.columns, columns):
        bit = 1 << store
        for position, ref in enumerate(column.refs):
            step = steps[ref.uid] if shared else steps[(id(column), position)]
            entry = entries.get(ref.uid) if shared else None
            if fresh[step] or entry is None or not entry[2] & bit:
                if (step, store) not in written:
                    written.add((step, store))
                    writes.append((step, store, ref))
    return writes


def flat_dict_keys(treedef):
    """The keys in flattening order if ``treedef`` is a dict of leaves, else None
    (writers read such steps without flattening them). A None value is no leaf: a dict
    with one is not flat (its keys and leaves would not pair up)."""
    if treedef.kind != specs.optree.PyTreeKind.DICT:
        return None
    if any(child.num_nodes != 1 or child.num_leaves != 1 for child in treedef.children()):
        return None
    return list(specs.optree.treespec_entries(treedef))


def check_priority(engine, priority) -> float:
    """The priority as a float, or InvalidPriorityError (NaN, negative, too large)."""
    if type(priority) is float and 0.0 <= priority <= engine.max_priority:
        return priority
    return float(_inputs.check_priorities(engine, priority, 1)[0])


def _insert_whole(engine, columns, priority, timeout, form: int, stays):
    """An item for a table that stores whole items (its first item came from insert):
    the referenced steps are stacked into the item's columns (in the table's form)."""
    arrays = [np.reshape(array, spec.shape)
              for array, spec in zip(_one_item.stacked(columns), engine.column_specs)]
    slots, rows = engine.reserve_items(1, timeout, arrays)
    return _one_item.commit(engine, slots,
                            lambda: engine.write_items(slots, rows, arrays, False),
                            priority, timeout, stays, form)

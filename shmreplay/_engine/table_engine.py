"""The engine of one table: shared-memory views, blocking, data copies, error mapping.

A ``TableEngine`` is one process's handle on one table. It owns no state of its own
beyond the mapped views: everything lives in shared memory. The facade (``client.py``)
validates user input; this module turns it into kernel calls following the protocol of
``shmreplay._shm.sync``: reserve slots, copy rows without the lock, commit; draw slots,
copy rows without the lock, re-check slot versions.
"""

import dataclasses
import math
import sys
import time
import warnings

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors, specs
from shmreplay._engine import data_segment as _data_segment
from shmreplay._engine import kinds as _kinds
from shmreplay._engine.kinds import general as _general
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay._shm import segment as _segment
from shmreplay._schema import storage as _storage
from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes
from shmreplay._shm.kernels import table as kernels
from shmreplay._engine import table_info as _table_info
from shmreplay._schema.fast_leaves import (UNSET, FastLeaves, fast_scalar_bounds, flat_access,
                                          unflattener)
from shmreplay._engine.inserts import Inserting
from shmreplay._engine.sampling import Sampling, seed_once
from shmreplay._engine.waits import Waiting
from shmreplay.replay_sample import TableInfo

_NO_KEYS = np.empty(0, np.int64)
_WEIGH_UNLOCKED_FROM = 32  # keys per update (below: weights computed under the lock)
# How long ``stop()`` waits for each table's lock before it marks the table closed
# without it (its holder is stopped, or stuck).
CLOSE_LOCK_TIMEOUT = 1.0


class TableEngine(FastLeaves, Waiting, Inserting, Sampling):
    """One process's handle on one table of a buffer."""

    def __init__(self, buffer_name: str, index: int, config, region: L.TableRegion, buf):
        self.buffer_name = buffer_name
        self.index = index
        self.config = config
        self.name = config.name
        self.region = region
        self.capacity = region.capacity
        # The largest insert_batch that fits the spare slots and the rate limiter's window.
        self.max_batch = min(self.capacity - config.max_size,
                             config.rate_limiter.max_batch_insert())
        self.max_priority = _max_priority(config, self.capacity)
        self._reclaim_at = 0.0  # when a refused call may next look for dead writers
        # Slots reserved by calls that gave up, and slots samples deleted but could not
        # free: both wait for the lock (``_settle_abandoned``).
        self._abandoned = []
        self.closed_here = False  # this process's Client (or Server) closed its mapping
        self._undrained = []
        views = L.table_views(buf, region)
        self.ctrl = views.ctrl
        # For the one-call kernels (sample_gather, update_whole, insert_staged): the
        # segment's bytes and where this table is in them.
        self._header_bytes = np.frombuffer(buf, np.uint8)
        self._table_offsets = L.table_offsets(region)
        self._table_offsets[kernels.TABLE_LARGEST:kernels.TABLE_LARGEST + 1].view(
            np.float64)[0] = self.max_priority
        self._update_scratch = np.empty((2, 256), np.int64)  # update_whole_weighed's, grown
        self._weighs = config.sampler.kind == codes.PRIORITIZED
        self._table_arrays = (views.ctrl, views.fctrl, views.meta, views.prio, views.trees)
        # Kernels take the step arrays too; placeholders until the data segment is mapped,
        # stamped with the layout generation they stand for (see ``L.C_LAYOUT_GEN``).
        self.layout_gen = int(views.ctrl[L.C_LAYOUT_GEN])
        self._table_offsets[kernels.TABLE_STAMP] = self.layout_gen
        self.refs, self.rows = L.no_step_views(self.layout_gen)
        self.arrays = self._table_arrays + (self.refs, self.rows)
        self.meta = views.meta
        self.episodes = L.episode_view(buf, region)  # writers' episode records
        self.episode_views = None  # their flat views (``episode_stays.EpisodeStays``)
        self.data_segment = None
        self.data_plan = None    # its plan, once mapped (``shmreplay._engine.growth``)
        self.storage = None      # what the data segment holds (``shmreplay._schema.storage``)
        self.columns = None      # the stores: per column (whole items) or per writer field
        self.column_specs = None
        self._results = None     # reusable small-batch results (whole items only)
        self.whole_items = False  # True once mapped whole-item storage: the fused kernels
        self._stagings = None
        self.arena = None  # the general store (``kinds.general.Arena``), if it has one
        self.kind = None  # the storage kind (``shmreplay._engine.kinds``), once mapped
        self.treedef = None
        self.paths = None
        self.signature = None
        self._flat_keys = UNSET
        seed_once()  # (this process's sampling RNG)

    # --- creation (owner only) --------------------------------------------------------

    def initialize(self):
        """Writes the table's settings and mutex into fresh (zeroed) shared memory."""
        config, ctrl = self.config, self.ctrl
        fctrl = self.arrays[1]
        limiter = config.rate_limiter
        ctrl[L.C_CAPACITY] = self.capacity
        ctrl[L.C_MAX_SIZE] = config.max_size
        ctrl[L.C_MAX_TIMES_SAMPLED] = config.max_times_sampled
        ctrl[L.C_SAMPLER_KIND] = config.sampler.kind
        ctrl[L.C_REMOVER_KIND] = config.remover.kind
        ctrl[L.C_MIN_SIZE] = limiter.min_size_to_sample
        ctrl[L.C_SLOT_BITS] = L.slot_bits(self.capacity)
        ctrl[L.C_TREE_LEAVES] = self.region.tree_leaves
        ctrl[L.C_NEXT_ID] = 1
        ctrl[L.C_HEAD] = -1
        ctrl[L.C_FREE_HEAD] = -1
        ctrl[L.C_ROW_FREE_HEAD] = -1
        ctrl[L.C_TAIL] = -1
        fctrl[L.F_SAMPLES_PER_INSERT] = limiter.samples_per_insert
        fctrl[L.F_MIN_DIFF] = limiter.min_diff
        fctrl[L.F_MAX_DIFF] = limiter.max_diff
        for role, selector in enumerate((config.sampler, config.remover)):
            fctrl[L.F_EXPONENT0 + role] = getattr(selector, "priority_exponent", 1.0)
        _sync.init_robust_mutex(ctrl)

    # --- columns (the data segment) -----------------------------------------------------

    def _create_data_segment(self, storage, rows: int = 0):
        """Creates, fills and maps this table's data segment for ``storage`` (the
        Server's restore, before any other process can see the table). Its stores'
        first ``rows`` (at least) are reserved in a second thread meanwhile: see
        ``_ops.restore``."""
        _data_segment.define(self, storage, 0, stores_later=True, rows=rows)

    def _attach_data_segment(self) -> bool:
        """Maps the data segment another process created, once validated; False if it
        belongs to a layout forgotten since (the table is not ready after all).

        Raises:
          BufferNotFoundError: if it does not exist (any more).
          LayoutMismatchError: if it is refused, foreign, truncated or inconsistent.
        """
        try:
            found = _data_segment.attach(self)
        except errors.BufferNotFoundError:
            if self.ctrl[L.C_CLOSED]:  # removed with its buffer (stop, gc, rm)
                self._raise_status(codes.CLOSED)
            raise
        if found is None:
            return False
        try:
            self._map_columns(*found)
        except BaseException:
            found[0].close()
            raise
        return True

    def _map_columns(self, segment, storage, plan, generation: int):
        self.data_segment = segment
        self.data_plan = plan  # (its stores grow: ``shmreplay._engine.growth``)
        self.storage = storage
        self.signature = storage.signature
        self.column_specs, self.treedef = specs.flatten(storage.signature)
        self.paths = specs.path_strings(self.treedef)
        self.layout_gen = generation
        self._table_offsets[kernels.TABLE_STAMP] = generation
        self.refs, self.rows = L.step_views(segment.buf, plan, self.capacity, generation)
        self.forms = L.forms_view(segment.buf, plan, self.capacity)  # see _item_forms
        self.arrays = self._table_arrays + (self.refs, self.rows)
        self.columns = L.store_views(segment.buf, plan, storage.store_specs)
        # For the fast input checks: numpy's own dtype objects, so that ``is`` compares
        # them (an unpickled dtype is an equal but different object).
        self._fast_specs = [(tuple(spec.shape), np.dtype(np.dtype(spec.dtype).str))
                            for spec in self.column_specs]
        # Per column, the Python scalars the fast path stores (others take the general
        # path, which applies ``specs.python_scalar_as`` and explains a refusal):
        # ints within an integer column's range, floats within a float column's.
        self._fast_scalars = [fast_scalar_bounds(dtype) for _, dtype in self._fast_specs]
        self._batch_shapes = {}  # batch size -> each column's full shape
        self._flat_keys = flat_access(self.treedef)
        # ``leaves -> nest`` (a plain function: reused results keep it, not the engine)
        self._unflatten = unflattener(self._flat_keys, self.treedef)
        # The storage kind maps its own part (for whole items, what the one-call kernels
        # read); its calls are bound here once, so the hot paths pay no extra lookup.
        self.kind = _kinds.mapped(self, segment, plan)
        self.reserve_items = self.kind.reserve_items
        self.write_items = self.kind.write_items
        self._gather = self.kind.gather
        views = L.arena_views(segment.buf, plan, self.capacity)
        self.arena = None if views is None else _general.Arena(self, views, Sampling.sample)
        if self.arena is not None:  # (bound here only: other tables' calls stay as they are)
            self.sample = self.arena.sample
            self.sample_items = self.arena.sample_items

    def has_columns(self) -> bool:
        """Maps the storage if some process has defined it; False if none has yet.
        A mapped layout that was forgotten since (``reset``) is dropped first."""
        if self.columns is not None:
            generation = self.ctrl[L.C_LAYOUT_GEN]
            if generation == self.layout_gen:
                return True
            self._drop_layout(int(generation))
        if self.ctrl[L.C_SCHEMA_READY] == 0:
            return False
        return self._attach_data_segment()

    def stores_steps(self) -> bool:
        """Whether items reference shared step rows (a writer defined the storage)."""
        return self.has_columns() and self.kind.steps

    def known_layout(self):
        """``(treedef, column_specs, paths)`` of the items, from the storage or else the
        table's signature; None when neither exists yet."""
        if self.has_columns():
            return self.treedef, self.column_specs, self.paths
        if self.config.signature is None:
            return None
        column_specs, treedef = specs.flatten(self.config.signature)
        return treedef, column_specs, specs.path_strings(treedef)

    def propose_whole_items(self, treedef, leaves, batched: bool, settled=None):
        """The storage the first inserted item would define (no side effects).
        ``settled``: the signature's column specs with open dimensions taken from the
        item (``specs.settled``), where it has any.

        Raises:
          SchemaError: if a leaf's dtype cannot be stored.
        """
        arena_bytes = _general.arena_bytes_of(self.config)
        if self.config.signature is not None:
            column_specs = settled or self.config.column_specs
            signature = specs.optree.tree_unflatten(specs.flatten(self.config.signature)[1],
                                                    list(column_specs))
            if all(specs.varies_in_time(spec) for spec in column_specs):
                # Items of any length: an insert is an item of one step, as in Reverb.
                cells = [specs.TensorSpec(spec.shape[1:], spec.dtype) for spec in column_specs]
                count = len(cells)
                storage = _storage.step_storage(signature, cells, [1] * count,
                                                [False] * count, [None] * count)
                return dataclasses.replace(_storage.variable_step_storage(
                    storage, self.capacity, count, count, self.config.max_steps, self.name),
                    arena_bytes=arena_bytes)
            if any(specs.varies_in_time(spec) for spec in column_specs):
                raise errors.SchemaError(
                    f"Table '{self.name}': its signature has a None (any length) time "
                    "dimension in some columns but not in others; the first item must "
                    "come from a writer (Client.trajectory_writer, Client.writer).")
            return _storage.whole_items(signature, arena_bytes)
        paths = specs.path_strings(treedef)
        column_specs = []
        for path, leaf in zip(paths, leaves):
            specs.check_storable_dtype(leaf.dtype, f"Table '{self.name}', column {path}")
            shape = leaf.shape[1:] if batched else leaf.shape
            column_specs.append(specs.TensorSpec(shape, leaf.dtype))
        return _storage.whole_items(specs.optree.tree_unflatten(treedef, column_specs),
                                    arena_bytes)

    def define_storage(self, storage, timeout=None):
        """Fixes what the table stores (its first item does); a no-op if another process
        did. Waits for another process creating it, up to ``timeout`` seconds (None:
        while that process lives); see ``shmreplay._engine.data_segment.define``."""
        _data_segment.define(self, storage, timeout)

    # --- the rest -----------------------------------------------------------------------

    def mutate(self, delete_keys, update_keys, update_priorities):
        io = np.zeros(1, np.int64)
        scratch = np.empty((2, len(update_keys)), np.int64)
        status = self._call(kernels.mutate, delete_keys, update_keys, update_priorities, io,
                            scratch)
        if status < 0:
            self._raise_status(status)
        return status, int(io[0])

    def update_whole(self, keys, priorities) -> int:
        """``update`` in one native call, for mapped whole-item tables (``whole_items``):
        uint64 ``keys``, float64 ``priorities`` checked by the kernel. Returns the number
        updated, or ``codes.INVALID_PRIORITY`` (nothing changed)."""
        lock_wait = None
        while True:
            if keys.shape[0] >= _WEIGH_UNLOCKED_FROM and self._weighs:
                # From a few dozen keys on, a Prioritized sampler's weights are worth
                # computing before the lock is taken (in a new array: that part is
                # unlocked).
                scratch = self._update_scratch
                if scratch.shape[1] < keys.shape[0]:
                    scratch = self._update_scratch = np.empty((2, keys.shape[0]), np.int64)
                status = kernels.update_whole_weighed(
                    self._header_bytes, self._table_offsets, keys, priorities,
                    self.max_priority, scratch, np.empty(2 * keys.shape[0]))
            else:  # (the scratch is the table offsets' own)
                status = kernels.update_whole(self._header_bytes, self._table_offsets, keys,
                                              priorities)
            if status != codes.LOCK_BUSY:
                break
            if lock_wait is None:
                lock_wait = _lock_waits.LockWait(self, None, None, "update of priorities")
            lock_wait.again()
        if status < 0 and status != codes.INVALID_PRIORITY:
            self._raise_status(status)
        return status

    def update(self, keys, priorities) -> int:
        """Sets priorities by key (the learner's path); returns how many keys were live."""
        io = np.empty(1, np.int64)
        status = self._call(kernels.mutate, _NO_KEYS, keys, priorities, io,
                            np.empty((2, len(keys)), np.int64))
        if status < 0:
            self._raise_status(status)
        return int(io[0])

    def reset(self):
        """Clears the table and forgets its layout, unless an item is being written right
        now: the next first item defines it again, as after the table was made. Without
        a signature (or with open dimensions) its shapes may change; with one, what
        stores it may (whole items from ``insert``, steps from a writer: the legacy
        ``Writer``'s items of any length per step, as Reverb takes them after a reset)."""
        forgotten = np.zeros(2, np.int64)  # (1 if forgotten, the forgotten segment's token)
        forget = True
        status = self._call(kernels.reset, forget, forgotten)
        if status < 0:
            self._raise_status(status)
        if forget and not forgotten[0] and self.ctrl[L.C_SCHEMA_READY]:
            warnings.warn(
                f"Table '{self.name}' was reset but keeps its layout: an item was being "
                "written or read by some process at that moment (a stopped or slow writer "
                "keeps it; reset again once it is done).", stacklevel=4)
        if forgotten[0]:
            # Nobody can create the next layout's segment while this name exists.
            _segment.unlink(L.data_segment_name(self.buffer_name, self.index,
                                                int(forgotten[1])))
            self._drop_layout(int(self.ctrl[L.C_LAYOUT_GEN]))

    def _drop_layout(self, generation: int):
        """Forgets the mapped layout; placeholders stamped with ``generation``."""
        self.detach()
        self.storage = self.signature = self.treedef = self.paths = None
        self.column_specs = self.forms = None
        self._flat_keys = UNSET
        self.layout_gen = generation
        self._table_offsets[kernels.TABLE_STAMP] = generation
        self.refs, self.rows = L.no_step_views(generation)
        self.arrays = self._table_arrays + (self.refs, self.rows)

    def close(self, lock_timeout: float = CLOSE_LOCK_TIMEOUT, may_compile: bool = True) -> bool:
        """Marks the table closed for every process (owner's stop) and wakes its waiters.

        Returns False if the lock stayed held for ``lock_timeout`` seconds (a stopped
        process holds it): the table is then marked closed without the lock. Every
        call, blocked or not, still sees it closed (the flag is one aligned word, and
        lock waiters check it between tries); only the holder's own call may finish.

        ``may_compile=False`` (a stop on SIGTERM) in a process that has not loaded the
        ``close`` kernel marks the table closed from Python instead: compiling it takes
        seconds on a cold cache, and from SIGTERM's thread it would wait on numba's and
        LLVM's locks, which the main thread may hold, compiling, while its own handler
        waits for this stop: a deadlock.
        """
        if not may_compile and not getattr(kernels.close, "overloads", None):
            self.ctrl[L.C_CLOSED] = 1
            _sync.bump_and_wake_from_python(self.ctrl, (L.C_ITEMS_SEQ, L.C_SPACE_SEQ))
            return True
        try:
            status = _lock_waits.call(self, time.monotonic() + lock_timeout, lock_timeout,
                                      "stop", kernels.close)
        except errors.LockTimeoutError:
            self.ctrl[L.C_CLOSED] = 1
            kernels.wake_all(self.ctrl)
            return False
        except errors.BufferBrokenError:
            return True  # (someone marked it closed meanwhile)
        if status < 0:
            self._raise_status(status)
        return True

    def verify(self, deadline=None, timeout=None):
        """Frees slots of dead writers, then names the invariants the table violates;
        waits for the lock up to ``deadline`` (``LockTimeoutError``)."""
        from shmreplay._shm.kernels import verify as checks
        self.reclaim_dead_writers()
        status = _lock_waits.call(self, deadline, timeout, "verify", kernels.verify)
        if status < 0:
            self._raise_status(status)
        found = [text for bit, text in checks.NAMES.items() if status & bit]
        if self.has_columns() and self.arena is not None:
            arena_status = self.arena.verify()
            if arena_status < 0:
                self._raise_status(arena_status)
            if arena_status:
                found.append("an arena item's extent is out of range or not its own")
        return found

    def can_insert(self, n: int) -> bool:
        return self._rate_check(n, True)

    def can_sample(self, n: int) -> bool:
        return self._rate_check(n, False)

    def _rate_check(self, n, inserting):
        status = self._call(kernels.rate_check, int(n), inserting)
        if status < 0:
            self._raise_status(status)
        return bool(status)

    def blocked(self):
        """Why an insert and why a sample would wait now: ``(insert_reason, sample_reason)``,
        each None when that call would proceed. From one consistent read of the counters,
        in the terms of the rate limiter's rules (``docs/concepts.md``)."""
        c = self.counters()
        limiter = self.config.rate_limiter
        spi, min_size = limiter.samples_per_insert, int(c[L.C_MIN_SIZE])
        inserts, samples, pending = int(c[L.C_INSERTS]), int(c[L.C_SAMPLES]), int(c[L.C_PENDING])
        size = int(c[L.C_SIZE])
        insert = sample = None
        free = int(c[L.C_FREE_TOP] + c[L.C_CAPACITY] - c[L.C_FRESH])
        ahead = (inserts + pending + 1) * spi - samples
        if inserts + pending + 1 - int(c[L.C_DELETES]) > min_size and ahead > limiter.max_diff:
            insert = (f"waits for samples: (inserts {inserts} + in flight {pending} + 1) x "
                      f"{spi:g} samples per insert - samples {samples} = {ahead:g} > max_diff "
                      f"{limiter.max_diff:g}")
        elif free < 1:
            insert = "waits for a free slot: every spare slot is being written"
        if size == 0:
            sample = "waits for items: the table is empty"
        elif inserts - int(c[L.C_DELETES]) < min_size:
            sample = (f"waits for inserts: {inserts - int(c[L.C_DELETES])} items < "
                      f"min_size_to_sample {min_size}")
        elif inserts * spi - samples - 1 < limiter.min_diff:
            sample = (f"waits for inserts: inserts {inserts} x {spi:g} - samples {samples} - 1 "
                      f"= {inserts * spi - samples - 1:g} < min_diff {limiter.min_diff:g}")
        return insert, sample

    def counters(self, deadline=None, timeout=None) -> np.ndarray:
        """A consistent copy of the control block (taken under the lock, waiting for it
        up to ``deadline``)."""
        out = np.empty(L.CTRL_WORDS, np.int64)
        status = _lock_waits.call(self, deadline, timeout, "info", kernels.snapshot, out)
        if status < 0:
            self._raise_status(status)
        return out

    def info(self, deadline=None, timeout=None) -> TableInfo:
        """The table's ``TableInfo``, waiting for its lock up to ``deadline``.

        Raises:
          LockTimeoutError: the lock stayed held (by a stopped process, say) until then.
        """
        c = self.counters(deadline, timeout)
        if c[L.C_CLOSED]:  # stopped by its owner: what it held is gone
            self._raise_status(codes.CLOSED)
        self.has_columns()
        episodes, deleted_episodes = _table_info.count_episodes(self, c, deadline, timeout)
        info = _table_info.make_info(self.config, c, episodes, deleted_episodes)
        if self.kind is not None:
            info = dataclasses.replace(
                info, num_stored_steps=int(self.kind.stored(c)),
                storage_bytes=_segment.resident_bytes(self.data_segment.name))
        return info

    def detach(self):
        """Drops this process's views (the segments stay for other processes)."""
        self.columns = None
        self.whole_items = False
        self._results = self._data_bytes = self._stagings = None  # (data segment views)
        self.kind = self.arena = None
        for bound in ("reserve_items", "write_items", "_gather",  # (the kind's, the arena's)
                      "sample", "sample_items"):
            self.__dict__.pop(bound, None)
        if self.data_segment is not None:
            self.data_segment.close()
            self.data_segment = None


def _max_priority(config, capacity) -> float:
    """The largest priority whose ``priority ** exponent`` keeps every sum-tree finite.

    Even if all ``capacity`` slots held it, the total stays below 1e300, so sampling
    never meets an infinite or NaN mass.
    """
    largest = sys.float_info.max
    for selector in (config.sampler, config.remover):
        exponent = getattr(selector, "priority_exponent", 0.0)
        if exponent > 0:
            # In logs: for small exponents the bound is beyond float range (no limit).
            log_bound = math.log(1e300 / capacity) / exponent
            if log_bound < math.log(largest):
                largest = math.exp(log_bound)
    return largest


"""The engine of one table: shared-memory views, blocking, data copies, error mapping.

A ``TableEngine`` is one process's handle on one table. It owns no state of its own
beyond the mapped views: everything lives in shared memory. The facade (``client.py``)
validates user input; this module turns it into kernel calls following the protocol of
``shmreplay._sync``: reserve slots, copy rows without the lock, commit; draw slots,
copy rows without the lock, re-check slot versions.
"""

import dataclasses
import functools
import math
import os
import sys
import time
import warnings

import cloudpickle
import numpy as np

from shmreplay import _layout as L
from shmreplay import _batch_outputs, _outputs, _segment, _staging, _storage, _sync, errors, specs
from shmreplay._procs import pid_alive
from shmreplay._kernels import codes
from shmreplay._kernels import table as kernels
from shmreplay import _table_info
from shmreplay.replay_sample import ReplaySample, SampleInfo, TableInfo

_RECLAIM_EVERY = 0.2  # seconds of blocked inserting between scans for dead writers


_seeded_pid = None
_UNSET = object()
_SCRATCH_IO = np.zeros(2, np.int64)  # for calls that never wait (its content is unused)
_NO_KEYS = np.empty(0, np.int64)
# The remover writes the evicted item's probability here; nobody reads it, so threads
# may share it.
_SCRATCH_PROB = np.empty(2, np.float64)
_WEIGH_UNLOCKED_FROM = 32  # keys per update (below: weights computed under the lock)


def _seed_rng():
    """numba keeps its own RNG per process: seed it from the OS once per process.

    Called when a process first maps a table (not at import: importing compiles
    nothing), and again in forked children, which would otherwise replay the parent's
    draws.
    """
    global _seeded_pid
    kernels.seed(int.from_bytes(os.urandom(4), "little"))
    _seeded_pid = os.getpid()


def _reseed_if_seeded():
    if _seeded_pid is not None:
        _seed_rng()


_PID = [os.getpid()]  # this process's pid, for the hot paths (kept right across fork)


def _after_fork():
    _PID[0] = os.getpid()
    _reseed_if_seeded()


os.register_at_fork(after_in_child=_after_fork)


class TableEngine:
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
        views = L.table_views(buf, region)
        self.ctrl = views.ctrl
        # For the one-call kernels (sample_gather, update_whole, insert_staged): the
        # segment's bytes and where this table is in them.
        self._header_bytes = np.frombuffer(buf, np.uint8)
        self._table_offsets = L.table_offsets(region)
        self._update_scratch = np.empty((2, 256), np.int64)  # update_whole's, grown as needed
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
        self.episode_views = None  # their flat views (``_table_info.record_episode``)
        self.data_segment = None
        self.storage = None      # what the data segment holds (``shmreplay._storage``)
        self.columns = None      # the stores: per column (whole items) or per writer field
        self.column_specs = None
        self._results = None     # reusable small-batch results (whole items only)
        self.whole_items = False  # True once mapped whole-item storage: the fused kernels
        self._stagings = None
        self.treedef = None
        self.paths = None
        self.signature = None
        self._flat_keys = _UNSET
        if _seeded_pid != os.getpid():
            _seed_rng()

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

    def _create_data_segment(self, storage):
        """Creates, fills and maps this table's data segment for ``storage``.

        Its mode and group follow the buffer's header, whichever process creates it:
        0600, or 0660 and the header segment's group when the buffer is shared with its
        owner's group (``self.access``, which ``shmreplay._buffer.Buffer`` sets).

        Raises:
          FileExistsError: if another process created it first.
        """
        access = getattr(self, "access", _segment.PRIVATE)
        blob = cloudpickle.dumps(storage)
        plan = L.plan_data(storage, self.capacity, len(blob))
        name = L.data_segment_name(self.buffer_name, self.index)
        segment = _segment.Segment.create(name, plan.total_bytes, access.mode, access.group)
        generation = int(self.ctrl[L.C_LAYOUT_GEN])  # (stable: the layout is not ready)
        try:
            header = L.data_header_view(segment.buf)
            header["magic"] = L.DATA_MAGIC
            header["layout_version"] = L.LAYOUT_VERSION
            header["schema_len"] = len(blob)
            header["total_bytes"] = plan.total_bytes
            header["generation"] = generation
            segment.buf[plan.schema_offset:plan.schema_offset + len(blob)] = blob
            if storage.steps:
                L.step_views(segment.buf, plan, self.capacity, generation)[1][-1] = generation
            header["complete"] = 1
        except BaseException:
            segment.unlink()
            segment.close()
            raise
        self._map_columns(segment, storage, plan, generation)
        if storage.steps:
            self.ctrl[L.C_ROW_CAPACITY] = plan.row_capacity
            self.ctrl[L.C_REFS_WIDTH] = plan.width
        self.ctrl[L.C_SCHEMA_READY] = 1

    def _attach_data_segment(self):
        """Maps the data segment another process created, after validating all of it.

        Its owner and mode are checked against the buffer's (``self.access``) before a
        byte is read, every header field before it is used, and the unpickled storage
        against the segment's size and the table's control block before any view or
        kernel relies on it.

        Called only once the table's control block says the segment is ready.

        Returns:
          True once mapped.

        Raises:
          BufferNotFoundError: if it does not exist (any more).
          LayoutMismatchError: if it is refused, foreign, truncated or inconsistent.
        """
        access = getattr(self, "access", _segment.PRIVATE)
        name = L.data_segment_name(self.buffer_name, self.index)
        segment = _segment.Segment.attach(name, f"table '{self.name}' data", access)

        def corrupt(problem):
            return errors.LayoutMismatchError(
                f"Table '{self.name}': data segment {name} {problem}.")

        try:
            if segment.size < L.DATA_HEADER_SIZE:
                raise corrupt(f"has {segment.size} bytes, less than its header")
            header = L.data_header_view(segment.buf)
            if (header["magic"][0] != L.DATA_MAGIC
                    or header["layout_version"][0] != L.LAYOUT_VERSION
                    or header["total_bytes"][0] != segment.size):
                raise corrupt("has a foreign or corrupt header")
            complete = int(header["complete"][0])
            if complete != 1:
                # Its creator sets the flag before the table's C_SCHEMA_READY, and only a
                # ready table's segment is attached: unfinished now means corrupt.
                raise corrupt(f"has an invalid completion flag {complete}")
            length = int(header["schema_len"][0])
            if not 0 < length <= segment.size - L.DATA_HEADER_SIZE:
                raise corrupt(f"has an impossible schema length {length}")
            if segment.buf[L.DATA_HEADER_SIZE + length - 1] != ord("."):  # a pickle's last byte
                raise corrupt(f"has a schema that does not end at its length {length}")
            try:
                storage = cloudpickle.loads(
                    segment.buf[L.DATA_HEADER_SIZE:L.DATA_HEADER_SIZE + length])
                if type(storage) is not _storage.Storage or type(storage.steps) is not bool:
                    raise TypeError(f"a {type(storage).__name__}, not a Storage")
                column_specs = specs.flatten(storage.signature)[0]
                stores = storage.store_specs
                for spec in stores:
                    dtype = spec.dtype
                    # An unpickled dtype carries its flags: rebuild it from its name and
                    # compare, so that a damaged one (say, flagged as holding objects)
                    # is refused before numpy maps memory with it.
                    if not (isinstance(dtype, np.dtype) and dtype.kind in "biufc"
                            and not dtype.hasobject and dtype.fields is None
                            and dtype.flags == np.dtype(dtype.str).flags
                            and dtype.itemsize == np.dtype(dtype.str).itemsize
                            and isinstance(spec.shape, tuple)
                            and all(type(d) is int and d >= 0 for d in spec.shape)):
                        raise TypeError(f"an invalid store {spec!r}")
                if storage.steps:
                    # Each item column reads ``length`` rows of one store: its spec must be
                    # that store's cell, with a time dimension unless squeezed.
                    offset, columns = 0, storage.columns
                    if (len(columns) != len(column_specs)
                            or len(storage.store_sources) != len(stores)):
                        raise TypeError("columns that do not match its signature")
                    for column, spec in zip(columns, column_specs):
                        if (type(column) is not _storage.ColumnRefs
                                or type(column.store) is not int or type(column.length) is not int
                                or type(column.squeeze) is not bool
                                or type(column.offset) is not int
                                or not 0 <= column.store < len(stores) or column.length < 1
                                or column.offset != offset
                                or (column.squeeze and column.length != 1)):
                            raise TypeError(f"an invalid column {column!r}")
                        cell = stores[column.store]
                        shape = cell.shape if column.squeeze else (column.length,) + cell.shape
                        if tuple(spec.shape) != shape or np.dtype(spec.dtype) != cell.dtype:
                            raise TypeError(f"a column {spec!r} its store {cell!r} cannot hold")
                        offset += column.length
                elif list(stores) != list(column_specs):
                    raise TypeError("stores that do not match its signature")
                plan = L.plan_data(storage, self.capacity, length)
            except Exception as exc:
                raise corrupt(f"holds an unreadable or invalid schema ({exc})") from exc
            if plan.total_bytes != segment.size:
                raise corrupt(f"has {segment.size} bytes, its schema needs {plan.total_bytes}")
            generation = int(header["generation"][0])
            if generation != self.ctrl[L.C_LAYOUT_GEN]:
                # A layout forgotten (reset) since the table said ready: not this one.
                segment.close()
                return False
            if storage.steps and (self.ctrl[L.C_ROW_CAPACITY] != plan.row_capacity
                                  or self.ctrl[L.C_REFS_WIDTH] != plan.width):
                raise corrupt(
                    f"holds {plan.row_capacity} rows of {plan.width} references, but the "
                    f"table's control block says {self.ctrl[L.C_ROW_CAPACITY]} of "
                    f"{self.ctrl[L.C_REFS_WIDTH]}")
            if storage.steps and L.step_views(segment.buf, plan, self.capacity,
                                              generation)[1][-1, 0] != generation:
                raise corrupt(f"has a layout stamp that is not its generation {generation}")
            self._map_columns(segment, storage, plan, generation)
        except BaseException:
            segment.close()
            raise
        return True

    def _map_columns(self, segment, storage, plan, generation: int):
        self.data_segment = segment
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
        self._fast_scalars = [_fast_scalar_bounds(dtype) for _, dtype in self._fast_specs]
        self._batch_shapes = {}  # batch size -> each column's full shape
        self._flat_keys = _flat_access(self.treedef)
        # ``leaves -> nest`` (a plain function: reused results keep it, not the engine)
        self._unflatten = _unflattener(self._flat_keys, self.treedef)
        if not storage.steps:
            # Where the one-call kernels copy rows from and to: the segment's bytes, and
            # each store's (start, row bytes) in them.
            self._data_bytes = np.frombuffer(segment.buf, np.uint8)
            stores = [(start, column[0].nbytes if len(column) else 0)
                      for start, column in zip(plan.stores, self.columns)]
            self.whole_items = True
            self._results = _batch_outputs.ResultPool(self.column_specs, stores,
                                                      self._unflatten)
            # Staging rows for single inserts, one per thread inserting at once (None:
            # items too large to copy under the lock).
            self._stores = stores
            self._stagings = [] if _staging.Staging.fits(self.column_specs) else None

    def fast_leaves(self, data):
        """The leaves of ``data`` if they match the columns exactly, else None.

        Covers the common actor case (a flat dict or tuple of arrays and Python
        scalars) in a few hundred nanoseconds; anything else takes the general path,
        which converts, validates and explains mismatches.
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
        """The leaves of a flat dict or tuple in column order, or None (use optree)."""
        keys = self._flat_keys
        if keys is _UNSET:
            if not self.has_columns():
                return None
            keys = self._flat_keys = _flat_access(self.treedef)
        if type(data) is dict:
            if not keys or len(data) != len(keys):
                return None
            try:
                return [data[key] for key in keys]
            except (KeyError, TypeError):
                return None
        if type(data) is tuple and keys is False and len(data) == len(self.column_specs):
            return list(data)
        return None

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
        return self.has_columns() and self.storage.steps

    def known_layout(self):
        """``(treedef, column_specs, paths)`` of the items, from the storage or else the
        table's signature; None when neither exists yet."""
        if self.has_columns():
            return self.treedef, self.column_specs, self.paths
        if self.config.signature is None:
            return None
        column_specs, treedef = specs.flatten(self.config.signature)
        return treedef, column_specs, specs.path_strings(treedef)

    def propose_whole_items(self, treedef, leaves, batched: bool):
        """The storage the first inserted item would define (no side effects).

        Raises:
          SchemaError: if a leaf's dtype cannot be stored.
        """
        if self.config.signature is not None:
            return _storage.whole_items(self.config.signature)
        paths = specs.path_strings(treedef)
        column_specs = []
        for path, leaf in zip(paths, leaves):
            specs.check_storable_dtype(leaf.dtype, f"Table '{self.name}', column {path}")
            shape = leaf.shape[1:] if batched else leaf.shape
            column_specs.append(specs.TensorSpec(shape, leaf.dtype))
        return _storage.whole_items(specs.optree.tree_unflatten(treedef, column_specs))

    def define_storage(self, storage):
        """Fixes what the table stores (its first item does); a no-op if another process did."""
        deadline = time.monotonic() + 2.0
        while not self.has_columns():
            if self.ctrl[L.C_CLOSED]:
                self._raise_status(codes.CLOSED)
            try:
                self._create_data_segment(storage)
            except FileExistsError:
                # Another process is creating it right now; if it died half-way, take over.
                if time.monotonic() > deadline:
                    _segment.unlink(L.data_segment_name(self.buffer_name, self.index))
                    deadline = time.monotonic() + 2.0
                time.sleep(0.001)
                continue
            if self.ctrl[L.C_CLOSED]:
                # The owner stopped while we created it: it may have unlinked the names
                # already, so remove ours rather than leak it.
                _segment.unlink(L.data_segment_name(self.buffer_name, self.index))
                self._raise_status(codes.CLOSED)
            return

    # --- blocking calls ---------------------------------------------------------------

    def _raise_status(self, status):
        if status == codes.NO_ROWS:
            raise errors.SchemaError(
                f"Table '{self.name}': an item references more distinct steps than its step "
                f"storage can hold ({self.ctrl[L.C_ROW_CAPACITY]} rows, sized for "
                f"{self.storage.steps_per_item} steps per item).")
        if status == codes.CLOSED:
            raise errors.BufferBrokenError(
                f"Buffer '{self.buffer_name}' was stopped by its owner (table '{self.name}').")
        raise errors.BufferBrokenError(
            f"Table '{self.name}' of buffer '{self.buffer_name}' is corrupt (status {status}).")

    def _call(self, kernel, *args):
        """Calls a locked kernel; maps the step storage first if the kernel asks for it."""
        status = kernel(*self.arrays, *args)
        if status == codes.UNMAPPED:
            self._map_step_storage()
            status = kernel(*self.arrays, *args)
        return status

    def _map_step_storage(self):
        """Maps the storage a kernel said we lack (``UNMAPPED``); it must exist by then.

        Raises:
          LayoutResetError: the layout this process mapped was forgotten (``reset``);
            the mapping is dropped, and the caller starts again with the current one.
        """
        generation = int(self.ctrl[L.C_LAYOUT_GEN])
        if generation != self.layout_gen:
            self._drop_layout(generation)
            raise errors.LayoutResetError(
                f"Table '{self.name}' of buffer '{self.buffer_name}' was reset and its "
                "layout forgotten during this call; call again.")
        if not self.has_columns():
            raise errors.BufferBrokenError(
                f"Table '{self.name}' of buffer '{self.buffer_name}' stores steps, but its "
                "data segment is missing or unfinished: the buffer is corrupt.")

    def _blocking(self, call, waiters_word, seq_word, timeout, inserting, make_args, io=None):
        """Runs ``call`` until it is not BLOCKED, sleeping on the futex in between."""
        if io is None:
            io = np.zeros(3, np.int64)
        timespec = np.zeros(2, np.int64)
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        was_waiting = 0
        next_reclaim = time.monotonic() + _RECLAIM_EVERY
        while True:
            register = 0 if timeout is not None and timeout <= 0 else 1
            status = call(*self.arrays, *make_args(was_waiting, register), io)
            if status >= 0:
                return status
            if status == codes.UNMAPPED:
                self._map_step_storage()
                continue
            if status != codes.BLOCKED:
                self._raise_status(status)
            was_waiting = register
            now = time.monotonic()
            remaining = _sync.WAIT_SLICE if deadline is None else min(deadline - now,
                                                                      _sync.WAIT_SLICE)
            if remaining <= 0:
                if register:
                    kernels.unwait(*self.arrays, waiters_word)
                    was_waiting = 0
                if inserting and self.ctrl[L.C_PENDING] > 0 and now >= self._reclaim_at:
                    # A call that does not wait (timeout 0) may be refused only because a
                    # dead writer's reservation holds the room: free those (at most every
                    # _RECLAIM_EVERY s), then try once more.
                    self._reclaim_at = now + _RECLAIM_EVERY
                    if self.reclaim_dead_writers():
                        continue
                raise errors.DeadlineExceededError(
                    f"Table '{self.name}': the rate limiter did not allow the "
                    f"{'insert' if inserting else 'sample'} within the timeout of "
                    f"{errors.seconds(timeout)}.")
            kernels.wait(self.ctrl, seq_word, io[0], int(remaining * 1e9), timespec)
            if inserting and time.monotonic() >= next_reclaim:
                self.reclaim_dead_writers()
                next_reclaim = time.monotonic() + _RECLAIM_EVERY

    def insert_one(self, leaves, priority: float, timeout):
        """Inserts one validated item; returns its key.

        A small item goes through a staging block and one native call (one lock hold);
        otherwise, or when that call is blocked: reserve, copy without the lock, commit.
        """
        stagings = self._stagings
        if stagings is not None:
            try:
                staging = stagings.pop()  # atomic: this thread's alone until appended
            except IndexError:
                staging = _staging.Staging(self.column_specs, self._stores)
            try:
                for row, leaf in zip(staging.rows, leaves):
                    row[0] = leaf
                key = kernels.insert_staged(self._header_bytes, self._table_offsets,
                                            self._data_bytes, staging.block, staging.layout,
                                            priority, _PID[0], _SCRATCH_PROB)
            finally:
                stagings.append(staging)
            if key > 0:
                return key
            if key != codes.BLOCKED:
                self._raise_status(key)
        slot = kernels.reserve_one(*self.arrays, os.getpid())
        if slot < 0:
            if slot != codes.BLOCKED:
                self._raise_status(slot)
            slot = self.reserve(1, timeout)[0]
        try:
            for column, leaf in zip(self.columns, leaves):
                column[slot] = leaf
        except BaseException:
            self.cancel(np.array([slot]))
            raise
        key = kernels.commit_one(*self.arrays, slot, priority, _SCRATCH_PROB)
        if key < 0:
            self._raise_status(key)
        return key

    def insert_many(self, leaves, priorities, count: int, timeout):
        """Inserts a validated batch into this whole-item table; returns the keys (uint64
        [B]), or None if a priority is invalid (checked natively; nothing changed).

        Two native calls around the copy (reserve, then commit), which runs without the
        lock: one slice per column when the slots are one run, as they usually are.
        """
        work = np.empty(5 * count + 1, np.int64)  # slots, run start, commit's scratch
        status = kernels.reserve_whole(self._header_bytes, self._table_offsets, count,
                                       priorities, self.max_priority, _PID[0], work,
                                       _SCRATCH_IO)
        if status == codes.INVALID_PRIORITY:
            return None
        if status < 0:
            if status != codes.BLOCKED:
                self._raise_status(status)
            work[:count] = self.reserve(count, timeout)
            work[count] = work[0] if kernels.ascending_run(work[:count]) else -1
        first = int(work[count])
        try:
            if first >= 0:
                rows = slice(first, first + count)
                for column, leaf in zip(self.columns, leaves):
                    column[rows] = leaf
            else:
                self.write(work[:count], leaves, True)
        except BaseException:
            self.cancel(work[:count])
            raise
        keys = np.empty(count, np.uint64)
        status = kernels.commit_whole(self._header_bytes, self._table_offsets, work, count,
                                      priorities, keys, _SCRATCH_PROB)
        if status < 0:
            self._raise_status(status)
        return keys

    def reserve(self, n: int, timeout):
        """Reserves ``n`` slots to write (blocks on the rate limiter and on free slots)."""
        slots = np.empty(n, np.int64)
        pid = os.getpid()
        self._blocking(kernels.reserve, L.C_SPACE_WAITERS, L.C_SPACE_SEQ, timeout, True,
                       lambda was_waiting, register: (n, pid, was_waiting, register, slots))
        return slots

    def write(self, slots, leaves, batched: bool):
        """Copies one item's (or a batch's) leaves into the reserved slots, without the lock."""
        if batched:
            if kernels.ascending_run(slots):
                rows = slice(int(slots[0]), int(slots[0]) + len(slots))
            else:
                rows = slots
            for column, leaf in zip(self.columns, leaves):
                column[rows] = leaf
        else:
            slot = slots[0]
            for column, leaf in zip(self.columns, leaves):
                column[slot] = leaf

    def reserve_item(self, known_rows, known_gens, ref_steps, timeout):
        """Reserves a slot and step rows for one item of step storage (blocking).

        See ``kernels.reserve_item``. Returns ``(slot, rows, fresh)``: the row of each
        distinct step, and whether it is new (to be written by the caller).
        """
        if ref_steps.shape[0] != self.refs.shape[1] or not 0 < known_rows.shape[0] <= len(ref_steps):
            raise ValueError(f"Table '{self.name}': an item of step storage needs "
                             f"{self.refs.shape[1]} references (got {ref_steps.shape[0]}) over "
                             f"1..{ref_steps.shape[0]} distinct steps (got {known_rows.shape[0]}).")
        distinct = known_rows.shape[0]
        rows = np.empty(distinct, np.int64)
        fresh = np.empty(distinct, np.int64)
        pid = os.getpid()
        slot = self._blocking(
            kernels.reserve_item, L.C_SPACE_WAITERS, L.C_SPACE_SEQ, timeout, True,
            lambda was_waiting, register: (known_rows, known_gens, ref_steps, pid, was_waiting,
                                           register, rows, fresh))
        return slot, rows, fresh

    def reserve_items(self, count: int, timeout):
        """Reserves ``count`` items for data given whole (``insert``): ``(slots, rows)``.

        ``rows`` is None for whole-item storage; for step storage, each item gets new
        rows (``split_rows`` says which reference uses which).
        """
        if not self.storage.steps:
            return self.reserve(count, timeout), None
        ref_steps, distinct = self._split_plan()
        known = np.full(distinct, -1, np.int64)
        gens = np.zeros(distinct, np.int64)
        if count == 1:  # nothing else is held while this one waits
            slot, rows, _ = self.reserve_item(known, gens, ref_steps, timeout)
            return np.array([slot], np.int64), rows.reshape(1, distinct)
        # Several items, one reservation each: take them all without waiting, or hand
        # back what was taken and wait, holding nothing, until the limiter admits them
        # all (holding some while waiting for the rest blocked other inserters).
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            slots = np.empty(count, np.int64)
            rows = np.empty((count, distinct), np.int64)
            done = 0
            try:
                for i in range(count):
                    slots[i], rows[i], _ = self.reserve_item(known, gens, ref_steps, 0.0)
                    done += 1
                return slots, rows
            except errors.DeadlineExceededError:
                self.cancel(slots[:done])
            except BaseException:
                self.cancel(slots[:done])
                raise
            self._wait_until_insertable(count, deadline, timeout)

    def _wait_until_insertable(self, count: int, deadline, timeout):
        """Polls ``can_insert(count)`` (a rare path: batches into step storage)."""
        pause = 0.0005
        next_reclaim = time.monotonic() + _RECLAIM_EVERY
        while not self.can_insert(count):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise errors.DeadlineExceededError(
                    f"Table '{self.name}': the rate limiter did not allow {count} inserts "
                    f"within the timeout of {errors.seconds(timeout)}.")
            if now >= next_reclaim:
                self.reclaim_dead_writers()
                next_reclaim = now + _RECLAIM_EVERY
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
            pause = min(2 * pause, 0.01)

    def _split_plan(self):
        """How whole item data maps onto new rows: ``(ref_steps, distinct)``.

        Columns stored in different stores share rows (row ``j`` holds each column's
        ``j``-th step); columns sharing a store get rows of their own.
        """
        plan = getattr(self, "_split", None)
        if plan is None:
            used = {}
            ref_steps = []
            for column in self.storage.columns:
                base = used.get(column.store, 0)
                ref_steps.extend(range(base, base + column.length))
                used[column.store] = base + column.length
            plan = self._split = (np.array(ref_steps, np.int64), max(used.values()))
        return plan

    def write_items(self, slots, rows, arrays, batched: bool):
        """Copies whole items' columns into their reserved slots or rows, without the lock."""
        if rows is None:
            self.write(slots, arrays, batched)
            return
        ref_steps, _ = self._split_plan()
        for column, array in zip(self.storage.columns, arrays):
            store = self.columns[column.store]
            steps = ref_steps[column.offset:column.offset + column.length]
            for i in range(len(slots)):
                value = array[i] if batched else array
                if column.squeeze:
                    store[rows[i, steps[0]]] = value
                else:
                    store[rows[i, steps]] = value

    def commit(self, slots, priorities):
        keys = np.empty(len(slots), np.int64)
        status = kernels.commit(*self.arrays, slots, priorities, keys, _SCRATCH_PROB,
                                np.empty((2, 2 * len(slots)), np.int64))
        if status < 0:
            self._raise_status(status)
        return keys.view(np.uint64)

    def cancel(self, slots):
        self._call(kernels.cancel, slots, np.full(len(slots), os.getpid(), np.int64))

    def reclaim_dead_writers(self) -> int:
        """Frees slots reserved by writers that died before committing them."""
        slots = np.empty(self.capacity, np.int64)
        pids = np.empty(self.capacity, np.int64)
        count = kernels.writing_slots(*self.arrays, slots, pids)
        dead = [i for i in range(max(count, 0)) if not pid_alive(int(pids[i]))]
        if not dead:
            return 0
        return self._call(kernels.cancel, slots[dead], pids[dead])

    # --- sampling ---------------------------------------------------------------------

    def sample(self, batch_size: int, timeout):
        """Samples ``batch_size`` items and copies them; returns a ReplaySample.

        Waits while the rate limiter allows no sample. Returns fewer rows only if the
        table ran out of items (``max_times_sampled``), or if ``timeout`` expired after at
        least one row was taken.
        """
        results = self._results
        if results is not None:  # whole items: small batches reuse their arrays
            outputs = results.claim(batch_size)
            if outputs is not None:
                try:
                    # One native call draws, copies and re-checks the batch.
                    status = kernels.sample_gather(self._header_bytes, self._table_offsets,
                                                   batch_size, _PID[0], self._data_bytes,
                                                   outputs.block, outputs.layout)
                    if status == batch_size:
                        return outputs.result(batch_size)
                    if status != codes.UNFINISHED:
                        self._raise_status(status)
                    return self._sample_waiting(batch_size, timeout, outputs)
                finally:
                    results.release(outputs)
        return self._sample_waiting(batch_size, timeout)

    def _sample_waiting(self, batch_size: int, timeout, outputs=None):
        """The paths of ``sample`` that may wait. The waits inside see only what is
        left of ``timeout``; a timeout names the caller's."""
        try:
            if outputs is not None:
                return self._finish_into(outputs, batch_size, timeout)
            deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
            if self.columns is None and not self.has_columns():
                # Nothing was ever inserted: wait for the first item, then map its columns.
                self._blocking(kernels.wait_for_items, L.C_ITEMS_WAITERS, L.C_ITEMS_SEQ,
                               timeout, False,
                               lambda was_waiting, register: (was_waiting, register))
                self.has_columns()
                return self.sample(batch_size, None if deadline is None
                                   else deadline - time.monotonic())
            return self._sample_new(batch_size, deadline)
        except errors.DeadlineExceededError:
            raise errors.DeadlineExceededError(
                f"Table '{self.name}': the rate limiter did not allow the sample within the "
                f"timeout of {errors.seconds(timeout)}.") from None

    def _finish_into(self, outputs, batch_size, timeout):
        """``sample_gather`` was blocked, stopped early, deleted what it drew, or found
        torn rows: the general steps finish the batch (copying its rows again, which is
        cheap next to any of these)."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        io = outputs.io
        count, _ = self._complete(batch_size, io.item(kernels.GATHER_COUNT), outputs.out_i,
                                  outputs.out_f, outputs.gens, io, deadline,
                                  outputs.gather_from(self.columns))
        outputs.times[:count] = outputs.out_i[kernels.OUT_TIMES, :count]
        return outputs.result(count)

    def _sample_new(self, batch_size, deadline):
        """The general path: new arrays for the result."""
        out_i = np.empty((kernels.OUT_INT_ROWS, batch_size), np.int64)
        out_f = np.empty((kernels.OUT_FLOAT_ROWS, batch_size), np.float64)
        out_gens = np.empty((batch_size, self.refs.shape[1]), np.int32)
        io = np.zeros(3, np.int64)
        count = kernels.sample(*self.arrays, batch_size, _PID[0], 0, 0, out_i, out_f, out_gens,
                               io)
        count, data = self._complete(batch_size, count, out_i, out_f, out_gens, io, deadline,
                                     self._gather)
        out_i = out_i[:, :count]
        out_f = out_f[:, :count]
        info = SampleInfo(out_i[kernels.OUT_KEY].view(np.uint64), out_f[kernels.OUT_PROBABILITY],
                          out_i[kernels.OUT_TABLE_SIZE], out_f[kernels.OUT_PRIORITY],
                          out_i[kernels.OUT_TIMES].astype(np.int32))
        return ReplaySample(info, self._unflatten(data))

    def _complete(self, batch_size, count, out_i, out_f, out_gens, io, deadline, gather):
        """Finishes a draw whose first kernel call returned ``count``: waits if it was
        blocked, fills the batch as the rate limiter allows, copies the rows with
        ``gather(slots)``, redraws torn ones, and frees the slots of items it deleted.

        Returns ``(count, data)``: rows taken, and one array per column.
        """
        if count < 0:
            count = self._draw_blocking(batch_size, out_i, out_f, out_gens, io, deadline, count)
        reserves = io.item(1)
        drained = io.item(2)
        try:
            if count < batch_size and io.item(0) > 0:
                # The rate limiter stopped the batch early: wait for credit, fill the rest.
                count, more = self._fill(out_i, out_f, out_gens, count, deadline)
                drained += more
            slots = out_i[kernels.OUT_SLOT, :count]
            data = gather(slots)
            if self.ctrl.item(L.C_RESERVES) != reserves:  # slots or rows reused: check ours
                torn = np.empty(count, np.int64)
                torn_count = kernels.torn_rows(self.meta, self.refs, self.rows, slots,
                                               out_i[kernels.OUT_VERSION, :count],
                                               out_gens[:count], torn)
                if torn_count:
                    drained += self._redraw_torn_rows(out_i, out_f, out_gens, data,
                                                      torn[:torn_count].tolist())
        finally:
            if drained:
                # Items this call deleted (max_times_sampled) kept their slots until now.
                kernels.release_drained(*self.arrays, out_i[kernels.OUT_SLOT, :count],
                                        out_i[kernels.OUT_VERSION, :count], _PID[0])
        return count, data

    def _gather(self, slots):
        """Copies the items in ``slots`` out of shared memory, one array per column.

        Large outputs go into recycled 64-byte aligned memory (``shmreplay._outputs``):
        no page faults, and TensorFlow and JAX take them without copying. (Indices are
        valid slots and rows, so numpy's fastest mode, ``clip``, changes nothing.)
        """
        storage = self.storage
        if not storage.steps:
            size = slots.size
            return [column.take(slots, axis=0) if size * column.strides[0] < _outputs.POOL_FROM
                    else _take(column, slots) for column in self.columns]
        refs = self.refs.take(slots, axis=0)
        data = []
        for column in storage.columns:
            if column.squeeze:
                rows = refs[:, column.offset]
            else:
                rows = refs[:, column.offset:column.offset + column.length]
            data.append(_take(self.columns[column.store], rows))
        return data

    def _draw_blocking(self, batch_size, out_i, out_f, out_gens, io, deadline, status):
        if status != codes.BLOCKED and status != codes.UNMAPPED:
            self._raise_status(status)
        timeout = None if deadline is None else deadline - time.monotonic()
        pid = os.getpid()
        return self._blocking(
            kernels.sample, L.C_ITEMS_WAITERS, L.C_ITEMS_SEQ, timeout, False,
            lambda was_waiting, register: (batch_size, pid, was_waiting, register, out_i,
                                           out_f, out_gens), io)

    def _fill(self, out_i, out_f, out_gens, count, deadline):
        """Draws the rest of a batch as the rate limiter allows; partial on timeout.

        Returns ``(count, drained)``: rows filled, and how many of them were deleted."""
        batch_size = out_i.shape[1]
        io = np.zeros(3, np.int64)
        drained = 0
        while count < batch_size:
            rest = batch_size - count
            more_i = np.empty((kernels.OUT_INT_ROWS, rest), np.int64)
            more_f = np.empty((kernels.OUT_FLOAT_ROWS, rest), np.float64)
            more_gens = np.empty((rest, out_gens.shape[1]), np.int32)
            try:
                got = self._draw_blocking(rest, more_i, more_f, more_gens, io, deadline,
                                          codes.BLOCKED)
            except errors.DeadlineExceededError:
                return count, drained
            out_i[:, count:count + got] = more_i[:, :got]
            out_f[:, count:count + got] = more_f[:, :got]
            out_gens[count:count + got] = more_gens[:got]
            count += got
            drained += io.item(2)
            if io[0] == 0:  # the table ran out of items
                return count, drained
        return count, drained

    def _redraw_torn_rows(self, out_i, out_f, out_gens, data, torn_rows):
        """Seqlock repair: redraws each row in ``torn_rows`` (its data was overwritten
        while we copied it) until a redrawn item's copy checks clean.

        Each redrawn row is checked alone, right after its own copy. Re-checking the
        whole batch instead would also flag rows whose copies were complete and clean
        but whose slots were overwritten since (harmless: the copy was done), so under
        heavy overwriting the batch never came out clean at once: one call made 50,000
        redraws in 0.9 s. Only items deleted by someone else are torn: the ones this call
        deletes (``max_times_sampled``) stay DRAINING until it is done. Returns how many
        redrawn items this call deleted."""
        pid = os.getpid()
        drained = 0
        new_i = np.empty((kernels.OUT_INT_ROWS, 1), np.int64)
        new_f = np.empty((kernels.OUT_FLOAT_ROWS, 1), np.float64)
        new_gens = np.empty((1, out_gens.shape[1]), np.int32)
        io = np.zeros(3, np.int64)
        torn = np.empty(1, np.int64)
        for row in torn_rows:
            while True:
                self._blocking(kernels.sample, L.C_ITEMS_WAITERS, L.C_ITEMS_SEQ, None, False,
                               lambda was_waiting, register: (1, pid, was_waiting, register,
                                                              new_i, new_f, new_gens), io)
                drained += io.item(2)
                values = self._gather(new_i[kernels.OUT_SLOT])
                if not kernels.torn_rows(self.meta, self.refs, self.rows,
                                         new_i[kernels.OUT_SLOT], new_i[kernels.OUT_VERSION],
                                         new_gens, torn):
                    break
            out_i[:, row] = new_i[:, 0]
            out_f[:, row] = new_f[:, 0]
            out_gens[row] = new_gens[0]
            for column, value in zip(data, values):
                column[row] = value[0]
        return drained

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
        scratch = self._update_scratch
        if scratch.shape[1] < keys.shape[0]:
            scratch = self._update_scratch = np.empty((2, keys.shape[0]), np.int64)
        if keys.shape[0] >= _WEIGH_UNLOCKED_FROM and self._weighs:
            # From a few dozen keys on, a Prioritized sampler's weights are worth
            # computing before the lock is taken (in a new array: that part is unlocked).
            status = kernels.update_whole_weighed(
                self._header_bytes, self._table_offsets, keys, priorities, self.max_priority,
                scratch, np.empty(2 * keys.shape[0]))
        else:
            status = kernels.update_whole(self._header_bytes, self._table_offsets, keys,
                                          priorities, self.max_priority, scratch)
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
        """Clears the table. A table without a signature also forgets its layout (the
        next item may have other shapes) unless an item is being written right now."""
        forgotten = np.zeros(1, np.int64)
        forget = self.config.signature is None
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
            _segment.unlink(L.data_segment_name(self.buffer_name, self.index))
            self._drop_layout(int(self.ctrl[L.C_LAYOUT_GEN]))

    def _drop_layout(self, generation: int):
        """Forgets the mapped layout; placeholders stamped with ``generation``."""
        self.detach()
        self.storage = self.signature = self.treedef = self.paths = None
        self.column_specs = self.forms = None
        self._flat_keys = _UNSET
        self.__dict__.pop("_split", None)
        self.layout_gen = generation
        self._table_offsets[kernels.TABLE_STAMP] = generation
        self.refs, self.rows = L.no_step_views(generation)
        self.arrays = self._table_arrays + (self.refs, self.rows)

    def close(self):
        """Marks the table closed for every process (owner's stop)."""
        kernels.close(*self.arrays)

    def verify(self):
        """Frees slots of dead writers, then names the invariants the table violates."""
        from shmreplay._kernels import verify as checks
        self.reclaim_dead_writers()
        status = self._call(kernels.verify)
        if status < 0:
            self._raise_status(status)
        names = {checks.SIZE: "size counter != live items",
                 checks.LIVE: "live-item index inconsistent",
                 checks.LIST: "insertion-order list inconsistent",
                 checks.TREE: "sum-tree does not match the priorities",
                 checks.HEAP: "heap order or positions broken",
                 checks.COUNTERS: "rate-limiter or pending counters inconsistent",
                 checks.ROWS: "step rows' reference counts or free list inconsistent"}
        return [text for bit, text in names.items() if status & bit]

    def can_insert(self, n: int) -> bool:
        return self._rate_check(n, True)

    def can_sample(self, n: int) -> bool:
        return self._rate_check(n, False)

    def _rate_check(self, n, inserting):
        status = kernels.rate_check(*self.arrays, int(n), inserting)
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

    def counters(self) -> np.ndarray:
        out = np.empty(L.CTRL_WORDS, np.int64)
        status = kernels.snapshot(*self.arrays, out)
        if status < 0:
            self._raise_status(status)
        return out

    def info(self) -> TableInfo:
        c = self.counters()
        if c[L.C_CLOSED]:  # stopped by its owner: what it held is gone
            self._raise_status(codes.CLOSED)
        self.has_columns()
        info = _table_info.make_info(self.config, c, _table_info.count_episodes(self, c))
        if self.storage is not None:
            stored = c[L.C_ROWS_LIVE] if self.storage.steps else c[L.C_SIZE] + c[L.C_PENDING]
            info = dataclasses.replace(
                info, num_stored_steps=int(stored),
                storage_bytes=_segment.resident_bytes(
                    L.data_segment_name(self.buffer_name, self.index)))
        return info

    def detach(self):
        """Drops this process's views (the segments stay for other processes)."""
        self.columns = None
        self.whole_items = False
        self._results = self._data_bytes = self._stagings = None  # (data segment views)
        if self.data_segment is not None:
            self.data_segment.close()
            self.data_segment = None


def _take(column, rows):
    """``column.take(rows, axis=0)``; a large result goes into pooled aligned memory."""
    if rows.size * column.strides[0] < _outputs.POOL_FROM:  # columns are C-contiguous
        return column.take(rows, axis=0)
    out = _outputs.empty(rows.shape + column.shape[1:], column.dtype)
    return np.take(column, rows, axis=0, out=out, mode="clip")


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


def _unflattener(flat_keys, treedef):
    """``leaves -> nest`` for a table's columns: a dict built directly for a flat dict
    nest (``flat_keys``), optree otherwise."""
    if flat_keys:
        return lambda leaves: dict(zip(flat_keys, leaves))
    return functools.partial(specs.optree.tree_unflatten, treedef)


def _fast_scalar_bounds(dtype: np.dtype):
    """``(int range or None, float bound or None)``: the Python ints and floats a column
    of ``dtype`` takes on the fast path (ints stored exactly, floats rounded but
    finite), as ``specs.python_scalar_as`` would."""
    if dtype.kind in "iu":
        return specs.int_range(dtype), None
    if dtype.kind == "f":
        exact = 2 ** (np.finfo(dtype).nmant + 1)  # every int up to it is a float exactly
        return (-exact, exact), specs.float_max(dtype)
    return None, None


def _flat_access(treedef):
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

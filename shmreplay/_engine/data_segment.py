"""A table's data segment: created by the process whose item first defines the table's
layout, and validated in full by every other process before it maps it.

Creation (``define``) is claimed under the table's lock, so one process creates and the
others wait for it. A waiter takes the creation over only once the claimant is dead
(its pid and start time, ``shmreplay._shm.procs.pid_alive``), never because it is slow: a
stopped or swapped-out creator finishes when it runs again, and its items are the
table's. Each claim draws a random token for the segment's name
(``_layout.data_segment_name``), so a taker-over never meets the dead claimant's file
(it unlinks it), and nobody who cannot read the buffer's header can create a file
under the name before the creator does.

The segment starts with a header (``_layout.DATA_HEADER``: magic, version, completion
flag, the pickled ``_storage.Storage``'s length, size and layout generation), then the
storage description itself, then the arrays ``_layout.plan_data`` places. A process
that attaches trusts none of it until checked: another user (a group member) or a
crash may have left anything there. ``TableEngine`` maps what these functions return.
"""

import os
import time

import cloudpickle
import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors, specs
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay._shm import procs as _procs
from shmreplay._shm import segment as _segment
from shmreplay._schema import storage as _storage
from shmreplay._shm.kernels import creation
from shmreplay._engine import growth as _growth

_POLL_MAX = 0.02  # seconds between looks at a creation under way (from 1 ms, doubling)


def define(engine, storage, timeout=None, stores_later: bool = False, rows: int = 0):
    """Makes ``storage`` the table's layout unless some process did already: claims the
    creation and creates the segment, or waits for the process that claimed it.

    Args:
      engine: The table's ``TableEngine``.
      storage: The layout (``shmreplay._schema.storage.Storage``) the caller's item defines.
      timeout: Seconds to wait for another process's creation (None: while it lives).
      stores_later: Reserve the stores' memory in a second thread (a restore: see
        ``create``).
      rows: The store rows to reserve at least (what a restore fills).

    Raises:
      DeadlineExceededError: another (live) process is creating the segment and did
        not finish within ``timeout``; the message names it and whether it is stopped.
      BufferBrokenError: the buffer was stopped.
      SharedMemoryFullError, SegmentSquattedError: from the creation.
    """
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    # The claim records this process's writer stamp (its pid with its pid namespace):
    # a creator in another container is never judged dead from here.
    pid = _procs.STAMP[0]
    start = _procs.start_time(os.getpid())
    out = np.zeros(3, np.int64)
    dead = (0, 0)
    pause = 0.001
    while not engine.has_columns():
        token = L.new_token()
        status = _lock_waits.call(engine, deadline, timeout, "insert", creation.claim, pid,
                                  start, token, dead[0], dead[1], out)
        if status < 0:
            engine._raise_status(status)
        if status == creation.READY:
            continue  # (has_columns maps it)
        if status == creation.CLAIMED:
            if dead[0] and out[0] == dead[0]:  # the dead claimant's file, if it made one
                _segment.unlink(L.data_segment_name(engine.buffer_name, engine.index,
                                                    int(out[2])))
            _create_claimed(engine, storage, token, stores_later, rows)
            return
        holder, holder_start = int(out[0]), int(out[1])
        holder_pid, holder_ns = _procs.split_stamp(holder)
        if _procs.judge(holder_pid, holder_ns, holder_start) is False:
            dead = (holder, holder_start)
            continue
        dead = (0, 0)
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            note = (_stopped_note(holder_pid) if holder_ns == _procs.NS[0]
                    else " (in another pid namespace)")
            raise errors.DeadlineExceededError(
                f"Table '{engine.name}': its data segment is being created by pid "
                f"{holder_pid}{note}, which did not finish within the timeout of "
                f"{errors.seconds(timeout)}. Its creation is taken over only once that "
                "process is dead; call again later, or end it if it is stuck.")
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))
        pause = min(pause * 2, _POLL_MAX)


def _release(engine, token: int):
    """Gives the claim ``token`` up (on the way out of a failed creation, whose error
    is the one to report: a stopped buffer needs no release)."""
    try:
        _lock_waits.call(engine, None, None, "insert", creation.release, token)
    except errors.ShmReplayError:
        pass


def _stopped_note(pid: int) -> str:
    """`` (stopped: ...)`` if the process is stopped (Ctrl-Z, SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    if state in (b"T", b"t"):
        return " (stopped: SIGSTOP, Ctrl-Z or a debugger; SIGCONT lets it finish)"
    return ""


def _create_claimed(engine, storage, token: int, stores_later: bool = False, rows: int = 0):
    """Creates, maps and publishes the segment of the caller's claim ``token``; on any
    failure releases the claim, so that nobody waits for a creation given up."""
    try:
        segment, plan, generation, reserved = create(engine, storage, token, stores_later,
                                                     rows)
    except BaseException:
        _release(engine, token)
        raise
    status = None
    try:
        engine._map_columns(segment, storage, plan, generation)
        status = _lock_waits.call(engine, None, None, "insert", creation.finish, token,
                                  int(storage.steps), plan.row_capacity, plan.width,
                                  len(storage.columns) if storage.variable else 0,
                                  reserved)
    finally:
        if status != 1:
            # Stopped meanwhile (the owner may have unlinked the names already), or
            # failed: remove ours rather than leak it.
            segment.unlink()
            if engine.data_segment is not segment:
                segment.close()
            engine._drop_layout(int(engine.ctrl[L.C_LAYOUT_GEN]))
            _release(engine, token)
    if status == 0:
        raise errors.BufferBrokenError(
            f"Table '{engine.name}': its data segment's creation by this process was taken "
            "over by another: the table's control block is inconsistent.")
    if status != 1:
        engine._raise_status(status)


def create(engine, storage, token: int, stores_later: bool = False, rows: int = 0):
    """Creates and fills ``engine``'s table's data segment for ``storage`` under the
    name of ``token`` (the caller's claim, see ``TableEngine.define_storage``); returns
    ``(segment, plan, generation, reserved)`` for the engine to map: ``reserved`` rows
    of each store are reserved (at least ``rows``; ``shmreplay._engine.growth``).

    Its mode and group follow the buffer's header, whichever process creates it:
    0600, or 0660 and the header segment's group when the buffer is shared with its
    owner's group (``engine.access``, which ``shmreplay._engine.buffer.Buffer`` sets).

    Raises:
      FileExistsError, SegmentSquattedError: if the name exists (see
        ``_segment.Segment.create``).
      SharedMemoryFullError: if /dev/shm cannot hold it.
    """
    access = getattr(engine, "access", _segment.PRIVATE)
    blob = cloudpickle.dumps(storage)
    plan = L.plan_data(storage, engine.capacity, len(blob))
    name = L.data_segment_name(engine.buffer_name, engine.index, token)
    reserved = _growth.initial_rows(plan, rows)
    now, stores = _growth.creation_ranges(plan, reserved)
    # A restore fills the stores as a second thread reserves them: reserving first (it
    # zeroes every page) made restoring a checkpoint of frames 40% slower.
    later = stores if stores_later else []
    if not stores_later:
        now = now + stores
    segment = _segment.Segment.create(name, plan.total_bytes, access.mode, access.group,
                                      f"the data segment of table '{engine.name}'", now,
                                      later)
    generation = int(engine.ctrl[L.C_LAYOUT_GEN])  # (stable: the layout is not ready)
    try:
        header = L.data_header_view(segment.buf)
        header["magic"] = L.DATA_MAGIC
        header["layout_version"] = L.LAYOUT_VERSION
        header["schema_len"] = len(blob)
        header["total_bytes"] = plan.total_bytes
        header["generation"] = generation
        segment.buf[plan.schema_offset:plan.schema_offset + len(blob)] = blob
        if storage.steps:
            L.step_views(segment.buf, plan, engine.capacity, generation)[1][-1] = generation
        header["complete"] = 1
    except BaseException:
        segment.unlink()
        segment.close()
        raise
    return segment, plan, generation, reserved


def current_name(engine) -> str:
    """The name of the table's data segment, from the token its control block holds."""
    return L.data_segment_name(engine.buffer_name, engine.index,
                               int(engine.ctrl[L.C_DATA_TOKEN]))


def _forgotten_since(engine, generation: int) -> bool:
    """Whether the layout of ``generation`` was forgotten (``reset``), or is not ready."""
    return (int(engine.ctrl[L.C_LAYOUT_GEN]) != generation
            or int(engine.ctrl[L.C_SCHEMA_READY]) == 0)


def attach(engine):
    """Opens the data segment another process created and validates all of it;
    returns ``(segment, storage, plan, generation)`` for the engine to map, or None if
    it is the segment of a layout forgotten since (``reset``).

    Its owner and mode are checked against the buffer's (``engine.access``) before a
    byte is read, every header field before it is used, and the unpickled storage
    against the segment's size and the table's control block before any view or
    kernel relies on it.

    Called only once the table's control block says the segment is ready.

    Raises:
      BufferNotFoundError: if it does not exist (any more).
      LayoutMismatchError: if it is refused, foreign, truncated or inconsistent.
    """
    access = getattr(engine, "access", _segment.PRIVATE)
    mapped_for = int(engine.ctrl[L.C_LAYOUT_GEN])  # (read before the token names it)
    name = current_name(engine)
    try:
        segment = _segment.Segment.attach(name, f"table '{engine.name}' data", access)
    except errors.BufferNotFoundError:
        if _forgotten_since(engine, mapped_for):
            return None  # reset meanwhile: its name is gone, the next layout not ready
        raise

    def corrupt(problem):
        return errors.LayoutMismatchError(
            f"Table '{engine.name}': data segment {name} {problem}.")

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
            # ready table's segment is attached: unfinished now means corrupt, unless
            # the table was reset meanwhile and this is the next layout's, being made.
            if _forgotten_since(engine, mapped_for):
                segment.close()
                return None
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
            if type(storage.variable) is not bool or (storage.variable and not storage.steps):
                raise TypeError("an invalid storage kind")
            if storage.steps:
                _check_step_columns(storage, column_specs, engine.capacity)
            elif list(stores) != list(column_specs):
                raise TypeError("stores that do not match its signature")
            arena_bytes = storage.arena_bytes
            # (sizes the general store's views and the kernels' page loops)
            if (type(arena_bytes) is not int or not 0 <= arena_bytes <= L.MAX_ARENA_BYTES
                    or arena_bytes % L.ARENA_PAGE):
                raise TypeError(f"an invalid arena size {arena_bytes!r}")
            plan = L.plan_data(storage, engine.capacity, length)
        except Exception as exc:
            raise corrupt(f"holds an unreadable or invalid schema ({exc})") from exc
        if plan.total_bytes != segment.size:
            raise corrupt(f"has {segment.size} bytes, its schema needs {plan.total_bytes}")
        generation = int(header["generation"][0])
        if generation != engine.ctrl[L.C_LAYOUT_GEN]:
            # A layout forgotten (reset) since the table said ready: not this one.
            segment.close()
            return None
        if storage.steps and (engine.ctrl[L.C_ROW_CAPACITY] != plan.row_capacity
                              or engine.ctrl[L.C_REFS_WIDTH] != plan.width):
            raise corrupt(
                f"holds {plan.row_capacity} rows of {plan.width} references, but the "
                f"table's control block says {engine.ctrl[L.C_ROW_CAPACITY]} of "
                f"{engine.ctrl[L.C_REFS_WIDTH]}")
        if storage.steps and L.step_views(segment.buf, plan, engine.capacity,
                                          generation)[1][-1, 0] != generation:
            raise corrupt(f"has a layout stamp that is not its generation {generation}")
    except BaseException:
        segment.close()
        raise
    return segment, storage, plan, generation


def _check_step_columns(storage, column_specs, capacity: int):
    """Raises TypeError unless step storage's columns fit its signature and stores: each
    item column reads ``length`` rows of one store (any number when items have any
    length and its spec's time dimension is None), so its spec must be that store's
    cell, with a time dimension unless squeezed."""
    stores = storage.store_specs
    offset, columns = 0, storage.columns
    if len(columns) != len(column_specs) or len(storage.store_sources) != len(stores):
        raise TypeError("columns that do not match its signature")
    variable = storage.variable
    if variable and not (
            all(type(n) is int for n in (storage.row_budget, storage.pool_blocks,
                                         storage.block_width))
            and 0 < storage.row_budget <= _storage.MAX_POOL
            and capacity <= storage.pool_blocks <= _storage.MAX_POOL - capacity
            and len(columns) + 2 < storage.block_width <= 1024):
        raise TypeError("an invalid reference pool")
    for column, spec in zip(columns, column_specs):
        if (type(column) is not _storage.ColumnRefs
                or type(column.store) is not int or type(column.length) is not int
                or type(column.squeeze) is not bool
                or type(column.offset) is not int
                or not 0 <= column.store < len(stores)
                or column.length < (0 if variable else 1)
                or column.offset != (0 if variable else offset)
                or (column.squeeze and column.length != 1)):
            raise TypeError(f"an invalid column {column!r}")
        cell = stores[column.store]
        length = None if column.length == 0 else column.length
        shape = cell.shape if column.squeeze else (length,) + cell.shape
        if tuple(spec.shape) != shape or np.dtype(spec.dtype) != cell.dtype:
            raise TypeError(f"a column {spec!r} its store {cell!r} cannot hold")
        offset += column.length

"""Checkpoint files: a consistent copy of a buffer's tables, and restoring one.

A checkpoint is one file, written to a temporary name in the destination directory,
flushed to disk, then renamed over the destination: a crash at any point leaves the
previous checkpoint at that path intact. Layout (little-endian)::

    0       FILE_HEADER   64 bytes: magic, format version, where the manifest is, its
                          crc32, the file's length (a truncated file is refused)
    64      arrays        raw C-order bytes, each 64-byte aligned
    ...     manifest      cloudpickle of a dict: per table its configuration, storage,
                          counters and where each of its arrays lies

Per table, the arrays hold its live items in insertion order (key, order, update
number, times sampled, priority) and their data: one array per column for tables that
store whole items; for step storage, the rows the items reference (renumbered
densely) and each item's references.

Snapshots take each table's lock only while copying its items into memory; the disk
is written after the lock is released. The manifest is unpickled on load: a checkpoint
file is trusted input, like any pickle (see ``docs/security.md``).
"""

import dataclasses
import gc
import os
import re
import signal
import sys
import threading
import time
import uuid
import warnings
import zlib
from typing import Callable, Dict, List, Optional, Union

import cloudpickle
import numpy as np

from shmreplay import _layout as L
from shmreplay import errors, specs
from shmreplay._kernels import codes, table as kernels

MAGIC = b"SHMRCKPT"
FORMAT_VERSION = 1
FILE_HEADER = np.dtype([
    ("magic", "S8"),
    ("version", "<u4"),
    ("manifest_crc", "<u4"),
    ("manifest_offset", "<i8"),
    ("manifest_len", "<i8"),
    ("file_len", "<i8"),
])
FILE_HEADER_SIZE = 64
_CHUNK = 16 << 20           # bytes per write (and per progress report)
_SHOW_PROGRESS_FROM = 256 << 20  # progress=None shows a bar on a terminal from this size

# Counters a restored table continues from (the rest are derived by ``rebuild``).
_COUNTERS = ("C_NEXT_ID", "C_INSERTS", "C_SAMPLES", "C_DELETES", "C_TOTAL_INSERTED",
             "C_TOTAL_SAMPLED", "C_TOTAL_DELETED", "C_NUM_UNIQUE", "C_ORDER_SEQ",
             "C_UPDATE_SEQ")
# Per-item fields saved from each slot's record.
_ITEM_FIELDS = {"key": L.M_KEY, "order": L.M_ORDER, "update": L.M_UPDATE, "times": L.M_TIMES}

Progress = Union[None, bool, Callable[[int, int], None]]


@dataclasses.dataclass
class TableSnapshot:
    """One table's items and state, copied out of shared memory under its lock."""

    name: str
    config: object
    storage: object            # ``_storage.Storage``, or None if nothing was ever stored
    capacity: int
    slot_bits: int
    counters: Dict[str, int]
    arrays: Dict[str, np.ndarray]
    hold_seconds: float        # how long the table's lock was held for the copy

    @property
    def num_items(self) -> int:
        return len(self.arrays["key"])


def snapshot_table(engine) -> TableSnapshot:
    """Copies one table's live items under its lock (inserts and samples wait meanwhile).

    Items being written (not yet committed) are not part of the snapshot; live items
    are complete and immutable, so the copy is consistent. The destination memory is
    allocated and touched *before* the lock is taken: first-touch page faults cost more
    than the copy itself, and nobody should wait for them.

    While the lock is held, this thread runs no Python signal handler and no garbage
    collection (both are deferred to the release): a handler or finalizer that touched
    the same table from this thread would wait forever for the lock it holds (a
    Server's SIGINT/SIGTERM handler closes every table), and an exception raised
    between the lock and the ``try`` could leave the lock held by a live process.
    """
    room = rows_room = 0
    while True:
        engine.has_columns()
        storage = engine.storage
        room = max(room, _room(engine.ctrl[L.C_SIZE] + engine.ctrl[L.C_PENDING], engine.capacity))
        steps = storage is not None and storage.steps
        if steps:
            rows_room = max(rows_room, _room(engine.ctrl[L.C_ROW_FRESH],
                                             int(engine.ctrl[L.C_ROW_CAPACITY])))
        out = _Outputs(engine, room, rows_room)
        with _HeldQuietly():
            started = time.perf_counter()
            count = engine._call(kernels.hold_items, out.slots, out.fields, out.priority)
            if count >= 0:
                try:
                    stored_rows = int(engine.ctrl[L.C_ROW_FRESH])
                    if engine.ctrl[L.C_CLOSED]:
                        count = codes.CLOSED  # the owner stopped the buffer
                    elif (engine.storage is not storage or (count > 0 and storage is None)
                            or (steps and stored_rows > rows_room)):
                        # Storage appeared (some process defined it; a kernel that found
                        # it unmapped had it mapped), or rows grew, since we looked.
                        count = None
                    else:
                        counters = _copy_held(engine, out, storage, count, stored_rows)
                finally:
                    kernels.release_hold(engine.ctrl)
                held = time.perf_counter() - started
        if count is None:
            continue
        if count <= _TOO_SMALL:
            room = -count + _TOO_SMALL + 1024
            continue
        if count < 0:
            engine._raise_status(count)
        break
    arrays = {name: out.fields[i, :count] for i, name in enumerate(_ITEM_FIELDS)}
    arrays["priority"] = out.priority[:count]
    if storage is not None and not storage.steps:
        for index, copy in enumerate(out.stores):
            arrays[f"store{index}"] = copy[:count]
    elif storage is not None:
        used, dense = np.unique(out.refs[:count], return_inverse=True)
        arrays["refs"] = dense.reshape(out.refs[:count].shape).astype(np.int32)
        for index, copy in enumerate(out.stores):
            arrays[f"store{index}"] = copy[used]  # only the rows items reference, densely
    return TableSnapshot(engine.name, engine.config, storage, engine.capacity,
                         int(engine.ctrl[L.C_SLOT_BITS]), counters, arrays, held)


def _copy_held(engine, out, storage, count, stored_rows):
    """Copies the held table's items into ``out``; returns its counters."""
    slots = out.slots[:count]
    # A table filled in order holds its items in one run of slots: copy slices.
    rows = slice(int(slots[0]), int(slots[0]) + count) if (
        count and kernels.ascending_run(slots)) else slots
    counters = {name: int(engine.ctrl[getattr(L, name)]) for name in _COUNTERS}
    if storage is not None and not storage.steps:
        for column, copy in zip(engine.columns, out.stores):
            _copy_rows(column, rows, copy[:count])
    elif storage is not None:
        _copy_rows(engine.refs, rows, out.refs[:count])
        for store, copy in zip(engine.columns, out.stores):
            copy[:stored_rows] = store[:stored_rows]
    return counters


class _HeldQuietly:
    """Defers Python signal handlers (main thread only: no other thread runs them) and
    garbage collection for the duration of a ``with`` block; caught signals are raised
    again, to their own handlers, at its end."""

    def __enter__(self):
        self._gc = gc.isenabled()
        gc.disable()
        self._saved = {}
        self._caught = []
        if threading.current_thread() is threading.main_thread():
            for signum in _HANDLED_SIGNALS:
                handler = signal.getsignal(signum)
                if callable(handler):
                    self._saved[signum] = handler
                    signal.signal(signum, self._note)
        return self

    def _note(self, signum, frame):
        self._caught.append(signum)

    def __exit__(self, *exc):
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        if self._gc:
            gc.enable()
        for signum in dict.fromkeys(self._caught):
            signal.raise_signal(signum)  # its handler runs now, the lock released
        return False


# Signals whose Python handlers are deferred while a table is held (not the ones a fault
# raises: their handlers cannot wait).
_HANDLED_SIGNALS = tuple(sorted(
    set(signal.valid_signals())
    - {signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
       signal.SIGILL, signal.SIGABRT, signal.SIGTRAP}))


_TOO_SMALL = -1000  # hold_items: -(count + 1000) when the outputs have too little room


def _room(count, limit) -> int:
    """Rows to prepare for ``count`` items or rows, with a margin for ones added meanwhile."""
    return int(min(limit, count + max(1024, count // 16)))


class _Outputs:
    """The destination arrays of one snapshot, touched page by page in advance."""

    def __init__(self, engine, room, rows_room):
        self.slots = _touched((room,), np.int64)
        self.fields = _touched((len(_ITEM_FIELDS), room), np.int64)
        self.priority = _touched((room,), np.float64)
        self.stores = []
        self.refs = None
        storage = engine.storage
        if storage is None:
            return
        if storage.steps:
            self.refs = _touched((room, engine.refs.shape[1]), engine.refs.dtype)
        n = rows_room if storage.steps else room
        self.stores = [_touched((n,) + column.shape[1:], column.dtype)
                       for column in engine.columns]


def _touched(shape, dtype) -> np.ndarray:
    array = np.empty(shape, dtype)
    flat = array.reshape(-1).view(np.uint8)
    flat[::4096] = 0  # one write per page: the kernel maps it now
    return array


def _copy_rows(source, rows, out):
    if isinstance(rows, slice):
        out[...] = source[rows]
    else:
        np.take(source, rows, axis=0, out=out, mode="clip")  # valid slots: clip is a no-op


# --- writing ------------------------------------------------------------------------------


@dataclasses.dataclass
class SaveSummary:
    """What ``save`` wrote."""

    path: str
    items: Dict[str, int]       # per table
    bytes: int
    seconds: float
    max_hold_seconds: float     # the longest time one table's lock was held


def save(engines, path: str, buffer_name: str, progress: Progress = None) -> SaveSummary:
    """Writes a checkpoint of ``engines`` (one table at a time) atomically to ``path``."""
    started = time.perf_counter()
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    _remove_stale_temporaries(path)
    temporary = os.path.join(
        directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    estimates = [_estimated_bytes(engine) for engine in engines]
    reporter = _Reporter(progress, sum(estimates))
    tables, items, max_hold = [], {}, 0.0
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(bytes(FILE_HEADER_SIZE))
            for engine, estimate in zip(engines, estimates):
                snapshot = snapshot_table(engine)
                actual = sum(a.nbytes for a in snapshot.arrays.values())
                reporter.total += actual - estimate
                entry = _manifest_entry(snapshot)
                for key, array in snapshot.arrays.items():
                    entry["arrays"][key] = _write_array(file, array, reporter)
                tables.append(entry)
                items[snapshot.name] = snapshot.num_items
                max_hold = max(max_hold, snapshot.hold_seconds)
                del snapshot  # free this table's copy before the next one is taken
            manifest = cloudpickle.dumps({
                "format": FORMAT_VERSION, "created_ns": time.time_ns(),
                "buffer": buffer_name, "tables": tables})
            manifest_offset = file.tell()
            file.write(manifest)
            header = np.zeros(1, FILE_HEADER)
            header["magic"] = MAGIC
            header["version"] = FORMAT_VERSION
            header["manifest_crc"] = zlib.crc32(manifest)
            header["manifest_offset"] = manifest_offset
            header["manifest_len"] = len(manifest)
            header["file_len"] = file.tell()
            size = file.tell()
            file.seek(0)
            file.write(header.tobytes().ljust(FILE_HEADER_SIZE, b"\0"))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        _unlink_quietly(temporary)
        reporter.finish(failed=True)
        raise
    _fsync_directory(directory)
    reporter.finish()
    return SaveSummary(path, items, size, time.perf_counter() - started, max_hold)


def _manifest_entry(snapshot: TableSnapshot) -> dict:
    return {"name": snapshot.name, "config": snapshot.config, "storage": snapshot.storage,
            "capacity": snapshot.capacity, "slot_bits": snapshot.slot_bits,
            "counters": snapshot.counters, "num_items": snapshot.num_items, "arrays": {}}


def _write_array(file, array: np.ndarray, reporter) -> tuple:
    """Appends ``array`` 64-byte aligned; returns ``(offset, dtype descr, shape)``."""
    padding = -file.tell() % L.ALIGN
    file.write(bytes(padding))
    offset = file.tell()
    data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    for start in range(0, len(data), _CHUNK):
        piece = data[start:start + _CHUNK]
        file.write(piece)
        reporter.advance(len(piece))
    return offset, np.lib.format.dtype_to_descr(array.dtype), array.shape


def _estimated_bytes(engine) -> int:
    """The snapshot's size from the counters (for the progress bar, before locking)."""
    size = int(engine.ctrl[L.C_SIZE])
    per_item = 8 * (len(_ITEM_FIELDS) + 1)
    if not engine.has_columns():
        return size * per_item
    if not engine.storage.steps:
        return size * (per_item + sum(c.strides[0] for c in engine.columns))
    row_bytes = sum(store.strides[0] for store in engine.columns)
    return (size * (per_item + 4 * engine.refs.shape[1])
            + int(engine.ctrl[L.C_ROWS_LIVE]) * row_bytes)


_TEMPORARY = re.compile(r"\.(?P<target>.+)\.tmp-(?P<pid>[0-9]+)-[0-9a-f]{8}")
# Another checkpoint's temporary is removed only once it is this old (seconds): its
# writer may run on another machine sharing the directory, where its pid means nothing.
_STALE_AFTER = 600


def _remove_stale_temporaries(path: str):
    """Removes temporaries that checkpoint writers killed mid-way left next to ``path``:
    those of ``path`` itself and, since checkpoints written into a directory get a new
    name every time, old ones of every ``*.shmreplay`` checkpoint in its directory."""
    from shmreplay._procs import pid_alive
    from shmreplay.checkpointers import SUFFIX
    directory, base = os.path.split(path)
    for name in os.listdir(directory):
        match = _TEMPORARY.fullmatch(name)
        if match is None or pid_alive(int(match["pid"])):
            continue
        temporary = os.path.join(directory, name)
        if match["target"] != base:
            try:
                age = time.time() - os.stat(temporary).st_mtime
            except OSError:
                continue
            if not match["target"].endswith(SUFFIX) or age < _STALE_AFTER:
                continue
        _unlink_quietly(temporary)


def _unlink_quietly(path: str):
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_directory(directory: str):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Reporter:
    """Calls the user's progress callback, or draws a bar on stderr."""

    def __init__(self, progress: Progress, total: int):
        self.total = max(total, 0)
        self.done = 0
        self._last_draw = 0.0
        self._bar = not callable(progress) and bool(
            progress or (progress is None and self.total >= _SHOW_PROGRESS_FROM
                         and sys.stderr.isatty()))
        self._callback = progress if callable(progress) else self._draw if self._bar else None

    def advance(self, count: int):
        self.done += count
        if self._callback is not None:
            self._callback(self.done, max(self.total, self.done))

    def finish(self, failed: bool = False):
        if self._bar:
            if not failed:
                self._draw(self.done, self.done, force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self, done: int, total: int, force: bool = False):
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        fraction = done / total if total else 1.0
        bar = "#" * int(30 * fraction)
        sys.stderr.write(f"\rcheckpoint [{bar:<30}] {100 * fraction:5.1f}% "
                         f"{done / 2**20:,.0f} / {total / 2**20:,.0f} MiB")
        sys.stderr.flush()


# --- reading ------------------------------------------------------------------------------


@dataclasses.dataclass
class TableCheckpoint:
    """One table as a checkpoint holds it; arrays are read from the file on demand."""

    name: str
    config: object
    storage: object
    capacity: int
    slot_bits: int
    counters: Dict[str, int]
    num_items: int
    path: str
    layout: Dict[str, tuple]

    def array(self, key: str) -> np.ndarray:
        offset, descr, shape = self.layout[key]
        dtype = np.lib.format.descr_to_dtype(descr)
        if int(np.prod(shape)) == 0:
            return np.empty(shape, dtype)
        return np.memmap(self.path, dtype, "r", offset, tuple(shape))


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint file's manifest (see ``load``)."""

    path: str
    created_ns: int
    buffer: str
    tables: List[TableCheckpoint]

    def table(self, name: str) -> Optional[TableCheckpoint]:
        return next((t for t in self.tables if t.name == name), None)


def load(path: str) -> Checkpoint:
    """Reads and checks a checkpoint's header and manifest (arrays stay on disk).

    Raises:
      CheckpointError: if the file is missing, truncated, foreign, corrupt or of an
        unknown format version.
    """
    path = os.path.abspath(path)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            raw = file.read(FILE_HEADER_SIZE)
            if len(raw) < FILE_HEADER_SIZE:
                raise errors.CheckpointError(
                    f"Checkpoint {path} has {size} bytes, less than its header: truncated.")
            header = np.frombuffer(raw[:FILE_HEADER.itemsize], FILE_HEADER)[0]
            if header["magic"] != MAGIC:
                raise errors.CheckpointError(
                    f"{path} is not a shmreplay checkpoint (magic {header['magic']!r}).")
            if header["version"] != FORMAT_VERSION:
                raise errors.CheckpointError(
                    f"Checkpoint {path} has format version {header['version']}; this "
                    f"shmreplay reads version {FORMAT_VERSION}.")
            offset, length = int(header["manifest_offset"]), int(header["manifest_len"])
            if int(header["file_len"]) != size or not (
                    FILE_HEADER_SIZE <= offset and 0 < length and offset + length <= size):
                raise errors.CheckpointError(
                    f"Checkpoint {path} is truncated or corrupt: {size} bytes, its header "
                    f"records {int(header['file_len'])} (manifest at {offset}+{length}).")
            file.seek(offset)
            manifest_bytes = file.read(length)
    except FileNotFoundError as exc:
        raise errors.CheckpointError(f"No checkpoint at {path}.") from exc
    except IsADirectoryError as exc:
        raise errors.CheckpointError(f"{path} is a directory, not a checkpoint file.") from exc
    if zlib.crc32(manifest_bytes) != int(header["manifest_crc"]):
        raise errors.CheckpointError(f"Checkpoint {path}: its manifest is corrupt (crc32).")
    try:
        manifest = cloudpickle.loads(manifest_bytes)
        tables = [TableCheckpoint(t["name"], t["config"], t["storage"], int(t["capacity"]),
                                  int(t["slot_bits"]), dict(t["counters"]), int(t["num_items"]),
                                  path, dict(t["arrays"]))
                  for t in manifest["tables"]]
    except Exception as exc:
        raise errors.CheckpointError(f"Checkpoint {path}: its manifest cannot be read.") from exc
    for table in tables:
        _check_table(path, size, table)
    return Checkpoint(path, int(manifest["created_ns"]), str(manifest["buffer"]), tables)


def _check_table(path: str, size: int, table: "TableCheckpoint"):
    """Checks one table's manifest entry: its storage and every array's place, dtype and
    shape against its item count (the arrays' values are checked by ``restore_table``).

    Raises:
      CheckpointError: if anything does not match what ``save`` writes.
    """
    from shmreplay import _storage
    from shmreplay.table import Table

    def corrupt(problem):
        return errors.CheckpointError(f"Checkpoint {path}: table '{table.name}' {problem}.")

    if not isinstance(table.config, Table) or table.config.name != table.name:
        raise corrupt("has no valid configuration")
    if table.storage is not None and (type(table.storage) is not _storage.Storage
                                      or type(table.storage.steps) is not bool):
        raise corrupt("has an invalid storage description")
    if not (0 <= table.num_items <= table.capacity and table.capacity > 0
            and table.slot_bits == L.slot_bits(table.capacity)):
        raise corrupt(f"has {table.num_items} items in {table.capacity} slots of "
                      f"{table.slot_bits} key bits")
    if set(table.counters) != set(_COUNTERS) or not all(
            type(v) is int and v >= 0 for v in table.counters.values()):
        raise corrupt("has invalid counters")
    n = table.num_items
    expected = {name: (np.dtype(np.int64), (n,)) for name in _ITEM_FIELDS}
    expected["priority"] = (np.dtype(np.float64), (n,))
    stored = None
    storage = table.storage
    if storage is not None:
        try:
            store_specs = [(np.dtype(spec.dtype), tuple(int(d) for d in spec.shape))
                           for spec in storage.store_specs]
        except Exception as exc:
            raise corrupt("has an invalid storage description") from exc
        if storage.steps:
            expected["refs"] = (np.dtype(np.int32), (n, storage.width))
            try:  # the steps stored: every store holds as many
                stored = table.layout["store0"][2][0]
            except Exception:
                stored = None
            if type(stored) is not int or stored < 0 or not store_specs:
                raise corrupt("has no valid step stores")
        for index, (dtype, shape) in enumerate(store_specs):
            expected[f"store{index}"] = (dtype, ((stored,) if storage.steps else (n,)) + shape)
    if set(table.layout) != set(expected):
        raise corrupt(f"has arrays {sorted(table.layout)}, not {sorted(expected)}")
    for key, entry in table.layout.items():
        try:
            offset, descr, shape = entry
            dtype = np.lib.format.descr_to_dtype(descr)
            shape = tuple(shape)
            valid = (type(offset) is int and all(type(d) is int for d in shape)
                     and (dtype, shape) == expected[key])
        except Exception:
            valid = False
        if not valid:
            raise corrupt(f"array {key} is not {expected[key][0]} of shape {expected[key][1]}")
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if offset < FILE_HEADER_SIZE or offset + nbytes > size:
            raise corrupt(f"array {key} lies outside the file")


# --- restoring ----------------------------------------------------------------------------


def tables_to_serve(checkpoint: Checkpoint, tables, override_config: bool):
    """The Table objects a restoring Server serves.

    With no ``tables``, the checkpoint's. Otherwise the given ones, matched with the
    checkpoint's tables by name; unless ``override_config``, a matched table takes the
    checkpoint's configuration (Reverb's behaviour), with a warning when it differs.
    """
    if not tables:
        return [t.config.replace() for t in checkpoint.tables]
    names = {t.name for t in tables}
    ignored = [t.name for t in checkpoint.tables if t.name not in names]
    if ignored:
        warnings.warn(f"Checkpoint {checkpoint.path}: tables {ignored} are not among the "
                      "Server's tables and are not restored.", stacklevel=3)
    if override_config:
        return list(tables)
    for table in tables:
        saved = checkpoint.table(table.name)
        if saved is None:
            continue
        differences = _config_differences(table, saved.config)
        if differences:
            warnings.warn(
                f"Table '{table.name}' is restored with the checkpoint's configuration "
                f"({'; '.join(differences)}). Pass override_config=True to keep the "
                "configuration given to the Server.", stacklevel=3)
        for field in ("sampler", "remover", "max_size", "rate_limiter", "max_times_sampled",
                      "signature", "column_specs"):
            setattr(table, field, getattr(saved.config, field))
    return list(tables)


def _config_differences(table, saved) -> List[str]:
    differences = []
    for field in ("sampler", "remover", "max_size", "rate_limiter", "max_times_sampled"):
        mine, theirs = getattr(table, field), getattr(saved, field)
        if repr(mine) != repr(theirs):
            differences.append(f"{field} {theirs!r} instead of {mine!r}")
    if _signature_key(table.signature) != _signature_key(saved.signature):
        differences.append(f"signature {saved.signature} instead of {table.signature}")
    return differences


def _signature_key(signature):
    """What makes two signatures the same: their paths, shapes and dtypes."""
    if signature is None:
        return None
    leaves, tree = specs.flatten(signature)
    return (specs.path_strings(tree), [(tuple(s.shape), np.dtype(s.dtype)) for s in leaves])


def restore_table(engine, saved: TableCheckpoint, reset_rate_limiter: bool) -> int:
    """Fills a new, empty table (not yet visible to other processes) from a checkpoint.

    Keys are kept when the table has the checkpoint's capacity (its ``max_size``); a
    table restored with another ``max_size`` gives its items new keys, which no key
    issued before the checkpoint can name. Items beyond the new ``max_size`` are evicted
    by the remover. Returns the number evicted.

    Raises:
      SchemaError: if the table's signature does not match the checkpoint's items.
      ValueError: if the table cannot hold the checkpoint's items.
      CheckpointError: if the checkpoint's arrays are inconsistent (damaged).
    """
    count = saved.num_items
    storage = saved.storage
    fields = _checked_items(saved)
    if storage is not None:
        _check_signature(engine, storage)
    counters = dict(saved.counters)
    if reset_rate_limiter:
        counters.update(C_INSERTS=count, C_SAMPLES=0, C_DELETES=0)
    if count > engine.capacity:
        raise ValueError(
            f"Table '{engine.name}': the checkpoint holds {count} items, more than a table "
            f"of max_size {engine.config.max_size} has room for ({engine.capacity} slots).")
    invalid = kernels.first_invalid_priority(fields["priority"], engine.max_priority)
    if invalid >= 0:
        raise ValueError(
            f"Table '{engine.name}': the checkpoint's priority {fields['priority'][invalid]} "
            f"is above the largest this table's selectors allow ({engine.max_priority}).")
    keys = fields["key"]
    bits = int(engine.ctrl[L.C_SLOT_BITS])
    if engine.capacity == saved.capacity and bits == saved.slot_bits:
        slots = keys & ((1 << bits) - 1)
    else:
        slots = np.arange(count, dtype=np.int64)
        ids = keys >> saved.slot_bits
        if bits != saved.slot_bits:
            # Keys the checkpointed run issued are below NEXT_ID << its slot bits: new
            # item ids start where none of them, read with these bits, can reach.
            next_id = counters["C_NEXT_ID"]
            first = max(next_id, ((next_id << saved.slot_bits) >> bits) + 1)
            if (first + count) << bits >= 1 << 63:
                raise ValueError(f"Table '{engine.name}': no keys left for the restored items.")
            ids = first + slots
            counters["C_NEXT_ID"] = first + count
        keys = (ids << bits) | slots
    rows = slice(int(slots[0]), int(slots[0]) + count) if (
        count and kernels.ascending_run(slots)) else slots
    if storage is not None:
        engine._create_data_segment(storage)
    if storage is not None and not storage.steps:
        for index, column in enumerate(engine.columns):
            column[rows] = saved.array(f"store{index}")
    elif storage is not None:
        stored = saved.array("store0").shape[0]
        if stored > int(engine.ctrl[L.C_ROW_CAPACITY]):
            raise ValueError(
                f"Table '{engine.name}': the checkpoint's items reference {stored} distinct "
                f"steps; a table of max_size {engine.config.max_size} stores at most "
                f"{int(engine.ctrl[L.C_ROW_CAPACITY])}.")
        refs = saved.array("refs")
        if count and (refs.min() < 0 or refs.max() >= stored):
            raise _damaged(saved, "references steps it does not hold")
        for index, store in enumerate(engine.columns):
            store[:stored] = saved.array(f"store{index}")
        engine.refs[rows] = refs
        engine.ctrl[L.C_ROW_FRESH] = stored
    for name, value in counters.items():
        engine.ctrl[getattr(L, name)] = value
    fresh = int(slots.max()) + 1 if count else 0
    evicted = kernels.restore_items(
        *engine.arrays, slots, keys, fields["order"], fields["update"], fields["times"],
        fields["priority"], fresh, np.zeros(2, np.float64))
    if evicted < 0:
        engine._raise_status(evicted)
    return evicted


def _damaged(saved: TableCheckpoint, problem: str) -> errors.CheckpointError:
    return errors.CheckpointError(f"Checkpoint {saved.path}: table '{saved.name}' {problem}.")


def _checked_items(saved: TableCheckpoint) -> Dict[str, np.ndarray]:
    """The items' fields, read into memory and checked against each other and the
    counters (array bytes are not checksummed, and the kernels trust what they get)."""
    fields = {name: np.array(saved.array(name)) for name in (*_ITEM_FIELDS, "priority")}
    keys, orders = fields["key"], fields["order"]
    bits, counters = saved.slot_bits, saved.counters
    slots = keys & ((1 << bits) - 1)
    ids = keys >> bits
    if saved.num_items:
        if ids.min() < 1 or ids.max() >= counters["C_NEXT_ID"] or slots.max() >= saved.capacity:
            raise _damaged(saved, "has invalid keys")
        taken = np.zeros(saved.capacity, np.bool_)
        taken[slots] = True
        if int(taken.sum()) != saved.num_items:
            raise _damaged(saved, "has two items in one slot")
        if (orders[0] < 0 or orders[-1] >= counters["C_ORDER_SEQ"]
                or (np.diff(orders) <= 0).any()):
            raise _damaged(saved, "has items out of insertion order")
        update = fields["update"]
        if update.min() < 0 or update.max() >= counters["C_UPDATE_SEQ"]:
            raise _damaged(saved, "has invalid update numbers")
        if fields["times"].min() < 0:
            raise _damaged(saved, "has negative sample counts")
        priority = fields["priority"]
        if not (priority >= 0).all():  # also NaN
            raise _damaged(saved, "has negative or NaN priorities")
    return fields


def _check_signature(engine, storage):
    signature = engine.config.signature
    if signature is None:
        return
    wanted, wanted_tree = specs.flatten(signature)
    saved, saved_tree = specs.flatten(storage.signature)
    same = (specs.path_strings(wanted_tree) == specs.path_strings(saved_tree)
            and [(s.shape, np.dtype(s.dtype)) for s in wanted]
            == [(s.shape, np.dtype(s.dtype)) for s in saved])
    if not same:
        raise errors.SchemaError(
            f"Table '{engine.name}': the checkpoint's items have signature "
            f"{storage.signature}, the table's signature is {signature}.")


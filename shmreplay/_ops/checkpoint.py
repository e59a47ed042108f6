"""Checkpoint files: a consistent copy of a buffer's tables, written atomically.

A checkpoint is one file, written to a temporary name in the destination directory,
flushed to disk, then renamed over the destination: a crash at any point leaves the
previous checkpoint at that path intact. Layout (little-endian)::

    0       FILE_HEADER   64 bytes: magic, format version, where the manifest is, its
                          crc32, the file's length (a truncated file is refused) and,
                          since format 3, the crc32 of these fields; the rest is zero
    64      arrays        raw C-order bytes, each 64-byte aligned (zero padding between)
    ...     manifest      cloudpickle of a dict: per table its configuration, storage,
                          counters, where each of its arrays lies and each array's
                          checksum (format 3: crc32; format 4 on: ``checksum64``,
                          about three times faster); it ends the file

Per table, the arrays hold its live items in insertion order (key, order, update
number, times sampled, priority, and since format 2 the episode: a writer's episode id,
or -1 for an item that is its own episode) and their data: one array per column for tables that
store whole items; for step storage, the rows the items reference (renumbered
densely) and each item's references.

Since format 3 every byte of the file is checked: the header, the manifest and the
padding on ``load``; each array's checksum when it is read (``TableCheckpoint.array``,
or all of a table's in a second thread while it is restored: ``checking``). Damage
anywhere raises ``CheckpointError`` naming the part.

Tables are snapshotted one at a time (``shmreplay._engine.snapshot``); the disk is written
after each table's lock is released. Restoring is ``shmreplay._ops.restore``. The manifest
is unpickled on load: a checkpoint file is trusted input, like any pickle (see
``docs/security.md``).
"""

import concurrent.futures
import contextlib
import dataclasses
import io
import mmap
import os
import pickle
import re
import sys
import time
import uuid
import zlib
from typing import Callable, Dict, List, Optional, Union

import cloudpickle
import numpy as np

from shmreplay._ops import checkpoint_checks as _checks
from shmreplay._shm import layout as L
from shmreplay import errors
from shmreplay._engine.snapshot import ITEM_FIELDS, TableSnapshot, snapshot_table

MAGIC = b"SHMRCKPT"
# 2: each item's episode (format 1 files restore, each item its own).
# 3: a crc32 of the header and of every array (format 1 and 2 files restore, their
#    arrays unchecksummed: their values are still checked, see ``_ops.restore``).
# 4: the arrays' checksums are ``checksum64`` (crc32 cost a fifth of a restore).
FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
CHECKSUMMED_FROM = 3
CHECKSUMS = _checks.CHECKSUMS
checksum_of = _checks.checksum_of
FILE_HEADER = np.dtype([
    ("magic", "S8"),
    ("version", "<u4"),
    ("manifest_crc", "<u4"),
    ("manifest_offset", "<i8"),
    ("manifest_len", "<i8"),
    ("file_len", "<i8"),
    ("header_crc", "<u4"),  # of the bytes before it (format 3 on)
])
_HEADER_CRC_COVERS = FILE_HEADER.fields["header_crc"][1]
FILE_HEADER_SIZE = _checks.FILE_HEADER_SIZE
_CHUNK = 16 << 20           # bytes per write (and per progress report)
_SHOW_PROGRESS_FROM = 256 << 20  # progress=None shows a bar on a terminal from this size

Progress = Union[None, bool, Callable[[int, int], None]]


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
        with os.fdopen(fd, "wb") as file, _checksummer(FORMAT_VERSION) as checksummer:
            file.write(bytes(FILE_HEADER_SIZE))
            for engine, estimate in zip(engines, estimates):
                snapshot = snapshot_table(engine)
                actual = sum(a.nbytes for a in snapshot.arrays.values())
                reporter.total += actual - estimate
                entry = _manifest_entry(snapshot)
                # The checksums run in another thread while this one writes (both
                # without the GIL): they cost little of the save's time.
                sums = {key: checksummer.submit(checksum_of, array, FORMAT_VERSION)
                        for key, array in snapshot.arrays.items()}
                for key, array in snapshot.arrays.items():
                    entry["arrays"][key] = _write_array(file, array, reporter)
                entry[CHECKSUMS[FORMAT_VERSION][0]] = {
                    key: value.result() for key, value in sums.items()}
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
            header["header_crc"] = zlib.crc32(header.tobytes()[:_HEADER_CRC_COVERS])
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


def _checksummer(version: int):
    """The one thread that computes checksums of format ``version`` while the caller
    writes or copies. Their kernels are loaded (or compiled) first, in the caller's
    thread: the thread would wait for the machine's compile lock, which the caller may
    hold (the warm-up does) while it waits for the thread."""
    checksum_of(np.empty(0, np.uint8), version)
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shmreplay-checksum")


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
    per_item = 8 * (len(ITEM_FIELDS) + 1)
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
    from shmreplay._shm.procs import pid_alive
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
    """One table as a checkpoint holds it; arrays are read from the file on demand.

    ``mapped`` is the one read-only mapping of the file that ``load`` checked, and
    ``file`` a descriptor of the same file: every array comes from them, never from the
    path again, so a checkpoint written over the same path meanwhile (an atomic rename)
    cannot mix into this one.
    """

    name: str
    config: object
    storage: object
    capacity: int
    slot_bits: int
    counters: Dict[str, int]
    num_items: int
    path: str
    layout: Dict[str, tuple]
    mapped: object = None
    checksums: Optional[Dict[str, int]] = None  # per array (format 3 on)
    version: int = FORMAT_VERSION
    file: object = None  # an _OpenFile
    verified: set = dataclasses.field(default_factory=set)
    _checks: Optional[dict] = None  # inside ``checking``: key -> its checksum's future
    _checker: object = None

    def array(self, key: str) -> np.ndarray:
        """The array ``key``, read-only from the file. Its checksum is checked now, or
        inside ``checking`` in the second thread (by the end of the ``with`` block).

        Raises:
          CheckpointError: if its bytes do not match the checksum ``save`` recorded.
        """
        offset, descr, shape = self.layout[key]
        dtype = np.lib.format.descr_to_dtype(descr)
        if int(np.prod(shape)) == 0:
            array = np.empty(shape, dtype)
        else:
            array = np.ndarray(tuple(shape), dtype, buffer=self.mapped, offset=offset)
        if self.checksums is not None and key not in self.verified:
            if self._checks is None:
                self._check(key, checksum_of(array, self.version))
            elif key not in self._checks:
                self._checks[key] = self._checker.submit(checksum_of, array, self.version)
        return array

    def read_into(self, key: str, destination: np.ndarray):
        """Reads array ``key`` into ``destination`` (C-contiguous, of its dtype and
        shape) and checks its checksum, piece by piece while each piece is still in the
        CPU's cache. For large arrays: one pass over memory, about a fifth faster than
        copying from the mapping (the kernel copies from its page cache, and no page of
        the mapping is faulted in), and the checksum needs no second pass.

        Raises:
          CheckpointError: if its bytes do not match the checksum ``save`` recorded.
        """
        offset, descr, shape = self.layout[key]
        dtype = np.lib.format.descr_to_dtype(descr)
        assert destination.dtype == dtype and destination.shape == tuple(shape)
        data = destination.reshape(-1).view(np.uint8)  # (a view: it is C-contiguous)
        summing = _checks.Checksum(self.version) if self.checksums is not None else None
        bytes_ = memoryview(data)
        for start in range(0, data.shape[0], _checks.CHECKSUM_PIECE):
            piece = bytes_[start:start + _checks.CHECKSUM_PIECE]
            if os.preadv(self.file.fd, [piece], offset + start) != len(piece):
                raise errors.CheckpointError(
                    f"Checkpoint {self.path}: table '{self.name}' array '{key}' ends early: "
                    "the file was truncated after it was loaded.")
            if summing is not None:
                summing.add(data[start:start + len(piece)])
        if summing is not None:
            self._check(key, summing.value())

    @contextlib.contextmanager
    def checking(self):
        """Checks the checksums of the arrays the ``with`` block reads with ``array``
        in another thread while the block copies them, and waits for the verdict at its
        end, when every array it did not read is checked too. Whatever the block made
        of the values must stay invisible to others until the block has ended.

        Raises:
          CheckpointError: naming the first damaged array (in the file's order), also
            when the block raised (damage explains a failure better than its symptom).
        """
        if self.checksums is None:
            yield
            return
        with _checksummer(self.version) as self._checker:
            self._checks = {}
            try:
                yield
            except Exception:
                self._check_all()
                raise
            except BaseException:  # Ctrl-C: do not wait for the checksums
                for value in self._checks.values():
                    value.cancel()
                raise
            else:
                self._check_all()
            finally:
                self._checks = self._checker = None

    def _check_all(self):
        """Waits for the second thread's checksums, then checks the rest."""
        for key in sorted(self.layout, key=lambda k: self.layout[k][0]):
            if key in self._checks:
                self._check(key, self._checks[key].result())
        self._checks = None  # (``array`` checks the rest in this thread)
        for key in set(self.layout) - self.verified:
            self.array(key)

    def _check(self, key: str, value: int):
        """Records array ``key`` as verified if ``value`` (its bytes' checksum) is the
        one saved.

        Raises:
          CheckpointError: naming the array, if it is not.
        """
        if value != self.checksums[key]:
            kind = CHECKSUMS[self.version][0]
            raise errors.CheckpointError(
                f"Checkpoint {self.path}: table '{self.name}' array '{key}' is damaged: its "
                f"{kind} is {value:#x}, the file recorded {self.checksums[key]:#x}. "
                "Restore another checkpoint (an older one, or a copy of this file).")
        self.verified.add(key)


class _OpenFile:
    """A checkpoint file's descriptor, closed when no table uses it any more."""

    def __init__(self, fd: int):
        self.fd = fd

    def __del__(self):
        os.close(self.fd)


@dataclasses.dataclass
class Checkpoint:
    """A checkpoint file's manifest (see ``load``)."""

    path: str
    created_ns: int
    buffer: str
    tables: List[TableCheckpoint]

    def table(self, name: str) -> Optional[TableCheckpoint]:
        return next((t for t in self.tables if t.name == name), None)


# Files written before the private modules moved into folders name the storage
# description by its old module; the class is the same.
_MOVED_MODULES = {"shmreplay._storage": "shmreplay._schema.storage"}


class _ManifestUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        return super().find_class(_MOVED_MODULES.get(module, module), name)


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
                    f"{path} is not a shmreplay checkpoint (the magic in its header is "
                    f"{bytes(header['magic'])!r}, not {MAGIC!r}).")
            version = int(header["version"])
            if version not in READABLE_VERSIONS:
                raise errors.CheckpointError(
                    f"Checkpoint {path} has format version {version} in its header; this "
                    f"shmreplay reads versions {', '.join(map(str, READABLE_VERSIONS))} "
                    "(a newer shmreplay wrote it, or its header is damaged).")
            if version >= CHECKSUMMED_FROM and (
                    zlib.crc32(raw[:_HEADER_CRC_COVERS]) != int(header["header_crc"])
                    or any(raw[FILE_HEADER.itemsize:])):
                raise errors.CheckpointError(
                    f"Checkpoint {path}: its header is damaged (crc32). Restore another "
                    "checkpoint (an older one, or a copy of this file).")
            offset, length = int(header["manifest_offset"]), int(header["manifest_len"])
            ends = offset + length == size if version >= CHECKSUMMED_FROM else True
            if int(header["file_len"]) != size or not ends or not (
                    FILE_HEADER_SIZE <= offset and 0 < length and offset + length <= size):
                raise errors.CheckpointError(
                    f"Checkpoint {path} is truncated or corrupt: {size} bytes, its header "
                    f"records {int(header['file_len'])} (manifest at {offset}+{length}).")
            file.seek(offset)
            manifest_bytes = file.read(length)
            mapped = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
            descriptor = _OpenFile(os.dup(file.fileno()))
    except FileNotFoundError as exc:
        raise errors.CheckpointError(f"No checkpoint at {path}.") from exc
    except IsADirectoryError as exc:
        raise errors.CheckpointError(f"{path} is a directory, not a checkpoint file.") from exc
    if zlib.crc32(manifest_bytes) != int(header["manifest_crc"]):
        raise errors.CheckpointError(f"Checkpoint {path}: its manifest is corrupt (crc32).")
    checksummed = version >= CHECKSUMMED_FROM
    try:
        manifest = _ManifestUnpickler(io.BytesIO(manifest_bytes)).load()
        tables = [TableCheckpoint(t["name"], t["config"], t["storage"], int(t["capacity"]),
                                  int(t["slot_bits"]), dict(t["counters"]), int(t["num_items"]),
                                  path, dict(t["arrays"]), mapped,
                                  dict(t[CHECKSUMS[version][0]]) if checksummed else None,
                                  version, descriptor)
                  for t in manifest["tables"]]
        written_as = manifest["format"]
    except Exception as exc:
        raise errors.CheckpointError(f"Checkpoint {path}: its manifest cannot be read.") from exc
    if written_as != version:  # the manifest's crc held, so the header is wrong
        raise errors.CheckpointError(
            f"Checkpoint {path}: its header says format {version}, its manifest format "
            f"{written_as!r}: the header is damaged.")
    for table in tables:
        _checks.check_table(path, size, table, version)
    if checksummed:
        _checks.check_padding(path, mapped, tables, offset)
    return Checkpoint(path, int(manifest["created_ns"]), str(manifest["buffer"]), tables)

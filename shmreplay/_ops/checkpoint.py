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

This module writes them; ``checkpoint_read`` loads them, and ``checkpoint_checks``
holds the format's constants, its checksums and the checks of a loaded manifest.
Since format 3 every byte of the file is checked: the header, the manifest and the
padding on ``load``; each array's checksum when it is read (``TableCheckpoint.array``
and ``read_into``, or in a second thread while a table is restored: ``checking``).
Damage anywhere raises ``CheckpointError`` naming the part.

Tables are snapshotted one at a time (``shmreplay._engine.snapshot``); the disk is written
after each table's lock is released. Restoring is ``shmreplay._ops.restore``. The manifest
is unpickled on load: a checkpoint file is trusted input, like any pickle (see
``docs/security.md``).
"""

import dataclasses
import os
import re
import sys
import time
import uuid
import zlib
from typing import Callable, Dict, Union

import cloudpickle
import numpy as np

from shmreplay._engine.snapshot import ITEM_FIELDS, TableSnapshot, snapshot_table
from shmreplay._ops import checkpoint_read
from shmreplay._ops.checkpoint_checks import (
    CHECKPOINTS_HEADER_COVERS as _HEADER_CRC_COVERS, CHECKSUMS, FILE_HEADER, FILE_HEADER_SIZE,
    FORMAT_VERSION, MAGIC, checksum_of, checksummer)
from shmreplay._shm import layout as L

# Reading is ``checkpoint_read``'s; its names stay reachable here, with the format's.
Checkpoint, TableCheckpoint = checkpoint_read.Checkpoint, checkpoint_read.TableCheckpoint
load = checkpoint_read.load
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
        with os.fdopen(fd, "wb") as file, checksummer(FORMAT_VERSION) as summing:
            file.write(bytes(FILE_HEADER_SIZE))
            for engine, estimate in zip(engines, estimates):
                snapshot = snapshot_table(engine)
                actual = sum(a.nbytes for a in snapshot.arrays.values())
                reporter.total += actual - estimate
                entry = _manifest_entry(snapshot)
                # The checksums run in another thread while this one writes (both
                # without the GIL): they cost little of the save's time.
                sums = {key: summing.submit(checksum_of, array, FORMAT_VERSION)
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


def save_for_client(buffer, buffer_name: str, path, progress: Progress) -> str:
    """``Client.checkpoint``: resolves ``path`` as its docstring says (None: the
    Server's checkpointer directory, keeping only the newest checkpoint there, or a
    private temporary directory; a directory or ``dir/``: a new timestamped file in
    it), saves, and returns the checkpoint's absolute path."""
    from shmreplay import checkpointers
    keep_latest_only = path is None  # a checkpointer's directory; not the user's own
    if path is None:
        root = buffer.checkpoint_root
        if root is None:
            root = checkpointers.private_temporary_directory(buffer_name)
        os.makedirs(root, exist_ok=True)
        path = root
    if os.path.isdir(path) or path.endswith(os.sep):  # "dir/": a directory, made if new
        os.makedirs(path, exist_ok=True)
        checkpointer = checkpointers.DefaultCheckpointer(path)
        path = checkpointer.new_checkpoint_path()
    else:
        checkpointer = None
    summary = save(buffer.engines, path, buffer_name, progress)
    if keep_latest_only:
        checkpointer.remove_older_than(summary.path)
    return summary.path


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



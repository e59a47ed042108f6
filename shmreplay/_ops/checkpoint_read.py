"""Reading a checkpoint file (``shmreplay._ops.checkpoint`` describes the format and
writes it): ``load`` checks its header and manifest, and each table's arrays are read
on demand, every one checked against its checksum before a restored table is served.
"""

import contextlib
import dataclasses
import io
import mmap
import os
import pickle
import zlib
from typing import Dict, List, Optional

import numpy as np

from shmreplay import errors
from shmreplay._ops import checkpoint_checks as _checks
from shmreplay._ops.checkpoint_checks import (
    CHECKPOINTS_HEADER_COVERS as _HEADER_CRC_COVERS, CHECKSUMMED_FROM, CHECKSUMS, FILE_HEADER,
    FILE_HEADER_SIZE, FORMAT_VERSION, MAGIC, READABLE_VERSIONS, checksum_of, checksummer)

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
        with checksummer(self.version) as self._checker:
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

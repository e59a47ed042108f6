"""A checkpoint file's format: its constants, the checksums of its arrays, and the checks
of its manifest and layout against what ``save`` writes.

``shmreplay._ops.checkpoint.load`` runs them once the manifest's crc32 held; the arrays'
own bytes are checked by their checksums and by ``shmreplay._ops.restore``.
"""

import concurrent.futures
import zlib

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors
from shmreplay._engine.snapshot import COUNTERS, ITEM_FIELDS

MAGIC = b"SHMRCKPT"
# 2: each item's episode (format 1 files restore, each item its own).
# 3: a crc32 of the header and of every array (format 1 and 2 files restore, their
#    arrays unchecksummed: their values are still checked, see ``_ops.restore``).
# 4: the arrays' checksums are ``checksum64`` (crc32 cost a fifth of a restore).
# 5: the counter ``C_EPISODE_REPEATS`` (``TableInfo.num_deleted_episodes``; older files
#    restore with none deleted).
FORMAT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
CHECKSUMMED_FROM = 3
FILE_HEADER = np.dtype([
    ("magic", "S8"),
    ("version", "<u4"),
    ("manifest_crc", "<u4"),
    ("manifest_offset", "<i8"),
    ("manifest_len", "<i8"),
    ("file_len", "<i8"),
    ("header_crc", "<u4"),  # of the bytes before it (format 3 on)
])
CHECKPOINTS_HEADER_COVERS = FILE_HEADER.fields["header_crc"][1]
FILE_HEADER_SIZE = 64  # (``_checkpoint.FILE_HEADER_SIZE``: the arrays start after it)
# Per format: the manifest's key for the arrays' checksums, and the bound of a value.
CHECKSUMS = {3: ("crc32", 1 << 32), 4: ("checksum64", 1 << 63), 5: ("checksum64", 1 << 63)}
# Counters a file of an older format may lack (``restore`` derives them).
COUNTERS_SINCE = {"C_EPISODE_REPEATS": 5}
# ``checksum64`` sums an array in pieces of this many bytes (a quarter of this machine's
# L2 cache: a piece just read is summed before it leaves the cache). Part of format 4.
CHECKSUM_PIECE = 256 << 10
_START = 0x243F6A8885A308D3  # the running sum of no bytes


class Checksum:
    """The running checksum of an array that format ``version`` records: ``add`` its
    bytes in order (whole ``CHECKSUM_PIECE``s but for the last call), then ``value``."""

    def __init__(self, version: int):
        self.version = version
        self.size = 0
        if version == 3:
            self.state = 0
        else:
            from shmreplay._shm.kernels import checksum
            self._kernels = checksum
            self.state = np.array([_START], np.uint64)

    def add(self, data: np.ndarray):
        """Adds ``data``'s bytes (a contiguous uint8 array; both kinds run without
        the GIL)."""
        if self.version == 3:
            self.state = zlib.crc32(data, self.state)
            self.size += data.shape[0]
            return
        if data.flags.writeable:  # one compiled version: numba types read-only arrays
            data = data.view()    # (a file's mapping) apart from writable ones
            data.flags.writeable = False
        self._kernels.add_pieces(data, CHECKSUM_PIECE, self.state)
        self.size += data.shape[0]

    def value(self) -> int:
        if self.version == 3:
            return self.state
        return int(self._kernels.finish(self.state, self.size))


def checksum_of(array: np.ndarray, version: int) -> int:
    """The checksum that format ``version`` records for ``array``'s bytes in C order."""
    summing = Checksum(version)
    summing.add(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return summing.value()


def check_table(path: str, size: int, table, version: int):
    """Checks one table's manifest entry: its storage and every array's place, dtype and
    shape against its item count (the arrays' values are checked by ``restore_table``).

    Raises:
      CheckpointError: if anything does not match what ``save`` writes.
    """
    from shmreplay._schema import storage as _storage
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
    required = {name for name in COUNTERS if COUNTERS_SINCE.get(name, 0) <= version}
    if not required <= set(table.counters) <= set(COUNTERS) or not all(
            type(v) is int and v >= 0 for v in table.counters.values()):
        raise corrupt("has invalid counters")
    n = table.num_items
    expected = {name: (np.dtype(np.int64), (n,)) for name in ITEM_FIELDS}
    expected["priority"] = (np.dtype(np.float64), (n,))
    if version >= 2:
        expected["episode"] = (np.dtype(np.int64), (n,))
    stored = None
    storage = table.storage
    if storage is not None:
        try:
            store_specs = [(np.dtype(spec.dtype), tuple(int(d) for d in spec.shape))
                           for spec in storage.store_specs]
        except Exception as exc:
            raise corrupt("has an invalid storage description") from exc
        if storage.steps and getattr(storage, "variable", False):
            # Items of any length: their column lengths, then all their references.
            expected["lengths"] = (np.dtype(np.int32), (n, len(storage.columns)))
            try:
                total = table.layout["refs"][2][0]
            except Exception:
                total = None
            if type(total) is not int or total < 0:
                raise corrupt("has no valid references")
            expected["refs"] = (np.dtype(np.int32), (total,))
        elif storage.steps:
            expected["refs"] = (np.dtype(np.int32), (n, storage.width))
        if storage.steps:
            try:  # the steps stored: every store holds as many
                stored = table.layout["store0"][2][0]
            except Exception:
                stored = None
            if type(stored) is not int or stored < 0 or not store_specs:
                raise corrupt("has no valid step stores")
        for index, (dtype, shape) in enumerate(store_specs):
            expected[f"store{index}"] = (dtype, ((stored,) if storage.steps else (n,)) + shape)
    if storage is not None and "forms" in table.layout:  # items' forms (_item_forms)
        expected["forms"] = (np.dtype(np.int64), (n,))
    if storage is not None and "arena_lengths" in table.layout:  # items of another shape
        expected["arena_lengths"] = (np.dtype(np.int64), (n,))
        try:
            encoded = table.layout["arena_data"][2][0]
        except Exception:
            encoded = None
        if type(encoded) is not int or encoded < 0:
            raise corrupt("has no valid arena data")
        expected["arena_data"] = (np.dtype(np.uint8), (encoded,))
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
    checksum_limit = CHECKSUMS.get(version, (None, 0))[1]
    if table.checksums is not None and (set(table.checksums) != set(table.layout) or not all(
            type(value) is int and 0 <= value < checksum_limit
            for value in table.checksums.values())):
        raise corrupt("has no valid checksum for each of its arrays")


def check_padding(path: str, mapped, tables: list, manifest_offset: int):
    """Checks that the arrays tile the file from the header to the manifest, with only
    zero bytes (fewer than an alignment's worth) between them: every byte there is
    then either checksummed or known.

    Raises:
      CheckpointError: naming the array the damaged padding precedes.
    """
    places = []
    for table in tables:
        for key, (offset, descr, shape) in table.layout.items():
            nbytes = np.lib.format.descr_to_dtype(descr).itemsize * int(np.prod(shape))
            places.append((offset, nbytes, f"table '{table.name}' array '{key}'"))
    places.sort()
    covered = FILE_HEADER_SIZE
    for offset, nbytes, name in places + [(manifest_offset, 0, "the manifest")]:
        gap = offset - covered
        if not 0 <= gap < L.ALIGN:
            raise errors.CheckpointError(
                f"Checkpoint {path}: its arrays do not follow each other as written "
                f"({gap} bytes before {name}): the manifest or the file is damaged.")
        if any(mapped[covered:offset]):
            raise errors.CheckpointError(
                f"Checkpoint {path}: its padding at bytes {covered}..{offset - 1} (before "
                f"{name}) is not zero: the file is damaged. Restore another checkpoint.")
        covered = offset + nbytes


def checksummer(version: int):
    """The one thread that computes checksums of format ``version`` while the caller
    writes or copies. Their kernels are loaded (or compiled) first, in the caller's
    thread: the thread would wait for the machine's compile lock, which the caller may
    hold (the warm-up does) while it waits for the thread."""
    checksum_of(np.empty(0, np.uint8), version)
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shmreplay-checksum")

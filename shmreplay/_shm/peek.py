"""What a buffer's header and control blocks say, read without attaching to it.

For the operator's commands that only look (``shmreplay ls``, ``gc``, ``rm``) and for
error messages about a name that is taken. Nothing here maps a table, unpickles a
configuration or loads a kernel, so these commands start fast, and a segment someone
else wrote can mislead them at worst, never run code here.

The rules, as for ``shmreplay._engine.buffer.attach``:

* A segment is opened ``O_NOFOLLOW | O_NONBLOCK`` and read only if it is a regular
  file under ``/dev/shm`` that no other user may write (mode at most ``0o660``): a
  symlink, FIFO or device there is never followed, never waited on, never read.
* Bytes are read with ``os.pread``, so a segment truncated meanwhile gives a short read
  (reported as unreadable), never a SIGBUS.
* The magic and layout version are checked before any other field is believed; each
  table's control block is located with ``shmreplay._shm.layout``'s plan from the settings
  the block itself holds, and believed only if that plan agrees with the header and
  with the block's own capacity and tree words, and fits in the segment.
* Death is a fact or nothing: an owner is *dead* only if its recorded pid (with its
  recorded start time, against pid reuse) is not running. A header that records no
  pid (a buffer being created) cannot be judged, and neither can a segment that is
  not a readable buffer of this layout version: ``alive`` is None for those. Nor can an
  owner in another pid namespace (a container sharing ``/dev/shm`` but not pids), whose
  pid means nothing here (``shmreplay._shm.procs``): ``alive`` is None, ``other_ns`` True.
"""

import dataclasses
import os
import stat
import types
from typing import Dict, List, Optional

import numpy as np

from shmreplay._shm import layout as L
from shmreplay._shm.kernels import codes
from shmreplay._shm import procs as _procs

SHM_DIR = "/dev/shm"
_OPEN_FLAGS = (os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
               | getattr(os, "O_CLOEXEC", 0))
_MAX_TABLES = 1 << 16
_SELECTOR_KINDS = frozenset((codes.UNIFORM, codes.PRIORITIZED, codes.FIFO, codes.LIFO,
                             codes.MIN_HEAP, codes.MAX_HEAP))
_STATES = {L.STATE_CREATING: "creating", L.STATE_ACTIVE: "active",
           L.STATE_STOPPED: "stopped"}


@dataclasses.dataclass(frozen=True)
class Peek:
    """What one buffer's header segment says.

    Attributes:
      name: The buffer's name.
      exists: Its header segment is in /dev/shm.
      problem: Why it is not a readable buffer of this layout version, or why its
        owner cannot be judged (None if neither).
      pid: The owner's pid (None when unknown).
      alive: Whether the owner runs; None when that cannot be judged (then ``problem``
        says why).
      state: ``"creating"``, ``"active"`` or ``"stopped"`` (None when unknown).
      tables: The number of tables (None when not readable).
      items: The items in all tables now (None when not readable).
      uid: The uid owning the segment (None when it does not exist).
      inode: The header segment's inode (None when it does not exist): ``gc`` and
        ``rm`` remove nothing if the name has been given to a new buffer meanwhile.
      other_ns: The owner runs in another pid namespace (or one that cannot be known),
        so whether it lives cannot be judged from here.
    """

    name: str
    exists: bool = False
    problem: Optional[str] = None
    pid: Optional[int] = None
    alive: Optional[bool] = None
    state: Optional[str] = None
    tables: Optional[int] = None
    items: Optional[int] = None
    uid: Optional[int] = None
    inode: Optional[int] = None
    other_ns: bool = False

    @property
    def status(self) -> str:
        """One word for ``ls``: dead, alive, creating, stopped, other-ns, or ``?``."""
        if self.other_ns:
            return "other-ns"
        if self.alive is None:
            return "?"
        if not self.alive:
            return "dead"
        return "alive" if self.state == "active" else self.state


OTHER_NS = ("its owner runs in another pid namespace (another container?), where its "
            "pid cannot be checked from here; run this in the owner's pid namespace")


def header_path(name: str) -> str:
    return os.path.join(SHM_DIR, L.SEGMENT_PREFIX + name)


def peek(name: str, tables: bool = True) -> Peek:
    """Reads buffer ``name``'s header (and, with ``tables``, its control blocks)."""
    if "/" in name or "\0" in name or not name:
        return Peek(name, problem="it is not a name of a segment in /dev/shm")
    try:
        fd = os.open(header_path(name), _OPEN_FLAGS)
    except FileNotFoundError:
        if segments_of(name):
            return Peek(name, problem="its header segment is gone; only data segments are "
                                      f"left (`shmreplay rm {name}` removes them)")
        return Peek(name, problem="it does not exist")
    except OSError as exc:  # a symlink (ELOOP), another user's private segment, ...
        return Peek(name, exists=True, problem=f"it cannot be opened ({exc.strerror})")
    try:
        return _read(name, fd, tables)
    finally:
        os.close(fd)


def _read(name: str, fd: int, with_tables: bool) -> Peek:
    info = os.fstat(fd)
    found = dict(name=name, exists=True, uid=info.st_uid, inode=info.st_ino)
    if not stat.S_ISREG(info.st_mode):
        return Peek(**found, problem="it is not a regular file")
    if stat.S_IMODE(info.st_mode) & ~0o660:
        return Peek(**found, problem=f"its mode {stat.S_IMODE(info.st_mode):04o} lets "
                                     "other users write it")
    raw = os.pread(fd, L.HEADER_SIZE, 0)
    if len(raw) < L.HEADER_SIZE:
        return Peek(**found, problem=f"it has {len(raw)} bytes, less than a header")
    header = np.frombuffer(raw, L.HEADER, 1)[0]
    if header["magic"] == L.DATA_MAGIC:
        return Peek(**found, problem="it is a table's data segment, and its buffer's header "
                                     "segment is gone")
    if header["magic"] != L.MAGIC:
        # A Server writes the magic first: zeros are a buffer being created (or not ours).
        return Peek(**found, problem="it has no shmreplay header (a buffer being created, "
                                     "or not a shmreplay buffer)")
    version = int(header["layout_version"])
    if version != L.LAYOUT_VERSION:
        return Peek(**found, problem=f"it has layout version {version}; this shmreplay "
                                     f"reads version {L.LAYOUT_VERSION}")
    pid, start = int(header["owner_pid"]), int(header["owner_start"])
    if pid <= 0:
        return Peek(**found, problem="its header names no owner yet (being created)")
    namespace = int(header["owner_ns"])
    alive = _procs.judge(pid, namespace, start)
    if alive is None:
        found.update(other_ns=True, problem=OTHER_NS)
    state = _STATES.get(int(header["state"]), "?")
    counts = _table_counts(fd, header, info.st_size) if with_tables else None
    tables, items = counts if counts is not None else (None, None)
    return Peek(**found, pid=pid, alive=alive, state=state, tables=tables, items=items)


def _table_counts(fd: int, header, size: int):
    """``(tables, items)`` from the control blocks, or None if anything disagrees."""
    located = ctrl_offsets(fd, header, size)
    if located is None:
        return None
    return len(located), sum(int(ctrl[L.C_SIZE]) for _, ctrl in located)


def ctrl_offsets(fd: int, header, size: int):
    """``[(offset, ctrl words)]`` of each table's control block in the header segment
    open as ``fd`` (of ``size`` bytes, ``header`` its parsed header), or None if
    anything disagrees: each block is located with ``_layout``'s plan from the settings
    the block itself holds, and believed only if that plan agrees with the header and
    with the block's own capacity and tree words, and fits in the segment."""
    total, count = int(header["total_bytes"]), int(header["num_tables"])
    config_len = int(header["config_len"])
    if (total != size or not 1 <= count <= _MAX_TABLES or config_len <= 0
            or int(header["config_offset"]) != L.HEADER_SIZE):
        return None
    offset, stand_ins, located = int(header["tables_offset"]), [], []
    for _ in range(count):
        where = L.plan_table(offset, _stand_in(1, codes.UNIFORM, codes.UNIFORM)).ctrl
        ctrl = _ctrl(fd, where)
        if ctrl is None:
            return None
        max_size = int(ctrl[L.C_MAX_SIZE])
        kinds = int(ctrl[L.C_SAMPLER_KIND]), int(ctrl[L.C_REMOVER_KIND])
        if not 1 <= max_size < 1 << 40 or not set(kinds) <= _SELECTOR_KINDS:
            return None
        stand_ins.append(_stand_in(max_size, *kinds))
        region = L.plan_table(offset, stand_ins[-1])
        size_now = int(ctrl[L.C_SIZE])
        if (region.end > total or int(ctrl[L.C_CAPACITY]) != region.capacity
                or int(ctrl[L.C_TREE_LEAVES]) != region.tree_leaves
                or not 0 <= size_now <= region.capacity):
            return None
        located.append((where, ctrl))
        offset = region.end
    plan = L.plan_buffer(stand_ins, config_len)
    if plan.total_bytes != total or plan.tables[0].offset != int(header["tables_offset"]):
        return None
    return located


def _stand_in(max_size: int, sampler: int, remover: int):
    """What ``_layout.plan_table`` reads of a Table, from a control block's words."""
    return types.SimpleNamespace(max_size=max_size,
                                 sampler=types.SimpleNamespace(kind=sampler),
                                 remover=types.SimpleNamespace(kind=remover))


def _ctrl(fd: int, offset: int):
    raw = os.pread(fd, L.CTRL_WORDS * 8, offset)
    if len(raw) < L.CTRL_WORDS * 8:
        return None
    return np.frombuffer(raw, np.int64)


def segments() -> Dict[str, List[str]]:
    """``{buffer name: [its /dev/shm entries]}``, header segment first.

    Names are parsed by ``shmreplay._shm.layout.parse_segment`` (a buffer name never
    contains the ``:`` that starts a data segment's own part, so each entry names
    exactly one buffer). A data segment is listed with its buffer when that buffer's
    header segment is there and the entry is a regular file owned as the header is
    (``_belongs``). Anything else, a data segment left without its header, a FIFO,
    directory or symlink, another user's file, is listed under its own name, as a
    buffer of its own: ``peek`` then says what it is, ``gc`` leaves it alone, and it is
    never removed with a buffer it does not belong to.
    """
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return {}
    parsed = {entry: L.parse_segment(entry) for entry in entries}
    headers = {found[0] for found in parsed.values()
               if found is not None and found[1] is None}
    result: Dict[str, List[str]] = {name: [L.SEGMENT_PREFIX + name] for name in headers}
    for entry, found in sorted(parsed.items()):
        if found is None or found[1] is None:
            continue
        if found[0] in headers and _belongs(entry, L.SEGMENT_PREFIX + found[0]):
            result[found[0]].append(entry)
        else:
            result[entry[len(L.SEGMENT_PREFIX):]] = [entry]
    return dict(sorted(result.items()))


def _belongs(entry: str, header_entry: str) -> bool:
    """Whether /dev/shm ``entry`` may be a data segment of the buffer whose header
    segment is ``header_entry``: a regular file (not followed if a symlink) that no
    other user may write, of the header's owner, or of its group if the header is
    shared with the group."""
    try:
        info = os.lstat(os.path.join(SHM_DIR, entry))
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o006:
        return False
    try:
        header = os.lstat(os.path.join(SHM_DIR, header_entry))
    except OSError:  # a leftover whose header is gone: ours, or a group member's of a
        # group-shared buffer (its header's group cannot be checked any more)
        return info.st_uid == os.getuid() or bool(info.st_mode & 0o060)
    return info.st_uid == header.st_uid or (
        bool(header.st_mode & 0o060) and info.st_gid == header.st_gid)


def segments_of(name: str) -> List[str]:
    """The /dev/shm entries of buffer ``name``: its header segment (first, if present,
    whatever it is) and the data segments that belong to it (see ``segments``)."""
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    header = L.SEGMENT_PREFIX + name
    data = L.data_segment_prefix(name)
    return sorted((e for e in entries if e == header or (
        e.startswith(data) and L.parse_segment(e) is not None and _belongs(e, header))),
        key=lambda e: (e != header, e))


def memory(entries: List[str]) -> int:
    """Bytes of memory the segments occupy now (tmpfs allocates pages on first write;
    a segment's reserved size costs nothing until written). Symlinks are not followed."""
    total = 0
    for entry in entries:
        try:
            info = os.lstat(os.path.join(SHM_DIR, entry))
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            total += info.st_blocks * 512
    return total


def format_bytes(count: int) -> str:
    """``ls`` and ``top`` print memory alike: ``36 KiB``, ``12.5 MiB``, ``1.20 GiB``."""
    if count >= 2**30:
        return f"{count / 2**30:.2f} GiB"
    if count >= 2**20:
        return f"{count / 2**20:.1f} MiB"
    return f"{count / 2**10:.0f} KiB"

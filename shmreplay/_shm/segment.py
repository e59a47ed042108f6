"""POSIX shared-memory segments: create, attach, close (this handle), unlink (the name).

``close`` and ``unlink`` are separate, as in ``multiprocessing.shared_memory``: every
process closes its own mapping; only the owner unlinks, once. Segments are created
with mode 0600 (owner only) unless the Server is told to share with its group (0660).

Attaching checks who may have written a segment before reading a byte of it
(``check_access``): segments hold pickled configuration, and unpickling is code
execution. By default only our own user's segments are accepted. Another user's are
accepted only when the caller trusts the group (``Access.trust_group``), the segment
carries the buffer's group, the caller belongs to it, and the segment's mode shares it
with exactly that group. A segment writable by every user is never accepted.
"""

import dataclasses
import errno
import mmap
import os
import stat as _stat
import threading
import warnings
from typing import Callable, Optional, Sequence, Set, Tuple

import posix_ipc

from shmreplay import errors
from shmreplay._shm import layout as _layout

Ranges = Sequence[Tuple[int, int]]  # ``(start, length)`` byte ranges of a segment

PRIVATE_MODE = 0o600
GROUP_MODE = 0o660


@dataclasses.dataclass(frozen=True)
class Access:
    """How one process creates, and what it accepts when attaching, one buffer's segments.

    Attributes:
      mode: The permission bits of the segments this process creates, and the widest
        bits it accepts on the segments it attaches (``PRIVATE_MODE`` or ``GROUP_MODE``).
      group: The gid every segment of a group-shared buffer carries (its header
        segment's); ``None`` for a private buffer.
      trust_group: Accept segments that another user owns, provided they carry
        ``group`` (when given), the caller is a member of their group, and their mode
        shares them with that group.
    """

    mode: int = PRIVATE_MODE
    group: Optional[int] = None
    trust_group: bool = False


PRIVATE = Access()


class Segment:
    """One mapped shared-memory segment.

    Attributes:
      name: The POSIX name (``/shmreplay....``).
      buf: A writable ``mmap`` of the whole segment.
      size: Its size in bytes.
      uid: The uid that owns the segment.
      gid: The gid the segment belongs to.
      mode: Its permission bits (``0o600``, ``0o660``, ...).
      inode: Its inode: whether its name still leads to it (``shmreplay rm`` may have
        given the name to another buffer).
    """

    name = None
    inode = None
    buf = None
    size = 0
    uid = None
    gid = None
    mode = None

    reservation = None  # a ``Reservation`` still running (``create(..., later=...)``)

    @classmethod
    def create(cls, name: str, size: int, mode: int = PRIVATE_MODE,
               group: Optional[int] = None, what: str = "segment",
               now: Optional[Ranges] = None, later: Ranges = ()) -> "Segment":
        """Creates and maps a new zero-filled segment with its memory reserved; fails
        if the name exists.

        The memory is allocated now (``posix_fallocate``): tmpfs otherwise allocates a
        page when it is first written, and a write that finds /dev/shm full kills its
        process with SIGBUS. A segment whose reservation is larger than the free space
        is refused before anything is created.

        Args:
          name: The POSIX name.
          size: Its size in bytes.
          mode: Its permission bits, set exactly (the process umask does not apply).
          group: The gid to give it; ``None`` keeps the creating process's.
          what: What the segment is, for error messages (``"buffer 'x'"``).
          now: The ``(start, length)`` byte ranges to reserve before this returns
            (None: the whole segment). Bytes of no range are reserved later, with
            ``reserve``, before anything writes them (a data segment's stores grow
            so as the table fills).
          later: ``(start, length)`` ranges reserved by a second thread meanwhile, not
            before this returns (a restore fills them). The caller writes there only
            through the kernel (``preadv``, which fails with EFAULT where a write would
            raise SIGBUS) or after ``wait_reserved``, and calls it before any other
            process may see the segment.

        Raises:
          FileExistsError: if a segment of ours has this name.
          SegmentSquattedError: if something not ours has it (another user's file, not
            a regular file, or a mode shmreplay never gives).
          SharedMemoryFullError: if /dev/shm has less free space than the reservation.
          PermissionError: if ``group`` is not one of the caller's groups.
        """
        self = cls()
        self.name = name
        now = [(0, size)] if now is None else list(now)
        check_free_space(sum(length for _, length in (*now, *later)), name, what)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=mode, size=size)
        except posix_ipc.ExistentialError as exc:
            _raise_if_squatted(name, what)
            raise FileExistsError(f"shared-memory segment {name} already exists") from exc
        try:
            os.fchmod(shm.fd, mode)  # the process umask must not widen or narrow it
            if group is not None and os.fstat(shm.fd).st_gid != group:
                os.fchown(shm.fd, -1, group)
            for start, length in now:
                _reserve(shm.fd, start, length, name, what)
            if later:
                self.reservation = Reservation(shm.fd, later, name, what)
            stat = os.fstat(shm.fd)
            self.uid, self.gid, self.mode = stat.st_uid, stat.st_gid, stat.st_mode & 0o777
            self.inode = stat.st_ino
            self.buf = mmap.mmap(shm.fd, size)
            self.size = size
        except BaseException:
            posix_ipc.unlink_shared_memory(name)
            raise
        finally:
            shm.close_fd()
        return self

    @classmethod
    def attach(cls, name: str, what: str, access: Access = PRIVATE) -> "Segment":
        """Maps an existing segment after checking who may have written it.

        Args:
          name: The POSIX name.
          what: What the segment is, for error messages (``"buffer 'x'"``).
          access: Which owners and modes to accept (see ``check_access``).

        It is opened ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file before
        anything else is looked at: a symlink is never followed, a FIFO never waited on.

        Raises:
          BufferNotFoundError: no segment has this name.
          LayoutMismatchError: the name is not a regular file (a symlink, FIFO,
            directory, ...), the segment is not accessible, ``check_access`` refuses it,
            or it is empty.
        """
        self = cls()
        self.name = name
        fd = _open_existing(name, what)
        try:
            stat = os.fstat(fd)
            if not _stat.S_ISREG(stat.st_mode):
                raise errors.LayoutMismatchError(
                    f"{SHM_DIR}{name} ({what}) is not a shared-memory segment but "
                    f"{_kind(stat.st_mode)}: not a shmreplay buffer. Its owner (uid "
                    f"{stat.st_uid}) can remove it if nothing uses it.")
            check_access(name, what, stat, access)
            self.uid, self.gid, self.mode = stat.st_uid, stat.st_gid, stat.st_mode & 0o777
            self.inode = stat.st_ino
            if stat.st_size == 0:
                raise errors.LayoutMismatchError(f"Segment {name!r} is empty: not a shmreplay {what}.")
            self.size = stat.st_size
            self.buf = mmap.mmap(fd, stat.st_size)
        finally:
            os.close(fd)
        return self

    def wait_reserved(self):
        """Waits until every page of the segment is reserved (see ``create``).

        Raises:
          SharedMemoryFullError: if /dev/shm filled up meanwhile.
        """
        reservation, self.reservation = self.reservation, None
        if reservation is not None:
            reservation.wait()

    def reserve(self, ranges: Ranges, full: Callable[[int], Exception]):
        """Reserves more of the segment (``posix_fallocate`` of each range; idempotent,
        so processes racing to reserve the same range do no harm). Any process that
        mapped the segment may: it is opened again by name, and used only if the name
        still leads to the segment mapped here.

        Raises:
          whatever ``full(free bytes of /dev/shm)`` returns, if /dev/shm is full;
          BufferBrokenError: if the segment's name is gone (the buffer was stopped).
        """
        try:
            fd = _open_existing(self.name, "data segment")
        except errors.ShmReplayError as exc:
            raise _gone(self.name) from exc
        try:
            if os.fstat(fd).st_ino != self.inode:
                raise _gone(self.name)
            for start, length in ranges:
                try:
                    _reserve(fd, start, length, self.name, "")
                except errors.SharedMemoryFullError as exc:
                    raise full(free_bytes()) from exc
        finally:
            os.close(fd)

    def close(self):
        """Unmaps this process's view. Views into ``buf`` must have been dropped."""
        buf, self.buf = self.buf, None
        if buf is not None:
            try:
                buf.close()
            except BufferError:
                # numpy views still point into the mapping; the mapping goes when they do.
                pass

    def unlink(self):
        """Removes the name (the memory goes when the last process unmaps it)."""
        unlink(self.name)


SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory
# Never follow a symlink, never wait on a FIFO (or a device) that has no writer.
_ATTACH_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _open_existing(name: str, what: str) -> int:
    """Opens ``/dev/shm{name}`` read-write without following a symlink or blocking.

    Raises:
      BufferNotFoundError: nothing has this name.
      LayoutMismatchError: something has it that cannot be opened as a segment.
    """
    try:
        return os.open(SHM_DIR + name, _ATTACH_FLAGS)
    except FileNotFoundError as exc:
        raise errors.BufferNotFoundError(
            f"No shmreplay {what} exists under the name {name!r} on this machine.") from exc
    except PermissionError as exc:
        raise errors.LayoutMismatchError(
            f"Segment {name!r} is not accessible to this user ({what}).") from exc
    except OSError as exc:
        kind = {errno.ELOOP: "a symbolic link", errno.EISDIR: "a directory"}.get(
            exc.errno, f"something that cannot be opened ({exc.strerror})")
        raise errors.LayoutMismatchError(
            f"{SHM_DIR}{name} ({what}) is {kind}, not a shared-memory segment: not a "
            "shmreplay buffer, and never followed. Remove it if nothing uses it.") from exc


def _kind(mode: int) -> str:
    for test, kind in ((_stat.S_ISDIR, "a directory"), (_stat.S_ISFIFO, "a FIFO"),
                       (_stat.S_ISSOCK, "a socket"), (_stat.S_ISCHR, "a device"),
                       (_stat.S_ISBLK, "a device"), (_stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return kind
    return "not a regular file"


def caller_groups() -> Set[int]:
    """The gids this process belongs to: real, effective and supplementary."""
    return {os.getgid(), os.getegid(), *os.getgroups()}


def check_access(name: str, what: str, stat: os.stat_result, access: Access = PRIVATE):
    """Refuses a segment that someone this process does not trust may have written.

    The rules, in order:

    * Its mode must not be wider than ``access.mode`` (read and write bits): a segment
      any user (or, for a private buffer, any group member) can write is refused,
      whoever owns it.
    * A segment of our own uid is accepted.
    * Another uid's segment is accepted only if ``access.trust_group``, it carries
      ``access.group`` (when set), that group is one of the caller's, and the mode gives
      the group read and write access.

    Args:
      name: The segment's POSIX name (for messages).
      what: What the segment is (for messages).
      stat: ``os.fstat`` of the open segment.
      access: What to accept.

    Raises:
      LayoutMismatchError: if the segment is refused; the message says why.
    """
    mode = stat.st_mode & 0o777
    if mode & ~access.mode & 0o666:
        raise errors.LayoutMismatchError(
            f"Segment {name!r} ({what}) has mode {mode:04o}, wider than the {access.mode:04o} "
            "shmreplay gives it: someone it does not trust may have written it.")
    uid = os.getuid()
    if stat.st_uid == uid:
        return
    if not access.trust_group:
        raise errors.LayoutMismatchError(
            f"Segment {name!r} ({what}) belongs to uid {stat.st_uid}, not to this user "
            f"(uid {uid}). shmreplay attaches to another user's buffer only if its owner "
            "shared it with a group (Server(share_with_group=True)) and you trust that "
            "group's members (Client(name, trust_group=True)).")
    if access.group is not None and stat.st_gid != access.group:
        raise errors.LayoutMismatchError(
            f"Segment {name!r} ({what}) of uid {stat.st_uid} belongs to gid {stat.st_gid}, "
            f"not to the buffer's group (gid {access.group}).")
    if stat.st_gid not in caller_groups():
        raise errors.LayoutMismatchError(
            f"Segment {name!r} ({what}) of uid {stat.st_uid} is shared with gid "
            f"{stat.st_gid}, which is not one of this process's groups.")
    if mode & 0o060 != 0o060:
        raise errors.LayoutMismatchError(
            f"Segment {name!r} ({what}) belongs to uid {stat.st_uid} and is not shared with "
            f"its group (mode {mode:04o}).")


SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory


def free_bytes() -> Optional[int]:
    """Bytes that /dev/shm can still allocate (None if it cannot be told, or if it has
    no limit: a tmpfs mounted with ``size=0`` reports no blocks at all)."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize if stat.f_blocks else None


def _full(size: int, free: Optional[int], name: str, what: str) -> errors.SharedMemoryFullError:
    have = "an unknown amount" if free is None else _gib(free)
    return errors.SharedMemoryFullError(
        f"Cannot create {what} ({SHM_DIR}{name}): it needs {_gib(size)} of shared memory "
        f"and {SHM_DIR} has {have} free. Use a smaller max_size (or fewer tables), free "
        f"{SHM_DIR} (`shmreplay ls`, `shmreplay gc`), or give the machine or container a "
        "larger /dev/shm (docker run --shm-size=..., or mount -o remount,size=... /dev/shm).")


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB ({count} bytes)"


def check_free_space(size: int, name: str, what: str):
    """Refuses a segment larger than /dev/shm's free space before anything is made.

    Raises:
      SharedMemoryFullError: naming the size needed and the space free.
    """
    free = free_bytes()
    if free is not None and size > free:
        raise _full(size, free, name, what)


def _reserve(fd: int, start: int, length: int, name: str, what: str):
    """Allocates every page of bytes ``start .. start + length`` of the segment now, so
    that no later write there can fail. Costs the time to zero them
    (docs/performance.md)."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise _full(start + length, free_bytes(), name, what) from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        # (A filesystem without fallocate: pages are allocated on first write.)


def _raise_if_squatted(name: str, what: str):
    """Raises if the existing ``name`` is not a segment this user could have made.

    Raises:
      SegmentSquattedError: naming the path, its owner and what it is.
    """
    path = SHM_DIR + name
    try:
        info = os.lstat(path)
    except OSError:
        return  # gone again, or not inspectable: report it as merely taken
    problem = None
    if not _stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    elif info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    elif _stat.S_IMODE(info.st_mode) & ~0o660:
        problem = f"has mode {_stat.S_IMODE(info.st_mode):04o}, which shmreplay never gives"
    if problem is not None:
        buffer = (_layout.parse_segment(name[1:]) or ("NAME",))[0]
        raise errors.SegmentSquattedError(
            f"Cannot create {what}: {path} already exists and {problem} (owner uid "
            f"{info.st_uid}). Someone else made it, not shmreplay; it was not opened. "
            f"Have its owner (or root) remove it (`shmreplay rm --force {buffer}`), or "
            "use another buffer name.")


def unlink(name: str) -> bool:
    """Unlinks a segment by name; returns False if it did not exist or is not ours to remove.

    In a group-shared buffer another user may have created a data segment; /dev/shm is
    sticky, so only that user (or root) can remove its name. That is warned about
    rather than raised: the owner's ``stop()`` must still remove everything else.
    """
    try:
        posix_ipc.unlink_shared_memory(name)
        return True
    except posix_ipc.ExistentialError:
        return False
    except (posix_ipc.PermissionsError, PermissionError) as exc:
        _warn_not_removed(name, exc)
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EACCES):
            raise
        _warn_not_removed(name, exc)
        return False


def _warn_not_removed(name, exc):
    warnings.warn(
        f"Segment {name} belongs to another user and cannot be removed by this one ({exc}); "
        f"its owner can remove it with `shmreplay rm` or by deleting /dev/shm{name}.",
        RuntimeWarning, stacklevel=3)


def exists(name: str) -> bool:
    try:
        posix_ipc.SharedMemory(name).close_fd()
        return True
    except posix_ipc.ExistentialError:
        return False


def resident_bytes(name: str) -> int:
    """Bytes of memory a segment occupies now (tmpfs allocates pages on first write)."""
    try:
        return os.stat(SHM_DIR + name).st_blocks * 512  # Linux maps POSIX shm there
    except OSError:
        return 0


def _gone(name: str) -> errors.BufferBrokenError:
    return errors.BufferBrokenError(
        f"{SHM_DIR}{name} is gone (its buffer was stopped or removed): attach to the "
        "buffer that replaces it, if any, with a new Client.")


class Reservation:
    """``_reserve`` of ranges in a second thread (``Segment.create(..., later=...)``),
    in steps of ``_STEP`` bytes: tmpfs holds the file's lock for a whole call, and the
    caller's own reservations and page faults must not wait for all of it."""

    _STEP = 64 << 20

    def __init__(self, fd: int, ranges: Ranges, name: str, what: str):
        self._fd = os.dup(fd)  # (the creator closes its own as soon as it has mapped)
        self._failure = None
        args = (list(ranges), name, what)
        self._thread = threading.Thread(target=self._run, args=args, daemon=True,
                                        name="shmreplay-reserve")
        self._thread.start()

    def _run(self, ranges, name, what):
        try:
            for start, length in ranges:
                for offset in range(start, start + length, self._STEP):
                    _reserve(self._fd, offset, min(self._STEP, start + length - offset),
                             name, what)
        except BaseException as exc:  # (raised by ``wait``, in the caller's thread)
            self._failure = exc
        finally:
            os.close(self._fd)

    def wait(self):
        self._thread.join()
        if self._failure is not None:
            raise self._failure

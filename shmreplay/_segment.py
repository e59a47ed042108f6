"""POSIX shared-memory segments: create, attach, close (this handle), unlink (the name).

``close`` and ``unlink`` are separate, as in ``multiprocessing.shared_memory``: every
process closes its own mapping; only the owner unlinks, once. Segments are created
with mode 0600 (owner only) unless the Server is told to share with its group.
Attaching refuses segments owned by another user before reading a byte of them: the
header holds pickled configuration, and unpickling is only safe from our own user.
"""

import mmap
import os
import warnings

import posix_ipc

from shmreplay import errors


class Segment:
    """One mapped shared-memory segment.

    Attributes:
      name: The POSIX name (``/shmreplay....``).
      buf: A writable ``mmap`` of the whole segment.
      size: Its size in bytes.
    """

    name = None
    buf = None
    size = 0

    @classmethod
    def create(cls, name: str, size: int, mode: int = 0o600) -> "Segment":
        """Creates and maps a new zero-filled segment; fails if the name exists."""
        self = cls()
        self.name = name
        _warn_if_larger_than_free_space(size, name)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=mode, size=size)
        except posix_ipc.ExistentialError as exc:
            raise FileExistsError(f"shared-memory segment {name} already exists") from exc
        try:
            os.fchmod(shm.fd, mode)  # the process umask must not widen or narrow it
            self.buf = mmap.mmap(shm.fd, size)
            self.size = size
        except BaseException:
            posix_ipc.unlink_shared_memory(name)
            raise
        finally:
            shm.close_fd()
        return self

    @classmethod
    def attach(cls, name: str, what: str) -> "Segment":
        """Maps an existing segment after checking that our user owns it.

        Raises:
          BufferNotFoundError: no segment has this name.
          LayoutMismatchError: the segment belongs to another user or is empty.
        """
        self = cls()
        self.name = name
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError as exc:
            raise errors.BufferNotFoundError(
                f"No shmreplay {what} exists under the name {name!r} on this machine.") from exc
        except posix_ipc.PermissionsError as exc:
            raise errors.LayoutMismatchError(
                f"Segment {name!r} is not accessible to this user ({what}).") from exc
        try:
            stat = os.fstat(shm.fd)
            if stat.st_uid != os.getuid():
                raise errors.LayoutMismatchError(
                    f"Segment {name!r} belongs to uid {stat.st_uid}, not to this user "
                    f"(uid {os.getuid()}); shmreplay only attaches to its own user's buffers.")
            if stat.st_size == 0:
                raise errors.LayoutMismatchError(f"Segment {name!r} is empty: not a shmreplay {what}.")
            self.size = stat.st_size
            self.buf = mmap.mmap(shm.fd, stat.st_size)
        finally:
            shm.close_fd()
        return self

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


def _warn_if_larger_than_free_space(size: int, name: str):
    # tmpfs accepts any size and allocates on first write; writing past its limit kills
    # the writer with SIGBUS. Say so now rather than then.
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return
    free = stat.f_bavail * stat.f_frsize
    if size > free:
        warnings.warn(
            f"Segment {name} reserves {size / 2**30:.1f} GiB but /dev/shm has only "
            f"{free / 2**30:.1f} GiB free: memory is allocated as items are written, and "
            "filling the table beyond the free space will crash the writing process.",
            ResourceWarning, stacklevel=4)


def unlink(name: str) -> bool:
    """Unlinks a segment by name; returns False if it did not exist."""
    try:
        posix_ipc.unlink_shared_memory(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def exists(name: str) -> bool:
    try:
        posix_ipc.SharedMemory(name).close_fd()
        return True
    except posix_ipc.ExistentialError:
        return False


def resident_bytes(name: str) -> int:
    """Bytes of memory a segment occupies now (tmpfs allocates pages on first write)."""
    try:
        return os.stat("/dev/shm" + name).st_blocks * 512  # Linux maps POSIX shm there
    except OSError:
        return 0

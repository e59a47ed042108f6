"""Is a process alive? (Used to find dead writers and dead owners.) And this process's
pid and writer stamp, for the hot paths.

A pid means something only in its pid namespace: the containers of one Kubernetes pod,
or Docker's ``--ipc=container:``, share ``/dev/shm`` but each has pid namespace of its
own, where another container's pid is absent or names some other process. So every pid
that goes into shared memory carries its namespace: a slot's writer *stamp* is
``namespace << 32 | pid`` and the header records the owner's namespace. A process judges
only pids of its own namespace and abstains from the others (``None``: cannot judge),
so nothing live is ever reclaimed or removed from another namespace.

The namespace is the inode of ``/proc/self/ns/pid`` (nsfs inodes are 32-bit, all at or
above 0xEFFFFFFC, so its low 31 bits tell namespaces apart and keep stamps positive).
When it cannot be read, or ``/proc`` is mounted from another pid namespace (then
``/proc/PID`` names other processes), it is 0: *unknown*. A process of an unknown
namespace judges nobody, and nobody judges it.
"""

import os
from typing import Optional

_NS_BITS = 0x7FFFFFFF


def _namespace() -> int:
    """This process's pid namespace, or 0 if it cannot be known for sure."""
    try:
        if int(os.readlink("/proc/self")) != os.getpid():
            return 0  # /proc shows another namespace's pids: /proc/PID would mislead
        return os.stat("/proc/self/ns/pid").st_ino & _NS_BITS
    except (OSError, ValueError):
        return 0


def stamp_of(pid: int, namespace: int) -> int:
    """The writer stamp of ``pid`` in ``namespace`` (what slots record)."""
    return (namespace << 32) | pid


def split_stamp(stamp: int):
    """``(pid, namespace)`` of a writer stamp."""
    return stamp & 0xFFFFFFFF, stamp >> 32


PID = [os.getpid()]  # this process's pid, read without a system call (kept right across fork)
NS = [_namespace()]  # its pid namespace (0: unknown)
STAMP = [stamp_of(PID[0], NS[0])]  # what its reservations and DRAINING slots record


def _after_fork():
    PID[0] = os.getpid()
    NS[0] = _namespace()  # the child of an unshare(CLONE_NEWPID) is in a new one
    STAMP[0] = stamp_of(PID[0], NS[0])


os.register_at_fork(after_in_child=_after_fork)


def start_time(pid: int) -> int:
    """The process's start time in clock ticks, 0 if unknown (guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0


def pid_alive(pid: int, started: int = 0) -> bool:
    """True if ``pid`` runs (and, if ``started`` is given, is the process that started then).

    ``pid`` must be of this process's pid namespace: ``judge`` checks that first."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, belongs to someone else
    return not started or start_time(pid) == started


def judge(pid: int, namespace: int, started: int = 0) -> Optional[bool]:
    """Whether process ``pid`` of pid namespace ``namespace`` runs; None when this
    process cannot tell (another namespace, or either one unknown)."""
    if namespace == 0 or namespace != NS[0]:
        return None
    return pid_alive(pid, started)


def writer_alive(stamp: int) -> Optional[bool]:
    """``judge`` of a slot's writer stamp."""
    pid, namespace = split_stamp(stamp)
    return judge(pid, namespace)


def other_namespace(namespace: int) -> bool:
    """Whether a recorded ``namespace`` is not this process's (or either is unknown)."""
    return namespace == 0 or namespace != NS[0]

"""Is a process alive? (Used to find dead writers and dead owners.) And this process's
pid, for the hot paths."""

import os

PID = [os.getpid()]  # this process's pid, read without a system call (kept right across fork)


def _after_fork():
    PID[0] = os.getpid()


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
    """True if ``pid`` runs (and, if ``started`` is given, is the process that started then)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, belongs to someone else
    return not started or start_time(pid) == started

"""Crash points, for tests: stop a chosen process at a chosen place inside a locked kernel.

A test arms a point for a child's pid; when the child reaches that place (with the
table's lock held), it stops itself with SIGSTOP; the test sees it stopped and SIGKILLs
it there. The points are listed in ``shmreplay._shm.kernels.codes`` (``STOP_*``). Arming is
two plain writes to the table's control block, so nothing is compiled or slowed down
for normal use: each point costs one comparison.
"""

import time

from shmreplay._shm import layout as L


def arm(engine, point: int, pid: int):
    """Makes process ``pid`` stop itself at ``point`` in ``engine``'s table."""
    engine.ctrl[L.C_STOP_PID] = pid
    engine.ctrl[L.C_STOP_POINT] = point


def disarm(engine):
    engine.ctrl[L.C_STOP_POINT] = 0
    engine.ctrl[L.C_STOP_PID] = 0


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state ``T`` in ``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def wait_stopped(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not is_stopped(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True

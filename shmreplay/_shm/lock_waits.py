"""Waiting for a table's lock that another process holds, with a limit.

A kernel that cannot take the table's lock within ``_sync.LOCK_SLICE_NS`` changes
nothing and returns ``codes.LOCK_BUSY``. Its caller then asks ``LockWait.again``
whether to try once more. Between two tries Python runs, so Ctrl-C is honoured, and
``again`` raises when the buffer was stopped meanwhile or the call's deadline passed.
Usually the holder is only busy (a rebuild after a crash, a checkpoint's copy) and the
next try succeeds. When the holder is *stopped* (Ctrl-Z, ``kill -STOP``, a debugger, a
frozen cgroup), it keeps the lock until it is resumed, and the error and the log say
which process it is and that it is stopped.
"""

import logging
import os
import time

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors
from shmreplay._shm.kernels import codes

LOG_AFTER = 5.0  # seconds a wait without a deadline lasts before it is logged
LOG_EVERY = 60.0
_FUTEX_TID_MASK = 0x3FFFFFFF

_log = logging.getLogger("shmreplay")


def lock_holder(ctrl) -> int:
    """The thread id that holds the table mutex in ``ctrl``'s first bytes, 0 if none
    (racy: a hint for messages). glibc keeps a robust mutex's owner tid, with two flag
    bits, in its first word."""
    return int(ctrl.view(np.int32)[0]) & _FUTEX_TID_MASK


def describe_holder(ctrl, buffer_name=None) -> str:
    """Which process holds the lock in ``ctrl``, and whether it is stopped, in words.

    The mutex records a thread id of the holder's pid namespace. When ``buffer_name`` is
    given, a process that does not map that buffer here is not taken for the holder:
    the holder then lives in another pid namespace (a container), where that id means
    another process."""
    tid = lock_holder(ctrl)
    if tid == 0:
        return "another process (it was released meanwhile)"
    status = _proc_status(tid)
    pid = None if status is None else status.get("Tgid", str(tid))
    if status is None or (buffer_name is not None and not _maps_buffer(pid, buffer_name)):
        return (f"thread {tid} of its pid namespace, a process this one cannot see (it "
                "runs in another pid namespace, say another container, or just exited)")
    name = status.get("Name", "?")
    who = f"process {pid} ({name}" + (f", thread {tid})" if str(tid) != pid else ")")
    state = status.get("State", "")
    if state[:1] in ("T", "t"):
        return (f"{who}, which is stopped ({state}): Ctrl-Z, kill -STOP or a debugger. "
                f"`kill -CONT {pid}` resumes it, `kill {pid}` ends it and frees the lock")
    return f"{who}, state {state or 'unknown'}"


def _maps_buffer(pid, buffer_name: str) -> bool:
    """Whether process ``pid`` maps buffer ``buffer_name``'s header segment (True when
    that cannot be read: no evidence against it)."""
    path = "/dev/shm" + L.header_segment_name(buffer_name)
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            wanted = path.encode()
            return any(line.rstrip().endswith(wanted) or wanted + b" " in line
                       for line in maps)
    except OSError:
        return True


def holder_stopped(ctrl) -> bool:
    """Whether the lock's holder is a process this one sees stopped."""
    tid = lock_holder(ctrl)
    status = _proc_status(tid) if tid else None
    return status is not None and status.get("State", "")[:1] in ("T", "t")


def _proc_status(tid: int):
    """``/proc/TID/status`` as a dict of its fields, None if it cannot be read."""
    try:
        with open(f"/proc/{tid}/status", "rb") as stream:
            text = stream.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


class LockWait:
    """One call's wait for a busy table lock (see the module docstring).

    Args:
      engine: The table's ``TableEngine`` (its name, buffer and control block).
      deadline: ``time.monotonic()`` value after which the call gives up; None: never.
      timeout: The caller's timeout, for the message.
      what: The call, for the message (``"insert"``, ``"sample"``, ...).
    """

    __slots__ = ("engine", "deadline", "timeout", "what", "started", "logged_at")

    def __init__(self, engine, deadline, timeout, what: str):
        self.engine = engine
        self.deadline = deadline
        self.timeout = timeout
        self.what = what
        self.started = time.monotonic()
        self.logged_at = None

    def again(self):
        """Returns if the caller should try again; raises if it must not.

        Raises:
          ClosedError: this process closed its Client (another thread) meanwhile.
          BufferBrokenError: the buffer was stopped while the call waited.
          LockTimeoutError: the deadline passed.
        """
        engine = self.engine
        if engine.closed_here:
            raise errors.ClosedError(
                f"Table '{engine.name}': its Client was closed (by another thread) while "
                f"this {self.what} waited for the table's lock.")
        if engine.ctrl[L.C_CLOSED]:
            raise errors.BufferBrokenError(
                f"Buffer '{engine.buffer_name}' was stopped by its owner, or removed with "
                f"`shmreplay gc`/`rm` (table '{engine.name}'), while this {self.what} waited "
                "for the table's lock.")
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise errors.LockTimeoutError(
                f"Table '{engine.name}': the {self.what} could not take the table's lock "
                f"within the timeout of {errors.seconds(self.timeout)}: it is held by "
                f"{describe_holder(engine.ctrl, engine.buffer_name)}.")
        if self.deadline is None and now - self.started >= LOG_AFTER and (
                self.logged_at is None or now - self.logged_at >= LOG_EVERY):
            self.logged_at = now
            _log.warning("shmreplay: %s on table '%s' of buffer '%s' (pid %d) has waited "
                         "%.0f s for the table's lock, held by %s", self.what, engine.name,
                         engine.buffer_name, os.getpid(), now - self.started,
                         describe_holder(engine.ctrl, engine.buffer_name))


def call(engine, deadline, timeout, what: str, kernel, *args):
    """``kernel(*engine.arrays, *args)``, tried again while the lock is busy, up to
    ``deadline``; maps the step storage first if the kernel asks for it."""
    wait = None
    remapped = False
    while True:
        status = kernel(*engine.arrays, *args)
        if status == codes.UNMAPPED and not remapped:
            engine._map_step_storage()
            remapped = True
            continue
        if status != codes.LOCK_BUSY:
            return status
        if wait is None:
            wait = LockWait(engine, deadline, timeout, what)
        wait.again()

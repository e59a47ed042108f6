"""Retiring a buffer from outside its owner: ``shmreplay gc`` and ``rm``, and a new
Server taking over a dead server's port.

Removing a buffer's names does not unmap it: every process still attached would go on
inserting into (and sampling from) memory nobody will read again, and acknowledged
inserts would be lost without an error. So before the names go, the buffer is marked
as ``Server.stop`` marks it: ``C_CLOSED`` set in every table, then the header's state
set to STOPPED. Every call that adds, removes or reads items (insert, its commit, the
writers' commits, sample, update and mutate) checks ``C_CLOSED`` under the table's lock
and raises ``BufferBrokenError``; a call blocked on a rate limiter re-checks within
``_sync.WAIT_SLICE`` (0.05 s); a new ``Client`` refuses a stopped header.

Unlike ``stop``, this takes no lock and runs no kernel (the commands that use it load
none): the two words are written with ``os.pwrite`` through the header segment opened
``O_NOFOLLOW | O_NONBLOCK``, at the control blocks ``shmreplay._shm.peek`` locates from the
numbers they hold (no configuration is unpickled, so a segment someone else wrote
cannot run code here). A word going from 0 to 1 needs no lock: a call that read it
before the write finishes as if it had run just before the buffer was removed, as a call
does that finishes just before ``stop``.
"""

import os
import stat

import numpy as np

from shmreplay._shm import layout as L
from shmreplay._shm import peek as _peek

_OPEN_FLAGS = (os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
               | getattr(os, "O_CLOEXEC", 0))
_ONE = np.int64(1).tobytes()
_STOPPED = np.int64(L.STATE_STOPPED).tobytes()
_STATE_OFFSET = L.HEADER.fields["state"][1]


def retire(name: str, inode: int) -> bool:
    """Marks buffer ``name`` stopped for every process attached to it, if its header
    segment is still the file ``inode`` (not a new buffer's of the same name).

    Returns whether every table was marked closed. False when the segment is not a
    buffer of this layout whose control blocks can be located (the header's state is
    still set to STOPPED if it is a header at all), or when this user may not write it.
    """
    try:
        fd = os.open(_peek.header_path(name), _OPEN_FLAGS)
    except OSError:  # gone, a symlink, not ours to write, ...
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_ino != inode:
            return False
        raw = os.pread(fd, L.HEADER_SIZE, 0)
        if len(raw) < L.HEADER_SIZE:
            return False
        header = np.frombuffer(raw, L.HEADER, 1)[0]
        if header["magic"] != L.MAGIC or int(header["layout_version"]) != L.LAYOUT_VERSION:
            return False
        located = _peek.ctrl_offsets(fd, header, info.st_size)
        for offset, _ in located or ():
            os.pwrite(fd, _ONE, offset + L.C_CLOSED * 8)
        os.pwrite(fd, _STOPPED, _STATE_OFFSET)
        return located is not None
    finally:
        os.close(fd)

"""A Client's lazy connection: waiting for a buffer that does not exist yet.

Reverb's ``Client(address)`` connects lazily: actors may start before the learner
creates the server, and their calls wait for it up to their deadline. A Client here
does the same: if its buffer is missing, it attaches on its first call that needs
the buffer, waiting up to that call's ``timeout``. So that a misspelled name is never
a silent hang, a wait that lasts ``WARN_AFTER`` seconds logs (logger ``shmreplay``)
which buffer it waits for and which exist, again every ``WARN_EVERY`` seconds; the
error at the deadline names them too.

A buffer whose owner died is not waited for when it is a port's (``port-P``): a new
Server for that port replaces it, as a dead server's port is free again. A buffer
being stopped counts as missing (its successor may come). Anything else that is
refused (another user's segment, a foreign file under the name) raises at once.
"""

import logging
import time
from typing import Optional

from shmreplay import errors
from shmreplay._client import address as _address
from shmreplay._engine import buffer as _buffer
from shmreplay._shm import peek as _peek

_log = logging.getLogger("shmreplay")
WARN_AFTER = 5.0
WARN_EVERY = 60.0
_MAX_LISTED = 10


def attach_now(name: str, trust_group: bool):
    """The attached buffer, or None if it does not exist (yet)."""
    if _address.port_of(name) is not None and _peek.peek(name, tables=False).alive is False:
        return None  # a dead server's port: the next Server(port=P) replaces it
    try:
        return _buffer.attach(name, trust_group=trust_group)
    except errors.BufferNotFoundError:
        return None
    except errors.BufferBrokenError:  # stopped by its owner: a new one may follow
        return None


def wait_for(name: str, trust_group: bool, timeout: Optional[float], address: str):
    """Attaches to buffer ``name``, waiting up to ``timeout`` seconds (None: forever).

    Raises:
      BufferNotFoundError: (also a ``DeadlineExceededError``) it did not appear in time.
      LayoutMismatchError: what is under that name is refused (``_buffer.attach``).
    """
    start = time.monotonic()
    deadline = None if timeout is None else start + max(0.0, timeout)
    next_warning = start + WARN_AFTER
    pause = 0.001
    while True:
        buffer = attach_now(name, trust_group)
        if buffer is not None:
            return buffer
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            waited = ("" if not timeout else f", and none appeared within the timeout of "
                      f"{errors.seconds(timeout)}")
            raise errors.BufferNotReadyError(f"{_missing(name, address)}{waited}. "
                                             f"{_existing(name)}")
        if now >= next_warning:
            _log.warning("%s: still waiting after %.0f s (Reverb's lazy connection: the "
                         "call proceeds once its Server exists). %s",
                         _missing(name, address), now - start, _existing(name))
            next_warning = now + WARN_EVERY
        pause = min(2 * pause, 0.05)
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - now)))


def _missing(name: str, address: str) -> str:
    port = _address.port_of(name)
    what = f"buffer {name!r}" + (f" (port {port})" if port is not None else "")
    via = f" (Client({address!r}))" if address != name else ""
    hint = ""
    if _address.looks_like_host(name):
        hint = (f" ({name!r} looks like a host: a Reverb address needs its port, "
                f"'{name}:PORT')")
    return f"No shmreplay {what} exists on this machine{via}{hint}"


def _existing(name: str) -> str:
    """Which buffers exist, for a reader who may have misspelled ``name``."""
    names = [n for n in _peek.segments() if n != name]
    if not names:
        return "No buffer exists on this machine yet."
    shown = ", ".join(_label(n) for n in names[:_MAX_LISTED])
    more = f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return f"Buffers on this machine: {shown}{more} (`shmreplay ls` lists them)."


def _label(name: str) -> str:
    port = _address.port_of(name)
    return repr(name) if port is None else f"{name!r} (localhost:{port})"

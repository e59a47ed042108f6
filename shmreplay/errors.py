"""The error taxonomy of shmreplay.

The contract, in one place:

* ``ShmReplayError`` is the base of every error this library raises on purpose.
* Misuse of an argument raises ``ValueError`` or ``TypeError`` (or one of the typed
  subclasses below, which are both a ``ShmReplayError`` and the builtin), with the
  offending value, the expected value, the table and the column in the message.
  A call rejected this way has changed nothing in the buffer.
* ``DeadlineExceededError`` means a ``timeout`` ran out while a rate limiter (or a full
  table) blocked the call. It is also a ``TimeoutError``. Nothing was changed.
  ``LockTimeoutError``, a ``DeadlineExceededError``, says the table's lock stayed held
  by another process for the whole timeout, which process, and whether it is stopped.
* ``TableNotFoundError`` is a ``RuntimeError`` (what Reverb's client raises for an
  unknown table), a ``ValueError`` (what Reverb's writers raise) and a ``KeyError``
  (what a Python user expects from a lookup).
* ``ClosedError``: *your* code closed this object (client, server, writer) and then used
  it again.
* ``BufferBrokenError``: the buffer broke underneath you: its owner stopped and removed
  it, or it is corrupt. The OS error, if any, is the ``__cause__``.
* ``ReservationLostError`` (a ``BufferBrokenError``): another process freed the slot
  this writer had reserved, judging the writer dead; that one item was not inserted,
  the table is intact, and inserting again works.
* ``BufferNotFoundError``: no buffer of that name exists on this machine.
  ``BufferNotReadyError``, also a ``DeadlineExceededError``, is the one a Client's call
  raises after waiting for its buffer up to its ``timeout`` (Reverb's lazy connection).
* ``BufferExistsError`` (also a ``FileExistsError``): ``Server(name=...)`` with a name
  a buffer already has; the message says whether its owner is alive (and its pid) or
  dead, and that ``shmreplay gc`` removes a dead owner's buffer.
* ``LayoutMismatchError``: a segment of that name exists but is not a shmreplay buffer
  of this layout version (wrong magic, version or inconsistent header).
* ``SegmentSquattedError`` (a ``BufferExistsError``): a name shmreplay must create in
  /dev/shm is taken by something not of ours; the message names its path and owner.
* ``SharedMemoryFullError`` (also a ``MemoryError``): /dev/shm cannot hold a segment
  being created (a Server's, or a table's data segment at its first item); the
  message names the size needed and the space free. Nothing was created.
* ``SchemaError``: the data does not fit a table's columns (structure, shape, dtype);
  the message names the key path in words. ``MissingValueError`` is the SchemaError of
  a ``None`` where a column needs a value: also a ``TypeError``, as Reverb raises one.
* ``CheckpointError``: a checkpoint file cannot be restored (missing, truncated, foreign,
  corrupt, or written by an incompatible format version).
"""


class ShmReplayError(Exception):
    """Base class of every error raised by shmreplay."""


class DeadlineExceededError(ShmReplayError, TimeoutError):
    """A blocking call's ``timeout`` expired before it could proceed."""


class LockTimeoutError(DeadlineExceededError):
    """The table's lock stayed held by another process (often a stopped one: Ctrl-Z,
    SIGSTOP, a debugger) for the whole timeout; nothing was changed."""


class TableNotFoundError(ShmReplayError, RuntimeError, KeyError, ValueError):
    """The named table does not exist in this buffer."""

    def __str__(self):  # KeyError would quote the message.
        return str(self.args[0]) if self.args else ""


class ClosedError(ShmReplayError, RuntimeError):
    """The object was closed by its user and cannot be used any more."""


class BufferBrokenError(ShmReplayError, RuntimeError):
    """The buffer was removed by its owner, or is corrupt."""


class ReservationLostError(BufferBrokenError):
    """A writer's reserved slot was freed under it (its process was judged dead by
    another); its item was not inserted, nothing else changed. A ``BufferBrokenError``,
    so code that handles the buffer breaking under it handles this too."""


class BufferNotFoundError(ShmReplayError, FileNotFoundError):
    """No shmreplay buffer with this name exists on this machine."""


class BufferNotReadyError(BufferNotFoundError, DeadlineExceededError):
    """A Client's call waited for its buffer to be created, up to its timeout, in vain.

    Both a ``BufferNotFoundError`` and a ``DeadlineExceededError`` (Reverb raises the
    latter when no server answers within the deadline)."""


class BufferExistsError(ShmReplayError, FileExistsError):
    """A buffer (or a leftover segment) already has the name a new Server asked for."""


class LayoutMismatchError(ShmReplayError, ValueError):
    """A segment exists under that name but is not a compatible shmreplay buffer."""


class SchemaError(ShmReplayError, ValueError):
    """Data does not match a table's signature (structure, shape or dtype)."""


class MissingValueError(SchemaError, TypeError):
    """A leaf of the data is ``None`` where the table stores (or would store) a column."""


class InvalidPriorityError(ShmReplayError, ValueError):
    """A priority is negative, NaN or infinite, or the priorities argument is malformed."""


class InvalidNameError(ShmReplayError, ValueError):
    """A buffer or table name is empty, too long, or has forbidden characters."""


class CheckpointError(ShmReplayError, ValueError):
    """A checkpoint file is missing, truncated, foreign, corrupt or of another format."""


def seconds(value, unit: str = "s") -> str:
    """A duration for a message, as a user would write it: ``0.1 * 3`` is ``'0.3 s'``.

    Six significant digits keep every timeout a person types (``0.25``, ``1e-4``,
    ``3600``) and drop float noise (``0.30000000000000004``). ``unit="ms"`` for a
    ``timeout_ms``.
    """
    try:
        return f"{float(value):.6g} {unit}"
    except (TypeError, ValueError):
        return f"{value!r} {unit}"


class LayoutResetError(ShmReplayError, RuntimeError):
    """A table's layout was forgotten (``Client.reset`` of a table without a signature)
    while a call was under way. The library's calls retry on their own; a call that
    still sees it (the table reset again and again) may simply be repeated."""


class SharedMemoryFullError(ShmReplayError, MemoryError):
    """/dev/shm has not enough free space for a segment shmreplay must create; the
    message names the size needed, the space free and what to do."""


class SegmentSquattedError(BufferExistsError):
    """A name shmreplay must create in /dev/shm is taken by something not of ours
    (another user's file, not a regular file); the message names its path and owner."""


class ArenaFullError(SchemaError):
    """An item of another shape cannot fit the table's general store (its arena) even
    with the table emptied: give the table a larger ``arena_bytes``."""


class CorruptItemError(BufferBrokenError):
    """An item in a table's general store (its arena) is not a valid encoding: the
    shared memory was damaged, or written by a hostile process."""

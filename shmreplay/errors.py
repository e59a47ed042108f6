"""The error taxonomy of shmreplay.

The contract, in one place:

* ``ShmReplayError`` is the base of every error this library raises on purpose.
* Misuse of an argument raises ``ValueError`` or ``TypeError`` (or one of the typed
  subclasses below, which are both a ``ShmReplayError`` and the builtin), with the
  offending value, the expected value, the table and the column in the message.
  A call rejected this way has changed nothing in the buffer.
* ``DeadlineExceededError`` means a ``timeout`` ran out while a rate limiter (or a full
  table) blocked the call. It is also a ``TimeoutError``. Nothing was changed.
* ``TableNotFoundError`` is a ``RuntimeError`` (what Reverb's client raises for an
  unknown table), a ``ValueError`` (what Reverb's writers raise) and a ``KeyError``
  (what a Python user expects from a lookup).
* ``ClosedError``: *your* code closed this object (client, server, writer) and then used
  it again.
* ``BufferBrokenError``: the buffer broke underneath you: its owner stopped and removed
  it, or it is corrupt. The OS error, if any, is the ``__cause__``.
* ``BufferNotFoundError``: no buffer of that name exists on this machine.
* ``LayoutMismatchError``: a segment of that name exists but is not a shmreplay buffer
  of this layout version (wrong magic, version or inconsistent header).
* ``CheckpointError``: a checkpoint file cannot be restored (missing, truncated, foreign,
  corrupt, or written by an incompatible format version).
"""


class ShmReplayError(Exception):
    """Base class of every error raised by shmreplay."""


class DeadlineExceededError(ShmReplayError, TimeoutError):
    """A blocking call's ``timeout`` expired before it could proceed."""


class TableNotFoundError(ShmReplayError, RuntimeError, KeyError, ValueError):
    """The named table does not exist in this buffer."""

    def __str__(self):  # KeyError would quote the message.
        return str(self.args[0]) if self.args else ""


class ClosedError(ShmReplayError, RuntimeError):
    """The object was closed by its user and cannot be used any more."""


class BufferBrokenError(ShmReplayError, RuntimeError):
    """The buffer was removed by its owner, or is corrupt."""


class BufferNotFoundError(ShmReplayError, FileNotFoundError):
    """No shmreplay buffer with this name exists on this machine."""


class LayoutMismatchError(ShmReplayError, ValueError):
    """A segment exists under that name but is not a compatible shmreplay buffer."""


class SchemaError(ShmReplayError, ValueError):
    """Data does not match a table's signature (structure, shape or dtype)."""


class InvalidPriorityError(ShmReplayError, ValueError):
    """A priority is negative, NaN or infinite, or the priorities argument is malformed."""


class InvalidNameError(ShmReplayError, ValueError):
    """A buffer or table name is empty, too long, or has forbidden characters."""


class CheckpointError(ShmReplayError, ValueError):
    """A checkpoint file is missing, truncated, foreign, corrupt or of another format."""

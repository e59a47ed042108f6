"""The errors ``shmreplay.ray`` adds to ``shmreplay.errors``."""

from shmreplay import errors


class BufferServiceUnavailableError(errors.ShmReplayError, ConnectionError):
    """No buffer-side actor answered within the remote client's ``retry_timeout``: it
    died and Ray did not restart it (in time), or the service was stopped. A chunk sent
    meanwhile is resent, once, by the next call of the same writer."""

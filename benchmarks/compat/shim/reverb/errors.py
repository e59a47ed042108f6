"""Reverb's ``reverb.errors``."""

from shmreplay.errors import DeadlineExceededError, ShmReplayError as ReverbError  # noqa: F401

__all__ = ["DeadlineExceededError", "ReverbError"]

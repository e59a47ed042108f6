"""Reverb's ``reverb.client``: ``Client`` and the legacy ``Writer``."""

from shmreplay.client import Client  # noqa: F401
from shmreplay.writer import Writer  # noqa: F401

from reverb import _ports  # noqa: F401

__all__ = ["Client", "Writer", "_ports"]

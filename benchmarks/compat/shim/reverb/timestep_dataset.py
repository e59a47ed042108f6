"""Reverb's ``reverb.timestep_dataset``."""

from shmreplay.tf import TimestepDataset  # noqa: F401

from reverb import _ports  # noqa: F401

__all__ = ["TimestepDataset", "_ports"]

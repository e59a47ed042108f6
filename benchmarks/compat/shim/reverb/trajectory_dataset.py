"""Reverb's ``reverb.trajectory_dataset``."""

from shmreplay.tf import TrajectoryDataset  # noqa: F401

from reverb import _ports  # noqa: F401

__all__ = ["TrajectoryDataset", "_ports"]

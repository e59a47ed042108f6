"""Reverb's ``reverb.replay_sample``."""

from shmreplay.replay_sample import ReplaySample, SampleInfo  # noqa: F401

__all__ = ["ReplaySample", "SampleInfo"]

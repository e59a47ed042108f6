"""Reverb's ``reverb.pattern_dataset``."""

from shmreplay.tf import PatternDataset, pattern_dataset_with_info  # noqa: F401

__all__ = ["PatternDataset", "pattern_dataset_with_info"]

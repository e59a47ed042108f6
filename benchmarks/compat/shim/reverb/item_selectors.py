"""Reverb's ``reverb.item_selectors``."""

from shmreplay.selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Uniform  # noqa: F401

__all__ = ["Fifo", "Lifo", "MaxHeap", "MinHeap", "Prioritized", "Uniform"]

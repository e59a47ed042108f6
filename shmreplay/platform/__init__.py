"""Reverb's ``reverb.platform`` package, for code that reaches the checkpointers there
(Reverb's README does: ``reverb.platform.checkpointers_lib.DefaultCheckpointer``)."""

from shmreplay.platform import checkpointers_lib

__all__ = ["checkpointers_lib"]

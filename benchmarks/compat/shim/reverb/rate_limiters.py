"""Reverb's ``reverb.rate_limiters``."""

from shmreplay.rate_limiters import (MinSize, Queue, RateLimiter,  # noqa: F401
                                     SampleToInsertRatio, Stack)

__all__ = ["MinSize", "Queue", "RateLimiter", "SampleToInsertRatio", "Stack"]

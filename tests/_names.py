"""Names of test buffers: unique, and marked with this test run's token.

The token lets the leak fixture watch only this run's segments, so two test runs on
one machine (two developers, a CI job and a benchmark) never see each other's objects
as leaks. Spawned workers inherit the token through the environment.
"""

import os
import uuid

RUN = os.environ.setdefault("SHMREPLAY_TEST_RUN", uuid.uuid4().hex[:6])


def unique(tag: str = "") -> str:
    """A fresh buffer name ``test-<run>-<tag>-<random>``."""
    return f"test-{RUN}-{tag + '-' if tag else ''}{uuid.uuid4().hex[:8]}"

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


def port_buffers_of(pids, entries):
    """The /dev/shm ``entries`` of port buffers (``shmreplay.port-P`` and its data segments) whose
    owner, as their header says, is one of ``pids``: what ``Server(tables)`` (no
    name) made in those processes."""
    from shmreplay._shm import layout as _layout
    from shmreplay._shm import peek as _peek
    owners = {}
    found = set()
    for entry in entries:
        parsed = _layout.parse_segment(entry)
        if parsed is None or not parsed[0].startswith("port-"):
            continue
        base = parsed[0]
        if base not in owners:
            owners[base] = _peek.peek(base, tables=False).pid
        if owners[base] in pids:
            found.add(entry)
    return found

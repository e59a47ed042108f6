"""Waiting in tests for what other processes and threads do, with deadlines.

A busy machine runs a prefetch thread or a worker late; a test that slept a fixed time
and then asserted would fail there. These poll for the condition, up to a generous
deadline, and never sleep-then-assert.
"""

import os
import time


def settled(count, target, overrun=0.5, timeout=60):
    """``count()`` once it reached ``target`` (polled, up to ``timeout`` s: a busy machine
    may run a background reader or prefetch thread late) and ``overrun`` s more passed,
    in which one that took more than it may would have taken it."""
    deadline = time.monotonic() + timeout
    while count() < target and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(overrun)
    return count()


def session_processes(sid):
    """Processes still alive in session ``sid`` (a demo and its workers)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != b"Z":  # fields[3] is the session id
            alive.append(int(entry))
    return alive


def wait_until_gone(sid, seconds=15.0):
    """The processes of session ``sid`` still alive after up to ``seconds`` of waiting."""
    deadline = time.monotonic() + seconds
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return session_processes(sid)

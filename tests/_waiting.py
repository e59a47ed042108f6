"""Waiting in tests for what other processes and threads do, with deadlines.

A busy machine runs a prefetch thread or a worker late; a test that slept a fixed time
and then asserted would fail there. These poll for the condition, up to a generous
deadline, and never sleep-then-assert.
"""

import os
import signal
import threading
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


class OutputWatch:
    """Reads a process's output in a thread; ``seen`` is set once a line matches.

    Leaving the ``with`` block kills the process's group if it is still running (the
    process must be started with ``start_new_session=True``) and collects its output.
    """

    def __init__(self, proc, matches):
        self.proc, self.lines, self.seen = proc, [], threading.Event()

        def read():
            for line in proc.stdout:
                self.lines.append(line)
                if matches(line):
                    self.seen.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=10)

#!/usr/bin/env python3
"""Runs a command on a deliberately busy machine, as a shared workstation or CI runner is.

    python tests/busy_machine.py [options] -- COMMAND [ARGS...]
    python tests/busy_machine.py --hogs 2 --runs 3 --fresh-numba-cache -- python -m pytest -q

Beside the command, for as long as it runs:

* ``--hogs N`` CPU hogs (default 2, which on a 2-core machine keeps both cores busy):
  processes that busy-loop ``--duty`` of the time (default 1.0: all of it; 0.5 keeps
  each of them busy half the time). They run at the command's priority, so the command
  gets roughly N+1-th of a core where it used to get a whole one.
* a churner (``--no-churn`` to leave it out), playing another program that uses
  shmreplay on the same machine: it keeps creating and removing
  ``/dev/shm/shmreplay.churn-<pid>-<n>`` segments (empty ones, as a buffer being created
  has for an instant, header-sized ones of random bytes, ones with a data segment
  ``...<n>.t0`` beside them) and ``sem.shmreplay.churn-<pid>-<n>`` semaphores, every
  ``--churn-interval`` seconds, and keeps ``--live`` of them for the whole run, as another
  program's live buffer stays. Unless ``--no-servers``, some of them are real buffers
  (``shmreplay.Server`` owned by the churner, alive), so ``shmreplay ls`` and ``gc`` meet
  a live buffer that is not the test run's, and one that appears and disappears.
  Every name starts with ``shmreplay`` (leftovers stay visible to ``shmreplay ls``) and
  none matches a test run's own prefixes (``shmreplay.test-<run>-``,
  ``shmreplay.port-N`` of a test process, see tests/_names.py and tests/conftest.py).

``--fresh-numba-cache`` runs the command each time with ``NUMBA_CACHE_DIR`` set to a new,
empty directory (removed afterwards): with the variable unset numba caches next to the
sources in ``__pycache__``, so setting it is what makes the cache empty, as on a fresh
clone or in CI.

It prints each run's exit status and wall time, and a summary; it exits 0 if every run
exited 0, else 1. On exit, Ctrl-C included, it stops its hogs and churner and removes
every object the churner created (also if the churner itself was killed).

This file is a plain script: pytest collects only ``test_*.py`` files and it defines no
tests.
"""

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SHM_DIR = "/dev/shm"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- helpers run as child processes of this script ----------------------------------------

def _hog(duty):
    """Busy-loops ``duty`` of every 100 ms (all of it when ``duty >= 1``), forever."""
    period = 0.1
    x = 0
    while True:
        end = time.monotonic() + period * duty
        while time.monotonic() < end:
            for _ in range(10000):
                x += 1
        if duty < 1:
            time.sleep(period * (1 - duty))


def _churn_prefix(pid):
    return f"shmreplay.churn-{pid}-"


class _Churner:
    """Creates and removes shmreplay-looking objects that belong to no test run."""

    def __init__(self, interval, live, servers):
        import posix_ipc  # a dependency of shmreplay: present wherever its tests run
        self.ipc = posix_ipc
        self.interval = interval
        self.pid = os.getpid()
        self.n = 0
        self.transient = []  # one [(kind, handle), ...] per object made, oldest first
        self.permanent = []  # the same, for the objects that live all run
        self.created = self.removed = 0
        self.stopping = False  # set by SIGTERM/SIGINT: stop between two steps, never inside one
        self.shmreplay = None
        if servers:
            sys.path.insert(0, ROOT)
            try:
                import shmreplay
                self.shmreplay = shmreplay
            except ImportError as exc:
                print(f"busy_machine: churner makes no real buffers ({exc})", file=sys.stderr)
        for _ in range(live):
            self.permanent.append(self._make(permanent=True))

    def _name(self):
        self.n += 1
        return f"churn-{self.pid}-{self.n}"

    def _segment(self, name, size, fill):
        shm = self.ipc.SharedMemory("/shmreplay." + name, self.ipc.O_CREX, mode=0o600, size=size)
        try:
            if size and fill:
                os.pwrite(shm.fd, os.urandom(size), 0)
        finally:
            shm.close_fd()
        return ("shm", "/shmreplay." + name)

    def _make(self, permanent=False):
        kinds = ["empty", "random", "pair", "sem"]
        if self.shmreplay is not None:
            kinds.append("server")
        kind = random.choice(kinds[1:] if permanent else kinds)  # a live buffer is not empty
        if permanent and self.shmreplay is not None and not self.permanent:
            kind = "server"  # at least one real, live buffer
        name = self._name()
        if kind == "empty":  # a header segment the instant after shm_open(O_CREAT)
            handles = [self._segment(name, 0, False)]
        elif kind == "random":  # someone else's segment that happens to share the prefix
            handles = [self._segment(name, 4096, True)]
        elif kind == "pair":  # header and data segment, as a buffer has
            handles = [self._segment(name, 4096, True), self._segment(name + ".t0", 65536, False)]
        elif kind == "sem":
            sem = self.ipc.Semaphore("/shmreplay." + name, self.ipc.O_CREX, mode=0o600,
                                     initial_value=1)
            sem.close()
            handles = [("sem", "/shmreplay." + name)]
        else:
            s = self.shmreplay
            server = s.Server([s.Table("churn", s.selectors.Uniform(), s.selectors.Fifo(), 16,
                                       s.rate_limiters.MinSize(1))], name=name)
            handles = [("server", server)]
        self.created += 1
        return handles

    def _remove(self, handles):
        for kind, handle in handles:
            try:
                if kind == "shm":
                    self.ipc.unlink_shared_memory(handle)
                elif kind == "sem":
                    self.ipc.unlink_semaphore(handle)
                else:
                    handle.stop()
            except self.ipc.ExistentialError:
                pass  # someone removed it (a `shmreplay gc` that thought it dead)
            except Exception as exc:  # keep churning; the sweep at exit removes leftovers
                print(f"busy_machine: churner could not remove {kind} {handle}: {exc!r}",
                      file=sys.stderr, flush=True)
        self.removed += 1

    def run(self):
        try:
            while not self.stopping:
                if len(self.transient) < 20 and (not self.transient or random.random() < 0.55):
                    self.transient.append(self._make())
                else:
                    self._remove(self.transient.pop(0))
                time.sleep(self.interval)
        finally:
            self.close()

    def close(self):
        while self.transient:
            self._remove(self.transient.pop())
        while self.permanent:
            self._remove(self.permanent.pop())


def _churn(interval, live, servers):
    # SIGTERM from the harness ends the loop between two steps (an object half made would
    # escape the record), then ``close`` removes every object. The handlers are installed
    # before any Server exists, so shmreplay leaves them alone.
    churner = None

    def stop(*_):
        if churner is None:
            sys.exit(0)
        churner.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    churner = _Churner(interval, live, servers)
    print(f"busy_machine: churner {os.getpid()} running ({len(churner.permanent)} live)",
          file=sys.stderr, flush=True)
    churner.run()
    print(f"busy_machine: churner {os.getpid()} made {churner.created} and removed "
          f"{churner.removed} buffers/segments/semaphores", file=sys.stderr, flush=True)


def _sweep(pid):
    """Removes whatever churner ``pid`` left in /dev/shm (if it was killed, say)."""
    prefixes = (_churn_prefix(pid), "sem." + _churn_prefix(pid))
    left = 0
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.startswith(prefixes):
            try:
                os.unlink(os.path.join(SHM_DIR, entry))
                left += 1
            except OSError:
                pass
    return left


# --- the harness ------------------------------------------------------------------------

def _spawn(*args):
    # A session of their own: a terminal's Ctrl-C goes to the command; the harness stops
    # its helpers itself, in order, after the command.
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                            start_new_session=True)


def _stop(proc, timeout=30.0):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


_TERMINATED = []  # non-empty once the harness got SIGTERM


def _on_sigterm(signum, frame):
    _TERMINATED.append(signum)
    raise KeyboardInterrupt  # stop as on Ctrl-C: helpers stopped, churner's objects gone


def _wait_or_signal(proc, timeout, signum):
    """Waits up to ``timeout`` s for ``proc``; sends it ``signum`` if it is still running."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signum)


def _run_once(command, index, args):
    env = dict(os.environ)
    cache = None
    if args.fresh_numba_cache:
        cache = tempfile.mkdtemp(prefix="busy-machine-numba-")
        env["NUMBA_CACHE_DIR"] = cache
    print(f"busy_machine: run {index}/{args.runs}: {' '.join(command)}"
          + (f" (NUMBA_CACHE_DIR={cache}, empty)" if cache else
             f" (NUMBA_CACHE_DIR={env.get('NUMBA_CACHE_DIR', 'unset: numba caches in __pycache__')})"),
          file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(command, env=env)
    try:
        try:
            status = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"busy_machine: run {index} took more than {args.timeout:g} s: stopping it",
                  file=sys.stderr, flush=True)
            proc.terminate()
            _wait_or_signal(proc, 60, signal.SIGKILL)
            status = proc.wait()
    except KeyboardInterrupt:
        # A terminal's Ctrl-C reached the command too; a SIGTERM (or a SIGINT sent to the
        # harness alone) did not: pass it on. Then give the command time to clean up.
        _wait_or_signal(proc, 0 if _TERMINATED else 10, signal.SIGTERM if _TERMINATED
                        else signal.SIGINT)
        _wait_or_signal(proc, 60, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
    return status, time.monotonic() - start


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Run a command beside CPU hogs and another program churning shmreplay "
                    "objects in /dev/shm.",
        usage="%(prog)s [options] -- COMMAND [ARGS...]")
    parser.add_argument("--hogs", type=int, default=2,
                        help="busy-looping processes (default 2: both cores of a 2-core machine)")
    parser.add_argument("--duty", type=float, default=1.0,
                        help="fraction of the time each hog is busy (default 1.0)")
    parser.add_argument("--runs", type=int, default=1, help="run the command this many times")
    parser.add_argument("--fresh-numba-cache", action="store_true",
                        help="each run with NUMBA_CACHE_DIR set to a new, empty directory")
    parser.add_argument("--no-churn", action="store_true", help="no churner")
    parser.add_argument("--churn-interval", type=float, default=0.02,
                        help="seconds between the churner's creations/removals (default 0.02)")
    parser.add_argument("--live", type=int, default=3,
                        help="churner objects alive for the whole run (default 3)")
    parser.add_argument("--no-servers", action="store_true",
                        help="the churner makes no real shmreplay buffers, only look-alikes")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop a run (SIGTERM, then SIGKILL) that takes longer than this")
    parser.add_argument("--stop-on-failure", action="store_true",
                        help="no further runs after one that failed")
    parser.add_argument("--_hog", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--_churn", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args._hog is not None:
        return _hog(args._hog)
    if args._churn is not None:
        interval, live, servers = args._churn
        return _churn(float(interval), int(live), servers == "1")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if not 0 < args.duty <= 1:
        parser.error("--duty must be in (0, 1]")

    signal.signal(signal.SIGTERM, _on_sigterm)
    helpers, churner, results = [], None, []
    print(f"busy_machine: {args.hogs} hog(s) at duty {args.duty:g} on {os.cpu_count()} CPU(s); "
          f"churner {'off' if args.no_churn else f'every {args.churn_interval:g} s, {args.live} live'}",
          file=sys.stderr, flush=True)
    try:
        helpers = [_spawn("--_hog", str(args.duty)) for _ in range(args.hogs)]
        if not args.no_churn:
            churner = _spawn("--_churn", str(args.churn_interval), str(args.live),
                             "0" if args.no_servers else "1")
            helpers.append(churner)
        for index in range(1, args.runs + 1):
            if churner is not None and churner.poll() is not None:
                print(f"busy_machine: the churner exited ({churner.returncode})", file=sys.stderr)
                return 1
            status, seconds = _run_once(command, index, args)
            results.append((status, seconds))
            print(f"busy_machine: run {index}/{args.runs}: exit {status}, {seconds:.0f} s "
                  f"({seconds / 60:.1f} min), load average {os.getloadavg()[0]:.2f}",
                  file=sys.stderr, flush=True)
            if status and args.stop_on_failure:
                break
    except KeyboardInterrupt:
        print("busy_machine: interrupted", file=sys.stderr)
        results.append((130, float("nan")))
    finally:
        for proc in helpers:
            _stop(proc)
        if churner is not None:
            swept = _sweep(churner.pid)
            if swept:
                print(f"busy_machine: removed {swept} object(s) the churner left",
                      file=sys.stderr)
    for index, (status, seconds) in enumerate(results, 1):
        print(f"busy_machine: summary run {index}: exit {status}, {seconds:.0f} s",
              file=sys.stderr)
    if _TERMINATED or any(status == 130 and seconds != seconds for status, seconds in results):
        return 130  # interrupted
    return 0 if results and all(status == 0 for status, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""SIGTERM ends a Server's process promptly, whatever its main thread is doing.

Python runs a signal handler only when the main thread executes bytecode. A learner
whose main thread waits in native code (a ``tf.data`` iterator's ``GetNext``, a C++
condition variable) would never run it: the process would ignore ``timeout``,
``docker stop`` and Kubernetes until SIGKILL, and its buffer would stay behind.

Python's C-level handler, however, writes the signal's number to the *wakeup fd* at
once, from whichever thread the kernel interrupts. So the owner's process gets a pipe
as its wakeup fd and a daemon thread that reads it. When SIGTERM arrives and
shmreplay's handler is still the one installed for it, the thread stops every Server
of the process (removing its buffer) and ends the process by SIGTERM's default action,
which is what the Python-level handler does when the main thread is free to run it.
Both go through ``stop()``, which is idempotent and thread-safe, so whichever runs
first does the work.

A wakeup fd set before (asyncio's, say) keeps receiving every byte: the thread
forwards them. One set later replaces this one; then only the Python-level handler
remains, as before. A forked child drops the wakeup fd (it would otherwise wake its
parent's thread with its own signals).
"""

import ctypes
import os
import signal
import threading

_watcher = None  # (thread, read fd, write fd, the wakeup fd it replaced)


def watch(signum: int, is_ours, on_signal):
    """Makes ``signum`` call ``on_signal()`` then die by it, from a thread, as long as
    ``is_ours()`` says shmreplay's handler is still the installed one. Main thread only;
    once per process."""
    global _watcher
    if _watcher is not None:
        return
    read_fd, write_fd = os.pipe()  # (not inherited by exec'd children)
    os.set_blocking(write_fd, False)  # the C handler must never block on it
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread after all
        os.close(read_fd)
        os.close(write_fd)
        return
    thread = threading.Thread(target=_run, args=(read_fd, previous, signum, is_ours,
                                                 on_signal),
                              name="shmreplay-sigterm", daemon=True)
    _watcher = (thread, read_fd, write_fd, previous)
    thread.start()


def _run(read_fd, previous, signum, is_ours, on_signal):
    while True:
        try:
            received = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not received:
            return
        if previous >= 0:
            try:
                os.write(previous, received)
            except OSError:
                pass
        if signum in received and is_ours():
            try:
                on_signal()
            finally:
                _die_by(signum)


def _die_by(signum: int):
    """The signal's default action, from any thread: Python's ``signal.signal`` works in
    the main thread only, so the disposition is reset through libc."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signum, None)  # SIG_DFL is 0
    os.kill(os.getpid(), signum)


def _after_fork_in_child():
    global _watcher
    if _watcher is None:
        return
    _, read_fd, write_fd, previous = _watcher
    _watcher = None
    try:
        current = signal.set_wakeup_fd(previous)
        if current != write_fd:  # someone else's was set meanwhile: keep it
            signal.set_wakeup_fd(current)
    except ValueError:
        pass
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)

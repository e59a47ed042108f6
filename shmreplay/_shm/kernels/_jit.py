"""How kernels are compiled: numba's JIT with its disk cache, one signature per kernel,
and a lock file so that the processes of a machine compile each kernel once.

Everything that touches numba's compiler lives here. The kernel modules only decorate
their functions (``shmreplay._shm.kernels.kernel``); ``shmreplay._ops.warmup`` asks which
kernels are missing from the cache and compiles them ahead of use.

* **One signature per kernel.** numba compiles a function once per tuple of argument
  types, and a constant argument at a call between kernels (``_block(ctrl,
  C_SPACE_WAITERS, ...)``) is typed as a literal of its value: every distinct constant
  cost another full compile of the callee and of everything it calls (94 compiled
  versions instead of 71 for the quickstart's calls, a sixth of the compile time).
  Calls between kernels are typed with the arguments' plain types, so all callers
  share one version.
* **One compile per machine.** A process compiles a kernel only while it holds an
  exclusive ``flock`` on a file in numba's cache directory. A process that needs a
  kernel while another compiles waits, then loads what the other wrote, instead of
  compiling the same code at the same time on the same cores. Loading a kernel that
  the cache holds takes no lock, so a warm process never waits for anyone. The lock is
  re-entrant within a process (compiling a kernel compiles its callees) and released
  by the kernel when its holder dies.
* **The wait is bounded by progress.** A waiter keeps waiting while the holder adds
  compiled kernels to the cache; once nothing new has appeared there for ``STALL``
  seconds (the holder was stopped with Ctrl-Z or a debugger, or is stuck) it compiles
  on its own, as numba would without the lock. Without a usable lock file (a read-only
  cache directory, a symlink, a file of another user) a process compiles at once.
"""

import contextlib
import fcntl
import glob
import hashlib
import logging
import os
import threading
import time

import numba
from numba.core import types

LOCK_NAME = "shmreplay-compile.lock"
STALL = 30.0        # seconds without a new cache file after which a waiter stops waiting
_TELL_AFTER = 1.0   # seconds of waiting before saying why
_POLL = 0.02

DISPATCHERS = []    # every kernel, in definition order: what the cache must hold

_log = logging.getLogger("shmreplay")


def jit(function, inline: bool):
    """The numba dispatcher of ``function``, with one signature and the machine lock."""
    options = dict(nogil=True, cache=True, _nrt=False, error_model="numpy")
    if inline:
        options["inline"] = "always"
    dispatcher = numba.njit(**options)(function)
    compile_, call_template = dispatcher.compile, dispatcher.get_call_template

    # numba looks both up on the instance: ``compile`` when a call finds no compiled
    # version (from Python, or while typing a calling kernel), ``get_call_template``
    # when it types a call from another kernel.
    def compile_locked(signature):
        if _loadable(dispatcher, signature):  # no lock to load: a stopped compiler
            return compile_(signature)        # never holds back a warm process
        with machine_lock():
            return compile_(signature)  # (loads what another process compiled meanwhile)

    def plain_call_template(args, kws):
        return call_template(tuple(types.unliteral(a) for a in args),
                             {k: types.unliteral(v) for k, v in kws.items()})

    dispatcher.compile = compile_locked
    dispatcher.get_call_template = plain_call_template
    # numba stamps a kernel's cache with its own file's mtime and size only, so editing
    # a callee in another file left callers compiled with the old callee. Stamp every
    # kernel with the contents of every file that kernels are made of.
    dispatcher._cache._cache_file._source_stamp = _sources_digest()
    DISPATCHERS.append(dispatcher)
    return dispatcher


def entry_points(module):
    """The kernels that Python code calls: the public kernels that ``module`` names
    (``shmreplay._shm.kernels.table``, which the caller imports: this module is below it;
    they are defined in the modules by job that it imports them from).

    Loading one of them from the cache loads everything it calls, compiled in.
    """
    return [d for d in DISPATCHERS if not d.py_func.__name__.startswith("_")
            and getattr(module, d.py_func.__name__, None) is d]


def _sources_digest() -> str:
    global _digest
    if _digest is None:
        package = os.path.dirname(os.path.abspath(__file__))
        files = sorted(glob.glob(os.path.join(package, "*.py")))
        files += [os.path.join(os.path.dirname(package), name)
                  for name in ("sync.py", "layout.py")]
        hasher = hashlib.sha256()
        for path in files:
            with open(path, "rb") as source:
                hasher.update(os.path.basename(path).encode() + b"\0" + source.read())
        _digest = hasher.hexdigest()
    return _digest


_digest = None


def cache_directory() -> str:
    """Where numba keeps the compiled code of this package's kernels, and the lock file.

    (Kernels defined in ``shmreplay._shm.sync`` are cached beside that module; one lock
    serves all of them.)
    """
    global _directory
    if _directory is None:
        from numba.core.caching import FunctionCache
        _directory = FunctionCache(cache_directory).cache_path
    return _directory


_directory = None


def uncached(module):
    """The entry points of ``module`` that are neither loaded in this process nor in
    numba's cache for this machine (its CPU, numba's version, the kernels' sources).

    Reads each one's cache index (a few kB); compiles and loads nothing.
    """
    entries = entry_points(module)
    machine = entries[0].targetctx.codegen().magic_tuple()
    missing = []
    for dispatcher in entries:
        if dispatcher.overloads:
            continue
        try:
            index = dispatcher._cache._cache_file._load_index()
        except Exception:  # an unreadable or foreign index: numba would compile
            index = {}
        if not any(key[1] == machine for key in index):
            missing.append(dispatcher)
    return missing


def _loadable(dispatcher, signature) -> bool:
    """Whether ``signature`` is loaded in this process or in the cache for this machine."""
    if tuple(signature) in dispatcher.overloads:
        return True
    try:
        cache = dispatcher._cache
        key = cache._index_key(signature, dispatcher.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # numba's internals changed: take the lock, as for a compile
        return False


# --- the machine lock -------------------------------------------------------------------

_mutex = threading.RLock()   # one compiling thread per process, as numba has anyway
_state = {"depth": 0, "fd": None}


def _forget_after_fork():
    # The child shares the parent's open lock file: closing it releases nothing the
    # parent holds (unlocking it would). The child starts with no lock of its own.
    global _mutex
    _mutex = threading.RLock()
    fd, _state["fd"], _state["depth"] = _state["fd"], None, 0
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


os.register_at_fork(after_in_child=_forget_after_fork)


@contextlib.contextmanager
def machine_lock():
    """Holds the machine's lock on compiling shmreplay's kernels (re-entrant)."""
    with _mutex:
        if _state["depth"] == 0:
            _state["fd"] = _acquire(cache_directory())
        _state["depth"] += 1
        try:
            yield
        finally:
            _state["depth"] -= 1
            if _state["depth"] == 0 and _state["fd"] is not None:
                fd, _state["fd"] = _state["fd"], None
                os.close(fd)  # releases the flock


def _acquire(directory: str):
    """An open, exclusively locked lock file; None if there is none to have in time."""
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, LOCK_NAME),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        start = progress_at = time.monotonic()
        progress = _modified(directory)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                _write_holder(fd)
                return fd
            now = time.monotonic()
            if _modified(directory) != progress:  # the holder wrote a compiled kernel
                progress, progress_at = _modified(directory), now
            if now - progress_at >= STALL:
                _log.warning("shmreplay: %s holds the kernel compile lock but has cached "
                             "nothing for %.0f s (stopped?); compiling without it",
                             _holder(fd), now - progress_at)
                os.close(fd)
                return None
            waited = now - start
            if not told and waited >= _TELL_AFTER:
                _log.warning("shmreplay: waiting for %s, which is compiling kernels "
                             "(first run only)", _holder(fd))
                told = True
            time.sleep(_POLL)
    except BaseException:
        os.close(fd)
        raise


def _modified(directory):
    try:
        return os.stat(directory).st_mtime_ns  # changes as numba adds files
    except OSError:
        return None


def _write_holder(fd):
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)


def _holder(fd) -> str:
    try:
        pid = int(os.pread(fd, 20, 0) or b"0")
    except (OSError, ValueError):
        pid = 0
    return f"process {pid}" if pid > 0 else "another process"

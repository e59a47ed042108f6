"""``Server``: creates a named buffer in shared memory and removes it when it stops.

There is no server thread: once created, the buffer is used directly by every process
that attaches with ``Client(name)``. The Server object only owns the buffer's lifetime:
``stop()``, leaving its ``with`` block, normal interpreter exit, an uncaught exception
(``KeyboardInterrupt`` from Ctrl-C included), and SIGTERM all remove every segment it
created. A ``KeyboardInterrupt`` the program catches leaves the buffer alone, and so
does a signal the program handles itself. (A SIGKILLed owner cannot clean up; its
buffer stays until removed by name.)
"""

import atexit
import functools
import logging
import os
import signal
import threading
import weakref
from typing import Optional, Sequence

from shmreplay import checkpointers, errors
from shmreplay._client import address as _address
from shmreplay._engine import buffer as _buffer
from shmreplay._ops import checkpoint as _checkpoint
from shmreplay._shm import layout as _layout
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay._shm import peek as _peek
from shmreplay._ops import restore as _restore
from shmreplay._ops import retire as _retire
from shmreplay._shm import segment as _segment
from shmreplay._shm import termination as _termination
from shmreplay._ops import warmup as _warmup
from shmreplay.table import Table, validate_name

_log = logging.getLogger("shmreplay")


class Server:
    """Creates a buffer holding ``tables`` under a name other processes can attach to.

    Args:
      tables: The tables (``shmreplay.Table``). Each becomes a live handle.
      port: As in Reverb: clients reach the buffer at ``f"localhost:{port}"``. There
        is no socket: port ``P`` is the buffer named ``port-P`` (``docs/design.md``).
        ``None`` (with no ``name``) picks a free port, readable as ``server.port``.
      checkpointer: A ``shmreplay.checkpointers`` checkpointer: the Server restores
        its latest checkpoint (or its fallback), and ``Client.checkpoint()`` without a
        path writes there.
      name: Instead of a port, the buffer's name (keyword only): letters, digits,
        ``_ . -``; at most 100 characters. ``Client(name)`` attaches to it.
      checkpoint: A checkpoint file (or a directory of them: the latest) to restore.
        Tables are matched by name. Without ``tables``, the checkpoint's are served.
      reset_rate_limiter: Restore items but start each rate limiter afresh, as if the
        restored items had just been inserted and never sampled (a limiter restored
        with millions of recorded samples may otherwise block sampling for a long time).
      override_config: Keep the sampler, remover, ``max_size``, rate limiter,
        ``max_times_sampled`` and signature of the given ``tables`` instead of the
        checkpoint's (Reverb always uses the checkpoint's). With another ``max_size``
        items may get new keys (an old key then names the same item or none, never
        another), and the remover evicts what no longer fits.
      share_with_group: Create every segment of the buffer with mode 0660 instead of
        0600, so that members of this process's group (its effective gid) can attach
        with ``Client(name, trust_group=True)``. They can then read and write
        everything, including the pickled configuration that every attaching process
        unpickles: share only with a group whose members you trust as yourself. See
        ``docs/security.md``.

    Raises:
      ValueError: if ``tables`` is empty, has duplicate names, or a table is already
        served; if ``name`` is invalid; if both ``name`` and ``port`` are given, or
        ``port`` is not in 1..65535.
      TypeError: if ``port`` is not an int (a name goes in ``name=``).
      BufferExistsError: (a ``FileExistsError``) if a buffer with this name (or port)
        already exists; the message says whether its owner is alive (and its pid) or
        dead. (A port's buffer whose owner died is replaced, as a dead server's port
        is free again.)
      CheckpointError: if the checkpoint to restore cannot be read.
      SchemaError: if a table's signature does not match its checkpointed items.

    Example::

        with shmreplay.Server([shmreplay.Table.queue("q", 100)]) as server:
            client = shmreplay.Client(f"localhost:{server.port}")  # any process of this user
        with shmreplay.Server([shmreplay.Table.queue("q", 100)], name="demo") as server:
            client = shmreplay.Client("demo")
    """

    def __init__(self, tables: Optional[Sequence[Table]] = None, port: Optional[int] = None,
                 checkpointer=None, *, name: Optional[str] = None,
                 checkpoint: Optional[str] = None,
                 reset_rate_limiter: bool = False, override_config: bool = False,
                 share_with_group: bool = False):
        # The given tables are checked before a checkpoint's configuration may be
        # copied into them (a table another Server serves must not change).
        _check_name_or_port(name, port)
        _check_tables(tables or ())
        restoring = _checkpoint_to_restore(checkpoint, checkpointer)
        if restoring is not None:
            tables = _restore.tables_to_serve(restoring, tables, override_config)
        if not tables:
            raise ValueError("At least one table must be provided.")
        _check_tables(tables)
        if name is not None:
            names = [validate_name(name, "Buffer", _address.MAX_BUFFER_NAME)]
        elif port is not None:
            names = [_address.name_for_port(port)]
        else:  # the first free port, by exclusive creation
            names = [_address.name_for_port(p) for p in _address.free_port_candidates()]
        # Before anything is created: SIGTERM must remove what this process makes, the
        # warm-up's scratch buffer included.
        _install_hooks()
        # Before any actor can attach: a cold numba cache is filled here, once per
        # machine, instead of in every process at its first call.
        _warmup.warm_up()
        self._tables = list(tables)
        self._owner_pid = os.getpid()
        self._stopped = threading.Event()
        self._stop_lock = threading.RLock()
        restore = None if restoring is None else functools.partial(
            _restore_tables, restoring, reset_rate_limiter)
        root = None if checkpointer is None else checkpointer.path
        mode = 0o660 if share_with_group else 0o600
        for self._name in names:
            try:
                self._buffer = _create(self._name, self._tables, root, restore, mode)
                break
            except errors.SegmentSquattedError:
                if len(names) == 1:
                    raise  # (it names the path and its owner)
            except FileExistsError as exc:
                if len(names) == 1:
                    raise _name_taken(self._name) from exc
        else:
            raise errors.BufferExistsError(
                f"Server: no free port among {len(names)} tried; pass port= or name=.")
        for table, engine in zip(self._tables, self._buffer.engines):
            table._engine = engine
        _register(self)

    @property
    def name(self) -> str:
        """The buffer's address: pass it to ``shmreplay.Client``."""
        return self._name

    @property
    def address(self) -> str:
        """The buffer's address (its name), as ``name``: pass it to ``shmreplay.Client``."""
        return self._name

    @property
    def port(self) -> int:
        """The port clients reach this buffer at: ``Client(f"localhost:{port}")``."""
        port = _address.port_of(self._name)
        if port is None:
            raise AttributeError(
                f"Server(name={self._name!r}) has no port: it was created by name. Use "
                f"Client({self._name!r}) (or Client(server.name)), or create the Server "
                "with port= (or neither) for Client(f'localhost:{server.port}').")
        return port

    def localhost_client(self):
        """A ``Client`` attached to this buffer (Reverb's name for it)."""
        from shmreplay.client import Client
        return Client(self._name)

    def stop(self):
        """Closes every table (waking blocked callers with an error) and removes the buffer.

        Idempotent. Only the creating process removes anything: a forked child that
        inherited this object does nothing.
        """
        with self._stop_lock:  # (SIGTERM's thread and the main thread may both stop it)
            self._stop()

    def _stop(self, promptly: bool = False):
        """``stop``; ``promptly`` (on SIGTERM) compiles nothing: see ``TableEngine.close``."""
        if self._stopped.is_set() or os.getpid() != self._owner_pid:
            return
        self._stopped.set()
        buffer, self._buffer = self._buffer, None
        for engine in buffer.engines:
            if not engine.close(may_compile=not promptly):
                _log.warning(
                    "shmreplay: stopping buffer '%s': table '%s' stayed locked by %s; it was "
                    "marked closed without its lock", self._name, engine.name,
                    _lock_waits.describe_holder(engine.ctrl, self._name))
        buffer.header["state"] = 2  # STATE_STOPPED: attaching clients are refused
        if _still_named(self._name, buffer.segment):
            _buffer.unlink_all(self._name, len(self._tables))
        for table in self._tables:
            table._engine = None
        buffer.close()
        _unregister(self)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until ``stop()`` is called (from another thread), SIGTERM, or ``timeout``
        seconds (None: no limit); returns whether the server stopped. Ctrl-C raises
        ``KeyboardInterrupt``, as in Reverb."""
        return self._stopped.wait(timeout)

    @property
    def stopped(self) -> bool:
        """Whether ``stop`` was called (or a signal stopped the server)."""
        return self._stopped.is_set()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass

    def __reduce__(self):
        raise TypeError("A Server cannot be pickled; send server.name and use shmreplay.Client.")

    def __repr__(self):
        state = "stopped" if self.stopped else "serving"
        return f"Server(name={self._name!r}, tables={[t.name for t in self._tables]}, {state})"


def _name_taken(name: str) -> errors.BufferExistsError:
    """The error for a name that a buffer (or something else in /dev/shm) has: whose it
    is, whether its owner lives, and what to do."""
    seen = _peek.peek(name, tables=False)
    where = f"{_peek.SHM_DIR}/{_layout.SEGMENT_PREFIX}{name}"
    if seen.alive and seen.pid == os.getpid():
        owner = (f"its owner is this process (pid {seen.pid}): a Server of that name is "
                 "already running here. Stop it first, or pick another name")
    elif seen.alive:
        owner = (f"its owner, pid {seen.pid}, is alive. Pick another name (name=None picks "
                 "a unique one), or stop that Server first")
    elif seen.other_ns:
        owner = (f"its owner, pid {seen.pid} of another pid namespace (another container?), "
                 "cannot be checked from here. Pick another name, or stop that Server")
    elif seen.alive is False:
        owner = (f"its owner, pid {seen.pid}, is dead: it was killed before it could "
                 f"remove the buffer. `shmreplay gc` removes the buffers of dead owners "
                 f"(`shmreplay rm {name}` this one); then create the Server again")
    else:
        owner = (f"{where} is not a buffer this shmreplay can judge: {seen.problem}. If it "
                 f"stays, `shmreplay rm --force {name}` removes it")
    port = _address.port_of(name)
    what = (f"Server(port={port}): the buffer of that port ({name!r})" if port is not None
            else f"Server(name={name!r}): a buffer of that name")
    return errors.BufferExistsError(
        f"{what} already exists on this machine; {owner}. (`shmreplay ls` lists the "
        "buffers.)")


def _check_tables(tables):
    names = [getattr(t, "name", None) for t in tables]
    duplicates = sorted({n for n in names if names.count(n) > 1 and n is not None})
    if duplicates:
        raise ValueError(f"Multiple items in tables have the same name: {', '.join(duplicates)}.")
    for table in tables:
        if not isinstance(table, Table):
            raise TypeError(f"tables must be shmreplay.Table objects, got {table!r}.")
        if table._engine is not None:
            raise ValueError(f"Table '{table.name}' is already served by another Server.")


def _restore_tables(checkpoint, reset_rate_limiter, buffer):
    """Fills the new buffer's tables from ``checkpoint`` (tables it lacks stay empty)."""
    for engine in buffer.engines:
        saved = checkpoint.table(engine.name)
        if saved is not None:
            _restore.restore_table(engine, saved, reset_rate_limiter)


def _checkpoint_to_restore(path, checkpointer):
    """The checkpoint a new Server restores, read and checked; None to start empty."""
    if path is None and checkpointer is not None:
        path = checkpointer.path_to_restore()
    if path is None:
        return None
    if os.path.isdir(path):
        latest = checkpointers.latest_in(path)
        if latest is None:
            raise errors.CheckpointError(f"No checkpoint in directory {path}.")
        path = latest
    return _checkpoint.load(path)


# --- owner-exit cleanup -------------------------------------------------------------------

_live_servers = weakref.WeakSet()
_hooks_installed = False


def _check_name_or_port(name, port):
    """Refuses a port that is not a port (an old positional name, a checkpointer in
    Reverb's third place misplaced), and a buffer asked to have both."""
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)):
        raise TypeError(
            f"Server(tables, port, checkpointer): port must be an int or None, got "
            f"{type(port).__name__} {port!r}. A buffer name goes in name=, a "
            "checkpointer in checkpointer= (or third).")
    if port is not None and name is not None:
        raise ValueError(
            f"Server(port={port}, name={name!r}): give one; port P is the buffer named "
            f"'port-P', reached as 'localhost:P'.")
    if port is not None:
        _address.name_for_port(port)  # range check


def _create(name, tables, root, restore, mode):
    """``_buffer.create``; a port's buffer left by a dead owner is replaced first,
    as a dead server's port is free again (a name's is not: see ``_name_taken``)."""
    try:
        return _buffer.create(name, tables, checkpoint_root=root, restore=restore, mode=mode)
    except FileExistsError:
        if _address.port_of(name) is None or not _reclaim_dead(name):
            raise
    return _buffer.create(name, tables, checkpoint_root=root, restore=restore, mode=mode)


def _reclaim_dead(name) -> bool:
    """Removes buffer ``name`` if it is ours and its owner is dead; returns whether."""
    seen = _peek.peek(name, tables=False)
    if seen.alive is not False or seen.uid != os.getuid():
        return False
    header = _layout.SEGMENT_PREFIX + name
    try:  # the header we judged, not one a new owner made meanwhile
        if os.lstat(os.path.join(_peek.SHM_DIR, header)).st_ino != seen.inode:
            return False
    except FileNotFoundError:
        return True
    # The Clients still attached to it must fail (BufferBrokenError) instead of feeding
    # a buffer nobody will read again.
    _retire.retire(name, seen.inode)
    for entry in sorted(_peek.segments_of(name), key=lambda e: e == header):
        _segment.unlink("/" + entry)  # data segments first, the header last
    return True


def _still_named(name, segment) -> bool:
    """Whether the name still leads to this buffer's header segment: after ``shmreplay rm
    --force`` a new Server may have taken it, and its segments are not ours to remove."""
    try:
        return os.lstat(_peek.header_path(name)).st_ino == segment.inode
    except FileNotFoundError:
        return False  # removed already (rm --force, gc): its data segments with it


def _register(server):
    _live_servers.add(server)


def _install_hooks():
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_stop_all)
    if threading.current_thread() is threading.main_thread():
        # Only a signal that would kill the process outright (SIG_DFL: SIGTERM, usually)
        # needs a hook. Python's own SIGINT handler raises KeyboardInterrupt, which either
        # the program catches (the buffer must survive: think of Jupyter's interrupt) or
        # ends the interpreter through atexit. A handler the program installed is its own.
        for signum in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _on_signal)
        if signal.getsignal(signal.SIGTERM) is _on_signal:
            # Also when the main thread waits in native code and cannot run the handler.
            _termination.watch(signal.SIGTERM,
                               lambda: signal.getsignal(signal.SIGTERM) is _on_signal,
                               _stop_promptly)


def _unregister(server):
    _live_servers.discard(server)


def _stop_all(promptly: bool = False):
    for server in list(_live_servers):
        try:
            with server._stop_lock:
                server._stop(promptly)
        except errors.ShmReplayError:
            pass
    _buffer.abandon_creations()  # (a Server still being made: at exit or SIGTERM)


def _stop_promptly():
    _stop_all(promptly=True)


def _on_signal(signum, frame):
    _stop_all(promptly=True)
    # Then the default action: die by the same signal, so the exit status stays honest.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)

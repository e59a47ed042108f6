"""Snapshots of tables: every live item of a table, copied out under its lock.

The one consistent view of all of a table's items at once, for checkpoints
(``shmreplay._ops.checkpoint``). The table's lock is held only while its items are copied
into memory prepared beforehand; nothing else happens under it.
"""

import dataclasses
import gc
import itertools
import signal
import threading
import time
from typing import Dict

import numpy as np

from shmreplay import errors
from shmreplay._schema import item_forms as _item_forms
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay._shm import layout as L
from shmreplay._shm.kernels import codes, table as kernels

# Counters a restored table continues from (the rest are derived by ``rebuild``).
COUNTERS = ("C_NEXT_ID", "C_INSERTS", "C_SAMPLES", "C_DELETES", "C_TOTAL_INSERTED",
            "C_TOTAL_SAMPLED", "C_TOTAL_DELETED", "C_NUM_UNIQUE", "C_ORDER_SEQ",
            "C_UPDATE_SEQ", "C_EPISODE_REPEATS")
# Per-item fields saved from each slot's record (and the priority).
ITEM_FIELDS = {"key": L.M_KEY, "order": L.M_ORDER, "update": L.M_UPDATE, "times": L.M_TIMES}


@dataclasses.dataclass
class TableSnapshot:
    """One table's items and state, copied out of shared memory under its lock."""

    name: str
    config: object
    storage: object            # ``_storage.Storage``, or None if nothing was ever stored
    capacity: int
    slot_bits: int
    counters: Dict[str, int]
    arrays: Dict[str, np.ndarray]
    hold_seconds: float        # how long the table's lock was held for the copy

    @property
    def num_items(self) -> int:
        return len(self.arrays["key"])


def snapshot_table(engine) -> TableSnapshot:
    """Copies one table's live items under its lock (inserts and samples wait meanwhile).

    Items being written (not yet committed) are not part of the snapshot; live items
    are complete and immutable, so the copy is consistent. The destination memory is
    allocated and touched *before* the lock is taken: first-touch page faults cost more
    than the copy itself, and nobody should wait for them.

    While the lock is held, this thread runs no Python signal handler and no garbage
    collection (both are deferred to the release): a handler or finalizer that touched
    the same table from this thread would wait forever for the lock it holds (a
    Server's SIGINT/SIGTERM handler closes every table), and an exception raised
    between the lock and the ``try`` could leave the lock held by a live process.
    """
    room = rows_room = 0
    lock_wait = None
    for attempt in itertools.count():
        engine.has_columns()
        storage = engine.storage
        room = max(room, _room(engine.ctrl[L.C_SIZE] + engine.ctrl[L.C_PENDING],
                               engine.capacity, attempt))
        steps = storage is not None and storage.steps
        if steps:
            rows_room = max(rows_room, _room(engine.ctrl[L.C_ROW_FRESH],
                                             int(engine.ctrl[L.C_ROW_CAPACITY]), attempt))
        out = _Outputs(engine, room, rows_room)
        with _HeldQuietly():
            started = time.perf_counter()
            try:
                # One try: a busy lock is waited for below, outside the quiet block, where
                # Ctrl-C works (its holder may be a stopped process).
                count = _lock_waits.call(engine, time.monotonic(), 0.0, "checkpoint",
                                         kernels.hold_items, out.slots, out.fields,
                                         out.priority)
            except errors.LayoutResetError:  # reset meanwhile: look at the table again
                continue
            except errors.LockTimeoutError:
                count = codes.LOCK_BUSY
            if count >= 0:
                try:
                    stored_rows = int(engine.ctrl[L.C_ROW_FRESH])
                    if engine.ctrl[L.C_CLOSED]:
                        count = codes.CLOSED  # the owner stopped the buffer
                    elif (engine.storage is not storage or (count > 0 and storage is None)
                            or (steps and stored_rows > rows_room)):
                        # Storage appeared (some process defined it; a kernel that found
                        # it unmapped had it mapped), or rows grew, since we looked.
                        count = None
                    else:
                        kind = engine.kind  # (the storage's, checked just above)
                        counters = _copy_held(engine, out, kind, count, stored_rows)
                finally:
                    kernels.release_hold(engine.ctrl)
                held = time.perf_counter() - started
        if count is None:
            continue
        if count == codes.LOCK_BUSY:
            if lock_wait is None:
                lock_wait = _lock_waits.LockWait(engine, None, None, "checkpoint")
            lock_wait.again()
            continue
        if count <= _TOO_SMALL:
            room = _room(-count + _TOO_SMALL, engine.capacity, attempt + 1)
            continue
        if count < 0:
            engine._raise_status(count)
        break
    arrays = {name: out.fields[i, :count] for i, name in enumerate(ITEM_FIELDS)}
    arrays["priority"] = out.priority[:count]
    arrays["episode"] = out.episode[:count]
    if storage is not None:
        # Read after the release: an entry is checked against the item's key, so a slot
        # reused meanwhile reads as the usual form, never as another item's.
        arrays["forms"] = _item_forms.forms_of(engine, arrays["key"])
    if storage is not None:
        arrays.update(kind.export(out, count))
    if out.arena is not None:
        arrays["arena_lengths"], arrays["arena_data"] = out.arena
    return TableSnapshot(engine.name, engine.config, storage, engine.capacity,
                         int(engine.ctrl[L.C_SLOT_BITS]), counters, arrays, held)


def _copy_held(engine, out, kind, count, stored_rows):
    """Copies the held table's items into ``out``; returns its counters."""
    slots = out.slots[:count]
    # A table filled in order holds its items in one run of slots: copy slices.
    rows = slice(int(slots[0]), int(slots[0]) + count) if (
        count and kernels.ascending_run(slots)) else slots
    counters = {name: int(engine.ctrl[getattr(L, name)]) for name in COUNTERS}
    # Each item's episode: its writer's id if its record is its own, else -1 (its own).
    if engine.ctrl[L.C_EPISODES_RECORDED]:
        records = engine.episodes[slots]
        own = records[:, L.E_VERSION] == engine.meta[slots, L.M_VERSION]
        out.episode[:count] = np.where(own, records[:, L.E_EPISODE], -1)
    else:
        out.episode[:count] = -1
    if kind is not None:
        kind.copy_held(out, rows, count, stored_rows)
    if engine.arena is not None and engine.ctrl[L.C_ARENA_ITEMS]:
        out.arena = engine.arena.copy_held(slots)  # (items of another shape)
    return counters


class _HeldQuietly:
    """Defers Python signal handlers and the stop signals' default action (main thread
    only: no other thread runs them) and garbage collection for the duration of a
    ``with`` block; caught signals are raised again, to their own handlers, at its end."""

    def __enter__(self):
        self._gc = gc.isenabled()
        gc.disable()
        self._saved = {}
        self._caught = []
        if threading.current_thread() is threading.main_thread():
            for signum in _HANDLED_SIGNALS:
                handler = signal.getsignal(signum)
                # Ctrl-Z (SIGTSTP, or a background terminal read or write) would stop
                # the process with the table locked, and every other process with it:
                # its default action waits until the end too. (A signal mask would not
                # do: any other thread of the process would take the signal.)
                if callable(handler) or (signum in _STOP_SIGNALS
                                         and handler == signal.SIG_DFL):
                    self._saved[signum] = handler
                    signal.signal(signum, self._note)
        return self

    def _note(self, signum, frame):
        self._caught.append(signum)

    def __exit__(self, *exc):
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        if self._gc:
            gc.enable()
        for signum in dict.fromkeys(self._caught):
            signal.raise_signal(signum)  # its handler runs now, the lock released
        return False


# Signals whose Python handlers are deferred while a table is held (not the ones a fault
# raises: their handlers cannot wait).
_HANDLED_SIGNALS = tuple(sorted(
    set(signal.valid_signals())
    - {signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
       signal.SIGILL, signal.SIGABRT, signal.SIGTRAP}))


_STOP_SIGNALS = {signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}

_TOO_SMALL = -1000  # hold_items: -(count + 1000) when the outputs have too little room


def _room(count, limit, attempt) -> int:
    """Rows to prepare for ``count`` items or rows, with a margin for ones added meanwhile.

    The margin doubles with each attempt, so a snapshot finishes even while inserts
    outrun its preparation (a fixed margin retried for as long as they did); at
    ``limit`` every item fits.
    """
    return int(min(limit, count + (max(1024, count // 16) << min(attempt, 40))))


class _Outputs:
    """The destination arrays of one snapshot, touched page by page in advance."""

    def __init__(self, engine, room, rows_room):
        self.slots = _touched((room,), np.int64)
        self.fields = _touched((len(ITEM_FIELDS), room), np.int64)
        self.priority = _touched((room,), np.float64)
        self.episode = _touched((room,), np.int64)
        self.stores = []
        self.refs = None
        self.arena = None  # (lengths, bytes) of the arena items, if the table has any
        storage = engine.storage
        if storage is None:
            return
        if storage.steps:
            self.refs = _touched((room, engine.refs.shape[1]), engine.refs.dtype)
        n = rows_room if storage.steps else room
        self.stores = [_touched((n,) + column.shape[1:], column.dtype)
                       for column in engine.columns]


def _touched(shape, dtype) -> np.ndarray:
    array = np.empty(shape, dtype)
    flat = array.reshape(-1).view(np.uint8)
    flat[::4096] = 0  # one write per page: the kernel maps it now
    return array

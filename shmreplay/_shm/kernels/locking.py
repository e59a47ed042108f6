"""A table's robust mutex, and blocking and waking its waiters (``shmreplay._shm.sync``).

``_lock`` repairs the table when the previous holder died; ``_block`` registers a caller
that must wait and hands back the futex value to wait on; ``_unlock_and_wake`` wakes
waiters only when the operation changed what they wait for. Also the waits that take no
slot: for items, and for the rate limiter (``rate_check``).
"""

from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes, items, kernel, rows as step_rows
from shmreplay._shm.layout import (
    C_CLOSED, C_ITEMS_SEQ, C_ITEMS_WAITERS, C_RECOVERIES, C_SIZE, C_ROWS_DIRTY, C_SPACE_SEQ,
    C_SPACE_WAITERS, C_STOP_PID, C_STOP_POINT)

BROKEN = -4  # the mutex is unrecoverable (cannot happen unless memory was corrupted)


@kernel
def _lock(ctrl, fctrl, meta, prio, trees, refs, rows):
    address = ctrl.ctypes.data
    result = _sync.mutex_trylock(address)
    spins = 0
    while result == _sync.EBUSY and spins < _sync.LOCK_SPINS:
        result = _sync.mutex_trylock(address)
        spins += 1
    if result == _sync.EBUSY:
        result = _sync.timed_lock(address, _sync.LOCK_SLICE_NS)
        if result == _sync.ETIMEDOUT:
            return codes.LOCK_BUSY
    if result == _sync.EOWNERDEAD:
        items.rebuild(ctrl, fctrl, meta, prio, trees, refs, rows)
        ctrl[C_RECOVERIES] += 1
        _sync.mutex_consistent(ctrl.ctypes.data)
        result = 0
    if result != 0:
        return BROKEN
    if ctrl[C_ROWS_DIRTY] != 0 and refs.shape[1] > 0 and step_rows.mapped(ctrl, refs, rows):
        step_rows.rebuild(ctrl, meta, refs, rows)
    return 0


@kernel
def _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows):
    """``_lock`` for calls that may add or remove items.

    Removing an item releases its step rows, so a process that has not mapped the
    table's step storage yet (placeholder arrays) must not: it gets ``UNMAPPED``, maps
    the storage and calls again.
    """
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if not step_rows.mapped(ctrl, refs, rows):
        _unlock(ctrl)
        return codes.UNMAPPED
    return 0


@kernel
def _lock_open(ctrl, fctrl, meta, prio, trees, refs, rows):
    """``_lock_items``, then ``CLOSED`` (unlocked) if the buffer was stopped."""
    status = _lock_items(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status == 0 and ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    return status


@kernel
def _unlock(ctrl):
    _sync.mutex_unlock(ctrl.ctypes.data)


@kernel
def _unlock_and_wake(ctrl, wake_items, wake_space):
    wake_items = wake_items and ctrl[C_ITEMS_WAITERS] > 0
    wake_space = wake_space and ctrl[C_SPACE_WAITERS] > 0
    _sync.mutex_unlock(ctrl.ctypes.data)
    if wake_items:
        _sync.futex_wake_all(ctrl, C_ITEMS_SEQ)
    if wake_space:
        _sync.futex_wake_all(ctrl, C_SPACE_SEQ)


@kernel
def _stop_point(ctrl, point):
    """A crash point: stops this process here if a test armed ``point`` for it."""
    if ctrl[C_STOP_POINT] == point:
        _sync.stop_self_if(ctrl[C_STOP_PID])


@kernel
def _bump(ctrl, word):
    ctrl[word] = (ctrl[word] + 1) & 0xFFFFFFFF


@kernel
def _block(ctrl, waiters, word, register, io):
    if register:
        ctrl[waiters] += 1
    io[0] = ctrl[word]
    _unlock(ctrl)
    return codes.BLOCKED


@kernel
def wake_all(ctrl):
    """Bumps both futex words and wakes every waiter, without the lock (``stop`` when a
    stopped process holds it: waiters then see ``C_CLOSED``)."""
    _bump(ctrl, C_ITEMS_SEQ)
    _bump(ctrl, C_SPACE_SEQ)
    _sync.futex_wake_all(ctrl, C_ITEMS_SEQ)
    _sync.futex_wake_all(ctrl, C_SPACE_SEQ)


@kernel
def rate_check(ctrl, fctrl, meta, prio, trees, refs, rows, n, inserting):
    """``can_insert(n)`` if ``inserting`` else ``can_sample(n)``, under the lock."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if inserting:
        allowed = items.can_insert(ctrl, fctrl, n)
    else:
        allowed = items.can_sample(ctrl, fctrl, n)
    _unlock(ctrl)
    return 1 if allowed else 0


@kernel
def wait(ctrl, word, expected, timeout_ns, timespec):
    """Sleeps on a futex word until it changes or ``timeout_ns`` passes."""
    return _sync.futex_wait(ctrl, word, expected, timeout_ns, timespec)


@kernel
def unwait(ctrl, fctrl, meta, prio, trees, refs, rows, waiters_word):
    """Withdraws a waiter registration (the caller gave up: timeout)."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if ctrl[waiters_word] > 0:
        ctrl[waiters_word] -= 1
    _unlock(ctrl)
    return 0


@kernel
def wait_for_items(ctrl, fctrl, meta, prio, trees, refs, rows, was_waiting, register, io):
    """Returns the table size once it is non-zero (BLOCKED while empty); takes nothing."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    if was_waiting and ctrl[C_ITEMS_WAITERS] > 0:
        ctrl[C_ITEMS_WAITERS] -= 1
    if ctrl[C_CLOSED] != 0:
        _unlock(ctrl)
        return codes.CLOSED
    size = ctrl[C_SIZE]
    if size == 0:
        return _block(ctrl, C_ITEMS_WAITERS, C_ITEMS_SEQ, register, io)
    _unlock(ctrl)
    return size

"""A table engine's calls that wait: for the rate limiter (futex sleeps) and for the
table's lock (``LOCK_BUSY``, see ``shmreplay._shm.lock_waits``); and the kernels' statuses
turned into typed errors.

``TableEngine`` takes these methods from ``Waiting``.
"""

import time

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay._shm import sync as _sync
from shmreplay._shm.kernels import codes
from shmreplay._shm.kernels import table as kernels
from shmreplay._engine import growth as _growth
from shmreplay._engine.inserts import RECLAIM_EVERY


class Waiting:
    """``TableEngine``'s waiting and status methods (see the module docstring)."""

    def _raise_status(self, status):
        if status == codes.NO_ROWS:
            if self.storage.variable:
                raise errors.SchemaError(
                    f"Table '{self.name}': the item needs more steps or references than "
                    f"the table's whole step budget ({self.ctrl[L.C_ROW_CAPACITY]} steps, "
                    f"{self.storage.pool_blocks * (self.storage.block_width - 1)} "
                    "references) even with every other item evicted; nothing was stored. "
                    "Give the Table a larger max_steps (docs/writers.md).")
            raise errors.SchemaError(
                f"Table '{self.name}': an item references more distinct steps than its step "
                f"storage can hold ({self.ctrl[L.C_ROW_CAPACITY]} rows, sized for "
                f"{self.storage.steps_per_item} steps per item).")
        if status == codes.NO_ARENA:
            raise errors.ArenaFullError(
                f"Table '{self.name}': an item of another shape does not fit the table's "
                "general store (arena) even with the table emptied; give the table a "
                "larger Table(..., arena_bytes=N).")
        if status == codes.LOST:
            raise errors.ReservationLostError(
                f"Table '{self.name}' of buffer '{self.buffer_name}': this writer's reserved "
                "slot was freed by another process that judged the writer dead, so the item "
                "was not inserted (the table is intact); insert it again. If this recurs, "
                "run every process of the buffer in one pid namespace (docs/design.md, "
                "'Pid namespaces').")
        if status == codes.CLOSED:
            raise errors.BufferBrokenError(
                f"Buffer '{self.buffer_name}' was stopped by its owner, or removed with "
                f"`shmreplay gc`/`rm` (table '{self.name}'): attach to the buffer that "
                "replaces it, if any, with a new Client.")
        raise errors.BufferBrokenError(
            f"Table '{self.name}' of buffer '{self.buffer_name}' is corrupt (status {status}).")

    def _call(self, kernel, *args):
        """Calls a locked kernel; maps the step storage first if the kernel asks for it.
        Waits for a busy lock without a limit (Ctrl-C interrupts it; a long wait is
        logged, naming the holder)."""
        return _lock_waits.call(self, None, None, None, kernel, *args)

    def _map_step_storage(self):
        """Maps the storage a kernel said we lack (``UNMAPPED``); it must exist by then.

        Raises:
          LayoutResetError: the layout this process mapped was forgotten (``reset``);
            the mapping is dropped, and the caller starts again with the current one.
        """
        generation = int(self.ctrl[L.C_LAYOUT_GEN])
        if generation != self.layout_gen:
            self._drop_layout(generation)
            raise errors.LayoutResetError(
                f"Table '{self.name}' of buffer '{self.buffer_name}' was reset and its "
                "layout forgotten during this call; call again.")
        if not self.has_columns():
            raise errors.BufferBrokenError(
                f"Table '{self.name}' of buffer '{self.buffer_name}' stores steps, but its "
                "data segment is missing or unfinished: the buffer is corrupt.")

    def _blocking(self, call, waiters_word, seq_word, timeout, inserting, make_args, io=None,
                  grow_wanted=1):
        """Runs ``call`` until it is not BLOCKED, sleeping on the futex in between; grows
        the table's stores when it returns GROW (``grow_wanted``: the slots or step rows
        the call takes).

        A call that ends while registered as a waiter (Ctrl-C during the sleep, a lock
        that stayed busy, a stopped buffer) withdraws its registration, so that
        ``shmreplay top`` never counts a phantom waiter.
        """
        if io is None:
            io = np.zeros(3, np.int64)
        timespec = np.zeros(2, np.int64)
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        what = "insert" if inserting else "sample"
        waiting = [0]  # registered as a waiter: the kernel's ``was_waiting`` next time
        lock_wait = None
        next_reclaim = time.monotonic() + RECLAIM_EVERY
        try:
            while True:
                register = 0 if timeout is not None and timeout <= 0 else 1
                status = call(*self.arrays, *make_args(waiting[0], register), io)
                if status == codes.LOCK_BUSY:  # the kernel did nothing: still registered
                    if lock_wait is None:
                        lock_wait = _lock_waits.LockWait(self, deadline, timeout, what)
                    lock_wait.again()
                    continue
                if status == codes.UNMAPPED:  # (refused before it withdrew anything)
                    self._map_step_storage()
                    continue
                waiting[0] = 0  # the kernel withdrew it (and registers again if BLOCKED)
                if status >= 0:
                    return status
                if status == codes.GROW:  # (nothing done: reserve more, call again)
                    _growth.grow(self, grow_wanted)
                    continue
                if status != codes.BLOCKED:
                    self._raise_status(status)
                waiting[0] = register
                now = time.monotonic()
                remaining = (_sync.WAIT_SLICE if deadline is None
                             else min(deadline - now, _sync.WAIT_SLICE))
                if remaining <= 0:
                    if waiting[0]:
                        waiting[0] = 0
                        self._withdraw_waiter(waiters_word)
                    if inserting and self.ctrl[L.C_PENDING] > 0 and now >= self._reclaim_at:
                        # A call that does not wait (timeout 0) may be refused only because
                        # a dead writer's reservation holds the room: free those (at most
                        # every RECLAIM_EVERY s), then try once more.
                        self._reclaim_at = now + RECLAIM_EVERY
                        if self.reclaim_dead_writers():
                            continue
                    raise errors.DeadlineExceededError(
                        f"Table '{self.name}': the rate limiter did not allow the {what} "
                        f"within the timeout of {errors.seconds(timeout)}.")
                kernels.wait(self.ctrl, seq_word, io[0], int(remaining * 1e9), timespec)
                if self.closed_here:
                    raise errors.ClosedError(
                        f"Table '{self.name}': its Client was closed (by another thread) "
                        f"while this {what} waited.")
                if inserting and time.monotonic() >= next_reclaim:
                    self.reclaim_dead_writers()
                    next_reclaim = time.monotonic() + RECLAIM_EVERY
        except BaseException:
            if waiting[0]:
                self._withdraw_waiter(waiters_word)
            raise

    def _withdraw_waiter(self, waiters_word):
        """``unwait``; gives up after a second if the lock stays busy (the count is then
        off by one until that waiter's process ends)."""
        try:
            _lock_waits.call(self, time.monotonic() + 1.0, 1.0, "withdrawal of a waiter",
                             kernels.unwait, waiters_word)
        except errors.ShmReplayError:
            pass

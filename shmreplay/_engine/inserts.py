"""Inserting into a table: reserve a slot (and step rows) under the lock, copy the
data without it, commit under the lock.

``TableEngine`` takes these methods from ``Inserting``. A reserved slot is WRITING for
its process until committed or cancelled; a writer that dies holding one is found by
``reclaim_dead_writers``. Small whole items take one native call and one lock hold
(``kernels.insert_staged``), batches two (``reserve_whole``, ``commit_whole``).
"""

import time

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay._engine import staging as _staging
from shmreplay._shm.kernels import codes
from shmreplay._shm.kernels import table as kernels
from shmreplay._shm.procs import STAMP as _STAMP, writer_alive

RECLAIM_EVERY = 0.2  # seconds of blocked inserting between scans for dead writers
_SCRATCH_IO = np.zeros(2, np.int64)  # for calls that never wait (its content is unused)
# The remover writes the evicted item's probability here; nobody reads it, so threads
# may share it.
_SCRATCH_PROB = np.empty(2, np.float64)


def _deadline(timeout):
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


class Inserting:
    """``TableEngine``'s inserting methods (see the module docstring)."""

    def insert_one(self, leaves, priority: float, timeout):
        """Inserts one validated item; returns its key.

        A small item goes through a staging block and one native call (one lock hold);
        otherwise, or when that call is blocked: reserve, copy without the lock, commit.
        """
        stagings = self._stagings
        if stagings is not None:
            try:
                staging = stagings.pop()  # atomic: this thread's alone until appended
            except IndexError:
                staging = _staging.Staging(self.column_specs, self._stores)
            try:
                for row, leaf in zip(staging.rows, leaves):
                    row[0] = leaf
                key = kernels.insert_staged(self._header_bytes, self._table_offsets,
                                            self._data_bytes, staging.block, staging.layout,
                                            priority, _STAMP[0], _SCRATCH_PROB)
            finally:
                stagings.append(staging)
            if key > 0:
                return key
            if key != codes.BLOCKED and key != codes.LOCK_BUSY and key != codes.GROW:
                self._raise_status(key)
        deadline = _deadline(timeout)
        slot = kernels.reserve_one(*self.arrays, _STAMP[0])
        if slot < 0:
            if slot != codes.BLOCKED and slot != codes.LOCK_BUSY and slot != codes.GROW:
                self._raise_status(slot)
            slot = self.reserve(1, timeout)[0]
        try:
            for column, leaf in zip(self.columns, leaves):
                column[slot] = leaf
        except BaseException:
            self.cancel(np.array([slot]))
            raise
        key = kernels.commit_one(*self.arrays, slot, priority, _SCRATCH_PROB, _STAMP[0], 0)
        if key == codes.LOCK_BUSY:
            key = self._commit_when_free(
                lambda: kernels.commit_one(*self.arrays, slot, priority, _SCRATCH_PROB,
                                           _STAMP[0], 0),
                np.array([slot]), deadline, timeout)
        if key < 0:
            self._raise_status(key)
        return key

    def insert_many(self, leaves, priorities, count: int, timeout):
        """Inserts a validated batch into this whole-item table; returns the keys (uint64
        [B]), or None if a priority is invalid (checked natively; nothing changed).

        Two native calls around the copy (reserve, then commit), which runs without the
        lock: one slice per column when the slots are one run, as they usually are.
        """
        work = np.empty(5 * count + 1, np.int64)  # slots, run start, commit's scratch
        deadline = _deadline(timeout)
        status = kernels.reserve_whole(self._header_bytes, self._table_offsets, count,
                                       priorities, self.max_priority, _STAMP[0], work,
                                       _SCRATCH_IO)
        if status == codes.INVALID_PRIORITY:
            return None
        if status < 0:
            if status != codes.BLOCKED and status != codes.LOCK_BUSY and status != codes.GROW:
                self._raise_status(status)
            work[:count] = self.reserve(count, timeout)
            work[count] = work[0] if kernels.ascending_run(work[:count]) else -1
        first = int(work[count])
        try:
            if first >= 0:
                rows = slice(first, first + count)
                for column, leaf in zip(self.columns, leaves):
                    column[rows] = leaf
            else:
                self.write(work[:count], leaves, True)
        except BaseException:
            self.cancel(work[:count])
            raise
        keys = np.empty(count, np.uint64)
        status = kernels.commit_whole(self._header_bytes, self._table_offsets, work, count,
                                      priorities, keys, _SCRATCH_PROB, _STAMP[0])
        if status == codes.LOCK_BUSY:
            status = self._commit_when_free(
                lambda: kernels.commit_whole(self._header_bytes, self._table_offsets, work,
                                             count, priorities, keys, _SCRATCH_PROB, _STAMP[0]),
                work[:count].copy(), deadline, timeout)
        if status < 0:
            self._raise_status(status)
        return keys

    def _commit_when_free(self, commit, slots, deadline, timeout):
        """Calls ``commit()`` (which returned ``LOCK_BUSY`` once) until the lock is free;
        returns its status. At ``deadline`` (or on Ctrl-C) gives the reserved ``slots``
        up, to be cancelled later (``_settle_abandoned``), and raises."""
        lock_wait = _lock_waits.LockWait(self, deadline, timeout, "insert")
        while True:
            try:
                lock_wait.again()
            except BaseException:
                self._abandoned.extend(int(slot) for slot in slots)
                raise
            status = commit()
            if status != codes.LOCK_BUSY:
                return status

    def _settle_abandoned(self):
        """Cancels the slots that calls gave up after reserving them (their commit found
        the lock held until their deadline), and frees the slots samples deleted but
        could not release. They stay WRITING or DRAINING for this process until then;
        if the lock is still busy, until the next try."""
        slots, self._abandoned[:] = list(self._abandoned), []
        undrained, self._undrained[:] = list(self._undrained), []
        try:
            if slots:
                _lock_waits.call(self, time.monotonic() + 0.1, 0.1, "cancel", kernels.cancel,
                                 np.array(slots, np.int64),
                                 np.full(len(slots), _STAMP[0], np.int64))
                slots = []
            while undrained:
                drained_slots, versions = undrained[-1]
                _lock_waits.call(self, time.monotonic() + 0.1, 0.1, "release",
                                 kernels.release_drained, drained_slots, versions, _STAMP[0])
                undrained.pop()
        except errors.LockTimeoutError:
            self._abandoned.extend(slots)
            self._undrained.extend(undrained)

    def reserve(self, n: int, timeout):
        """Reserves ``n`` slots to write (blocks on the rate limiter and on free slots;
        grows the stores' reserved memory when the slots need it)."""
        if self._abandoned or self._undrained:
            self._settle_abandoned()
        slots = np.empty(n, np.int64)
        stamp = _STAMP[0]
        self._blocking(kernels.reserve, L.C_SPACE_WAITERS, L.C_SPACE_SEQ, timeout, True,
                       lambda was_waiting, register: (n, stamp, was_waiting, register, slots),
                       grow_wanted=n)
        return slots

    def write(self, slots, leaves, batched: bool):
        """Copies one item's (or a batch's) leaves into the reserved slots, without the lock."""
        if batched:
            if kernels.ascending_run(slots):
                rows = slice(int(slots[0]), int(slots[0]) + len(slots))
            else:
                rows = slots
            for column, leaf in zip(self.columns, leaves):
                column[rows] = leaf
        else:
            slot = slots[0]
            for column, leaf in zip(self.columns, leaves):
                column[slot] = leaf

    def reserve_item(self, known_rows, known_gens, ref_steps, timeout):
        """Reserves a slot and step rows for one item of step storage (blocking).

        See ``kernels.reserve_item``. Returns ``(slot, rows, fresh)``: the row of each
        distinct step, and whether it is new (to be written by the caller).
        """
        distinct = known_rows.shape[0]
        if self.storage.variable:  # (the item's column lengths come first)
            columns = len(self.storage.columns)
            wanted = columns + int(ref_steps[:columns].sum())
            ok = (ref_steps.shape[0] == wanted and ref_steps[:columns].min() >= 0
                  and 0 < distinct and ref_steps[columns:].max(initial=0) < distinct)
        else:
            wanted = self.refs.shape[1]
            ok = (ref_steps.shape[0] == wanted and 0 < distinct <= len(ref_steps)
                  and ref_steps.max(initial=0) < distinct)
        if not ok or ref_steps.min(initial=0) < 0:
            raise ValueError(f"Table '{self.name}': an item of step storage needs "
                             f"{wanted} references (got {ref_steps.shape[0]}) over "
                             f"1..{ref_steps.shape[0]} distinct steps (got {distinct}).")
        rows = np.empty(distinct, np.int64)
        fresh = np.empty(distinct, np.int64)
        stamp = _STAMP[0]
        slot = self._blocking(
            kernels.reserve_item, L.C_SPACE_WAITERS, L.C_SPACE_SEQ, timeout, True,
            lambda was_waiting, register: (known_rows, known_gens, ref_steps, stamp, was_waiting,
                                           register, rows, fresh), grow_wanted=distinct)
        return slot, rows, fresh

    def commit(self, slots, priorities, deadline=None, timeout=None, repeats=0):
        """Publishes reserved ``slots``; ``repeats`` of them continue an episode that has
        a live item in the table (``table_info.EpisodeStays``). Returns the keys."""
        keys = np.empty(len(slots), np.int64)
        touched = np.empty((2, 2 * len(slots)), np.int64)
        status = kernels.commit(*self.arrays, slots, priorities, keys, _SCRATCH_PROB, touched,
                                _STAMP[0], repeats)
        if status == codes.LOCK_BUSY:
            status = self._commit_when_free(
                lambda: kernels.commit(*self.arrays, slots, priorities, keys, _SCRATCH_PROB,
                                       touched, _STAMP[0], repeats),
                slots, deadline, timeout)
        if status < 0:
            self._raise_status(status)
        return keys.view(np.uint64)

    def cancel(self, slots):
        self._call(kernels.cancel, slots, np.full(len(slots), _STAMP[0], np.int64))

    def reclaim_dead_writers(self) -> int:
        """Frees slots reserved by writers that died before committing them.

        Only writers of this process's pid namespace are judged: another namespace's
        slots stay reserved (``shmreplay._shm.procs``; the docs' "pid namespaces").
        """
        if self._abandoned or self._undrained:
            self._settle_abandoned()
        slots = np.empty(self.capacity, np.int64)
        stamps = np.empty(self.capacity, np.int64)
        count = kernels.writing_slots(*self.arrays, slots, stamps)
        dead = [i for i in range(max(count, 0)) if writer_alive(int(stamps[i])) is False]
        if not dead:
            return 0
        return self._call(kernels.cancel, slots[dead], stamps[dead])

"""Sampling a table: draw under the lock, copy without it, re-check the copy.

``TableEngine`` takes these methods from ``Sampling``. A draw marks what it took (slot
versions, row generations); the rows are copied after the lock is released, and a row
whose slot or step rows changed meanwhile (torn) is drawn again. Items that
``max_times_sampled`` deletes stay DRAINING until their copy is done. Small batches of
whole items take one native call (``kernels.sample_gather``); the rest go the general
way, which may wait for the rate limiter.
"""

import os
import time

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors
from shmreplay._shm import lock_waits as _lock_waits
from shmreplay._shm.kernels import codes
from shmreplay._shm.kernels import table as kernels
from shmreplay._shm.procs import STAMP as _STAMP
from shmreplay.replay_sample import PaddedSample, ReplaySample, SampleInfo


_seeded_pid = None


def seed_once():
    """Seeds this process's sampling RNG the first time it maps a table."""
    if _seeded_pid != os.getpid():
        _seed_rng()


def _seed_rng():
    """numba keeps its own RNG per process: seed it from the OS once per process.

    Called when a process first maps a table (not at import: importing compiles
    nothing), and again in forked children, which would otherwise replay the parent's
    draws.
    """
    global _seeded_pid
    kernels.seed(int.from_bytes(os.urandom(4), "little"))
    _seeded_pid = os.getpid()


def _reseed_if_seeded():
    if _seeded_pid is not None:
        _seed_rng()


os.register_at_fork(after_in_child=_reseed_if_seeded)


class _MappedNow(Exception):
    """The table's layout was mapped during a sample: sample again (``timeout``: what is
    left of the caller's)."""

    def __init__(self, timeout):
        super().__init__()
        self.timeout = timeout


class Sampling:
    """``TableEngine``'s sampling methods (see the module docstring)."""

    def sample(self, batch_size: int, timeout):
        """Samples ``batch_size`` items and copies them; returns a ReplaySample.

        Waits while the rate limiter allows no sample. Returns fewer rows only if the
        table ran out of items (``max_times_sampled``), or if ``timeout`` expired after at
        least one row was taken.
        """
        results = self._results
        if results is not None:  # whole items: small batches reuse their arrays
            outputs = results.claim(batch_size)
            if outputs is not None:
                try:
                    # One native call draws, copies and re-checks the batch.
                    status = kernels.sample_gather(self._header_bytes, self._table_offsets,
                                                   batch_size, _STAMP[0], self._data_bytes,
                                                   outputs.block, outputs.layout)
                    if status == batch_size:
                        return outputs.result(batch_size)
                    if status != codes.UNFINISHED:
                        self._raise_status(status)
                    return self._sample_waiting(batch_size, timeout, outputs)
                finally:
                    results.release(outputs)
        try:
            return self._sample_waiting(batch_size, timeout)
        except _MappedNow as mapped:
            return self.sample(batch_size, mapped.timeout)  # (the calls the layout bound)

    def sample_items(self, batch_size: int, timeout):
        """``(batch, arena_rows)``: ``sample``, and the rows that are items of another
        shape (``kinds.general``; a table with an arena binds its own)."""
        try:
            return self._sample_waiting(batch_size, timeout), {}
        except _MappedNow as mapped:
            return self.sample_items(batch_size, mapped.timeout)

    def _sample_waiting(self, batch_size: int, timeout, outputs=None, gather=None):
        """The paths of ``sample`` that may wait. The waits inside see only what is
        left of ``timeout``; a timeout names the caller's. ``gather`` replaces the
        kind's copy (the general store's sampling: ``kinds.general``)."""
        try:
            if outputs is not None:
                return self._finish_into(outputs, batch_size, timeout)
            deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
            if self.columns is None:
                if not self.has_columns():
                    # Nothing was ever inserted: wait for the first item, then map its
                    # columns.
                    self._blocking(kernels.wait_for_items, L.C_ITEMS_WAITERS,
                                   L.C_ITEMS_SEQ, timeout, False,
                                   lambda was_waiting, register: (was_waiting, register))
                    self.has_columns()
                # Mapped just now, which bound its kind's and its general store's calls
                # (``TableEngine._map_columns``): the caller samples again through them,
                # before anything is drawn (this call's lookup predates them).
                remaining = None if deadline is None else deadline - time.monotonic()
                if gather is not None:  # (the general store's own call, after a reset)
                    return self.sample(batch_size, remaining)
                raise _MappedNow(remaining)
            return self._sample_new(batch_size, deadline, gather or self._gather)
        except errors.LockTimeoutError:
            raise
        except errors.DeadlineExceededError:
            raise errors.DeadlineExceededError(
                f"Table '{self.name}': the rate limiter did not allow the sample within the "
                f"timeout of {errors.seconds(timeout)}.") from None

    def _finish_into(self, outputs, batch_size, timeout):
        """``sample_gather`` was blocked, stopped early, deleted what it drew, or found
        torn rows: the general steps finish the batch (copying its rows again, which is
        cheap next to any of these)."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        io = outputs.io
        count, _ = self._complete(batch_size, io.item(kernels.GATHER_COUNT), outputs.out_i,
                                  outputs.out_f, outputs.gens, io, deadline,
                                  outputs.gather_from(self.columns))
        outputs.times[:count] = outputs.out_i[kernels.OUT_TIMES, :count]
        return outputs.result(count)

    def _sample_new(self, batch_size, deadline, gather):
        """The general path: new arrays for the result."""
        out_i = np.empty((kernels.OUT_INT_ROWS, batch_size), np.int64)
        out_f = np.empty((kernels.OUT_FLOAT_ROWS, batch_size), np.float64)
        out_gens = np.empty((batch_size, self.refs.shape[1]), np.int32)
        io = np.zeros(3, np.int64)
        count = kernels.sample(*self.arrays, batch_size, _STAMP[0], 0, 0, out_i, out_f, out_gens,
                               io)
        count, data = self._complete(batch_size, count, out_i, out_f, out_gens, io, deadline,
                                     gather)
        out_i = out_i[:, :count]
        out_f = out_f[:, :count]
        info = SampleInfo(out_i[kernels.OUT_KEY].view(np.uint64), out_f[kernels.OUT_PROBABILITY],
                          out_i[kernels.OUT_TABLE_SIZE], out_f[kernels.OUT_PRIORITY],
                          out_i[kernels.OUT_TIMES].astype(np.int32))
        lengths = getattr(data, "lengths", None)
        if lengths is None:
            return ReplaySample(info, self._unflatten(data))
        padded = PaddedSample(info, self._unflatten(data))  # items of any length
        padded.lengths = self._unflatten(list(lengths[:count].T))
        return padded

    def _complete(self, batch_size, count, out_i, out_f, out_gens, io, deadline, gather):
        """Finishes a draw whose first kernel call returned ``count``: waits if it was
        blocked, fills the batch as the rate limiter allows, copies the rows with
        ``gather(slots)``, redraws torn ones, and frees the slots of items it deleted.

        Returns ``(count, data)``: rows taken, and one array per column.
        """
        if count < 0:
            count = self._draw_blocking(batch_size, out_i, out_f, out_gens, io, deadline, count)
        reserves = io.item(1)
        drained = io.item(2)
        try:
            if count < batch_size and io.item(0) > 0:
                # The rate limiter stopped the batch early: wait for credit, fill the rest.
                count, more = self._fill(out_i, out_f, out_gens, count, deadline)
                drained += more
            slots = out_i[kernels.OUT_SLOT, :count]
            data = gather(slots)
            # Slots or rows reused: check ours. (A chain of pool blocks is torn by its
            # item's removal alone, which need not reserve anything: always checked.
            # References in slot heads stay until the slot is reserved again.)
            if self.ctrl.item(L.C_RESERVES) != reserves or getattr(data, "chained", False):
                torn = np.empty(count, np.int64)
                torn_count = kernels.torn_rows(self.meta, self.refs, self.rows, slots,
                                               out_i[kernels.OUT_VERSION, :count],
                                               out_gens[:count], torn)
                if torn_count:
                    drained += self._redraw_torn_rows(out_i, out_f, out_gens, data,
                                                      torn[:torn_count].tolist(), gather)
        finally:
            if drained:
                # Items this call deleted (max_times_sampled) kept their slots until now.
                self._release_drained(out_i[kernels.OUT_SLOT, :count],
                                      out_i[kernels.OUT_VERSION, :count], deadline)
        return count, data

    def _release_drained(self, slots, versions, deadline):
        """Frees the slots this call deleted once copied; if the lock stays held until
        ``deadline``, later (``_settle_abandoned``), so that the sample is not lost."""
        status = kernels.release_drained(*self.arrays, slots, versions, _STAMP[0])
        if status != codes.LOCK_BUSY:
            return
        try:
            _lock_waits.call(self, deadline, None, "sample", kernels.release_drained, slots,
                             versions, _STAMP[0])
        except errors.LockTimeoutError:
            self._undrained.append((slots.copy(), versions.copy()))

    def _draw_blocking(self, batch_size, out_i, out_f, out_gens, io, deadline, status):
        if status not in (codes.BLOCKED, codes.UNMAPPED, codes.LOCK_BUSY):
            self._raise_status(status)
        timeout = None if deadline is None else deadline - time.monotonic()
        pid = _STAMP[0]  # (DRAINING slots record it; release_drained checks it)
        return self._blocking(
            kernels.sample, L.C_ITEMS_WAITERS, L.C_ITEMS_SEQ, timeout, False,
            lambda was_waiting, register: (batch_size, pid, was_waiting, register, out_i,
                                           out_f, out_gens), io)

    def _fill(self, out_i, out_f, out_gens, count, deadline):
        """Draws the rest of a batch as the rate limiter allows; partial on timeout.

        Returns ``(count, drained)``: rows filled, and how many of them were deleted."""
        batch_size = out_i.shape[1]
        io = np.zeros(3, np.int64)
        drained = 0
        while count < batch_size:
            rest = batch_size - count
            more_i = np.empty((kernels.OUT_INT_ROWS, rest), np.int64)
            more_f = np.empty((kernels.OUT_FLOAT_ROWS, rest), np.float64)
            more_gens = np.empty((rest, out_gens.shape[1]), np.int32)
            try:
                got = self._draw_blocking(rest, more_i, more_f, more_gens, io, deadline,
                                          codes.BLOCKED)
            except errors.DeadlineExceededError:
                return count, drained
            out_i[:, count:count + got] = more_i[:, :got]
            out_f[:, count:count + got] = more_f[:, :got]
            out_gens[count:count + got] = more_gens[:got]
            count += got
            drained += io.item(2)
            if io[0] == 0:  # the table ran out of items
                return count, drained
        return count, drained

    def _redraw_torn_rows(self, out_i, out_f, out_gens, data, torn_rows, gather):
        """Seqlock repair: redraws each row in ``torn_rows`` (its data was overwritten
        while we copied it) until a redrawn item's copy checks clean.

        Each redrawn row is checked alone, right after its own copy. Re-checking the
        whole batch instead would also flag rows whose copies were complete and clean
        but whose slots were overwritten since (harmless: the copy was done), so under
        heavy overwriting the batch never came out clean at once: one call made 50,000
        redraws in 0.9 s. Only items deleted by someone else are torn: the ones this call
        deletes (``max_times_sampled``) stay DRAINING until it is done. Returns how many
        redrawn items this call deleted."""
        pid = _STAMP[0]  # (DRAINING slots record it; release_drained checks it)
        drained = 0
        new_i = np.empty((kernels.OUT_INT_ROWS, 1), np.int64)
        new_f = np.empty((kernels.OUT_FLOAT_ROWS, 1), np.float64)
        new_gens = np.empty((1, out_gens.shape[1]), np.int32)
        io = np.zeros(3, np.int64)
        torn = np.empty(1, np.int64)
        for row in torn_rows:
            while True:
                self._blocking(kernels.sample, L.C_ITEMS_WAITERS, L.C_ITEMS_SEQ, None, False,
                               lambda was_waiting, register: (1, pid, was_waiting, register,
                                                              new_i, new_f, new_gens), io)
                drained += io.item(2)
                values = gather(new_i[kernels.OUT_SLOT])
                if not kernels.torn_rows(self.meta, self.refs, self.rows,
                                         new_i[kernels.OUT_SLOT], new_i[kernels.OUT_VERSION],
                                         new_gens, torn):
                    break
            out_i[:, row] = new_i[:, 0]
            out_f[:, row] = new_f[:, 0]
            out_gens[row] = new_gens[0]
            self.kind.put_row(data, row, values)
        return drained

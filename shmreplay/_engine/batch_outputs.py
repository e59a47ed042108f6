"""Reused results for small sampled batches: arrays made once, refilled when unused.

A learner samples the same batch size over and over. With small items, making the
result's arrays cost more than sampling: for a uniform batch of 2, creating the ten
arrays of a ``ReplaySample`` (and the scratch arrays of the call) took about 3 of its
7 us. So a table handle keeps a few ready results per batch size. Each is one byte
block holding the sampler's output rows and every column, viewed as the arrays a
``ReplaySample`` is made of, and the native ``sample_gather`` fills all of it in one
call.

A result is refilled only when nothing outside holds any part of it: reference counts
say so exactly. Every array handed out is a view whose ``base`` is the block, and numpy
points any view derived from them (``batch.data["obs"][0]``, a framework aliasing the
memory) at the block too, so the block's count covers those and each array's own count
covers the arrays themselves.

Batches of ``REUSE_BELOW`` bytes or more take the general path: there the copy costs
far more than the arrays, and their memory comes from ``shmreplay._engine.outputs``.
"""

import sys

import numpy as np

from shmreplay._shm.kernels import table as kernels
from shmreplay.replay_sample import BatchInfo, ReplaySample, SampleInfo

REUSE_BELOW = 1 << 18
# Results kept per batch size: a loop that holds its last batch while sampling the next
# alternates between two; a third covers one batch kept a little longer.
PER_SIZE = 3
# Batch sizes a handle keeps results for (it forgets them all beyond that).
MAX_SIZES = 8
ALIGN = 64
_refs = sys.getrefcount
_new_tuple = tuple.__new__


def _align(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


class BatchOutputs:
    """One reusable result: the output block of ``kernels.sample_gather`` and its views.

    Attributes:
      block: the bytes; ``layout`` says where each output starts in them, and where
        each column's rows are in the table's data segment (``stores``: ``(start, row
        bytes)`` per column).
      out_i, out_f: the sampler's int64 and float64 output rows (``kernels.OUT_*``).
      times: ``times_sampled`` as int32.
      torn, io: the kernel's torn rows and its ``io``.
      gens: the (empty) row generations of whole items, for the general steps.
      info: the five ``SampleInfo`` arrays, as a ``SampleInfo``.
      leaves: one array ``[B, ...]`` per column.
      pool: the ``ResultPool`` list it goes back to.
    """

    __slots__ = ("block", "layout", "out_i", "out_f", "times", "torn", "io", "gens", "info",
                 "leaves", "pool", "_unflatten", "_flat", "_exposed", "_idle", "_weighed")

    def __init__(self, batch_size: int, column_specs, stores, unflatten, weighing=None):
        shapes = [((kernels.OUT_INT_ROWS, batch_size), np.dtype(np.int64)),
                  ((kernels.OUT_FLOAT_ROWS, batch_size), np.dtype(np.float64)),
                  ((batch_size,), np.dtype(np.int32)),
                  ((batch_size,), np.dtype(np.int64)),
                  ((kernels.GATHER_IO,), np.dtype(np.int64)),
                  ((batch_size,), np.dtype(np.float32)),
                  ((2,), np.dtype(np.float64))]
        shapes += [((batch_size,) + tuple(spec.shape), np.dtype(spec.dtype))
                   for spec in column_specs]
        starts, end = [], 0
        for shape, dtype in shapes:
            starts.append(_align(end))
            end = starts[-1] + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.block = np.empty(_align(end) + ALIGN, np.uint8)  # (whole words for the kernel)
        first = -self.block.ctypes.data % ALIGN
        starts = [first + start for start in starts]
        views = [np.ndarray(shape, dtype, self.block, start)
                 for (shape, dtype), start in zip(shapes, starts)]
        columns = starts[kernels.LAYOUT_COLUMNS:]
        self.layout = np.array(starts[:kernels.LAYOUT_COLUMNS] + [
            number for start, store in zip(columns, stores) for number in (start, *store)],
            np.int64)
        (self.out_i, self.out_f, self.times, self.torn, self.io, weights,
         weighed) = views[:kernels.LAYOUT_COLUMNS]
        self.leaves = views[kernels.LAYOUT_COLUMNS:]
        del views  # (it would count as a reference in ``_idle``)
        weighed[0] = np.nan
        self.gens = np.empty((batch_size, 0), np.int32)
        self.info = _new_tuple(BatchInfo, (self.out_i[kernels.OUT_KEY].view(np.uint64),
                                           self.out_f[kernels.OUT_PROBABILITY],
                                           self.out_i[kernels.OUT_TABLE_SIZE],
                                           self.out_f[kernels.OUT_PRIORITY], self.times))
        if weighing is not None:
            self.info._weights = FusedWeights(weights, weighed, weighing)
        self._weighed = weighed  # (kept: its reference to the block is counted as idle)
        del weighed
        # (``weights`` is handed out by ``importance_weights``: counted like the others)
        self._exposed = ((self.block, self.info) + tuple(self.info) + tuple(self.leaves)
                         + (weights,))
        del weights
        # A flat dict nest is copied (a new dict each time: the caller may change it);
        # other nests are rebuilt by ``unflatten``.
        self._unflatten = unflatten
        nest = unflatten(self.leaves)
        flat = (type(nest) is dict and len(nest) == len(self.leaves)
                and all(value is leaf for value, leaf in zip(nest.values(), self.leaves)))
        self._flat = nest if flat else None
        del nest  # (a nest other than a flat dict would count as a reference in ``_idle``)
        self._idle = self._counts()

    def gather_from(self, columns):
        """A ``gather(slots)`` for the engine's general steps: copies the rows ``slots``
        of each column into this result's arrays, and returns them."""
        def gather(slots):
            count = slots.shape[0]
            for column, leaf in zip(columns, self.leaves):
                np.take(column, slots, axis=0, out=leaf[:count], mode="clip")
            return self.leaves
        return gather

    def result(self, count: int) -> ReplaySample:
        """The ``ReplaySample`` of the first ``count`` rows (all of them normally)."""
        if count == self.times.shape[0]:
            flat = self._flat
            # (tuple.__new__ makes the namedtuple in half the time of its constructor)
            return _new_tuple(ReplaySample, (self.info, flat.copy() if flat is not None
                                             else self._unflatten(self.leaves)))
        return ReplaySample(SampleInfo(*(field[:count] for field in self.info)),
                            self._unflatten([leaf[:count] for leaf in self.leaves]))

    @staticmethod
    def nbytes(batch_size: int, column_specs) -> int:
        """About the size of the block for ``batch_size`` rows."""
        row = 8 * (kernels.OUT_INT_ROWS + kernels.OUT_FLOAT_ROWS) + 4 + 8 + 4
        row += sum(int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
                   for spec in column_specs)
        return batch_size * row

    def _counts(self):
        # Measured the same way when made and when tested, so the interpreter's own
        # temporary references cancel out. One sum: no count is ever below its idle
        # value (this object's own references stay), so the sums are equal only if
        # every count is.
        return sum(map(_refs, self._exposed))

    def idle(self) -> bool:
        """True if nothing but this object refers to the block or any array of it."""
        return self._counts() == self._idle


class ResultPool:
    """A table handle's reusable results, per batch size.

    ``claim`` hands out an idle result (or a new one) that no other thread can get
    until ``release``; results beyond ``PER_SIZE`` per size, or too large to reuse,
    are not kept (``claim`` returns None for those sizes: use the general path).
    """

    def __init__(self, column_specs, stores, unflatten, weighing=None):
        self._specs = list(column_specs)
        self._stores = stores
        self._unflatten = unflatten
        self._weighing = weighing  # the handle's ``Weighing`` (None: weigh nothing)
        self._pools = {}  # batch size -> results, least recently used last; None: too big

    def claim(self, batch_size: int):
        """An idle result for ``batch_size`` rows, or None (use new arrays)."""
        pool = self._pools.get(batch_size)
        if pool:
            # list.pop and insert are atomic, so a result popped here is this thread's
            # alone. The least recently used one is idle in the usual loop. Two tries: a
            # result the caller keeps for good comes back to the end after every call
            # (the results handed out go in front of it), and the next one is idle.
            for _ in range(2):
                try:
                    outputs = pool.pop()
                except IndexError:
                    break
                if sum(map(_refs, outputs._exposed)) == outputs._idle:
                    return outputs
                pool.insert(0, outputs)
        return self._claim_slow(batch_size)

    def _claim_slow(self, batch_size: int):
        pool = self._pools.get(batch_size, False)
        if pool is False:
            if len(self._pools) >= MAX_SIZES:
                self._pools.clear()
            small = BatchOutputs.nbytes(batch_size, self._specs) < REUSE_BELOW
            pool = self._pools[batch_size] = [] if small else None
        if pool is None:
            return None
        for _ in range(len(pool)):
            try:
                outputs = pool.pop()
            except IndexError:
                break
            if outputs.idle():
                return outputs
            pool.insert(0, outputs)
        if len(pool) >= PER_SIZE:
            return None  # the caller holds on to many batches: plain new arrays
        outputs = BatchOutputs(batch_size, self._specs, self._stores, self._unflatten,
                               self._weighing)
        outputs.pool = pool
        return outputs

    @staticmethod
    def release(outputs: BatchOutputs):
        """Gives a claimed result back (to be tried last: the caller likely holds it)."""
        pool = outputs.pool
        if len(pool) < PER_SIZE:
            pool.insert(0, outputs)


class Weighing:
    """A table handle's choice of importance weights for ``sample_gather`` to compute
    with each reused result (the fused path of ``SampleInfo.importance_weights``).

    A learner asks for the same ``(beta, normalize)`` at every step, or anneals beta a
    little at every step. So the handle weighs batches only once two calls in a row
    asked for the same pair, and stops at the first call that asks for another: an
    annealed beta is never computed in vain. The pair lives in the handle's table
    offsets (``kernels.TABLE_WEIGH_*``), which every ``sample_gather`` reads.
    """

    __slots__ = ("_beta", "_normalize", "_last_beta", "_last_normalize", "_on")

    def __init__(self, table_offsets):
        self._beta = memoryview(table_offsets[kernels.TABLE_WEIGH_BETA:
                                              kernels.TABLE_WEIGH_BETA + 1].view(np.float64))
        self._normalize = memoryview(table_offsets[kernels.TABLE_WEIGH_NORMALIZE:
                                                   kernels.TABLE_WEIGH_NORMALIZE + 1])
        self._normalize[0] = -1  # (off until asked twice: a handle mapped again starts so)
        self._last_beta = self._last_normalize = None
        self._on = False

    def asked(self, beta, normalize):
        """A call asked for weights the batch did not come with (the path of every call
        when beta is annealed: kept short)."""
        if type(beta) is not float:
            try:
                beta = float(beta)
            except (TypeError, ValueError):
                return  # (the general path raises)
        normalize = 1 if normalize else 0
        if beta == self._last_beta and normalize == self._last_normalize:  # (NaN: never)
            self._beta[0] = beta
            self._normalize[0] = normalize
            self._on = True
        else:
            if self._on:
                self._normalize[0] = -1
                self._on = False
            self._last_beta = beta
            self._last_normalize = normalize


class FusedWeights:
    """One reused result's importance weights, as ``sample_gather`` computed them, and the
    ``(beta, normalize)`` they were computed with (``weighed``; beta NaN: none, or handed
    out already). ``BatchInfo.importance_weights`` hands them out once per batch."""

    __slots__ = ("_weights", "_weighed", "_weighing")

    def __init__(self, weights, weighed, weighing):
        self._weights = weights
        self._weighed = memoryview(weighed)
        self._weighing = weighing

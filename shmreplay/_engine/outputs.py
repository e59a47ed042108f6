"""Memory for large sampled batches: 64-byte aligned, recycled once nobody holds it.

Why recycle: a batch of Atari frames is megabytes. glibc serves such allocations with a
fresh ``mmap`` whenever its mmap threshold is low (it is once TensorFlow is loaded, and
in threads other than the main one), and every fresh page then costs a page fault when
the gather first writes it. Measured on the 2-core benchmark machine, ``sample_batch``
of 256 frames took 2,230 us in a process with TensorFlow loaded against 530 us with
memory that had been written before; this pool gives the second figure in both cases.

Why aligned: TensorFlow and JAX take a 64-byte aligned host array without copying it
(through DLPack, and ``jax.device_put`` on CPU).

A block is reused only when no array made from it is alive: every array handed out is a
view whose ``base`` is the block, and frameworks that alias the memory keep such a view
alive, so the block's reference count says whether anyone still uses it.
"""

import os
import sys
import threading

import numpy as np

ALIGN = 64
# Batches smaller than this are allocated as numpy does: malloc's heap serves them
# without page faults, and aligning one costs about 3 us.
POOL_FROM = 1 << 18
# The pool tracks at most this many blocks (and bytes), in use or idle; batches beyond
# that get plain aligned memory, freed with them. Of its idle blocks it keeps at most
# MAX_IDLE, so a burst of batches held at once (a consumer that keeps old batches, many
# prefetching datasets) does not stay allocated after it.
MAX_BLOCKS = 64
MAX_BYTES = 2 << 30
MAX_IDLE = 8

_lock = threading.Lock()
_blocks = []          # uint8 arrays, each owned by the pool
_free_refs = [None]   # a block's reference count while only the pool holds it


def _reset_lock_in_child():
    # A fork taken while another thread held the lock would leave the child's copy held.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_in_child)


def _refs(blocks, index):
    # The same expression measures an idle block and tests one, so whatever references
    # the interpreter itself adds for it cancel out.
    return sys.getrefcount(blocks[index])


def empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array, 64-byte aligned, from a reused block if large."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < POOL_FROM:
        return np.empty(shape, dtype)
    with _lock:
        block = _claim(nbytes)
        start = -block.ctypes.data % ALIGN
        return block[start:start + nbytes].view(dtype).reshape(shape)


def _claim(nbytes):
    """A block of at least ``nbytes + ALIGN`` bytes that nobody references. Under ``_lock``."""
    free = _free_refs[0]
    idle = [index for index in range(len(_blocks)) if _refs(_blocks, index) == free]
    fitting = [index for index in idle if _blocks[index].size >= nbytes + ALIGN]
    chosen = fitting[0] if fitting else None
    if len(idle) >= MAX_IDLE or (chosen is None and idle and _full(nbytes)):
        # Too many idle blocks (or none fits and the pool is full): drop idle ones,
        # smallest first, so that the pool follows the batch sizes in use.
        surplus = sorted((i for i in idle if i != chosen), key=lambda i: _blocks[i].size)
        drop = set(surplus[:max(1, len(idle) - MAX_IDLE + 1)])
        _blocks[:] = [block for i, block in enumerate(_blocks) if i not in drop]
        if chosen is not None:
            chosen -= sum(1 for i in drop if i < chosen)
    if chosen is not None:
        return _blocks[chosen]
    block = np.empty(nbytes + ALIGN, np.uint8)
    if _full(nbytes):
        return block
    _blocks.append(block)
    if free is None:
        _free_refs[0] = _refs(_blocks, len(_blocks) - 1) - 1  # minus ``block``, here
    return block


def _full(nbytes):
    return (len(_blocks) >= MAX_BLOCKS
            or pooled_bytes() + nbytes + ALIGN > MAX_BYTES)


def pooled_bytes() -> int:
    """Bytes the pool holds (in use or idle)."""
    return sum(block.size for block in _blocks)


def clear():
    """Drops every pooled block (arrays made from them stay valid: they hold their block)."""
    with _lock:
        _blocks.clear()


def take(column, rows):
    """``column.take(rows, axis=0)``; a large result goes into pooled aligned memory."""
    if rows.size * column.strides[0] < POOL_FROM:  # columns are C-contiguous
        return column.take(rows, axis=0)
    out = empty(rows.shape + column.shape[1:], column.dtype)
    return np.take(column, rows, axis=0, out=out, mode="clip")

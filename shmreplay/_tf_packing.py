"""How ``make_dataset`` 's batches cross ``tf.numpy_function``: the small leaves of a
batch in one uint8 array, and several batches in one call.

Each output of a ``numpy_function`` costs TensorFlow a conversion (checks, a tensor made,
a copy when the array is not 64-byte aligned), and each call costs a trip into Python
(the GIL, the call, waking tf.data's threads). For a batch of transitions (5 info fields
and 5 columns) these cost more than the sampling, so they are cut twice: the leaves
travel packed (``Packing``), and a call may carry several batches, one row each
(``Packing.pack_rows``), that ``unbatch`` splits in C++.
"""

import numpy as np
import tensorflow as tf

from shmreplay._engine import outputs as _outputs

BLOCK_BYTES = 1 << 19  # a call carries up to this many bytes of batches ...
MAX_BATCHES_PER_CALL = 8  # ... and at most this many batches


def default_batches_per_call(batch_bytes: int, deterministic_sampler: bool) -> int:
    """Batches per call when the caller did not say: as many as fit ``BLOCK_BYTES``
    (at most ``MAX_BATCHES_PER_CALL``) for a uniform or prioritized table, 1 for a FIFO,
    LIFO or heap table, whose batches taken ahead would be lost with the iterator.
    (Large batches gain nothing: their trip costs little beside their copy, and rows
    would copy the leaves that otherwise cross without a copy.)"""
    if deterministic_sampler or batch_bytes <= 0:
        return 1
    return max(1, min(MAX_BATCHES_PER_CALL, BLOCK_BYTES // batch_bytes))


def _aligned(shape) -> np.ndarray:
    """An uninitialized uint8 array of ``shape`` at a 64-byte aligned address (TensorFlow
    takes such an output of a ``numpy_function`` without copying it)."""
    size = int(np.prod(shape))
    raw = np.empty(size + _outputs.ALIGN, np.uint8)
    start = -raw.ctypes.data % _outputs.ALIGN
    return raw[start:start + size].reshape(shape)


class Packing:
    """Which leaves of a batch travel packed, and where.

    The leaves below ``_outputs.POOL_FROM`` bytes of a numeric dtype are copied into one
    uint8 array, each at a 64-byte aligned offset, and taken apart in the graph (a slice
    and a bitcast each). Larger leaves, which come aligned from the engine's pool, pass
    as they are, without a copy. Fixed shapes only (the offsets are fixed).
    """

    def __init__(self, flat_spec, owner: str = "make_dataset"):
        self.owner = owner  # (names the caller in errors)
        self.specs = flat_spec
        self.layouts = [(spec.dtype.as_numpy_dtype, tuple(spec.shape.as_list()))
                        for spec in flat_spec]
        self.offsets = []  # per leaf: its byte offset in the packed array, or None
        size = 0
        for spec in flat_spec:
            nbytes = spec.shape.num_elements() * spec.dtype.size
            if (spec.dtype.is_numpy_compatible and spec.dtype != tf.bool
                    and (spec.dtype.is_integer or spec.dtype.is_floating)
                    and nbytes < _outputs.POOL_FROM):
                self.offsets.append(size)
                size += -(-nbytes // _outputs.ALIGN) * _outputs.ALIGN
            else:
                self.offsets.append(None)
        self.size = size
        self.output_dtypes = [tf.uint8] + [spec.dtype for spec, offset
                                           in zip(flat_spec, self.offsets) if offset is None]

    def pack(self, leaves):
        """``[packed uint8 array] + the leaves not packed``, in order."""
        packed = _aligned((self.size,))
        return [packed] + self.pack_into(packed, leaves)

    def pack_rows(self, batches):
        """Several batches (each a list of leaves) in one call's outputs: ``[packed
        uint8 [n, size]] + the leaves not packed, each stacked to [n, ...]``."""
        packed = _aligned((len(batches), self.size))
        rests = [self.pack_into(row, leaves) for row, leaves in zip(packed, batches)]
        stacked = []
        for column, index in enumerate(i for i, offset in enumerate(self.offsets)
                                       if offset is None):
            dtype, shape = self.layouts[index]
            stacked.append(np.stack([rest[column] for rest in rests]) if rests
                           else np.zeros((0,) + shape, dtype))
        return [packed] + stacked

    def pack_into(self, packed, leaves):
        """Copies the packed leaves into ``packed`` (uint8 [size]); returns the others."""
        rest = []
        for index, (leaf, offset) in enumerate(zip(leaves, self.offsets)):
            if offset is None:
                rest.append(leaf)
                continue
            dtype, shape = self.layouts[index]
            if leaf.dtype != dtype or leaf.shape != shape:  # (never reinterpret bytes)
                raise ValueError(
                    f"{self.owner}: leaf {index} of the batch is {leaf.dtype}{list(leaf.shape)}, "
                    f"the dataset's spec says {np.dtype(dtype)}{list(shape)}.")
            packed[offset:offset + leaf.nbytes] = np.ascontiguousarray(leaf).reshape(-1).view(
                np.uint8)
        return rest

    def unpack(self, outputs, rows: bool = False):
        """The leaves (tensors) from ``outputs`` of the ``numpy_function``; with ``rows``,
        of ``pack_rows`` 's outputs (each leaf then has a leading batches dimension)."""
        packed, rest = outputs[0], iter(outputs[1:])
        leaves = []
        for spec, offset in zip(self.specs, self.offsets):
            if offset is None:
                leaves.append(next(rest))
                continue
            count, itemsize = spec.shape.num_elements(), spec.dtype.size
            piece = packed[..., offset:offset + count * itemsize]
            lead = [-1] if rows else []
            if itemsize > 1:
                piece = tf.reshape(piece, lead + [count, itemsize])
            if spec.dtype != tf.uint8:
                piece = tf.bitcast(piece, spec.dtype)
            leaves.append(tf.reshape(piece, lead + spec.shape.as_list()))
        return leaves

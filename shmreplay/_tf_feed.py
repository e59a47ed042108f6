"""Batches handed to a ``tf.function`` as its argument: ``PackedBatches``.

A ``make_dataset`` iterator read inside a ``tf.function`` reaches Python through
tf.data: a ``numpy_function`` run by tf.data's threads, a hand-off between them and the
step, and batches sampled ahead. On two cores that a small step keeps busy, that
machinery costs a learner about a tenth of its steps (docs/performance.md, "Learner
feed"). ``PackedBatches`` has none of it: ``next`` samples in the learner's own thread,
copies the batch's small leaves into one 64-byte aligned array (``_tf_packing``), and
makes one tensor of it; the step takes that tensor as its argument and takes it apart
with a slice and a bitcast per leaf (``unpack``), inside the compiled graph.
"""

from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from shmreplay import _batches, _tf_common as common
from shmreplay._tf_packing import Packing
from shmreplay.replay_sample import ReplaySample, SampleInfo


def _is_integer(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


class PackedBatch(NamedTuple):
    """One batch: ``info`` (a ``SampleInfo`` of numpy arrays ``[B]``, on the host: the
    keys for ``update_priorities``) and ``packed`` (a tuple of tensors to pass to the
    train step, which gives them to ``PackedBatches.unpack``)."""

    info: SampleInfo
    packed: Any


class PackedBatches:
    """Yields batches for a ``tf.function`` 's argument, sampled in the caller's thread.

    The fast way into a TensorFlow learner for small items (transitions)::

        from shmreplay import tf as shmreplay_tf

        batches = shmreplay_tf.PackedBatches("my-buffer", "replay", batch_size=256)

        @tf.function
        def train_step(packed):
            sample = batches.unpack(packed)   # ReplaySample(info, data) of tensors
            ...                               # the same step as on make_dataset's
            return td_errors

        for batch in batches:
            td_errors = train_step(batch.packed)
            batches.update_priorities(batch.info.key, td_errors)

    ``unpack`` gives what ``make_dataset(..., batch_size)`` yields, so a step written
    for that dataset's elements runs unchanged. Each batch is sampled when ``next`` is
    called, nothing ahead: priorities set after a step count from the next batch on.
    Fixed shapes only (a table of items of any length: ``make_dataset`` with ``pad_to``).

    Args:
      client: The buffer's name (a str or a string tensor), or a ``shmreplay.Client``
        (its name and ``trust_group`` are used; the iterator attaches its own).
      table: The table to sample.
      batch_size: Items per batch (``Client.sample_batch`` semantics: a batch waits for
        rate-limiter credit until it is full).
      rate_limiter_timeout_ms: Ends the iteration when no batch could be filled in this
        many milliseconds (Reverb's dataset option); the rows of a batch left partial
        are dropped, as Reverb's datasets drop them. Negative: wait forever.
      max_batches: Ends the iteration after this many batches (None: never).

    Raises (when made):
      BufferNotFoundError: no such buffer.
      ValueError: no such table, a table of items of any shape or length, nothing yet
        says what the table's items look like (no signature and no item), or an
        argument out of range. ``next`` raises what ``Client.sample_batch`` raises.
    """

    def __init__(self, client, table: str, batch_size: int, *,
                 rate_limiter_timeout_ms: int = -1, max_batches: Optional[int] = None):
        if not _is_integer(batch_size) or batch_size < 1:
            raise ValueError(f"PackedBatches: batch_size must be an integer >= 1, got "
                             f"{batch_size!r}.")
        if max_batches is not None and (not _is_integer(max_batches) or max_batches < 0):
            raise ValueError(f"PackedBatches: max_batches must be None (no end) or an "
                             f"integer >= 0, got {max_batches!r}.")
        if not _is_integer(rate_limiter_timeout_ms):
            raise ValueError(f"PackedBatches: rate_limiter_timeout_ms must be an integer "
                             f"(negative: wait forever), got {rate_limiter_timeout_ms!r}.")
        self.table = common.plain(table, "table")
        self.batch_size = int(batch_size)
        self._timeout = None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000
        self._left = None if max_batches is None else int(max_batches)
        self._done = False
        self._client = common.connect(common.plain(client, "client"))  # (its own Client)
        try:
            self.element_spec = self._spec()
            self._flat_spec = tf.nest.flatten(self.element_spec)
            self._packing = Packing(self._flat_spec, "PackedBatches")
        except BaseException:
            self._client.close()
            raise

    def _spec(self) -> ReplaySample:
        """make_dataset's element spec for the table (fixed shapes only)."""
        dtypes, shapes = common.table_signature(self._client, self.table)
        shape_leaves = common.flatten_specs(dtypes, shapes)[2]
        if any(not isinstance(shape, tuple) or None in shape for shape in shape_leaves):
            raise ValueError(
                f"PackedBatches: table '{self.table}' holds items whose shapes are not "
                f"fixed ({', '.join(map(str, shape_leaves))}), so its batches differ in "
                "shape; use make_dataset for it (pad_to=... for a None time dimension).")
        return ReplaySample(common.info_spec((self.batch_size,)),
                            common.data_spec(dtypes, shapes, (self.batch_size,)))

    def __iter__(self):
        return self

    def __next__(self) -> PackedBatch:
        if self._done or self._left == 0:
            self._done = True
            raise StopIteration
        sample = _batches.full_batch(self._client, self.table, self.batch_size,
                                     self._timeout)
        if sample is None:
            self._done = True
            raise StopIteration
        if self._left is not None:
            self._left -= 1
        return PackedBatch(sample.info, self.pack(sample))

    def pack(self, sample: ReplaySample) -> tuple:
        """``sample`` (numpy arrays of the table's batch shapes, as ``sample_batch``
        returns them) as the tensors ``unpack`` takes; ``next`` packs its batches so."""
        # One conversion per array, usually just the packed one: converting the ten
        # leaves of a batch of transitions one by one cost the benchmark's TF step about
        # a fifth of its rate, the packed array a twentieth. Large leaves (frames) are
        # shared with TensorFlow without a copy where their memory allows it.
        return tuple(tf.convert_to_tensor(common.shared_tensor(array))
                     for array in self._packing.pack(tf.nest.flatten(sample)))

    def unpack(self, packed) -> ReplaySample:
        """The batch as ``ReplaySample(info, data)`` of tensors ``[B, ...]`` (make_dataset's
        element): call it inside the ``tf.function`` that takes ``batch.packed``."""
        leaves = self._packing.unpack(list(packed))
        for tensor, spec in zip(leaves, self._flat_spec):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(self.element_spec, leaves)

    def update_priorities(self, keys, td_errors, *, exponent: float = 1.0,
                          epsilon: float = 1e-6) -> int:
        """Sets the sampled items' priorities to ``|td_errors| ** exponent + epsilon``.

        Args:
          keys: ``batch.info.key`` (uint64, on the host).
          td_errors: A tensor (or numpy array) ``[B]``, as the step returned it.
          exponent: Applied to ``|td_errors|`` (1: proportional prioritization).
          epsilon: Keeps every item sampleable.

        Returns:
          How many of the keys were still in the table.

        Raises:
          ShmReplayError: What ``Client.update_priorities`` raises (a NaN TD error, for
            one: ``InvalidPriorityError``, and no priority changes).
        """
        return self._client.update_priorities(
            self.table, keys, _batches.priorities_from_td(td_errors, exponent, epsilon))

    def close(self):
        """Detaches from the buffer (the table is left as it is)."""
        self._done = True
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

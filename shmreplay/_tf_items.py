"""Reverb's per-item datasets (``TrajectoryDataset``, ``TimestepDataset``,
``ReplayDataset``), re-exported by ``shmreplay.tf``, which explains how they sample.
"""

import queue
import threading
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from shmreplay import _batches, _tf_common as common, errors, specs
from shmreplay.replay_sample import ReplaySample, SampleInfo



def _check_options(max_in_flight_samples_per_worker, num_workers_per_iterator,
                   max_samples_per_stream, rate_limiter_timeout_ms, max_samples):
    if max_in_flight_samples_per_worker < 1:
        raise ValueError("max_in_flight_samples_per_worker must be >= 1, got "
                         f"{max_in_flight_samples_per_worker}.")
    if num_workers_per_iterator < 1 and num_workers_per_iterator != -1:
        raise ValueError("num_workers_per_iterator must be >= 1 or -1, got "
                         f"{num_workers_per_iterator}.")
    if max_samples_per_stream < 1 and max_samples_per_stream != -1:
        raise ValueError(f"max_samples_per_stream must be >= 1 or -1, got {max_samples_per_stream}.")
    if rate_limiter_timeout_ms < -1:
        raise ValueError("rate_limiter_timeout_ms must be an integer >= -1, got "
                         f"{rate_limiter_timeout_ms}.")
    if max_samples < 1 and max_samples != -1:
        raise ValueError(f"max_samples must be >= 1 or -1, got {max_samples}.")


class _Worker:
    """Samples chunks of a table for one tf.data generator (runs in TF's threads)."""

    def __init__(self, server_address, table, chunk, rate_limiter_timeout_ms, max_samples):
        self.server_address = server_address
        self.table = table
        self.chunk = chunk
        self.timeout = None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000
        self.max_samples = max_samples

    def chunks(self, stop: Optional[threading.Event] = None):
        """Yields ``ReplaySample`` s of up to ``chunk`` items until the end (the timeout,
        ``max_samples`` taken, or ``stop`` set), and None after each slice of waiting
        in which no item came (see ``_chunk_dataset``: the generator must return to
        tf.data while it waits)."""
        client = common.connect(self.server_address)
        left = self.max_samples
        try:
            waiting_since = time.monotonic()
            while left != 0:
                if stop is not None and stop.is_set():
                    return
                wanted = self.chunk if left < 0 else min(self.chunk, left)
                sample = self._take(client, wanted, waiting_since)
                if sample is _ENDED:
                    return
                if sample is None:
                    yield None
                    continue
                waiting_since = time.monotonic()
                if left > 0:
                    left -= len(sample.info.key)
                yield sample
        finally:
            client.close()

    def _take(self, client, wanted, waiting_since):
        """Up to ``wanted`` items (at least one); None if none came within a slice;
        ``_ENDED`` when the timeout (counted from ``waiting_since``) ran out."""
        wait = _batches.SLICE
        if self.timeout is not None:  # (a call is made even at 0: what is there comes)
            wait = min(wait, max(0.0, self.timeout - (time.monotonic() - waiting_since)))
        try:
            return client.sample_batch(self.table, wanted, timeout=wait)
        except errors.DeadlineExceededError:
            if self.timeout is not None and time.monotonic() - waiting_since >= self.timeout:
                return _ENDED
            return None


_ENDED = object()  # a worker's timeout ran out


def _parallel_chunks(workers):
    """The chunks of several ``_Worker`` s, in the order they come.

    Each worker runs in a thread and samples its next chunk only once the consumer has
    finished its previous one (asked for the chunk after it), so the items taken but
    not yet delivered stay within one chunk (``max_in_flight_samples_per_worker``) per
    worker, as in Reverb. tf.data's own ``interleave`` buffers several chunks per worker
    ahead (about 3.5x the bound was measured), and a queue table loses what it buffers.
    """
    results = queue.Queue()
    stop = threading.Event()
    turns = [threading.Semaphore(0) for _ in workers]

    def run(index, worker):
        try:
            for chunk in worker.chunks(stop):
                if chunk is None:
                    continue
                results.put((index, chunk, None))
                while not turns[index].acquire(timeout=_batches.SLICE):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            results.put((index, None, exc))
            return
        results.put((index, None, None))

    threads = [threading.Thread(target=run, args=(i, worker), daemon=True,
                                name=f"shmreplay-dataset-worker-{i}")
               for i, worker in enumerate(workers)]
    for thread in threads:
        thread.start()
    running = len(workers)
    try:
        while running:
            try:
                index, chunk, exc = results.get(timeout=_batches.SLICE)
            except queue.Empty:
                yield None  # nothing yet: return to tf.data (see _chunk_dataset)
                continue
            if exc is not None:
                raise exc
            if chunk is None:
                running -= 1
                continue
            yield chunk
            turns[index].release()  # the consumer is done with it: that worker may go on
    finally:
        stop.set()  # a dropped iterator ends the workers within a slice


def _chunk_dataset(server_address, table, data_spec, max_in_flight_samples_per_worker,
                   num_workers_per_iterator, rate_limiter_timeout_ms, max_samples,
                   timesteps=False):
    """A dataset of chunks: ``ReplaySample`` s with a leading dimension (<= the chunk size)
    and ``data_spec`` after it; with ``timesteps``, sequence items are cut into their
    timesteps (the info repeated on each).

    While no item comes, the generator yields an empty chunk every ``SLICE`` (unbatch
    turns it into nothing) instead of waiting inside it: a generator call that waits
    holds a tf.data thread that nothing can interrupt. Three interleaved datasets
    draining a table whose items expire (TF-Agents' ``test_prioritized_table_max_sample``)
    hung that way: the drained datasets waited forever inside their calls, and the
    iterator's destructor (or the interleave) waited for them. Returning lets tf.data
    cancel the next call instead.
    """
    workers = 1 if num_workers_per_iterator == -1 else num_workers_per_iterator
    chunk_spec = ReplaySample(common.info_spec((None,)), tf.nest.map_structure(
        lambda s: tf.TensorSpec((None,) + tuple(s.shape), s.dtype), data_spec))
    flat_spec = tf.nest.flatten(data_spec)
    spec_structure = specs.optree.tree_structure(data_spec)
    ndim = len(flat_spec[0].shape) if flat_spec else 0
    empty = tf.nest.map_structure(
        lambda s: np.zeros([0] + [d or 0 for d in s.shape.as_list()[1:]],
                           s.dtype.as_numpy_dtype), chunk_spec)

    def worker(index):
        # Each worker has its own share of max_samples, so together they take exactly
        # max_samples and no worker takes what another should have.
        budget = -1
        if max_samples != -1:
            budget = max_samples // workers + (1 if index < max_samples % workers else 0)
        return _Worker(server_address, table, max_in_flight_samples_per_worker,
                       rate_limiter_timeout_ms, budget)

    def generate():
        chosen = [worker(i) for i in range(workers)]
        chosen = [w for w in chosen if w.max_samples != 0]
        chunks = chosen[0].chunks() if len(chosen) == 1 else _parallel_chunks(chosen)
        checked = add_time = False
        for sample in chunks:
            if sample is None:
                yield empty
                continue
            sample = _as_timesteps(sample, ndim) if timesteps else common.zero_copy(sample)
            if not checked:
                add_time = not timesteps and _wants_time_dim(sample, flat_spec)
            if add_time:
                sample = ReplaySample(sample.info, specs.optree.tree_map(
                    lambda leaf: leaf[:, None], sample.data))
            if not checked:  # tf.data would cast a wrong dtype silently
                _check_chunk(sample, flat_spec, table)
                checked = True
            # As in Reverb, an item meets the dataset leaf by leaf: the elements take the
            # structure of ``dtypes`` (a bare dtype for a table of ``[x]`` items, tuples
            # where the items hold lists).
            yield ReplaySample(sample.info, specs.optree.tree_unflatten(
                spec_structure, specs.optree.tree_leaves(sample.data)))

    return tf.data.Dataset.from_generator(generate, output_signature=chunk_spec)


def _wants_time_dim(sample, flat_spec):
    """Whether the dataset asks for a time dimension of 1 that the sampled items lack
    (items from ``insert`` are one timestep: Reverb samples them as ``[1, ...]``)."""
    leaves = specs.optree.tree_leaves(sample.data)
    return len(leaves) == len(flat_spec) and all(
        len(spec.shape) == leaf.ndim and spec.shape[0] in (1, None)
        for leaf, spec in zip(leaves, flat_spec))


def _check_chunk(sample, flat_spec, table):
    """Raises ValueError (InvalidArgumentError in tf.data) unless the sampled leaves have
    the dtypes and shapes the dataset was given."""
    leaves = specs.optree.tree_leaves(sample.data)
    if len(leaves) != len(flat_spec):
        raise ValueError(
            f"Table '{table}': the dataset expects {len(flat_spec)} tensors per item, "
            f"the table's items have {len(leaves)}.")
    for index, (leaf, spec) in enumerate(zip(leaves, flat_spec)):
        dtype = np.dtype(spec.dtype.as_numpy_dtype)
        shape = tuple(leaf.shape[1:])
        if leaf.dtype != dtype or not tf.TensorShape(spec.shape).is_compatible_with(shape):
            # Worded as Reverb's error (TensorFlow's dtype names, [3,3]): code and tests
            # match on it.
            raise ValueError(
                f"Table '{table}': requested incompatible tensor at flattened index "
                f"{index}. Specification has (dtype, shape): ({specs.tf_dtype_name(dtype)}, "
                f"{_shape_str(spec.shape)}).  Tensor has (dtype, shape): "
                f"({specs.tf_dtype_name(leaf.dtype)}, {_shape_str(shape)}).")


def _shape_str(shape) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in tf.TensorShape(shape)) + "]"


def _as_timesteps(sample, ndim):
    """Sequence items ``[k, T, ...]`` as ``k * T`` timesteps; whole items stay as they are."""
    leaves = specs.optree.tree_leaves(sample.data)
    if leaves[0].ndim == ndim + 1:  # items without a time dimension: one timestep each
        return sample
    length = leaves[0].shape[1]
    if any(leaf.ndim < 2 or leaf.shape[1] != length for leaf in leaves):
        raise ValueError("Can't split non timestep trajectory into timesteps.")
    data = specs.optree.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), sample.data)
    info = SampleInfo(*(np.repeat(field, length) for field in sample.info))
    return ReplaySample(info, data)


class TrajectoryDataset(tf.compat.v1.data.Dataset):
    """One element per sampled item, the whole trajectory (Reverb's ``TrajectoryDataset``).

    A ``tf.compat.v1.data.Dataset``, as Reverb's is: a ``tf.data.Dataset`` in every
    way, that also has the graph-mode ``make_initializable_iterator()`` and
    ``make_one_shot_iterator()`` methods Reverb's users (and its tests) call.

    Args:
      server_address: The buffer's name, or a ``Client`` (its name and ``trust_group``
        are used: the way to read a group member's shared buffer).
      table: The table to sample.
      dtypes, shapes: Nests describing ``data`` (lists are read as tuples). Shapes are
        the item's, time dimension included for sequence items.
      max_in_flight_samples_per_worker: Items one worker takes per ``sample_batch``
        call (they count as sampled then). Reverb suggests 2-3x the batch size.
      num_workers_per_iterator: Parallel workers; -1 means 1, which keeps a FIFO
        table's order.
      max_samples_per_stream: Accepted for Reverb compatibility (no streams here).
      rate_limiter_timeout_ms: End the dataset when no item arrives in this many
        milliseconds; -1 waits forever.
      max_samples: End after this many items, taking no more than that from the table;
        -1: never.

    Raises:
      ValueError: an option is out of range, or ``dtypes`` and ``shapes`` differ in
        structure.
    """

    _TIMESTEPS = False  # whether elements are timesteps (``from_table_signature``'s shapes)

    def __init__(self, server_address: str, table: str, dtypes, shapes,
                 max_in_flight_samples_per_worker: int, num_workers_per_iterator: int = -1,
                 max_samples_per_stream: int = -1, rate_limiter_timeout_ms: int = -1,
                 max_samples: int = -1):
        _check_options(max_in_flight_samples_per_worker, num_workers_per_iterator,
                       max_samples_per_stream, rate_limiter_timeout_ms, max_samples)
        server_address = common.plain(server_address, "server_address")
        table = common.plain(table, "table")
        data_spec = common.data_spec(dtypes, shapes)
        for spec in tf.nest.flatten(data_spec):
            if 0 in spec.shape:  # tf.data's unbatch crashes the process (SIGSEGV) on them
                raise ValueError(
                    f"Table '{table}': a column of shape {list(spec.shape)} has no elements, "
                    "which this dataset cannot carry (TensorFlow crashes); use make_dataset, "
                    "or leave the column out of the items.")
        self._dataset = self._build(server_address, table, data_spec,
                                    max_in_flight_samples_per_worker, num_workers_per_iterator,
                                    rate_limiter_timeout_ms, max_samples)
        super().__init__()  # DatasetV1 asks _as_variant_tensor

    def _build(self, server_address, table, data_spec, max_in_flight, workers, timeout_ms,
               max_samples):
        return common.no_lookahead(_chunk_dataset(server_address, table, data_spec, max_in_flight,
                                            workers, timeout_ms, max_samples).unbatch())

    @property
    def element_spec(self):
        return self._dataset.element_spec

    def _as_variant_tensor(self):
        return self._dataset._variant_tensor

    def _inputs(self):
        return []

    @classmethod
    def from_table_signature(cls, server_address: str, table: str,
                             max_in_flight_samples_per_worker: int,
                             num_workers_per_iterator: int = -1,
                             max_samples_per_stream: int = -1,
                             rate_limiter_timeout_ms: int = -1,
                             get_signature_timeout_secs: Optional[int] = None,
                             max_samples: int = -1):
        """The dataset of a table whose item shapes are known: from its signature, or from
        the items already in it.

        Raises:
          ValueError: no such table, or the table has neither a signature nor items.
        """
        dtypes, shapes = common.table_signature(server_address, table, get_signature_timeout_secs,
                                         timesteps=cls._TIMESTEPS)
        return cls(server_address, table, dtypes, shapes, max_in_flight_samples_per_worker,
                   num_workers_per_iterator, max_samples_per_stream, rate_limiter_timeout_ms,
                   max_samples)


class TimestepDataset(TrajectoryDataset):
    """One element per timestep of each sampled item (Reverb's ``TimestepDataset``).

    ``shapes`` are one timestep's (no time dimension). Every column of the table's items
    must have the same length; items from ``Client.insert`` are one timestep each. The
    item's ``info`` repeats on each of its timesteps; nothing marks where an item ends
    (batch by the item length, or use ``TrajectoryDataset``). ``from_table_signature``
    takes the table's signature as it is (one timestep's, as in Reverb) or, without one,
    the items' shapes: a sequence item's columns without their time dimension.
    """

    _TIMESTEPS = True

    def _build(self, server_address, table, data_spec, max_in_flight, workers, timeout_ms,
               max_samples):
        # ``max_samples`` counts items, as in Reverb.
        return common.no_lookahead(_chunk_dataset(server_address, table, data_spec, max_in_flight,
                                            workers, timeout_ms, max_samples,
                                            timesteps=True).unbatch())


def ReplayDataset(server_address: str, table: str, dtypes, shapes,
                  max_in_flight_samples_per_worker: int, sequence_length: Optional[int] = None,
                  emit_timesteps: bool = True, num_workers_per_iterator: int = -1,
                  max_samples_per_stream: int = -1, rate_limiter_timeout_ms: int = -1):
    """Reverb's legacy ``ReplayDataset`` (the one its tutorial uses).

    With ``emit_timesteps=True`` one element per timestep (``shapes`` per timestep);
    otherwise one element per item, whose leaves get a leading ``sequence_length``
    dimension added to ``shapes``.
    """
    if emit_timesteps:
        return TimestepDataset(server_address, table, dtypes, shapes,
                               max_in_flight_samples_per_worker, num_workers_per_iterator,
                               max_samples_per_stream, rate_limiter_timeout_ms)
    if sequence_length is None:
        raise ValueError("ReplayDataset: sequence_length is required when emit_timesteps "
                         "is False.")
    treedef, _, shape_leaves = common.flatten_specs(dtypes, shapes)
    shapes = specs.optree.tree_unflatten(
        treedef, [(sequence_length,) + tuple(shape) for shape in shape_leaves])
    return TrajectoryDataset(server_address, table, dtypes, shapes,
                             max_in_flight_samples_per_worker, num_workers_per_iterator,
                             max_samples_per_stream, rate_limiter_timeout_ms)

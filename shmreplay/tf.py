"""tf.data datasets over shmreplay tables, with Reverb's dataset API.

Import it as ``shmreplay.tf`` (it imports TensorFlow; ``import shmreplay`` does not)::

    from shmreplay import tf as shmreplay_tf

    dataset = shmreplay_tf.TrajectoryDataset.from_table_signature(
        "my-buffer", "replay", max_in_flight_samples_per_worker=512)
    for sample in dataset.batch(256).take(10):
        ...                                       # ReplaySample(info, data), [256, ...]

    # The fast path for training: whole batches straight from ``sample_batch``.
    dataset = shmreplay_tf.make_dataset("my-buffer", "replay", batch_size=256)

Elements are ``ReplaySample(info, data)`` with Reverb's info dtypes (key uint64,
probability float64, table_size int64, priority float64, times_sampled int32).

How sampling maps onto tf.data: a worker takes up to
``max_in_flight_samples_per_worker`` items in one ``sample_batch`` call (the rate limiter
counts them then, as Reverb's server does) and the dataset hands them out one by one.
The worker never takes more than ``max_samples`` in all, takes its next items only
once the consumer has read the last ones, and waits in short slices so that a discarded
iterator stops it.
"""

import contextlib
import queue
import threading
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from shmreplay import _batches, _outputs, errors, specs
from shmreplay.client import Client
from shmreplay.replay_sample import INFO_DTYPES, ReplaySample, SampleInfo

__all__ = ["ReplayBuffer", "ReplayDataset", "TimestepDataset", "TrajectoryDataset",
           "make_dataset"]


def _info_spec(batch_shape=()):
    return SampleInfo(*(tf.TensorSpec(batch_shape, tf.as_dtype(INFO_DTYPES[field]))
                        for field in SampleInfo._fields))


def _data_spec(dtypes, shapes, batch_shape=()):
    dtypes = _as_tuples(dtypes)
    shapes = _as_tuples(shapes)
    if any(leaf is None for leaf in specs.optree.tree_leaves(dtypes, none_is_leaf=True)):
        raise ValueError(
            "The items have a None value (no tensor), which tf.data cannot carry: read "
            "them with Client.sample_batch, or leave the field out of the items.")
    try:
        return specs.optree.tree_map(
            lambda dtype, shape: tf.TensorSpec(tuple(batch_shape) + tuple(shape),
                                               tf.as_dtype(dtype)),
            dtypes, shapes, is_leaf=_is_shape)
    except ValueError as exc:
        raise ValueError(f"dtypes and shapes must have the same structure: {exc}") from exc


def _is_shape(x):
    return isinstance(x, (tf.TensorShape,)) or (
        isinstance(x, tuple) and all(isinstance(d, (int, type(None))) for d in x))


def _as_tuples(nest):
    """Lists become tuples (tf.data treats lists as tensors), as Reverb does, at any depth
    (inside namedtuples too)."""
    if isinstance(nest, list):
        return tuple(_as_tuples(x) for x in nest)
    if isinstance(nest, tuple):
        items = [_as_tuples(x) for x in nest]
        return type(nest)(*items) if hasattr(nest, "_fields") else tuple(items)
    if isinstance(nest, dict):
        return {k: _as_tuples(v) for k, v in nest.items()}
    return nest


def _has_lists(nest) -> bool:
    if isinstance(nest, list):
        return True
    if isinstance(nest, tuple):
        return any(_has_lists(x) for x in nest)
    if isinstance(nest, dict):
        return any(_has_lists(x) for x in nest.values())
    return False


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
        ``max_samples`` taken, or ``stop`` set)."""
        client = _connect(self.server_address)
        left = self.max_samples
        try:
            while left != 0:
                wanted = self.chunk if left < 0 else min(self.chunk, left)
                sample = self._take(client, wanted, stop)
                if sample is None:
                    return
                if left > 0:
                    left -= len(sample.info.key)
                yield sample
        finally:
            client.close()

    def _take(self, client, wanted, stop=None):
        """Up to ``wanted`` items (at least one), or None when the timeout (or ``stop``)
        ended it."""
        started = time.monotonic()
        while stop is None or not stop.is_set():
            wait = _batches.SLICE
            if self.timeout is not None:
                wait = min(wait, max(0.0, self.timeout - (time.monotonic() - started)))
            try:
                return client.sample_batch(self.table, wanted, timeout=wait)
            except errors.DeadlineExceededError:
                if self.timeout is not None and time.monotonic() - started >= self.timeout:
                    return None
        return None


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
            index, chunk, exc = results.get()
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
    timesteps (the info repeated on each)."""
    workers = 1 if num_workers_per_iterator == -1 else num_workers_per_iterator
    chunk_spec = ReplaySample(_info_spec((None,)), tf.nest.map_structure(
        lambda s: tf.TensorSpec((None,) + tuple(s.shape), s.dtype), data_spec))
    ndim = len(tf.nest.flatten(data_spec)[0].shape)

    flat_spec = tf.nest.flatten(data_spec)

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
        checked = add_time = lists = False
        for sample in chunks:
            sample = _as_timesteps(sample, ndim) if timesteps else _zero_copy(sample)
            if not checked:
                add_time = not timesteps and _wants_time_dim(sample, flat_spec)
                lists = _has_lists(sample.data)  # tuples, as the spec has them
            if lists:
                sample = ReplaySample(sample.info, _as_tuples(sample.data))
            if add_time:
                sample = ReplaySample(sample.info, specs.optree.tree_map(
                    lambda leaf: leaf[:, None], sample.data))
            if not checked:  # tf.data would cast a wrong dtype silently
                _check_chunk(sample, flat_spec, table)
                checked = True
            yield sample

    return tf.data.Dataset.from_generator(generate, output_signature=chunk_spec)


def _no_lookahead(dataset):
    """``dataset`` without the prefetch tf.data would add at the end of the pipeline:
    it takes items from the table before the consumer asks (2 chunks ahead here), so a
    queue loses them when the iterator is dropped, and ``max_in_flight`` would not
    bound what is taken. A ``prefetch`` the user adds is still theirs.

    And without tf.data's autotuning: these pipelines set their own parallelism and
    prefetch, and an iterator with autotuning has a model thread that its destructor
    joins; in 3 of 32 runs of ``examples/tf_dqn.py`` that join never returned (gdb:
    ``~RootDataset::Iterator`` waiting in ``Model::OptimizeLoop``), at a ``break`` out
    of the dataset or at exit. (Options the user sets later take precedence.)"""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    options.autotune.enabled = False
    return dataset.with_options(options)


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
            raise ValueError(
                f"Table '{table}': requested incompatible tensor at flattened index "
                f"{index}. Specification has (dtype, shape): ({dtype.name}, "
                f"{list(spec.shape)}). Tensor has (dtype, shape): ({leaf.dtype.name}, "
                f"{list(shape)}).")


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


class TrajectoryDataset(tf.data.Dataset):
    """One element per sampled item, the whole trajectory (Reverb's ``TrajectoryDataset``).

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
        server_address = _plain(server_address, "server_address")
        table = _plain(table, "table")
        data_spec = _data_spec(dtypes, shapes)
        for spec in tf.nest.flatten(data_spec):
            if 0 in spec.shape:  # tf.data's unbatch crashes the process (SIGSEGV) on them
                raise ValueError(
                    f"Table '{table}': a column of shape {list(spec.shape)} has no elements, "
                    "which this dataset cannot carry (TensorFlow crashes); use make_dataset, "
                    "or leave the column out of the items.")
        self._dataset = self._build(server_address, table, data_spec,
                                    max_in_flight_samples_per_worker, num_workers_per_iterator,
                                    rate_limiter_timeout_ms, max_samples)
        super().__init__(self._dataset._variant_tensor)

    def _build(self, server_address, table, data_spec, max_in_flight, workers, timeout_ms,
               max_samples):
        return _no_lookahead(_chunk_dataset(server_address, table, data_spec, max_in_flight,
                                            workers, timeout_ms, max_samples).unbatch())

    @property
    def element_spec(self):
        return self._dataset.element_spec

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
        dtypes, shapes = table_signature(server_address, table, get_signature_timeout_secs,
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
        return _no_lookahead(_chunk_dataset(server_address, table, data_spec, max_in_flight,
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
    shapes = specs.optree.tree_map(lambda shape: (sequence_length,) + tuple(shape),
                                   _as_tuples(shapes), is_leaf=_is_shape)
    return TrajectoryDataset(server_address, table, dtypes, shapes,
                             max_in_flight_samples_per_worker, num_workers_per_iterator,
                             max_samples_per_stream, rate_limiter_timeout_ms)


_CLIENT_TYPE = Client


def _plain(value, what: str):
    """A string given as a tf.Tensor (Reverb accepts ``str|tf.Tensor``) as a str."""
    if isinstance(value, tf.Tensor):
        if not hasattr(value, "numpy"):
            raise TypeError(f"{what} must be a str or an eager tf.Tensor, got the symbolic "
                            f"{value!r}.")
        value = value.numpy()
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode()
    return value


def _connect(server_address) -> Client:
    """A new Client for a dataset worker: by name, or like the given Client."""
    if isinstance(server_address, _CLIENT_TYPE):
        return Client(server_address.server_address, trust_group=server_address._trust_group)
    return Client(server_address)


def _connect_within(server_address, timeout_secs):
    deadline = None if timeout_secs is None else time.monotonic() + timeout_secs
    while True:
        try:
            return _connect(server_address)
        except errors.BufferNotFoundError:
            if deadline is None:
                raise
            if time.monotonic() >= deadline:
                raise errors.DeadlineExceededError(
                    f"No buffer named {server_address!r} appeared within "
                    f"{errors.seconds(timeout_secs)} (get_signature_timeout_secs).") from None
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def table_signature(server_address: str, table: str, timeout_secs: Optional[float] = None,
                    timesteps: bool = False):
    """``(dtypes, shapes)`` nests of a table's items (signature, or the first item's).

    ``timeout_secs``: how long to wait for the buffer to exist (its owner may start
    later); None: it must exist now. ``timesteps``: the shapes of one timestep (what
    ``TimestepDataset`` takes): without a signature, the items' shapes lose their time
    dimension when they are sequence items.

    Raises:
      ValueError: no such table, or nothing says what its items look like yet.
      BufferNotFoundError: no such buffer (``timeout_secs`` None).
      DeadlineExceededError: no such buffer within ``timeout_secs``.
    """
    server_address = _plain(server_address, "server_address")
    table = _plain(table, "table")
    client = _connect_within(server_address, timeout_secs)
    try:
        buffer = client._buffer
        engine = buffer.by_name.get(table)
        if engine is None:
            raise ValueError(
                f"Server at {server_address} does not contain any table named {table}. "
                f"Found: {', '.join(sorted(buffer.by_name))}.")
        layout = engine.known_layout()
        if layout is None:
            raise ValueError(f"Table {table} at {server_address} does not have a signature "
                             "(and no item fixed its shapes yet).")
        treedef, column_specs, _ = layout
        shapes = [tuple(s.shape) for s in column_specs]
        if (timesteps and engine.config.signature is None and engine.has_columns()
                and engine.storage.steps):
            # Shapes from the items (no signature): one timestep is a sequence item's
            # columns without their time dimension. A signature is taken as it is, as
            # Reverb does, so the dataset is the same whenever it is made.
            shapes = [shape if column.squeeze else shape[1:]
                      for shape, column in zip(shapes, engine.storage.columns)]
        dtypes = specs.optree.tree_unflatten(treedef, [s.dtype for s in column_specs])
        return dtypes, specs.optree.tree_unflatten(treedef, shapes)
    finally:
        client.close()


def make_dataset(server_address: str, table: str, batch_size: Optional[int], *,
                 prefetch_size: int = 2, sequence_length: Optional[int] = None,
                 num_parallel_calls: Optional[int] = None, deterministic: bool = True,
                 rate_limiter_timeout_ms: int = -1, max_batches: int = -1):
    """A dataset of whole batches, the learner's fast path (Acme's ``make_reverb_dataset``).

    Each element is ``ReplaySample`` with ``[batch_size]`` info fields and
    ``[batch_size, ...]`` data: one ``Client.sample_batch`` call, no per-item work in
    tf.data. Shapes come from the table (its signature, or its first item).

    Args:
      server_address, table: As for the datasets.
      batch_size: Items per element; every element is full. None: one item per element
        (a ``TrajectoryDataset``).
      prefetch_size: Batches prepared ahead of the consumer (they count as sampled when
        taken). 0: none. With ``num_parallel_calls`` above 1, up to that many more are
        being sampled at any time.
      sequence_length: If given, the items' time dimension, checked against the table
        (every column that has one).
      num_parallel_calls: Batches sampled at once. 1 keeps a FIFO table's order (the
        deterministic single-worker mode); 2 lets one call's copy overlap the other's
        Python work, faster for large batches from tables whose order does not matter.
        None (the default) picks 2 for uniform and prioritized tables when a batch is
        1 MiB or more, else 1.
      deterministic: With several workers, take their batches in a fixed rotation
        (True) or as they come (False, faster).
      rate_limiter_timeout_ms: End when a batch could not be filled for this long.
      max_batches: End after this many batches (-1: never).

    Raises:
      ValueError: an argument is out of range, or ``sequence_length`` does not match.
    """
    server_address = _plain(server_address, "server_address")
    table = _plain(table, "table")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be None or >= 1, got {batch_size}.")
    if num_parallel_calls is not None and num_parallel_calls < 1:
        raise ValueError(f"num_parallel_calls must be None or >= 1, got {num_parallel_calls}.")
    dtypes, shapes = table_signature(server_address, table)
    if sequence_length is not None:
        lengths = {shape[0] for shape in specs.optree.tree_leaves(shapes, is_leaf=_is_shape)
                   if shape}
        if lengths != {sequence_length}:
            raise ValueError(
                f"make_dataset: sequence_length={sequence_length}, but table '{table}' holds "
                f"items whose leading dimensions are {sorted(lengths)}.")
    if batch_size is None:
        items = TrajectoryDataset(server_address, table, dtypes, shapes, 2,
                                  num_parallel_calls or 1, -1, rate_limiter_timeout_ms,
                                  -1 if max_batches < 0 else max_batches)
        return items.prefetch(prefetch_size) if prefetch_size > 0 else items
    spec = ReplaySample(_info_spec((batch_size,)), _data_spec(dtypes, shapes, (batch_size,)))
    timeout = None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000
    if num_parallel_calls is None:
        batch_bytes = sum(leaf.shape.num_elements() * leaf.dtype.size
                          for leaf in tf.nest.flatten(spec.data))
        client = _connect(server_address)
        try:
            num_parallel_calls = _batches.default_parallelism(client, table, batch_bytes)
        finally:
            client.close()
    return _batch_dataset(server_address, table, batch_size, spec, timeout, max_batches,
                          num_parallel_calls, deterministic, prefetch_size)


def _batch_dataset(server_address, table, batch_size, spec, timeout, max_batches,
                   num_parallel_calls, deterministic, prefetch_size):
    """``make_dataset`` 's batches: ``range`` mapped through ``tf.numpy_function``.

    Not ``from_generator``: it converts every leaf in Python and copied the arrays; a
    ``numpy_function`` takes 64-byte aligned arrays (large batches come so, see
    ``shmreplay._outputs``) without copying, and runs ``num_parallel_calls`` calls at
    once, so that one call's copy (outside the GIL) overlaps another's Python work. On
    the benchmark machine this took 256 Atari frames from 3,470 to about 700 us a batch.
    ``max_batches`` bounds the ``range``, so no batch is sampled and thrown away.
    """
    flat_spec = tf.nest.flatten(spec)
    ends = timeout is not None  # only then can a call come back empty
    clients = _ClientPool(server_address)

    def fetch(_):
        with clients.borrow() as client:
            sample = _batches.full_batch(client, table, batch_size, timeout)
        if sample is None:
            return [False] + [np.zeros(s.shape, s.dtype.as_numpy_dtype) for s in flat_spec]
        leaves = tf.nest.flatten(sample)
        return [True] + leaves if ends else leaves

    def to_sample(index):
        out_types = ([tf.bool] if ends else []) + [s.dtype for s in flat_spec]
        flat = tf.numpy_function(fetch, [index], out_types, stateful=True)
        for tensor, leaf_spec in zip(flat[1:] if ends else flat, flat_spec):
            tensor.set_shape(leaf_spec.shape)
        sample = tf.nest.pack_sequence_as(spec, flat[1:] if ends else flat)
        return (flat[0], sample) if ends else sample

    indices = tf.data.Dataset.range(max_batches if max_batches >= 0 else np.iinfo(np.int64).max)
    if num_parallel_calls > 1:
        dataset = indices.map(to_sample, num_parallel_calls=num_parallel_calls,
                              deterministic=deterministic)
    else:  # a parallel map of one call still samples a batch ahead
        dataset = indices.map(to_sample)
    if ends:
        dataset = dataset.take_while(_is_ok).map(_drop_ok)
    return _no_lookahead(dataset.prefetch(prefetch_size) if prefetch_size > 0 else dataset)


def _is_ok(ok, _):
    return ok


def _drop_ok(_, sample):
    return sample


class _ClientPool:
    """Clients for a dataset's parallel calls: one per call in flight, made on demand."""

    def __init__(self, server_address):
        self._address = server_address
        self._idle = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self):
        with self._lock:
            client = self._idle.pop() if self._idle else None
        if client is None:
            client = _connect(self._address)
        try:
            yield client
        finally:
            with self._lock:
                self._idle.append(client)


def _zero_copy(sample):
    """``sample`` with its large data leaves as tensors sharing their memory (DLPack).

    ``from_generator`` would otherwise copy every array into a new tensor: 7 MB for 256
    Atari frames, about 200 us, plus page faults on TensorFlow's fresh allocation. The
    tensor keeps the array (and its pooled block, see ``shmreplay._outputs``) alive.
    """
    return ReplaySample(sample.info, specs.optree.tree_map(_shared_tensor, sample.data))


def _shared_tensor(leaf):
    if (leaf.nbytes < _outputs.POOL_FROM or leaf.dtype.kind not in "iuf"
            or leaf.ctypes.data % _outputs.ALIGN or not leaf.flags.c_contiguous):
        return leaf
    return tf.experimental.dlpack.from_dlpack(leaf.__dlpack__())


class ReplayBuffer:
    """A tf_agents-style replay buffer over a shmreplay table (no tf_agents needed).

    Mirrors the parts of ``tf_agents.replay_buffers.ReverbReplayBuffer`` a training
    loop uses; items are written by actors with ``Client`` or a writer.

    Args:
      server_address: The buffer's name, or a ``Client`` (its name and ``trust_group``
        are used: the way to read a group member's shared buffer).
      table_name: The table.
    """

    def __init__(self, server_address: str, table_name: str):
        self._address = server_address
        self._table = table_name
        self._client = _connect(server_address)
        self._engine = self._client._engine(table_name)

    @property
    def capacity(self) -> int:
        return self._engine.config.max_size

    @property
    def data_spec(self):
        dtypes, shapes = table_signature(self._address, self._table)
        return _data_spec(dtypes, shapes)

    def num_frames(self) -> int:
        """Items in the table now."""
        return self._client.server_info()[self._table].current_size

    def get_table_info(self):
        return self._client.server_info()[self._table]

    def as_dataset(self, sample_batch_size: Optional[int] = None, num_steps: Optional[int] = None,
                   num_parallel_calls: Optional[int] = None, sequence_preprocess_fn=None,
                   single_deterministic_pass: bool = False):
        """Samples as ``(data, info)`` pairs, batched by ``sample_batch_size`` if given.

        ``num_steps`` must be None or match the items' time dimension (items are stored
        with a fixed length). ``single_deterministic_pass`` samples with one worker and
        ends when no item arrives within a second; like tf_agents it raises ValueError
        unless the table's sampler and remover are both deterministic (Fifo, Lifo or a
        heap).
        """
        if single_deterministic_pass:
            info = self.get_table_info()
            if not (info.sampler_options["is_deterministic"]
                    and info.remover_options["is_deterministic"]):
                raise ValueError(
                    f"Unable to perform a single deterministic pass over table "
                    f"'{self._table}': its sampler or remover is not deterministic "
                    "(use Fifo, Lifo or a heap for both), as in tf_agents.")
        dtypes, shapes = table_signature(self._address, self._table)
        if num_steps is not None:
            lengths = {shape[0] if shape else None
                       for shape in specs.optree.tree_leaves(shapes, is_leaf=_is_shape)}
            if lengths != {num_steps}:
                raise ValueError(f"ReplayBuffer.as_dataset: num_steps={num_steps}, but the "
                                 f"table's items have time dimensions {sorted(map(str, lengths))}.")
        timeout = 1000 if single_deterministic_pass else -1
        if sample_batch_size is not None and not single_deterministic_pass:
            dataset = make_dataset(self._address, self._table, sample_batch_size,
                                   num_parallel_calls=num_parallel_calls,
                                   rate_limiter_timeout_ms=timeout)
        else:
            workers = 1 if single_deterministic_pass else (num_parallel_calls or -1)
            dataset = TrajectoryDataset(self._address, self._table, dtypes, shapes,
                                        max_in_flight_samples_per_worker=2 * (sample_batch_size or 1),
                                        num_workers_per_iterator=workers,
                                        rate_limiter_timeout_ms=timeout)
            if sample_batch_size is not None:
                dataset = dataset.batch(sample_batch_size, drop_remainder=True)
        dataset = dataset.map(lambda sample: (sample.data, sample.info))
        if sequence_preprocess_fn is not None:
            dataset = dataset.map(lambda data, info: (sequence_preprocess_fn(data), info))
        return dataset

    def update_priorities(self, keys, priorities):
        """Sets priorities by key (keys from ``info.key``; numpy or tf tensors).

        Works inside a ``tf.function`` too (as a ``tf.numpy_function``), where it returns
        the number of keys updated as an int64 tensor.
        """
        if not tf.executing_eagerly():
            return tf.numpy_function(self._update, [keys, priorities], tf.int64,
                                     stateful=True)
        return self._update(keys, priorities)

    def _update(self, keys, priorities):
        return np.int64(self._client.update_priorities(
            self._table, np.asarray(keys, np.uint64), np.asarray(priorities, np.float64)))

    def clear(self):
        """Removes every item (and resets the table's rate limiter)."""
        self._client.reset(self._table)

    def close(self):
        self._client.close()

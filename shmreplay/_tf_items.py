"""Reverb's per-item datasets (``TrajectoryDataset``, ``TimestepDataset``,
``ReplayDataset``), re-exported by ``shmreplay.tf``, which explains how they sample.
"""

import collections
import queue
import threading
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from shmreplay import _batches, _tf_common as common, errors, specs
from shmreplay._engine.kinds import general as _general
from shmreplay._tf_item_views import ItemViews
from shmreplay.replay_sample import ReplaySample


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
    """Samples chunks of a table for one tf.data pipeline: what its calls share."""

    def __init__(self, server_address, table, chunk, rate_limiter_timeout_ms, max_samples,
                 views):
        self.server_address = server_address
        self.table = table
        self.chunk = chunk
        self.timeout = None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000
        self.max_samples = max_samples
        self.views = views
        # Chunks drawn but not given yet: items of other shapes that could not share a
        # chunk come one per chunk, the first at once and the others at the next calls.
        self.drawn = collections.deque()

    def take(self, client, left, waiting_since):
        """The next chunk as ``(items, info leaves, data leaves)``: up to ``chunk`` items (no
        more than ``left``, unless it is -1); None if none came within a slice;
        ``_ENDED`` when ``left`` is 0 or the timeout (counted from ``waiting_since``)
        ran out."""
        wanted = self.chunk if left < 0 else min(self.chunk, left)
        if wanted == 0:
            return _ENDED
        try:
            return self.drawn.popleft()
        except IndexError:
            pass
        wait = _batches.SLICE
        if self.timeout is not None:  # (a call is made even at 0: what is there comes)
            wait = min(wait, max(0.0, self.timeout - (time.monotonic() - waiting_since)))
        try:
            parts = _sample_parts(client, self.table, wanted, wait)
        except errors.DeadlineExceededError:
            if self.timeout is not None and time.monotonic() - waiting_since >= self.timeout:
                return _ENDED
            return None
        engine = client._engine(self.table)
        chunks = [(len(part.info.key),) + self.views(engine, part) for part in parts]
        self.drawn.extend(chunks[1:])
        return chunks[0]

    def chunks(self, stop: Optional[threading.Event] = None):
        """Yields chunks until the end (the timeout, ``max_samples`` taken, or ``stop``
        set), and None after each slice of waiting in which no item came."""
        client = common.connect(self.server_address)
        left = self.max_samples
        try:
            waiting_since = time.monotonic()
            while stop is None or not stop.is_set():
                chunk = self.take(client, left, waiting_since)
                if chunk is _ENDED:
                    return
                if chunk is not None:
                    waiting_since = time.monotonic()
                    left = left - chunk[0] if left > 0 else left  # (items, not timesteps)
                yield chunk
        finally:
            client.close()


def _sample_parts(client, table: str, count: int, timeout):
    """``client.sample_batch``, in parts (``kinds.general.sample_parts``)."""
    try:
        try:
            return _general.sample_parts(client._engine(table, timeout), count, timeout)
        except errors.LayoutResetError:  # drawn against a layout forgotten meanwhile
            return _general.sample_parts(client._engine(table), count, timeout)
    except Exception as exc:
        client._raise_if_closed(exc)
        raise


_ENDED = object()  # a worker's timeout ran out, or it took all it may


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
                yield None  # nothing yet: return to tf.data (see _item_dataset)
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


def _item_dataset(server_address, table, data_spec, max_in_flight_samples_per_worker,
                  num_workers_per_iterator, rate_limiter_timeout_ms, max_samples,
                  timesteps=False):
    """A dataset of items (``ReplaySample`` s of ``data_spec``), sampled in chunks of up
    to ``max_in_flight_samples_per_worker``; with ``timesteps``, sequence items are cut
    into their timesteps (the info repeated on each).

    While no item comes, a call returns an empty chunk every ``SLICE`` (which gives no
    element) instead of waiting on: a call that waits holds a tf.data thread that
    nothing can interrupt. Three interleaved datasets draining a table whose items
    expire (TF-Agents' ``test_prioritized_table_max_sample``) hung that way: the drained
    datasets waited forever inside their calls, and the iterator's destructor (or the
    interleave) waited for them. Returning lets tf.data cancel the next call instead.
    """
    workers = 1 if num_workers_per_iterator == -1 else num_workers_per_iterator
    chunk_spec = ReplaySample(common.info_spec((None,)), tf.nest.map_structure(
        lambda s: tf.TensorSpec(tf.TensorShape([None]).concatenate(s.shape), s.dtype),
        data_spec))
    any_length = [] if timesteps else common.any_length_columns(server_address, table,
                                                                data_spec)
    if any(any_length):  # the chunks carry the lengths to cut the items to
        chunk_spec = (chunk_spec, tuple(tf.TensorSpec((None,), tf.int64)
                                        for flag in any_length if flag))
    views = ItemViews(table, tf.nest.flatten(data_spec), timesteps, any_length)

    def worker(index):
        # Each worker has its own share of max_samples, so together they take exactly
        # max_samples and no worker takes what another should have.
        budget = -1
        if max_samples != -1:
            budget = max_samples // workers + (1 if index < max_samples % workers else 0)
        return _Worker(server_address, table, max_in_flight_samples_per_worker,
                       rate_limiter_timeout_ms, budget, views)

    if workers == 1:
        items = _mapped_items(worker(0), chunk_spec)
    else:
        items = _generated_chunks([w for w in map(worker, range(workers))
                                   if w.max_samples != 0], chunk_spec).unbatch()
    if not any(any_length):
        return items
    # Not fused with a later ``batch``: on a busy machine the fused op (which runs the map
    # on tf.data's threads) cost 1.7x the map and batch apart (134 against 79 us an item).
    options = tf.data.Options()
    options.experimental_optimization.map_and_batch_fusion = False
    return items.map(_cutter(any_length)).with_options(options)


def _cutter(any_length):
    """The map that cuts each padded item of any length to its own length (one slice per
    column of any length, in the pipeline: no Python per item)."""

    @tf.autograph.experimental.do_not_convert
    def cut(sample, lengths):
        leaves, lengths = tf.nest.flatten(sample.data), iter(lengths)
        leaves = [leaf[:next(lengths)] if flag else leaf
                  for leaf, flag in zip(leaves, any_length)]
        return ReplaySample(sample.info, tf.nest.pack_sequence_as(sample.data, leaves))

    return cut


def _mapped_items(worker, chunk_spec):
    """One worker's items: ``range`` flat-mapped through a ``tf.numpy_function`` that
    samples a chunk, sliced by ``from_tensor_slices``. No Python generator, whose per-
    iterator machinery (``from_generator``) cost about 3.5 ms to make an iterator and
    6-9 ms more to its first element, 3x Reverb's.

    Making an iterator instantiates each dataset function afresh, and Grappler's work
    on one grows with its outputs (about 0.3 ms each here): a function that returns
    its chunk as one dataset costs least. (``map`` + ``unbatch`` returned 10 tensors,
    and ``unbatch`` adds a ``map`` of its own: 3x the cost.) Without a timeout or
    ``max_samples`` a call needs nothing from the one before. Otherwise a ``scan``
    carries the items left and when the last item came from call to call (per
    iterator: each samples on its own), and ``take_while`` ends the dataset.
    """
    flat_spec = tf.nest.flatten(chunk_spec)
    out_types = [tf.bool, tf.int64, tf.float64] + [s.dtype for s in flat_spec]
    empty = [_no_items(s) for s in flat_spec]
    clients = common.ClientPool(worker.server_address)

    def fetch(left, waiting_since):
        """``[ended, items left, waiting since] + chunk leaves`` after one sampling call."""
        left, waiting_since = int(left), float(waiting_since)
        if waiting_since < 0:  # the iterator's first call
            waiting_since = time.monotonic()
        with clients.borrow() as client:
            chunk = worker.take(client, left, waiting_since)
        if chunk is None or chunk is _ENDED:
            return [np.bool_(chunk is _ENDED), np.int64(left), np.float64(waiting_since)] + empty
        items, info, data = chunk
        left = left - items if left > 0 else left
        return [np.bool_(False), np.int64(left), np.float64(time.monotonic())] + info + data

    def call(left, waiting_since):
        out = tf.numpy_function(fetch, [left, waiting_since], out_types, stateful=True)
        for tensor, spec in zip(out[3:], flat_spec):
            tensor.set_shape(spec.shape)
        return out[0], (out[1], out[2]), tf.nest.pack_sequence_as(chunk_spec, out[3:])

    slices = tf.data.Dataset.from_tensor_slices
    plain = tf.autograph.experimental.do_not_convert  # (nothing to convert: traced faster)
    indices = tf.data.Dataset.range(np.iinfo(np.int64).max)
    if worker.timeout is None and worker.max_samples == -1:  # never ends, keeps no state
        return indices.flat_map(plain(lambda _: slices(call(np.int64(-1), np.float64(-1.0))[2])))

    def step(state, _):  # (the chunk leaves it as a dataset: fewer outputs)
        ended, state, chunk = call(*state)
        return state, (ended, slices(chunk))

    start = (np.int64(worker.max_samples), np.float64(-1.0))
    return (indices.scan(start, plain(step))
            .take_while(plain(lambda ended, _: tf.logical_not(ended)))
            .flat_map(plain(lambda _, items: items)))


def _no_items(chunk_spec):
    """An empty chunk of a column (a shape of unknown rank: any array fits it)."""
    cell = [] if chunk_spec.shape.rank is None else chunk_spec.shape.as_list()[1:]
    return np.zeros([0] + [d or 0 for d in cell], chunk_spec.dtype.as_numpy_dtype)


def _generated_chunks(workers, chunk_spec):
    """Several workers' chunks through ``from_generator``: their threads need a per-
    iterator generator (see ``_parallel_chunks``)."""
    empty = tf.nest.map_structure(_no_items, chunk_spec)

    def generate():
        for chunk in _parallel_chunks(workers):
            if chunk is None:
                yield empty
                continue
            _, info, data = chunk
            yield tf.nest.pack_sequence_as(chunk_spec, info + [
                common.shared_tensor(leaf) for leaf in data])

    return tf.data.Dataset.from_generator(generate, output_signature=chunk_spec)


class TrajectoryDataset(tf.compat.v1.data.Dataset):
    """One element per sampled item, the whole trajectory (Reverb's ``TrajectoryDataset``).

    A ``tf.compat.v1.data.Dataset``, as Reverb's is: a ``tf.data.Dataset`` in every
    way, that also has the graph-mode ``make_initializable_iterator()`` and
    ``make_one_shot_iterator()`` methods Reverb's users (and its tests) call.

    Args:
      server_address: The buffer's name, or a ``Client`` (its name and ``trust_group``
        are used: the way to read a group member's shared buffer).
      table: The table to sample.
      dtypes: A nest describing ``data``'s dtypes (lists are read as tuples).
      shapes: A nest like ``dtypes``: the item's shapes, time dimension included for
        sequence items; ``None`` for a table of items of any length, whose items then
        come each at its own length.
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
            if spec.shape.rank and 0 in spec.shape:  # (unbatch crashes the process on them)
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
        return common.no_lookahead(_item_dataset(server_address, table, data_spec, max_in_flight,
                                                 workers, timeout_ms, max_samples))

    @property
    def element_spec(self):
        """The spec of one element: ``ReplaySample(info, data)`` of ``tf.TensorSpec``."""
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
    must have the same length (items of any length: each item its own number of
    timesteps); items from ``Client.insert`` are one timestep each. The
    item's ``info`` repeats on each of its timesteps; nothing marks where an item ends
    (batch by the item length, or use ``TrajectoryDataset``). ``from_table_signature``
    takes the table's signature as it is (one timestep's, as in Reverb) or, without one,
    the items' shapes: a sequence item's columns without their time dimension.
    """

    _TIMESTEPS = True

    def _build(self, server_address, table, data_spec, max_in_flight, workers, timeout_ms,
               max_samples):
        # ``max_samples`` counts items, as in Reverb.
        return common.no_lookahead(_item_dataset(server_address, table, data_spec, max_in_flight,
                                                 workers, timeout_ms, max_samples,
                                                 timesteps=True))


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

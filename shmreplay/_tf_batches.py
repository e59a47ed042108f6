"""Whole batches for TensorFlow learners: ``make_dataset`` and a tf_agents-style
``ReplayBuffer`` (both re-exported by ``shmreplay.tf``).

Each element is one ``sample_batch`` call, mapped through ``tf.numpy_function`` so that
large batches reach TensorFlow without a copy.
"""

from typing import Optional

import numpy as np
import tensorflow as tf

from shmreplay import _batches, _tf_common as common, specs
from shmreplay._tf_items import TrajectoryDataset
from shmreplay._tf_packing import Packing, default_batches_per_call
from shmreplay.replay_sample import ReplaySample


def make_dataset(server_address: str, table: str, batch_size: Optional[int], *,
                 prefetch_size: int = 2, sequence_length: Optional[int] = None,
                 num_parallel_calls: Optional[int] = None, deterministic: bool = True,
                 rate_limiter_timeout_ms: int = -1, max_batches: int = -1,
                 pad_to: Optional[int] = None, batches_per_call: Optional[int] = None):
    """A dataset of whole batches, the learner's fast path (Acme's ``make_reverb_dataset``).

    Each element is ``ReplaySample`` with ``[batch_size]`` info fields and
    ``[batch_size, ...]`` data: one ``Client.sample_batch`` call, no per-item work in
    tf.data. Shapes come from the table (its signature, or its first item).

    A table of items of any length (a signature's ``None`` time dimension) gives pairs
    ``(ReplaySample, lengths)`` instead: the columns of any length zero-padded to the
    batch's longest item (or to ``pad_to`` steps), ``lengths`` a nest like ``data`` of
    int64 ``[batch_size]`` (``Client.sample_batch`` 's ``PaddedSample``; see
    ``docs/learners.md`` for why a pair).

    Args:
      server_address: As for the datasets: the buffer's name, or a ``Client``.
      table: The table to sample.
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
      pad_to: Items of any length only: pad their columns to this many steps, so that
        every batch has one shape (a compiled learner's); a longer item raises
        ``InvalidArgumentError`` (a ``ValueError`` from ``Client.sample_batch``).
      batches_per_call: Batches sampled in one trip from TensorFlow into Python (each
        its own ``sample_batch`` call), which ``unbatch`` then hands out one by one. A
        trip costs TensorFlow about as much as sampling a small batch, so for small
        batches several per trip are faster; but they are all taken when the first is
        asked for, so with priorities updated each step the last one was drawn up to
        ``batches_per_call - 1`` updates earlier. None (the default) picks up to 8, as
        many as fit 512 KiB, for uniform and prioritized tables of fixed shapes, else 1
        (a FIFO, LIFO or heap table: what is taken ahead is lost with the iterator).
        1: each batch is sampled when the pipeline asks for it.

    Raises:
      ValueError: an argument is out of range, ``sequence_length`` does not match, or
        ``pad_to`` is given for a table of fixed shapes or without ``batch_size``.
    """
    server_address = common.plain(server_address, "server_address")
    table = common.plain(table, "table")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be None or >= 1, got {batch_size}.")
    if num_parallel_calls is not None and num_parallel_calls < 1:
        raise ValueError(f"num_parallel_calls must be None or >= 1, got {num_parallel_calls}.")
    if batches_per_call is not None and (isinstance(batches_per_call, bool) or int(
            batches_per_call) != batches_per_call or batches_per_call < 1):
        raise ValueError(f"make_dataset: batches_per_call must be None or an integer >= 1, "
                         f"got {batches_per_call!r}.")
    dtypes, shapes = common.table_signature(server_address, table)
    treedef, _, shape_leaves = common.flatten_specs(dtypes, shapes)
    any_length = [bool(shape) and shape[0] is None for shape in shape_leaves]
    if pad_to is not None:
        _check_pad_to(table, pad_to, batch_size, any(any_length), sequence_length)
    if sequence_length is not None and any(any_length):
        # Acme's fixed sequences from a table of items of any length: each batch's items
        # are checked to have that length (a plain ReplaySample, as for fixed items).
        shapes = specs.optree.tree_unflatten(treedef, [
            (sequence_length,) + tuple(shape[1:]) if flag else shape
            for shape, flag in zip(shape_leaves, any_length)])
        fixed_length = (sequence_length, any_length)
        shape_leaves = common.flatten_specs(dtypes, shapes)[2]
        any_length = [False] * len(any_length)
    else:
        fixed_length = None
    if sequence_length is not None:
        lengths = {shape[0] for shape in common.flatten_specs(dtypes, shapes)[2] if shape}
        if lengths != {sequence_length}:
            raise ValueError(
                f"make_dataset: sequence_length={sequence_length}, but table '{table}' holds "
                f"items whose leading dimensions are {sorted(lengths)}.")
    if batch_size is None:
        items = TrajectoryDataset(server_address, table, dtypes, shapes, 2,
                                  num_parallel_calls or 1, -1, rate_limiter_timeout_ms,
                                  -1 if max_batches < 0 else max_batches)
        return items.prefetch(prefetch_size) if prefetch_size > 0 else items
    if any(any_length):  # the padded time dimension: pad_to, or each batch's own
        shapes = specs.optree.tree_unflatten(treedef, [
            (pad_to,) + tuple(shape[1:]) if flag else shape
            for shape, flag in zip(shape_leaves, any_length)])
    spec = ReplaySample(common.info_spec((batch_size,)),
                        common.data_spec(dtypes, shapes, (batch_size,)))
    timeout = None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000
    padded = any(any_length)
    if padded:
        if batches_per_call not in (None, 1):
            raise ValueError(
                f"make_dataset: batches_per_call={batches_per_call} needs items of fixed "
                f"shapes; table '{table}' holds items of any length, whose batches differ "
                "in shape: leave batches_per_call out.")
        batches_per_call = 1
    if num_parallel_calls is None or batches_per_call is None:
        flat_spec = tf.nest.flatten(spec)
        batch_bytes = sum(leaf.shape.num_elements() * leaf.dtype.size for leaf in flat_spec
                          if leaf.shape.is_fully_defined())  # (any length: a lower bound)
        client = common.connect(server_address)
        try:
            if num_parallel_calls is None:
                num_parallel_calls = _batches.default_parallelism(client, table, batch_bytes)
            if batches_per_call is None:
                batches_per_call = default_batches_per_call(
                    batch_bytes, _batches.is_deterministic(client, table))
        finally:
            client.close()
    if padded:
        spec = (spec, tf.nest.map_structure(
            lambda _: tf.TensorSpec((batch_size,), tf.int64), spec.data))
    return _batch_dataset(server_address, table, batch_size, spec, timeout, max_batches,
                          num_parallel_calls, deterministic, prefetch_size, pad_to,
                          fixed_length, batches_per_call)


def _check_pad_to(table, pad_to, batch_size, any_length, sequence_length):
    if sequence_length is not None:
        raise ValueError("make_dataset: give pad_to (padded items of any length) or "
                         "sequence_length (items of exactly that length), not both.")
    if isinstance(pad_to, bool) or int(pad_to) != pad_to or pad_to < 1:
        raise ValueError(f"make_dataset: pad_to must be None or an integer >= 1, got "
                         f"{pad_to!r}.")
    if not any_length:
        raise ValueError(
            f"make_dataset: pad_to is for tables of items of any length (a signature "
            f"whose time dimension is None); table '{table}' has fixed shapes, so leave "
            "pad_to out.")
    if batch_size is None:
        raise ValueError("make_dataset: pad_to pads batches; with batch_size=None each "
                         "element is one item at its own length, so leave pad_to out.")


def _batch_dataset(server_address, table, batch_size, spec, timeout, max_batches,
                   num_parallel_calls, deterministic, prefetch_size, pad_to=None,
                   fixed_length=None, batches_per_call=1):
    """``make_dataset`` 's batches: ``range`` mapped through ``tf.numpy_function``.

    Not ``from_generator``: it converts every leaf in Python and copied the arrays; a
    ``numpy_function`` takes 64-byte aligned arrays (large batches come so, see
    ``shmreplay._engine.outputs``) without copying, and runs ``num_parallel_calls`` calls at
    once, so that one call's copy (outside the GIL) overlaps another's Python work. On
    the benchmark machine this took 256 Atari frames from 3,470 to about 700 us a batch.
    With ``batches_per_call`` above 1 each call brings that many batches as rows (fixed
    shapes only, see ``shmreplay._tf_packing``), and ``unbatch`` hands them out.
    ``max_batches`` bounds the ``range``, so no batch is sampled and thrown away.
    ``spec`` is ``(ReplaySample spec, lengths spec)`` for items of any length.
    """
    flat_spec = tf.nest.flatten(spec)
    ends = timeout is not None  # only then can a call come back empty
    clients = common.ClientPool(server_address)
    padded = not isinstance(spec, ReplaySample)  # (ReplaySample, lengths): any length
    # Fixed shapes: the small leaves travel packed in one uint8 array (see Packing).
    packing = (Packing(flat_spec) if not padded and all(
        leaf_spec.shape.is_fully_defined() for leaf_spec in flat_spec) else None)
    rows = batches_per_call > 1  # (make_dataset allows it for fixed shapes only)

    def leaves_of(sample):
        leaves = tf.nest.flatten(sample)
        if padded:
            leaves += tf.nest.flatten(sample.lengths)
        elif fixed_length is not None:
            _check_fixed_length(table, sample, fixed_length)
        return leaves

    def fetch(_):
        with clients.borrow() as client:
            sample = _batches.full_batch(client, table, batch_size, timeout, pad_to=pad_to)
        if sample is None:
            empty = [np.zeros([d or 0 for d in s.shape.as_list()], s.dtype.as_numpy_dtype)
                     for s in flat_spec]
            return [False] + (empty if packing is None else packing.pack(empty))
        leaves = leaves_of(sample)
        if packing is not None:
            leaves = packing.pack(leaves)
        return [True] + leaves if ends else leaves

    def fetch_rows(index):
        count = batches_per_call if max_batches < 0 else min(
            batches_per_call, max_batches - int(index) * batches_per_call)
        batches = []
        with clients.borrow() as client:
            while len(batches) < count:
                sample = _batches.full_batch(client, table, batch_size, timeout)
                if sample is None:  # (the batches before it are still handed out)
                    break
                batches.append(leaves_of(sample))
        outputs = packing.pack_rows(batches)
        return [bool(batches)] + outputs if ends else outputs

    def to_sample(index):
        leaf_types = ([s.dtype for s in flat_spec] if packing is None
                      else packing.output_dtypes)
        flat = tf.numpy_function(fetch_rows if rows else fetch, [index],
                                 ([tf.bool] if ends else []) + leaf_types, stateful=True)
        leaves = flat[1:] if ends else flat
        if packing is not None:
            leaves = packing.unpack(leaves, rows=rows)
        for tensor, leaf_spec in zip(leaves, flat_spec):
            tensor.set_shape(([None] if rows else []) + leaf_spec.shape.as_list())
        sample = tf.nest.pack_sequence_as(spec, leaves)
        return (flat[0], sample) if ends else sample

    calls = (np.iinfo(np.int64).max if max_batches < 0
             else -(-max_batches // batches_per_call))
    indices = tf.data.Dataset.range(calls)
    if num_parallel_calls > 1:
        dataset = indices.map(to_sample, num_parallel_calls=num_parallel_calls,
                              deterministic=deterministic)
    else:  # a parallel map of one call still samples a batch ahead
        dataset = indices.map(to_sample)
    if ends:
        dataset = dataset.take_while(_is_ok).map(_drop_ok)
    if rows:
        dataset = dataset.unbatch()
    return common.no_lookahead(dataset.prefetch(prefetch_size) if prefetch_size > 0 else dataset)


def _check_fixed_length(table, sample, fixed_length):
    """Every item of ``sample`` (a ``PaddedSample``) has the ``sequence_length`` steps of
    ``fixed_length = (sequence_length, flags of the columns of any length)``."""
    length, flags = fixed_length
    for lengths, flag in zip(tf.nest.flatten(sample.lengths), flags):
        if flag and (lengths != length).any():
            raise ValueError(
                f"make_dataset: sequence_length={length}, but table '{table}' gave an item "
                f"of {int(lengths[lengths != length][0])} steps (its items have any "
                "length): leave sequence_length out for padded batches with their lengths.")


def _is_ok(ok, _):
    return ok


def _drop_ok(_, sample):
    return sample


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
        self._client = common.connect(server_address)
        self._engine = self._client._engine(table_name)

    @property
    def capacity(self) -> int:
        """The table's ``max_size``."""
        return self._engine.config.max_size

    @property
    def data_spec(self):
        """The ``tf.TensorSpec`` nest of one item, from the table's signature."""
        dtypes, shapes = common.table_signature(self._address, self._table)
        return common.data_spec(dtypes, shapes)

    def num_frames(self) -> int:
        """Items in the table now."""
        return self._client.server_info()[self._table].current_size

    def get_table_info(self):
        """The table's ``TableInfo`` now (``Client.server_info()[table]``)."""
        return self._client.server_info()[self._table]

    def as_dataset(self, sample_batch_size: Optional[int] = None, num_steps: Optional[int] = None,
                   num_parallel_calls: Optional[int] = None, sequence_preprocess_fn=None,
                   single_deterministic_pass: bool = False, pad_to: Optional[int] = None):
        """Samples as ``(data, info)`` pairs, batched by ``sample_batch_size`` if given.

        ``num_steps`` must be None or match the items' time dimension (items are stored
        with a fixed length). Items of any length (a signature's ``None`` time
        dimension) come one by one at their own length; batched, as
        ``((data, info), lengths)``, padded to the batch's longest item or to ``pad_to``
        (see ``make_dataset``). ``single_deterministic_pass`` samples with one worker and
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
        dtypes, shapes = common.table_signature(self._address, self._table)
        if num_steps is not None:
            lengths = {shape[0] if shape else None
                       for shape in common.flatten_specs(dtypes, shapes)[2]}
            if lengths != {num_steps}:
                raise ValueError(f"ReplayBuffer.as_dataset: num_steps={num_steps}, but the "
                                 f"table's items have time dimensions {sorted(map(str, lengths))}.")
        timeout = 1000 if single_deterministic_pass else -1
        any_length = any(bool(shape) and shape[0] is None
                         for shape in common.flatten_specs(dtypes, shapes)[2])
        if any_length and sample_batch_size is not None:
            # Padded batches with their lengths, one worker for a single pass (its order).
            dataset = make_dataset(self._address, self._table, sample_batch_size,
                                   num_parallel_calls=1 if single_deterministic_pass
                                   else num_parallel_calls,
                                   rate_limiter_timeout_ms=timeout, pad_to=pad_to)
            return dataset.map(lambda sample, lengths: (
                (sample.data if sequence_preprocess_fn is None
                 else sequence_preprocess_fn(sample.data), sample.info), lengths))
        if pad_to is not None:
            raise ValueError(
                f"ReplayBuffer.as_dataset: pad_to pads batches of items of any length; table "
                f"'{self._table}' " + ("has fixed shapes" if not any_length else
                                       "gives one item per element without "
                                       "sample_batch_size") + ", so leave pad_to out.")
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
        """Closes the buffer's client (the table is left as it is)."""
        self._client.close()

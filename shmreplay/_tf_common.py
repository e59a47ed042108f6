"""What shmreplay's tf.data datasets share: specs, options, connecting, signatures.

``shmreplay.tf`` (the per-item datasets, Reverb's) and ``shmreplay._tf_batches``
(``make_dataset`` and the tf_agents-style ``ReplayBuffer``, whole batches) both build
on these.
"""

import contextlib
import numbers
import threading
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from shmreplay import _batches, errors, specs
from shmreplay._engine import outputs as _outputs
from shmreplay.client import Client
from shmreplay.replay_sample import INFO_DTYPES, SampleInfo


def info_spec(batch_shape=()):
    return SampleInfo(*(tf.TensorSpec(batch_shape, tf.as_dtype(INFO_DTYPES[field]))
                        for field in SampleInfo._fields))


def data_spec(dtypes, shapes, batch_shape=()):
    """The ``tf.TensorSpec`` nest of ``dtypes`` and ``shapes``, with ``batch_shape`` first.

    The structure comes from ``dtypes``, as in Reverb: a leaf there is one tensor, and
    ``shapes`` gives a shape at each (a tuple, list or ``TensorShape``, read whole). So an
    empty sub-nest in ``dtypes`` (Acme's ``extras=()``, TF-Agents' ``policy_info=()``)
    stays an empty sub-nest with no tensor, where ``shapes`` has ``()`` or ``[]`` too.
    """
    treedef, dtype_leaves, shape_leaves = flatten_specs(dtypes, shapes)
    return specs.optree.tree_unflatten(treedef, [
        tf.TensorSpec(tf.TensorShape(batch_shape).concatenate(shape), tf.as_dtype(dtype))
        for dtype, shape in zip(dtype_leaves, shape_leaves)])


def flatten_specs(dtypes, shapes):
    """``(treedef, dtype leaves, shape leaves)`` of a dataset's ``dtypes`` and ``shapes``,
    the structure taken from ``dtypes`` (see ``data_spec``)."""
    dtypes = as_tuples(dtypes)
    shapes = as_tuples(shapes)
    dtype_leaves, treedef = specs.optree.tree_flatten(dtypes, none_is_leaf=True)
    if any(leaf is None for leaf in dtype_leaves):
        raise ValueError(
            "The items have a None value (no tensor), which tf.data cannot carry: read "
            "them with Client.sample_batch, or leave the field out of the items.")
    try:
        shape_leaves = treedef.flatten_up_to(shapes)
    except ValueError as exc:
        raise ValueError(f"dtypes and shapes must have the same structure: {exc}") from exc
    for shape in shape_leaves:
        if not is_shape(shape):
            raise ValueError(f"dtypes and shapes must have the same structure: {shape!r} is "
                             "where dtypes has a dtype, and it is not a shape.")
    return treedef, dtype_leaves, [_as_tuple(shape) for shape in shape_leaves]


def _as_tuple(shape):
    if isinstance(shape, tf.TensorShape) and shape.rank is not None:
        return tuple(shape.as_list())
    return shape


def is_shape(x):
    return isinstance(x, tf.TensorShape) or (isinstance(x, tuple) and all(
        d is None or isinstance(d, (numbers.Integral, tf.compat.v1.Dimension)) for d in x))


def as_tuples(nest):
    """Lists become tuples (tf.data treats lists as tensors), as Reverb does, at any depth
    (inside namedtuples too)."""
    if isinstance(nest, list):
        return tuple(as_tuples(x) for x in nest)
    if isinstance(nest, tuple):
        items = [as_tuples(x) for x in nest]
        return type(nest)(*items) if hasattr(nest, "_fields") else tuple(items)
    if isinstance(nest, dict):
        return {k: as_tuples(v) for k, v in nest.items()}
    return nest


def no_lookahead(dataset):
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


_CLIENT_TYPE = Client  # (tests replace Client to watch how workers attach)


def plain(value, what: str):
    """A string given as a tf.Tensor (Reverb accepts ``str|tf.Tensor``) as a str: an eager
    tensor's value, or a graph-mode constant's (``tf.constant`` under ``tf.compat.v1``)."""
    if isinstance(value, tf.Tensor):
        static = tf.get_static_value(value)
        if static is None:
            raise TypeError(f"{what} must be a str, an eager tf.Tensor or a constant, got the "
                            f"symbolic {value!r}, whose value is only known when it runs.")
        value = static
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return plain(value.item(), what)
    return value


def connect(server_address) -> Client:
    """A new Client for a dataset worker: by name, or like the given Client."""
    if isinstance(server_address, _CLIENT_TYPE):
        client = Client(server_address.server_address,
                        trust_group=server_address._trust_group)
    else:
        client = Client(server_address)
    client._connected(0.0)  # attached now (BufferNotFoundError if missing)
    return client


def connect_within(server_address, timeout_secs):
    deadline = None if timeout_secs is None else time.monotonic() + timeout_secs
    while True:
        try:
            return connect(server_address)
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
    dimension when they are sequence items. A signature is taken as it is, as Reverb
    does (it validates a dataset's shapes against it unchanged, timesteps included).

    Raises:
      ValueError: no such table, or nothing says what its items look like yet.
      BufferNotFoundError: no such buffer (``timeout_secs`` None).
      DeadlineExceededError: no such buffer within ``timeout_secs``.
    """
    server_address = plain(server_address, "server_address")
    table = plain(table, "table")
    client = connect_within(server_address, timeout_secs)
    try:
        buffer = client._buffer
        engine = buffer.by_name.get(table)
        if engine is None:
            raise ValueError(
                f"Server at {server_address} does not contain any table named {table}. "
                f"Found: {', '.join(sorted(buffer.by_name))}.")
        layout = engine.known_layout()
        if engine.config.signature is not None:  # as given, as Reverb takes it (for
            column_specs, treedef = specs.flatten(engine.config.signature)  # timesteps too)
            layout = treedef, column_specs, None
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
        elif (timesteps and engine.config.signature is None
              and any(_batches.any_length_columns(engine))):
            # A time dimension of any length is no timestep's: one timestep is without it.
            shapes = [shape[1:] if flag else shape
                      for shape, flag in zip(shapes, _batches.any_length_columns(engine))]
        dtypes = specs.optree.tree_unflatten(treedef, [s.dtype for s in column_specs])
        return dtypes, specs.optree.tree_unflatten(treedef, shapes)
    finally:
        client.close()


def any_length_columns(server_address, table: str, data_spec) -> list:
    """Per column, whether ``table`` takes items of any length there (a signature's
    ``None`` time dimension); [] when no leaf of ``data_spec`` has an unknown first
    dimension (no need to ask: such a table's columns need one), or the buffer or the
    table is not there yet (the dataset's first chunk then says so if it matters)."""
    if not any(spec.shape.rank and spec.shape[0] is None
               for spec in tf.nest.flatten(data_spec)):
        return []
    try:
        client = connect(server_address)
    except errors.BufferNotFoundError:
        return []
    try:
        engine = client._buffer.by_name.get(table)
        flags = [] if engine is None else _batches.any_length_columns(engine)
    finally:
        client.close()
    # Cut only where the spec leaves the time dimension open (a fixed one is checked).
    return [flag and bool(spec.shape.rank) and spec.shape[0] is None
            for flag, spec in zip(flags, tf.nest.flatten(data_spec))]


def shared_tensor(leaf):
    """A large array as a tensor sharing its memory (DLPack), else the array as it is.

    ``from_generator`` would otherwise copy it into a new tensor: 7 MB for 256 Atari
    frames, about 200 us, plus page faults on TensorFlow's fresh allocation. The tensor
    keeps the array (and its pooled block, see ``shmreplay._engine.outputs``) alive.
    """
    if (leaf.nbytes < _outputs.POOL_FROM or leaf.dtype.kind not in "iuf"
            or leaf.ctypes.data % _outputs.ALIGN or not leaf.flags.c_contiguous):
        return leaf
    return tf.experimental.dlpack.from_dlpack(leaf.__dlpack__())


class ClientPool:
    """Clients for a dataset's calls: one per call in flight, made on demand (a call
    made ``tf.numpy_function`` has no state of its own to keep one in)."""

    def __init__(self, server_address):
        self._address = server_address
        self._idle = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self):
        with self._lock:
            client = self._idle.pop() if self._idle else None
        if client is None:
            client = connect(self._address)
        try:
            yield client
        finally:
            with self._lock:
                self._idle.append(client)

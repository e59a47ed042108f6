"""``TFClient``: Reverb's TensorFlow client ops (insert, sample, update priorities).

Re-exported by ``shmreplay.tf``. Each method works eagerly, inside ``tf.function``, in
graph mode (``tf.compat.v1.Session``) and inside a ``tf.data`` ``map``.

How a call becomes an op: eagerly, the method simply runs (an eager op runs when it is
called, so nothing is lost, and no op machinery is paid for). Anywhere else it builds a
``tf.numpy_function`` that calls the same code when the graph runs. A Python function
inside a graph can only fail as ``InvalidArgumentError`` (ValueError) or
``UnknownError`` (anything else), so the function returns a status code and a message
next to its outputs, and stock ops raise the error TensorFlow users expect: ``Assert``
for ``InvalidArgumentError``, ``ReadFile`` of a path that cannot exist for
``NotFoundError`` (TensorFlow has no op that raises a chosen error code), and for
``InternalError`` what raises it in Reverb's op: an output whose dtype is not the
declared one (a staged string read back as int32).

Which error, as in Reverb's op: ``sample`` with data_dtypes that do not match the item
raises ``InvalidArgumentError`` eagerly ("Type mismatch") but ``InternalError`` in a
graph (``tf.function``, ``tf.data``, ``Session``: TensorFlow's own check of the op's
output dtypes). There TensorFlow's message cannot carry shmreplay's, so shmreplay's is
logged (``tf.compat.v1.logging.error``) just before.
"""

import threading
from typing import Optional

import numpy as np
import tensorflow as tf

from shmreplay import _tf_common as common
from shmreplay import errors, specs
from shmreplay._tf_items import ReplayDataset
from shmreplay.replay_sample import INFO_DTYPES, ReplaySample, SampleInfo

_OK, _INVALID, _NOT_FOUND, _INTERNAL = 0, 1, 2, 3
_INFO_DTYPES = [np.dtype(INFO_DTYPES[field]) for field in SampleInfo._fields]
# ReadFile of this prefix fails with NotFound ("...; No such file or directory"): /proc/self
# exists, and no process has an entry whose name starts with a space.
_NOT_FOUND_PATH = "/proc/self/ shmreplay: "


class _Failed(Exception):
    """A call failed: ``code`` says which TensorFlow error it becomes."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _status(exc: Exception) -> _Failed:
    """The TensorFlow error code for one of shmreplay's errors."""
    if isinstance(exc, (errors.TableNotFoundError, errors.BufferNotFoundError)):
        return _Failed(_NOT_FOUND, str(exc))
    if isinstance(exc, (ValueError, TypeError)):  # SchemaError, InvalidPriorityError, ...
        return _Failed(_INVALID, str(exc))
    raise exc


def _as_eager_error(failed: _Failed):
    # (_INTERNAL too: eagerly Reverb's op raises InvalidArgumentError for a dtype mismatch)
    kind = tf.errors.NotFoundError if failed.code == _NOT_FOUND else tf.errors.InvalidArgumentError
    return kind(None, None, str(failed))


def _one_string(value, what: str) -> str:
    """A table name given as str, bytes, or a tensor of exactly one string (Reverb reads
    its only element, so ``tf.constant(['name'])`` works too)."""
    if isinstance(value, (str, bytes, np.bytes_)):
        return value.decode() if isinstance(value, (bytes, np.bytes_)) else value
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "SUO":
        raise _Failed(_INVALID, f"{what} must hold exactly one string, got {array!r}.")
    item = array.reshape(-1)[0]
    return item.decode() if isinstance(item, bytes) else str(item)


def _shapes_like(dtypes, shapes):
    """``shapes`` as tuples in the structure of ``dtypes``: a leaf of ``dtypes`` takes
    whatever ``tf.TensorShape`` takes (``4``, ``[4]``, ``None``...), as Reverb's did."""
    if isinstance(dtypes, dict):
        return {key: _shapes_like(dtypes[key], shapes[key]) for key in dtypes}
    if isinstance(dtypes, (list, tuple)):
        if len(dtypes) != len(shapes):
            raise ValueError(f"dtypes and shapes must have the same structure, got {dtypes!r} "
                             f"and {shapes!r}.")
        parts = [_shapes_like(d, s) for d, s in zip(dtypes, shapes)]
        return type(dtypes)(*parts) if hasattr(dtypes, "_fields") else type(dtypes)(parts)
    return tuple(tf.TensorShape(shapes).as_list())


def _check_dtypes(table, dtypes, paths, wanted):
    if len(dtypes) != len(wanted):
        raise _Failed(_INVALID, f"Table '{table}': its items have {len(dtypes)} tensors, "
                                f"data_dtypes asks for {len(wanted)}.")
    for index, (dtype, want) in enumerate(zip(dtypes, wanted)):
        if np.dtype(dtype) != want.as_numpy_dtype:
            column = f"column {paths[index]}" if paths else f"tensor {index}"
            raise _Failed(_INTERNAL, f"Table '{table}', {column}: the items hold "
                                     f"{np.dtype(dtype).name}, data_dtypes asks for {want.name}.")


class TFClient:
    """Reverb's ``TFClient``: a buffer's insert, sample and priority updates as ops.

    Args:
      server_address: What ``Client`` accepts (the buffer's name). The buffer is
        attached on the first call that runs, in the process that runs it, so a
        TFClient can be made before its buffer exists.
      shared_name: Accepted for Reverb compatibility (there, a client resource shared
        between sessions); no effect.
      name: The name scope prefix of the ops (``reverb_insert``, ...).
    """

    def __init__(self, server_address: str, shared_name: Optional[str] = None,
                 name: str = "reverb"):
        self._server_address = common.plain(server_address, "server_address")
        self._name = name
        self._client = None
        self._lock = threading.Lock()
        self._datasets = {}  # repr(arguments): dataset

    @property
    def server_address(self) -> str:
        """The address this client was made with."""
        return self._server_address

    def _connected(self):
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = common.connect(self._server_address)
        return self._client

    # --- insert ---------------------------------------------------------------------------

    def insert(self, data, tables: tf.Tensor, priorities: tf.Tensor,
               name: Optional[str] = None):
        """Inserts ``data`` (a list of tensors: one step) as one item into each of
        ``tables``, the i-th with ``priorities[i]``. The data is validated against every
        table before any item is inserted: an error inserts nothing.

        Returns:
          An op doing the insert (None when executed eagerly).

        Raises:
          ValueError: ``tables`` is not a rank-1 string tensor, ``priorities`` not a
            rank-1 float64 tensor, or their shapes differ (when the op is built).
          tf.errors.NotFoundError: no such table (when it runs).
          tf.errors.InvalidArgumentError: the data does not fit a table, or a priority
            is negative or not finite (when it runs).
        """
        if tables.dtype != tf.string or tables.shape.rank != 1:
            raise ValueError(f"tables must be a string tensor of rank 1, got {tables!r}.")
        if priorities.dtype != tf.float64 or priorities.shape.rank != 1:
            raise ValueError(f"priorities must be a float64 tensor of rank 1, got {priorities!r}.")
        if not tables.shape.is_compatible_with(priorities.shape):
            raise ValueError(f"priorities and tables must have the same shape, got "
                             f"{priorities.shape} and {tables.shape}.")
        if tf.executing_eagerly():
            # (TensorFlow's conversion, not numpy's: a Python float is float32, as in Reverb)
            arrays = [(leaf if isinstance(leaf, tf.Tensor) else tf.convert_to_tensor(leaf))
                      .numpy() for leaf in data]
            self._run_eagerly(self._insert, arrays, tables.numpy(), priorities.numpy())
            return None
        data = [tf.convert_to_tensor(leaf) for leaf in data]
        with tf.name_scope(name or f"{self._name}_insert"):
            return tf.group(self._graph_call(
                lambda *args: self._insert(list(args[2:]), args[0], args[1]),
                [tables, priorities] + data, []))

    def _insert(self, data, tables, priorities):
        if tables.shape != priorities.shape:  # also checked when the op is built
            raise _Failed(_INVALID, "Tensors `tables` and `priorities` do not match in shape "
                                    f"({tables.shape} vs. {priorities.shape}).")
        names = [name.decode() if isinstance(name, bytes) else str(name) for name in tables]
        client = self._connected()
        try:
            if not names:  # no tables: no items, as in Reverb
                return []
            if len(names) == 1:  # the usual call
                client.insert(data, {names[0]: float(priorities[0])})
                return []
            first, again = {}, []
            for table, priority in zip(names, priorities.tolist()):
                if table in first:
                    again.append({table: priority})
                else:
                    first[table] = priority
            client.insert(data, first)
            for extra in again:  # a table named twice gets two items (one call each)
                client.insert(data, extra)
        except (errors.ShmReplayError, ValueError, TypeError) as exc:
            raise _status(exc) from exc
        return []

    # --- sample ---------------------------------------------------------------------------

    def sample(self, table, data_dtypes, name: Optional[str] = None) -> ReplaySample:
        """Samples one item and returns its first timestep, as Reverb's op does (an item
        from ``insert`` is one timestep), waiting while the rate limiter blocks.

        Args:
          table: The table: a str or a string tensor of one element.
          data_dtypes: The dtypes of the data, a nest (the data comes back in it).

        Returns:
          ``ReplaySample(info, data)`` of tensors: info as in Reverb (key uint64,
          probability float64, table_size int64, priority float64, times_sampled int32),
          data in the nest of ``data_dtypes`` (shapes unknown until it runs).

        Raises:
          tf.errors.NotFoundError: no such table.
          tf.errors.InvalidArgumentError: the item has another number of tensors than
            ``data_dtypes`` says (or, eagerly, a tensor of another dtype).
          tf.errors.InternalError: in a graph, a tensor of another dtype than
            ``data_dtypes`` says (as Reverb's op; shmreplay's message is logged).

        Either way nothing is sampled.
        """
        flat_dtypes = [tf.as_dtype(dtype) for dtype in tf.nest.flatten(data_dtypes)]
        if tf.executing_eagerly():
            if isinstance(table, tf.Tensor):
                table = table.numpy()
            flat = self._run_eagerly(self._sample, table, flat_dtypes)
            flat = [tf.constant(array) for array in flat]  # (convert_to_tensor: 2x slower)
        else:
            table = tf.convert_to_tensor(table, tf.string)
            with tf.name_scope(name or f"{self._name}_sample"):
                outputs = [tf.as_dtype(d) for d in _INFO_DTYPES] + flat_dtypes
                flat = self._graph_call(lambda table: self._sample(table, flat_dtypes),
                                        [table], outputs)
                for info in flat[:len(_INFO_DTYPES)]:
                    info.set_shape(())
        data = flat[len(_INFO_DTYPES):]
        if not (type(data_dtypes) is list and len(data_dtypes) == len(data)):  # (flat: as is)
            data = tf.nest.pack_sequence_as(data_dtypes, data)
        return ReplaySample(SampleInfo(*flat[:len(_INFO_DTYPES)]), data)

    def _sample(self, table, flat_dtypes):
        table = _one_string(table, "table")
        client = self._connected()
        try:
            engine = client._engine(table)
            layout = engine.known_layout()
            if layout is not None:  # check before sampling: a refused call samples nothing
                _, column_specs, paths = layout
                _check_dtypes(table, [s.dtype for s in column_specs], paths, flat_dtypes)
            step = next(client.sample(table, 1))[0]
        except (errors.ShmReplayError, ValueError, TypeError) as exc:
            raise _status(exc) from exc
        leaves = specs.optree.tree_leaves(step.data)
        _check_dtypes(table, [leaf.dtype for leaf in leaves], None, flat_dtypes)
        info = [np.asarray(value, dtype) for value, dtype in zip(step.info, _INFO_DTYPES)]
        return info + [np.asarray(leaf) for leaf in leaves]

    # --- update_priorities ----------------------------------------------------------------

    def update_priorities(self, table, keys, priorities, name: Optional[str] = None):
        """Sets the priorities of the items ``keys`` (uint64) to ``priorities`` (float64,
        as many). Keys not in the table are ignored; a bad priority changes nothing.

        Returns:
          An op doing the update (None when executed eagerly).

        Raises:
          tf.errors.NotFoundError: no such table.
          tf.errors.InvalidArgumentError: ``keys`` is not of rank 1, ``priorities`` has
            another shape, or a priority is negative or not finite.
        """
        table = tf.convert_to_tensor(table, tf.string)
        keys = tf.convert_to_tensor(keys, tf.uint64)
        priorities = tf.convert_to_tensor(priorities, tf.float64)
        if tf.executing_eagerly():
            self._run_eagerly(self._update, table.numpy(), keys.numpy(), priorities.numpy())
            return None
        with tf.name_scope(name or f"{self._name}_update_priorities"):
            return tf.group(self._graph_call(self._update, [table, keys, priorities], []))

    def _update(self, table, keys, priorities):
        table = _one_string(table, "table")
        if keys.ndim != 1:
            raise _Failed(_INVALID, "Tensors `keys` and `priorities` must be of rank 1.")
        if keys.shape != priorities.shape:
            raise _Failed(_INVALID, "Tensors `keys` and `priorities` do not match in shape "
                                    f"({keys.shape} vs. {priorities.shape}).")
        try:
            self._connected().update_priorities(table, keys, priorities)
        except (errors.ShmReplayError, ValueError, TypeError) as exc:
            raise _status(exc) from exc
        return []

    # --- dataset --------------------------------------------------------------------------

    def dataset(self, table, dtypes, shapes, capacity: int = 100,
                num_workers_per_iterator: int = -1, max_samples_per_stream: int = -1,
                sequence_length: Optional[int] = None, emit_timesteps: bool = True,
                rate_limiter_timeout_ms: int = -1):
        """Reverb's deprecated ``TFClient.dataset`` (Reverb removed it in 2022): the legacy
        ``ReplayDataset`` over ``table``, ``capacity`` being its
        ``max_in_flight_samples_per_worker``. Shapes may be ints (``4`` is ``[4]``)."""
        table = _one_string(table.numpy() if isinstance(table, tf.Tensor) else table, "table")
        shapes = _shapes_like(dtypes, shapes)
        args = (table, dtypes, shapes, capacity, sequence_length, emit_timesteps,
                num_workers_per_iterator, max_samples_per_stream, rate_limiter_timeout_ms)
        # A dataset is a description (each iterator samples on its own), and making one
        # traces tf.data functions (~20 ms): a call repeated with the same arguments, as
        # in seed 002's loop, gets the same dataset (eagerly: a graph's belongs to it).
        key = repr(args)
        dataset = self._datasets.get(key) if tf.executing_eagerly() else None
        if dataset is None:
            dataset = ReplayDataset(self._server_address, *args)
            if not tf.executing_eagerly():
                return dataset
            if len(self._datasets) >= 16:
                self._datasets.pop(next(iter(self._datasets)))
            self._datasets[key] = dataset
        return dataset

    # --- running the calls ----------------------------------------------------------------

    @staticmethod
    def _run_eagerly(function, *args):
        try:
            return function(*args)
        except _Failed as failed:
            raise _as_eager_error(failed) from None

    @staticmethod
    def _graph_call(function, inputs, output_dtypes):
        """``function`` as a numpy_function whose failure raises the TensorFlow error of
        its code when the graph runs; returns the output tensors."""
        def call(*args):
            try:
                outputs = function(*args)
                return [np.int32(_OK), np.bytes_(b"")] + outputs
            except _Failed as failed:
                empty = [np.zeros((), dtype.as_numpy_dtype) for dtype in output_dtypes]
                return [np.int32(failed.code), np.bytes_(str(failed).encode())] + empty

        results = tf.numpy_function(call, inputs, [tf.int32, tf.string] + list(output_dtypes))
        code, message = results[0], results[1]

        def failed():
            not_found = tf.cond(
                tf.equal(code, _NOT_FOUND),
                lambda: tf.io.read_file(tf.strings.join([_NOT_FOUND_PATH, message])),
                lambda: tf.constant(""))
            with tf.control_dependencies([not_found]):
                internal = tf.cond(tf.equal(code, _INTERNAL), lambda: _internal_error(message),
                                   lambda: tf.constant(0))
            with tf.control_dependencies([internal]):
                check = tf.debugging.Assert(tf.not_equal(code, _INVALID), [message])
            with tf.control_dependencies([check]):
                return tf.constant(0)

        # The error ops sit in the branch that runs only on a failure: a call that
        # succeeds pays for one cond (about half of what the op cost with three checks).
        # Assert is stateful, so tf.function and tf.data keep the cond (and what it
        # depends on) even when nothing uses the outputs: an insert's op is usually unused.
        status = tf.cond(tf.equal(code, _OK), lambda: tf.constant(0), failed)
        with tf.control_dependencies([status]):
            return [tf.identity(output) for output in results[2:]] or [tf.identity(status)]


def _internal_error(message):
    """Raises ``InternalError`` when it runs, after logging ``message``: a staged string
    read back as int32 fails TensorFlow's check of an op's output dtypes, the check
    Reverb's sample op fails on a dtype mismatch. (Each failing run stages one string
    and takes one back, so concurrent runs of the op share the area harmlessly.)"""
    logged = tf.print("shmreplay:", message, output_stream=tf.compat.v1.logging.error)
    with tf.control_dependencies([logged]):
        staged = tf.raw_ops.Stage(values=[message], shared_name="shmreplay_internal_error")
    with tf.control_dependencies([staged]):
        return tf.raw_ops.Unstage(dtypes=[tf.int32], shared_name="shmreplay_internal_error",
                                  name="data_dtypes_do_not_match_the_item")[0]

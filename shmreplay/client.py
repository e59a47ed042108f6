"""``Client``: attach to a buffer by name; insert, sample, update priorities.

The facade: it validates and converts user input, calls the table engines, and wraps
results. No offsets, no locks, no numba here.
"""

import numbers
import threading
import time
from typing import Dict, Iterator, List, Optional

import numpy as np

from shmreplay import _batches, errors
from shmreplay._client import (address as _address, calls as _client_calls,
                               connect as _connect, inserting as _inserting,
                               samples as _samples)
from shmreplay._schema import inputs as _inputs
from shmreplay._client.calls import (after_layout_reset as _after_layout_reset,
                                     closed_aware as _closed_aware,
                                     retried_after_layout_reset as _retried_after_layout_reset)
from shmreplay._shm.kernels import table as kernels
from shmreplay._engine.table_engine import TableEngine
from shmreplay.replay_sample import ReplaySample

_UINT64, _FLOAT64 = np.dtype(np.uint64), np.dtype(np.float64)


class Client:
    """A handle on a buffer, usable from any process of the same user.

    Args:
      server_address: The buffer's name (``Server.name``), or a Reverb address of
        this machine such as ``f"localhost:{server.port}"`` (``docs/guide.md``).
      trust_group: Also attach to a buffer of another user, if its owner shared it
        with a group this process belongs to (``Server(share_with_group=True)``).
        Attaching unpickles configuration that any member of that group could have
        written, which can run their code in this process: pass True only if you
        trust every member of the group. Buffers of your own user never need it.

    Raises:
      InvalidNameError: if ``server_address`` is neither a buffer name nor an address
        of this machine (another host is refused with a message saying why).
      LayoutMismatchError: if the name belongs to something that is not a compatible
        shmreplay buffer, or to another user's buffer that is not group-shared or that
        ``trust_group`` does not accept.

    A missing buffer is no error here: as Reverb's client connects lazily, each call
    that needs the buffer waits for it up to the call's ``timeout`` and then raises
    ``BufferNotReadyError`` (a ``BufferNotFoundError`` and a ``DeadlineExceededError``);
    a call without a timeout waits, logging after a few seconds which buffer it waits
    for and which exist.

    A Client pickles as its address, so it can be passed to ``multiprocessing``
    workers; each process maps the buffer on first use. It is safe to share between
    threads.
    """

    def __init__(self, server_address: str, trust_group: bool = False):
        self._name = _address.buffer_name(server_address)
        self._address = server_address
        self._trust_group = bool(trust_group)
        self._closed = False
        self._lock = threading.Lock()
        self._buffer = _connect.attach_now(self._name, self._trust_group)  # None: lazy

    @property
    def server_address(self) -> str:
        """The address this Client was given (a name, or ``"localhost:P"``), as Reverb's."""
        return self._address

    # Reverb's Client keeps its address in ``_server_address``, and code that pickles or
    # copies Clients (Reverb's own test_pickle among it) reads that name.
    _server_address = server_address

    def __reduce__(self):
        return (Client, (self._address, self._trust_group))

    def _connected(self, timeout: Optional[float] = None):
        """The attached buffer; a lazy Client first waits for it (``_connect``)."""
        buffer = self._buffer
        if buffer is not None:
            return buffer
        if self._closed:
            raise errors.ClosedError(f"Client for '{self._name}' was closed.")
        buffer = _connect.wait_for(self._name, self._trust_group, timeout, self._address)
        with self._lock:  # two threads may have waited: one mapping stays
            if self._buffer is None and not self._closed:
                self._buffer, buffer = buffer, None
        if buffer is not None:
            buffer.close()
        return self._connected(0.0)

    def __repr__(self):
        return f"Client({self._name!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _raise_if_closed(self, exc):
        _client_calls.raise_if_closed(self._closed, self._name, exc)

    def close(self):
        """Unmaps the buffer from this process (the buffer itself stays).

        Calls that other threads are making at that moment raise ``ClosedError``
        (blocked ones within ``_sync.WAIT_SLICE``); the memory they use stays mapped
        until they are done with it.
        """
        self._closed = True
        with self._lock:
            buffer, self._buffer = self._buffer, None
        if buffer is not None:
            buffer.close()

    def _engine(self, table: str, timeout: Optional[float] = None) -> TableEngine:
        buffer = self._buffer
        if buffer is None:
            buffer = self._connected(timeout)
        engine = buffer.by_name.get(table)
        if engine is None:
            raise errors.TableNotFoundError(
                f"Priority table {table!r} was not found in buffer '{self._name}'. "
                f"Tables: {', '.join(sorted(buffer.by_name))}.")
        return engine

    # --- inserting ------------------------------------------------------------------------

    def insert(self, data, priorities: Dict[str, float], timeout: Optional[float] = None):
        """Inserts one item into each table named in ``priorities``.

        Args:
          data: A nest (dict, tuple, list, namedtuple) of numpy arrays, Python or numpy
            scalars, tf.Tensors or jax arrays.
          priorities: ``{table_name: priority}``; one item goes into each table, all
            of them or none (an error or timeout inserts nothing; a process killed
            while committing may leave the item in the tables it committed first, as
            each table commits under its own lock). While one table's rate limiter
            makes the call wait, it holds nothing in the others.
          timeout: Seconds to wait for the rate limiter; ``None`` waits forever.

        Returns:
          The new items' keys, ``{table_name: key}``.

        Raises:
          InvalidPriorityError: if ``priorities`` is empty, or a priority is negative,
            NaN or infinite.
          TableNotFoundError: if a table does not exist.
          SchemaError: if the data does not match a table's columns.
          DeadlineExceededError: if ``timeout`` expired; nothing was inserted.
        """
        try:
            if type(priorities) is dict and len(priorities) == 1:
                # The actor's hot path: one table, data already shaped like its columns.
                (table, priority), = priorities.items()
                engine = self._engine(table, timeout)
                leaves = engine.fast_leaves(data)
                if leaves is not None:
                    if type(priority) is not float:
                        priority = float(_inputs.check_priorities(engine, priority, 1)[0])
                    elif not 0.0 <= priority <= engine.max_priority:  # also rejects NaN
                        _inputs.check_priorities(engine, priority, 1)
                    return {table: engine.insert_one(leaves, priority, timeout)}
            return self._insert(data, priorities, timeout, batched=False)
        except errors.LayoutResetError:  # checked against a layout forgotten meanwhile
            return _after_layout_reset(self._insert, data, priorities, timeout, False)
        except Exception as exc:
            self._raise_if_closed(exc)
            raise

    def insert_batch(self, data, priorities, timeout: Optional[float] = None):
        """Inserts ``B`` items into each table named in ``priorities``, atomically per table.

        Args:
          data: A nest whose every leaf has the same leading dimension ``B``.
          priorities: ``{table_name: priority}``, each a scalar or an array of ``B``.
          timeout: Seconds to wait until the rate limiter allows all ``B`` inserts.

        Returns:
          ``{table_name: uint64 array of B keys}``.

        Raises:
          SchemaError: as ``insert``; also if leaves have different leading sizes.
          ValueError: ``B`` exceeds what the table can take in one call.

        ``insert``'s other errors are raised as there.
        """
        try:
            return self._insert_batch(data, priorities, timeout)
        except errors.LayoutResetError:  # checked against a layout forgotten meanwhile
            return _after_layout_reset(self._insert, data, priorities, timeout, True)
        except Exception as exc:
            self._raise_if_closed(exc)
            raise

    def _insert_batch(self, data, priorities, timeout):
        if type(priorities) is dict and len(priorities) == 1:
            (table, priority), = priorities.items()
            engine = self._engine(table, timeout)
            fast = engine.fast_batch_leaves(data)
            # (a batch too large for the table goes the general way, which names the
            # problem after checking the priorities, as for any other bad input)
            if fast is not None and fast[1] <= engine.max_batch:
                leaves, count = fast
                if type(priority) is float:
                    prios = np.empty(count)
                    prios.fill(priority)
                elif (type(priority) is np.ndarray and priority.dtype is _FLOAT64
                      and priority.shape == (count,)):
                    prios = priority
                else:
                    prios = _inputs.check_priorities(engine, priority, count)
                keys = engine.insert_many(leaves, prios, count, timeout)  # checks prios
                if keys is not None:
                    return {table: keys}
                _inputs.check_priorities(engine, prios, count)  # refused: say which, and why
        return self._insert(data, priorities, timeout, batched=True)

    def _insert(self, data, priorities, timeout, batched):
        return _inserting.insert(lambda table: self._engine(table, timeout), data, priorities,
                                 timeout, batched)

    # --- writers --------------------------------------------------------------------------

    def writer(self, max_sequence_length: int, delta_encoded: bool = False,
               chunk_length: Optional[int] = None, max_in_flight_items: Optional[int] = 25):
        """A legacy ``Writer``: append steps, create items of the last N steps.

        Args:
          max_sequence_length: The most steps one item can span (steps kept).
          delta_encoded: Accepted for Reverb compatibility; no effect.
          chunk_length: Accepted for Reverb compatibility; no effect.
          max_in_flight_items: ``create_item`` blocks while this many items wait for
            their table's rate limiter (None: never).

        Raises:
          ValueError: an argument is out of range.
        """
        from shmreplay.writer import Writer
        self._check_open()
        return Writer(self, max_sequence_length, delta_encoded, chunk_length,
                      max_in_flight_items)

    def trajectory_writer(self, num_keep_alive_refs: int, *, validate_items: bool = True,
                          get_signature_timeout_ms: Optional[int] = None):
        """A ``TrajectoryWriter``: append steps column-wise, create items from its history.

        Args:
          num_keep_alive_refs: How many recent steps of each column stay referenceable
            (the longest item's span).
          validate_items: Accepted for Reverb compatibility; items are always validated.
          get_signature_timeout_ms: How long to wait for the tables' signatures (earlier
            Reverb releases' keyword, which Acme's adders pass): here, how long a lazy
            Client waits for its buffer to appear; an attached Client has them already.
            None waits as every call does.

        Raises:
          ValueError: ``num_keep_alive_refs < 1``.
          TypeError: ``get_signature_timeout_ms`` is neither None nor a number.
          DeadlineExceededError: the buffer did not appear within
            ``get_signature_timeout_ms``.
        """
        from shmreplay.trajectory_writer import TrajectoryWriter
        if get_signature_timeout_ms is not None and not isinstance(
                get_signature_timeout_ms, numbers.Real):
            raise TypeError("get_signature_timeout_ms must be None or a number of "
                            f"milliseconds, got {get_signature_timeout_ms!r}.")
        self._connected(None if get_signature_timeout_ms is None
                        else max(0.0, get_signature_timeout_ms / 1000))
        return TrajectoryWriter(self, num_keep_alive_refs, validate_items)

    def structured_writer(self, configs):
        """A ``StructuredWriter`` that inserts the items ``configs`` make (Reverb's; see
        ``shmreplay.structured_writer``). Raises ValueError for no or invalid configs."""
        from shmreplay._writers.structured import StructuredWriter
        return StructuredWriter(self, configs)

    def _check_open(self):
        self._connected()  # a writer needs the buffer (waits for a lazy Client's)

    # --- sampling -------------------------------------------------------------------------

    def sample_batch(self, table: str, batch_size: int, timeout: Optional[float] = None, *,
                     pad_to: Optional[int] = None) -> ReplaySample:
        """Samples a batch: the learner's fast path.

        Takes items as the rate limiter allows them, waiting for more credit until the
        batch is full (a learner's train step wants a fixed batch shape). Fewer than
        ``batch_size`` rows come back only if ``max_times_sampled`` deletions empty the
        table (a queue with fewer items than asked for), or if ``timeout`` expires after
        at least one row was taken; with no row taken, the timeout raises.

        Returns:
          ``ReplaySample(info, data)``: ``info`` fields are arrays ``[B]`` (key uint64,
          probability float64, table_size int64, priority float64, times_sampled
          int32); ``data`` is the item nest with arrays ``[B, ...]``. For prioritized
          replay, ``info.importance_weights(beta)`` gives the IS weights. The arrays
          stay valid while anything refers to any part of them (views included); a
          batch nobody refers to any more has its memory reused by a later call.
          Items of any length come as a ``PaddedSample`` (padded to the batch's longest
          item, or to ``pad_to`` steps if given; ``docs/learners.md``).

        Raises:
          TableNotFoundError: unknown table.
          DeadlineExceededError: nothing could be sampled within ``timeout``.
          ValueError: ``pad_to`` on a table of fixed shapes, or an item longer than it.
        """
        if pad_to is not None:  # (the usual call pays only this test)
            return _batches.padded_batch(self, table, batch_size, timeout, pad_to)
        if type(batch_size) is not int or batch_size < 1:
            if int(batch_size) != batch_size or batch_size < 1:
                raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
            batch_size = int(batch_size)
        try:
            buffer = self._buffer  # (``_engine`` inline: a learner calls this at every step)
            engine = None if buffer is None else buffer.by_name.get(table)
            return (engine or self._engine(table, timeout)).sample(batch_size, timeout)
        except errors.LayoutResetError:
            return _after_layout_reset(self._engine(table).sample, batch_size, timeout)
        except Exception as exc:
            self._raise_if_closed(exc)
            raise

    def sample(self, table: str, num_samples: int = 1, emit_timesteps: bool = True,
               timeout: Optional[float] = None, unpack_as_table_signature: bool = False
               ) -> Iterator:
        """Yields ``num_samples`` samples, one at a time (Reverb's ``Client.sample``).

        As in Reverb, ``data`` is the **flat list** of the item's columns (in
        ``tree.flatten`` order: dict keys sorted) unless ``unpack_as_table_signature``
        is True and the table has a signature; then it is the item's nest. Columns come as Reverb stores them: an
        item from ``insert``, from the legacy ``Writer`` or from ``[-n:]`` windows has
        a time dimension (``[1, ...]`` for ``insert``); a squeezed ``history[k][-1]``
        column has none.

        With ``emit_timesteps=False`` each sample is one ``ReplaySample``. With
        ``emit_timesteps=True`` (the default) each is a list of one ``ReplaySample``
        per timestep: every column is split along its first dimension, and all
        columns must have the same length. ``info`` fields are Python scalars. For
        training loops use ``sample_batch``.

        Raises:
          TableNotFoundError: unknown table (on the first ``next``).
          DeadlineExceededError: a sample was not allowed within ``timeout``
            (shmreplay's addition: Reverb's waits forever).
          ValueError: ``emit_timesteps=True`` on items whose columns differ in length
            ("Can't split non timestep trajectory into timesteps.").
        """
        if int(num_samples) != num_samples or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}.")
        for _ in range(int(num_samples)):
            try:
                engine = self._engine(table, timeout)
                batch, arena_rows = _after_layout_reset(
                    lambda: engine.sample_items(1, timeout))
            except Exception as exc:
                self._raise_if_closed(exc)
                raise
            yield _samples.as_reverb(engine, batch, arena_rows, emit_timesteps,
                                     unpack_as_table_signature)

    # --- priorities and lifecycle ---------------------------------------------------------

    @_retried_after_layout_reset
    def mutate_priorities(self, table: str, updates: Optional[Dict[int, float]] = None,
                          deletes: Optional[List[int]] = None):
        """Updates priorities and/or deletes items, by key. Unknown keys are ignored.

        Deletes happen before updates. All priorities are validated before anything
        changes, so a bad priority leaves the table untouched.

        Raises:
          TableNotFoundError: unknown table.
          InvalidPriorityError: a negative, NaN, infinite or text (``"1.5"``) priority.
          TypeError, ValueError: a key that is not an integer in 0 .. 2**64 - 1.
        """
        engine = self._engine(table)
        updates = updates or {}
        keys = _inputs.check_keys(table, list(updates), "updates")
        prios = _inputs.check_priorities(engine, list(updates.values()), len(updates))
        delete_keys = _inputs.check_keys(table, list(deletes or ()), "deletes")
        engine.mutate(delete_keys.view(np.int64), keys.view(np.int64), prios)

    def update_priorities(self, table: str, keys, priorities):
        """Sets the priorities of items by key, from arrays (the fast form of mutate).

        Args:
          keys: uint64 keys, e.g. ``sample.info.key``.
          priorities: One priority per key (or one for all).

        Returns:
          How many keys were found and updated (evicted items are ignored).
        """
        try:  # (inline: a learner calls this at every step)
            buffer = self._buffer
            engine = (None if buffer is None else buffer.by_name.get(table)) or self._engine(table)
            if (type(keys) is np.ndarray and keys.dtype is _UINT64 and keys.ndim == 1
                    and type(priorities) is np.ndarray and priorities.dtype is _FLOAT64
                    and priorities.shape == keys.shape and engine.whole_items):
                updated = engine.update_whole(keys, priorities)
                if updated >= 0:
                    return updated
                # A priority the kernel refused (nothing changed): say which, and why.
                _inputs.check_priorities(engine, priorities, keys.size)
            if type(keys) is not np.ndarray or keys.dtype != np.uint64 or keys.ndim != 1:
                keys = _inputs.check_keys(table, keys, "keys")
            if (type(priorities) is np.ndarray and priorities.dtype == np.float64
                    and priorities.shape == keys.shape):
                prios = priorities  # validated by the kernel call below
                bad = kernels.first_invalid_priority(prios, engine.max_priority)
                if bad >= 0:
                    _inputs.check_priorities(engine, prios, keys.size)
            else:
                prios = _inputs.check_priorities(engine, priorities, keys.size)
            return engine.update(keys.view(np.int64), prios)
        except errors.LayoutResetError:
            return _after_layout_reset(self.update_priorities, table, keys, priorities)
        except Exception as exc:
            self._raise_if_closed(exc)
            raise

    @_retried_after_layout_reset
    def reset(self, table: str):
        """Removes every item of ``table`` and resets its rate limiter.

        A table without a signature also forgets the layout its first item fixed, so
        that the next item may have other shapes (as Reverb's tables take any): unless
        some item is being written or read at that moment, when the layout stays.
        Every process sees the new layout at its next call."""
        self._engine(table).reset()

    @_retried_after_layout_reset
    def verify(self, table: str) -> List[str]:
        """Checks a table's invariants (sum-trees, heaps, lists, counters, slot states).

        First frees the slots that writers reserved and then died holding (they are never
        visible as items, but count against the rate limiter until freed); only writers
        of this process's pid namespace are judged (docs/design.md, "Pid namespaces").

        Returns:
          A list of problems, empty when the table is consistent.
        """
        return self._engine(table).verify()

    @_closed_aware
    def checkpoint(self, path: Optional[str] = None, *, progress=None) -> str:
        """Writes a consistent snapshot of every table to a checkpoint file.

        Each table is locked only while its items are copied into this process's memory
        (inserts and samples of that table wait meanwhile); the file is written after.
        The file appears atomically: it is written under a temporary name and renamed,
        so a crash mid-way leaves any previous checkpoint at ``path`` intact.

        Args:
          path: The file to write, or a directory to write a new, timestamped file in
            (a path ending in ``/`` is a directory, created if missing).
            ``None``: the Server's checkpointer directory, keeping only the newest
            checkpoint there; without a checkpointer, the buffer's directory in this
            user's private temporary directory (``$TMPDIR/shmreplay-checkpoints-UID``).
          progress: ``True`` draws a progress bar on stderr, ``False`` never does, a
            callable receives ``(bytes_done, bytes_total)``; ``None`` draws one for large
            checkpoints (256 MiB and up) when stderr is a terminal.

        Returns:
          The absolute path of the checkpoint (for ``Server(checkpoint=...)``).

        Raises:
          ClosedError: if this client was closed.
          BufferBrokenError: if the buffer was stopped.
          OSError: if the file cannot be written (nothing is left behind).
        """
        from shmreplay._ops import checkpoint as _checkpoint
        buffer = self._connected()
        return _checkpoint.save_for_client(buffer, self._name, path, progress)

    @_closed_aware
    def server_info(self, timeout: Optional[float] = None):
        """``{table_name: TableInfo}`` for every table.

        Args:
          timeout: Seconds to wait for a buffer that does not exist yet (a lazy
            Client's); None waits as long as it takes.

        Raises:
          BufferNotReadyError: (a ``DeadlineExceededError``, as in Reverb) the buffer
            did not appear within ``timeout``.
          LockTimeoutError: (a ``DeadlineExceededError`` too) a table's lock stayed held
            by another process (a stopped one, say) for the rest of ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        engines = self._connected(timeout).engines
        return {engine.name: engine.info(deadline, timeout) for engine in engines}

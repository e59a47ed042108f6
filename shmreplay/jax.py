"""A JAX learner's view of a table: batches as JAX arrays on a device, sampled ahead.

Import it as ``shmreplay.jax`` (it imports JAX; ``import shmreplay`` does not)::

    from shmreplay.jax import BatchIterator

    batches = BatchIterator("my-buffer", "replay", batch_size=256, importance_beta=0.4)
    for batch in batches:
        loss, td_errors = train_step(params, batch.data, batch.weights)
        batches.update_priorities(batch.info.key, td_errors)

A background thread samples the next ``prefetch`` batches and puts them on the device
while the learner computes on the current one (shmreplay's sampling releases the GIL
in its native parts, and so does XLA), so the learner rarely waits for data. With
``prefetch=0`` there is no thread and no transfer of its own: ``next`` samples in the
learner's thread, which JAX's asynchronous dispatch has freed while the previous step
computes, and gives the batch as numpy arrays, which the jit-compiled step's own call
moves to the device: when JAX computes on the CPU this is the faster way (the thread
and its transfer take cores the step needs; docs/learners.md and docs/performance.md,
"Learner feed"). With
``update_priorities(..., wait=False)`` the learner does not wait for its TD errors
either: they are applied once the step has computed them (by a thread, or with
``prefetch=0`` by the learner's later calls), so the next step is dispatched at once.
"""

import queue
import threading
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from shmreplay import _batches, _deferred_updates
from shmreplay._deferred_updates import MAX_PENDING_UPDATES  # noqa: F401 (documented here)
from shmreplay.client import Client
from shmreplay.replay_sample import PaddedSample, SampleInfo

_END = object()


class JaxBatch(NamedTuple):
    """One batch: ``info`` (a ``SampleInfo`` of numpy arrays ``[B]``: keys stay on the
    host, for priority updates), ``data`` (the item nest as JAX arrays ``[B, ...]`` on
    the device), and ``weights`` (float32 ``[B]`` importance weights on the device, or
    None when the iterator was made without ``importance_beta``)."""

    info: SampleInfo
    data: Any
    weights: Optional[Any]


class PaddedJaxBatch(NamedTuple):
    """One batch of items of any length (a signature's ``None`` time dimension): as
    ``JaxBatch``, each column of any length zero-padded to the batch's longest item (or
    to the iterator's ``pad_to``), and ``lengths``, a nest like ``data`` of int64 (int32
    unless JAX's x64 is on) ``[B]`` arrays on the device: each item's length in that
    column (1 for a column without a time dimension). A mask is
    ``jnp.arange(T) < lengths[..., None]``."""

    info: SampleInfo
    data: Any
    weights: Optional[Any]
    lengths: Any


class _Transfer:
    """Puts batches of numpy arrays on a device through a jitted identity function.

    ``jax.device_put`` converts and transfers each array in Python, and the calling
    thread waits for each transfer: on the busy 2-core benchmark machine, 0.43 ms of
    CPU and 1.4 ms of wall time for a batch of transitions (five columns and the
    weights), as long as half of a small learner's step. A jitted function's arguments
    take JAX's native dispatch path, which does the same conversion and transfer for
    all the leaves at once: 0.07 ms of CPU and 0.17 ms for the same batch. The
    identity is compiled once per batch layout (a table of fixed shapes has one); it
    gives the arrays JAX's usual dtypes (float64 becomes float32 unless x64 is on), as
    ``device_put`` does.
    """

    def __init__(self, device):
        self.device = device
        self._put = jax.jit(lambda tree: tree,
                            in_shardings=jax.sharding.SingleDeviceSharding(device))

    def put(self, tree):
        return self._put(tree)


class BatchIterator:
    """Yields ``JaxBatch`` es sampled from a table, prefetched onto a JAX device.

    Args:
      client: A ``shmreplay.Client``, or the buffer's name.
      table: The table to sample.
      batch_size: Items per batch (``Client.sample_batch`` semantics: a batch waits for
        rate-limiter credit until it is full).
      device: A ``jax.Device`` (default: ``jax.devices()[0]``).
      prefetch: How many batches the background threads sample ahead of the one last
        delivered (all workers together). Each counts as sampled for the rate limiter
        when it is taken, as with Reverb's datasets, so keep it small. 0: no thread;
        ``next`` samples the batch in the caller's thread (with JAX's asynchronous
        dispatch, while the step dispatched before it computes) and leaves it in host
        memory: ``data``, ``weights`` (and ``lengths``) are numpy arrays, which a
        jit-compiled step takes as arguments and moves to the device in its own call;
        updates queued with ``wait=False`` are applied by the learner's later calls.
      importance_beta: If set, each batch carries importance weights
        ``(N * P) ** -beta / max`` (prioritized replay).
      rate_limiter_timeout_ms: Ends the iteration when no batch could be sampled in this
        many milliseconds (Reverb's dataset option). Negative: wait forever.
      max_batches: Ends the iteration after this many batches (None: never).
      num_workers: Threads sampling batches at once; each attaches its own Client. 1
        keeps a FIFO table's order. 2 lets one thread's copy (which runs outside the
        GIL) overlap the other's Python work and ``device_put``: faster for large
        batches from tables whose order does not matter (uniform, prioritized). None
        (the default) picks 2 for such tables when a batch is 1 MiB or more, else 1.
      pad_to: Items of any length only: pad their columns to this many steps, so that
        a jit-compiled step sees one shape (without it, each batch is as long as its
        longest item, and a new length compiles anew). An item longer raises
        ``ValueError`` from ``next``.

    Items of any length come as ``PaddedJaxBatch`` es (``docs/learners.md``).

    Raises (from ``next``):
      TableNotFoundError, BufferBrokenError: as ``Client.sample_batch``.
    """

    def __init__(self, client, table: str, batch_size: int, *, device=None, prefetch: int = 2,
                 importance_beta: Optional[float] = None, rate_limiter_timeout_ms: int = -1,
                 max_batches: Optional[int] = None, num_workers: Optional[int] = None,
                 pad_to: Optional[int] = None):
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
        if int(prefetch) != prefetch or prefetch < 0:
            raise ValueError(f"prefetch must be an integer >= 0, got {prefetch!r}.")
        if max_batches is not None and max_batches < 0:
            raise ValueError(f"max_batches must be None or >= 0, got {max_batches!r}.")
        if num_workers is not None and (int(num_workers) != num_workers or num_workers < 1):
            raise ValueError(f"num_workers must be None or an integer >= 1, got {num_workers!r}.")
        if prefetch == 0 and num_workers not in (None, 1):
            raise ValueError(f"prefetch=0 samples in the caller's thread: num_workers must "
                             f"be None or 1, got {num_workers!r}.")
        self._client = client if isinstance(client, Client) else Client(client)
        self._owns_client = not isinstance(client, Client)
        engine = self._client._engine(table)  # unknown table: fail now, not in the thread
        self._pad_to = None if pad_to is None else _batches.check_pad_to(engine, pad_to)
        self.table = table
        self.batch_size = int(batch_size)
        self.device = device if device is not None else jax.devices()[0]
        self._transfer = _Transfer(self.device)
        self._beta = importance_beta
        self._timeout = None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000
        self._max_batches = max_batches
        # Credit for sampling ahead: a worker takes one before each batch and the consumer
        # gives one back per batch delivered, so at most ``prefetch`` batches are sampled
        # and not yet delivered, however many workers there are.
        self._credit = threading.Semaphore(int(prefetch))
        self._queue = queue.Queue()
        self._stop = threading.Event()
        self._done = False
        self._lock = threading.Lock()
        self._claimed = 0     # batches the workers have started (max_batches bounds it)
        self._running = 0     # workers that have not put their _END yet
        self._threads = []
        self._worker_clients = []
        self._inline = prefetch == 0
        # update_priorities(wait=False): applied in order by a thread, or inline
        if self._inline:
            self._updates = _deferred_updates.InlineUpdates(self._apply)
        else:
            self._updates = _deferred_updates.ThreadedUpdates(
                self._apply, f"shmreplay-jax-{self.table}-priorities")
        # None: one worker now; the first batch's size decides whether a second joins.
        self._auto_workers = num_workers is None and not self._inline
        for _ in range(0 if self._inline else 1 if num_workers is None else int(num_workers)):
            self._start_worker()

    def _start_worker(self):
        """Starts a sampling thread (its own Client, except for the first)."""
        with self._lock:
            if self._threads:
                client = Client(self._client.server_address,
                                trust_group=self._client._trust_group)
                self._worker_clients.append(client)
            else:
                client = self._client
            self._running += 1
            thread = threading.Thread(target=self._produce, args=(client,), daemon=True,
                                      name=f"shmreplay-jax-{self.table}-{len(self._threads)}")
            self._threads.append(thread)
        thread.start()

    def _claim(self) -> bool:
        """Takes the next batch to sample, unless ``max_batches`` were taken."""
        with self._lock:
            if self._max_batches is not None and self._claimed >= self._max_batches:
                return False
            self._claimed += 1
            return True

    # --- the producer threads ---------------------------------------------------------

    def _produce(self, client):
        try:
            while self._take_credit() and self._claim():
                sample = _batches.full_batch(client, self.table, self.batch_size,
                                             self._timeout, self._stop, self._pad_to)
                if sample is None:
                    break
                if self._auto_workers:
                    self._auto_workers = False
                    batch_bytes = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(
                        sample.data))
                    if _batches.default_parallelism(client, self.table, batch_bytes) > 1:
                        self._start_worker()
                self._queue.put(self._to_device(sample))
        except BaseException as exc:  # delivered to the consumer by __next__
            self._queue.put(exc)
            return
        self._queue.put(_END)

    def _take_credit(self) -> bool:
        while not self._stop.is_set():
            if self._credit.acquire(timeout=_batches.SLICE):
                return True
        return False

    def _to_device(self, sample) -> JaxBatch:
        # Fixed shapes through a jitted identity (see _Transfer); padded batches, whose
        # shapes may change from one batch to the next (a compilation each), by device_put.
        if isinstance(sample, PaddedSample):
            weights = None if self._beta is None else sample.info.importance_weights(self._beta)
            data, weights, lengths = jax.device_put((sample.data, weights, sample.lengths),
                                                    self.device)
            return PaddedJaxBatch(sample.info, data, weights, lengths)
        if self._beta is None:
            return JaxBatch(sample.info, self._transfer.put(sample.data), None)
        weights = sample.info.importance_weights(self._beta)
        data, weights = self._transfer.put((sample.data, weights))
        return JaxBatch(sample.info, data, weights)

    # --- the consumer -----------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):  # -> JaxBatch, or PaddedJaxBatch for items of any length
        self._updates.poll()
        if self._inline:
            return self._next_inline()
        while not self._done:
            try:
                item = self._queue.get(timeout=_batches.SLICE)
            except queue.Empty:
                if not any(thread.is_alive() for thread in self._threads) and self._queue.empty():
                    self._done = True
                continue
            if item is _END:
                with self._lock:
                    self._running -= 1
                    self._done = self._running == 0
                continue
            if isinstance(item, BaseException):
                self._done = True
                raise item
            self._credit.release()
            return item
        raise StopIteration

    def _next_inline(self):
        if self._done or self._stop.is_set() or not self._claim():
            self._done = True
            raise StopIteration
        sample = _batches.full_batch(self._client, self.table, self.batch_size,
                                     self._timeout, self._stop, self._pad_to)
        if sample is None:
            self._done = True
            raise StopIteration
        # Left on the host: the step's own call moves the arrays, so no separate
        # transfer (a jitted identity: one more computation per batch) is queued.
        weights = None if self._beta is None else sample.info.importance_weights(self._beta)
        if isinstance(sample, PaddedSample):
            return PaddedJaxBatch(sample.info, sample.data, weights, sample.lengths)
        return JaxBatch(sample.info, sample.data, weights)

    def update_priorities(self, keys, td_errors, *, exponent: float = 1.0,
                          epsilon: float = 1e-6, wait: bool = True) -> Optional[int]:
        """Sets the sampled items' priorities to ``|td_errors| ** exponent + epsilon``.

        Args:
          keys: ``batch.info.key`` (uint64, on the host).
          td_errors: A JAX (or numpy) array ``[B]``; fetched to the host once.
          exponent: Applied to ``|td_errors|`` (1: proportional prioritization).
          epsilon: Keeps every item sampleable.
          wait: True: fetch the errors and update now (this waits for the step that
            computes them). False: queue the update and return at once, so the
            learner's next step is dispatched without waiting (JAX's asynchronous
            dispatch); the updates are applied in the order given once the step has
            computed their errors: by a background thread, or with ``prefetch=0`` by
            this iterator's later calls (``next``, ``update_priorities``, ``flush``,
            ``close``). At most ``MAX_PENDING_UPDATES`` wait to be applied; beyond
            that this call waits for the oldest. ``flush()`` waits until the queued
            ones are applied.

        Returns:
          How many of the keys were still in the table; None with ``wait=False``
          (``flush()`` returns the count of the queued updates).

        Raises:
          ShmReplayError: What ``Client.update_priorities`` raises. With ``wait=False``
            a failed update raises from the next call of ``update_priorities``, ``next``
            or ``flush``.
        """
        if wait:
            self._updates.poll()
            return self._apply(keys, td_errors, exponent, epsilon)
        # Keys are copied: a batch's arrays may be reused once the learner drops it.
        self._updates.add((np.array(keys, dtype=np.uint64), td_errors, exponent, epsilon))
        return None

    def _apply(self, keys, td_errors, exponent, epsilon) -> int:
        return self._client.update_priorities(
            self.table, keys, _batches.priorities_from_td(td_errors, exponent, epsilon))

    def flush(self) -> int:
        """Waits until the updates queued with ``wait=False`` are applied.

        Returns:
          How many keys they found in the table (since the last ``flush``).

        Raises:
          ShmReplayError: What a queued update raised (the updates queued after it
            were dropped).
        """
        return self._updates.flush()

    def close(self):
        """Applies the queued priority updates (their errors are dropped; ``flush()``
        first to see them), then stops the threads (batches already sampled are
        dropped)."""
        self._updates.close()
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._done = True
        for client in self._worker_clients:
            client.close()
        if self._owns_client:
            self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

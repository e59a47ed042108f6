"""A JAX learner's view of a table: batches as JAX arrays on a device, sampled ahead.

Import it as ``shmreplay.jax`` (it imports JAX; ``import shmreplay`` does not)::

    from shmreplay.jax import BatchIterator

    batches = BatchIterator("my-buffer", "replay", batch_size=256, importance_beta=0.4)
    for batch in batches:
        loss, td_errors = train_step(params, batch.data, batch.weights)
        batches.update_priorities(batch.info.key, td_errors)

A background thread samples the next ``prefetch`` batches and puts them on the device
while the learner computes on the current one (shmreplay's sampling releases the GIL
in its native parts, and so does XLA), so the learner rarely waits for data.
"""

import queue
import threading
import time
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from shmreplay import errors, specs
from shmreplay.client import Client
from shmreplay.replay_sample import ReplaySample, SampleInfo

_END = object()
_SLICE = 0.1  # seconds: how often a waiting thread checks whether it should stop


class JaxBatch(NamedTuple):
    """One batch: ``info`` (a ``SampleInfo`` of numpy arrays ``[B]``: keys stay on the
    host, for priority updates), ``data`` (the item nest as JAX arrays ``[B, ...]`` on
    the device), and ``weights`` (float32 ``[B]`` importance weights on the device, or
    None when the iterator was made without ``importance_beta``)."""

    info: SampleInfo
    data: Any
    weights: Optional[Any]


class BatchIterator:
    """Yields ``JaxBatch`` es sampled from a table, prefetched onto a JAX device.

    Args:
      client: A ``shmreplay.Client``, or the buffer's name.
      table: The table to sample.
      batch_size: Items per batch (``Client.sample_batch`` semantics: a batch waits for
        rate-limiter credit until it is full).
      device: A ``jax.Device`` (default: ``jax.devices()[0]``).
      prefetch: How many batches the background thread samples ahead (>= 1). Each one
        counts as sampled for the rate limiter when it is taken, as with Reverb's
        datasets, so keep it small.
      importance_beta: If set, each batch carries importance weights
        ``(N * P) ** -beta / max`` (prioritized replay).
      rate_limiter_timeout_ms: Ends the iteration when no batch could be sampled in this
        many milliseconds (Reverb's dataset option). Negative: wait forever.
      max_batches: Ends the iteration after this many batches (None: never).

    Raises (from ``next``):
      TableNotFoundError, BufferBrokenError: as ``Client.sample_batch``.
    """

    def __init__(self, client, table: str, batch_size: int, *, device=None, prefetch: int = 2,
                 importance_beta: Optional[float] = None, rate_limiter_timeout_ms: int = -1,
                 max_batches: Optional[int] = None):
        if int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
        if int(prefetch) != prefetch or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {prefetch!r}.")
        if max_batches is not None and max_batches < 0:
            raise ValueError(f"max_batches must be None or >= 0, got {max_batches!r}.")
        self._client = client if isinstance(client, Client) else Client(client)
        self._owns_client = not isinstance(client, Client)
        self._client._engine(table)  # unknown table: fail now, not in the thread
        self.table = table
        self.batch_size = int(batch_size)
        self.device = device if device is not None else jax.devices()[0]
        self._beta = importance_beta
        self._timeout = None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000
        self._max_batches = max_batches
        # The queue holds prefetch - 1 batches, and the thread one more in hand: at most
        # ``prefetch`` batches are sampled and not yet delivered.
        self._queue = queue.Queue(maxsize=max(1, int(prefetch) - 1))
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._produce, name=f"shmreplay-jax-{table}",
                                        daemon=True)
        self._thread.start()

    # --- the producer thread ----------------------------------------------------------

    def _produce(self):
        produced = 0
        try:
            while not self._stop.is_set():
                if self._max_batches is not None and produced >= self._max_batches:
                    break
                sample = self._sample_full_batch()
                if sample is None:
                    break
                produced += 1
                if not self._put(self._to_device(sample)):
                    return
        except BaseException as exc:  # delivered to the consumer by __next__
            self._put(exc)
            return
        self._put(_END)

    def _sample_full_batch(self):
        """A full batch, or None when stopping or ``rate_limiter_timeout_ms`` ran out.

        Waits in short slices, so that ``close`` is noticed; rows that a slice brings
        are kept and the rest is sampled next.
        """
        parts, have = [], 0
        last_rows = time.monotonic()
        while have < self.batch_size:
            if self._stop.is_set():
                return None
            wait = _SLICE
            if self._timeout is not None:
                wait = min(wait, max(0.0, self._timeout - (time.monotonic() - last_rows)))
            try:
                part = self._client.sample_batch(self.table, self.batch_size - have, timeout=wait)
            except errors.DeadlineExceededError:
                if (self._timeout is not None
                        and time.monotonic() - last_rows >= self._timeout):
                    return None  # like Reverb's datasets: the end (a partial batch is dropped)
                continue
            parts.append(part)
            have += len(part.info.key)
            last_rows = time.monotonic()
        return parts[0] if len(parts) == 1 else _concatenate(parts)

    def _put(self, value) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=_SLICE)
                return True
            except queue.Full:
                continue
        return False

    def _to_device(self, sample) -> JaxBatch:
        # One device_put for the whole batch: each call costs tens of microseconds.
        if self._beta is None:
            return JaxBatch(sample.info, jax.device_put(sample.data, self.device), None)
        weights = sample.info.importance_weights(self._beta)
        data, weights = jax.device_put((sample.data, weights), self.device)
        return JaxBatch(sample.info, data, weights)

    # --- the consumer -----------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self) -> JaxBatch:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_SLICE)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise StopIteration from None
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return item

    def update_priorities(self, keys, td_errors, *, exponent: float = 1.0,
                          epsilon: float = 1e-6) -> int:
        """Sets the sampled items' priorities to ``|td_errors| ** exponent + epsilon``.

        Args:
          keys: ``batch.info.key`` (uint64, on the host).
          td_errors: A JAX (or numpy) array ``[B]``; fetched to the host once.
          exponent: Applied to ``|td_errors|`` (1: proportional prioritization).
          epsilon: Keeps every item sampleable.

        Returns:
          How many of the keys were still in the table.
        """
        errors_host = np.abs(np.asarray(td_errors, dtype=np.float64)).reshape(-1)
        if exponent != 1.0:
            errors_host = errors_host ** exponent
        return self._client.update_priorities(self.table, keys, errors_host + epsilon)

    def close(self):
        """Stops the producer thread (batches already sampled are dropped)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._done = True
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


def _concatenate(parts):
    """One ReplaySample from several partial batches (rows in order)."""
    info = SampleInfo(*(np.concatenate(fields) for fields in zip(*(p.info for p in parts))))
    data = specs.optree.tree_map(lambda *leaves: np.concatenate(leaves),
                                 *(p.data for p in parts))
    return ReplaySample(info, data)

"""Priority updates applied beside the learner, so that its next step does not wait.

A TensorFlow learner's loop runs the step, then sets the sampled items' priorities from
the TD errors it returned. Done there, the update sits between two steps: its copy of the
keys and errors, its table lock (which a sampling thread may hold just then) and its
sum-tree work all delay the next step. ``PriorityUpdater`` hands the update to a thread,
which applies the updates in the order given while the next step runs::

    from shmreplay import PriorityUpdater

    with PriorityUpdater(client, "replay") as updates:
        for _ in range(steps):
            keys, td_errors = train_step(iterator)       # a tf.function
            updates.update_priorities(keys, td_errors)   # returns at once

It takes anything numpy can read (numpy arrays, TensorFlow eager tensors, JAX arrays):
JAX learners have the same thing built into ``shmreplay.jax.BatchIterator``
(``update_priorities(..., wait=False)``).
"""

from typing import Optional

import numpy as np

from shmreplay import _deferred_updates
from shmreplay._deferred_updates import MAX_PENDING_UPDATES  # noqa: F401 (documented here)
from shmreplay.client import Client


class PriorityUpdater:
    """Sets priorities ``|td_errors| ** exponent + epsilon`` by key, from a thread.

    Args:
      client: A ``shmreplay.Client``, or the buffer's name (then the updater attaches
        its own client and closes it with ``close``).
      table: The table whose priorities it sets.

    Updates are applied in the order given, by one thread started with the first. At
    most ``MAX_PENDING_UPDATES`` (8) wait to be applied; the ninth waits for the oldest.
    A failed update (a non-finite TD error, a stopped buffer) raises from the next
    ``update_priorities`` or ``flush``, and the updates queued after it are dropped.
    """

    def __init__(self, client, table: str):
        self._client = client if isinstance(client, Client) else Client(client)
        self._owns_client = not isinstance(client, Client)
        self._client._engine(table)  # unknown table: fail now, not in the thread
        self.table = table
        self._closed = False
        self._updates = _deferred_updates.ThreadedUpdates(
            self._apply, f"shmreplay-priorities-{table}")

    def update_priorities(self, keys, td_errors, *, exponent: float = 1.0,
                          epsilon: float = 1e-6, wait: bool = False) -> Optional[int]:
        """Sets the priorities of the items ``keys`` to ``|td_errors| ** exponent + epsilon``.

        Args:
          keys: The sampled keys (``sample.info.key``): uint64, ``[B]``.
          td_errors: ``[B]``, anything numpy can read; read by the thread.
          exponent: Applied to ``|td_errors|`` (1: proportional prioritization).
          epsilon: Keeps every item sampleable.
          wait: False (the default): queue the update and return at once. True: apply
            it now, after the queued ones, and return how many keys were found (what
            ``Client.update_priorities`` does, in order with the queue).

        Returns:
          None, or with ``wait=True`` how many of the keys were still in the table.

        Raises:
          ShmReplayError: What an update queued before raised (once), or with
            ``wait=True`` what this one raised.
          RuntimeError: After ``close``.
        """
        if self._closed:
            raise RuntimeError(f"This PriorityUpdater of table '{self.table}' is closed.")
        # The keys are copied now: a batch's arrays may be reused once the learner drops it.
        update = (np.array(keys, dtype=np.uint64), td_errors, exponent, epsilon)
        if wait:
            self.flush()
            return self._apply(*update)
        self._updates.add(update)
        return None

    def _apply(self, keys, td_errors, exponent, epsilon) -> int:
        priorities = _deferred_updates.priorities_from(td_errors, exponent, epsilon)
        return self._client.update_priorities(self.table, keys, priorities)

    def flush(self) -> int:
        """Waits until the queued updates are applied; returns how many keys they found
        in the table (since the last ``flush``). Raises what a queued update raised."""
        return self._updates.flush()

    def close(self):
        """Applies the queued updates (their errors are dropped: ``flush()`` first to see
        them) and stops the thread."""
        if self._closed:
            return
        self._closed = True
        self._updates.close()
        if self._owns_client:
            self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

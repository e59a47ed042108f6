"""Full batches for the learner adapters (``shmreplay.tf``, ``shmreplay.jax``).

Both adapters hand a learner fixed-size batches sampled in background threads, wait in
short slices (so that a stopped iterator is noticed), end after a rate-limiter timeout,
and choose how many batches to sample at once. That shared logic lives here; this
module imports neither TensorFlow nor JAX.
"""

import threading
import time
from typing import Optional

import numpy as np

from shmreplay import errors, specs
from shmreplay.replay_sample import ReplaySample, SampleInfo

SLICE = 0.1  # seconds a waiting worker sleeps at a time before it checks for a stop
# Sampling two batches at once pays off when the copy, which runs outside the GIL, is
# most of a batch's cost: measured on 2 cores, batches of 256 Atari frames (7 MB) went
# from 0.55 to 0.75 of sample_batch's rate in eager TensorFlow; below about 1 MiB the
# second call gained nothing or lost a little.
PARALLEL_FROM_BYTES = 1 << 20


def full_batch(client, table: str, batch_size: int, timeout: Optional[float],
               stop: Optional[threading.Event] = None) -> Optional[ReplaySample]:
    """A batch of exactly ``batch_size`` items, or None.

    Takes what the rate limiter allows and waits for the rest. Returns None when no row
    came for ``timeout`` seconds (None: wait forever; rows already taken are dropped,
    as Reverb's datasets drop a partial batch), or when ``stop`` is set.
    """
    parts, have = [], 0
    last_rows = time.monotonic()
    while have < batch_size:
        if stop is not None and stop.is_set():
            return None
        wait = SLICE if timeout is None else min(
            SLICE, max(0.0, timeout - (time.monotonic() - last_rows)))
        try:
            part = client.sample_batch(table, batch_size - have, timeout=wait)
        except errors.DeadlineExceededError:
            if timeout is not None and time.monotonic() - last_rows >= timeout:
                return None
            continue
        parts.append(part)
        have += len(part.info.key)
        last_rows = time.monotonic()
    return parts[0] if len(parts) == 1 else concatenate(parts)


def concatenate(parts) -> ReplaySample:
    """One ReplaySample from several partial batches (rows in order)."""
    info = SampleInfo(*(np.concatenate(fields) for fields in zip(*(p.info for p in parts))))
    data = specs.optree.tree_map(lambda *leaves: np.concatenate(leaves),
                                 *(p.data for p in parts))
    return ReplaySample(info, data)


def default_parallelism(client, table: str, batch_bytes: int) -> int:
    """How many batches to sample at once when the caller did not say: 2 for batches of
    ``PARALLEL_FROM_BYTES`` or more from a table whose sampler is not deterministic
    (uniform, prioritized), else 1, which keeps a FIFO, LIFO or heap table's order."""
    if batch_bytes < PARALLEL_FROM_BYTES:
        return 1
    sampler = client.server_info()[table].sampler_options
    return 1 if sampler.get("is_deterministic", True) else 2

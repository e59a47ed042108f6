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
from shmreplay.replay_sample import PaddedSample, ReplaySample, SampleInfo

SLICE = 0.1  # seconds a waiting worker sleeps at a time before it checks for a stop
# Sampling two batches at once pays off when the copy, which runs outside the GIL, is
# most of a batch's cost: measured on 2 cores, batches of 256 Atari frames (7 MB) went
# from 0.55 to 0.75 of sample_batch's rate in eager TensorFlow; below about 1 MiB the
# second call gained nothing or lost a little.
PARALLEL_FROM_BYTES = 1 << 20


def full_batch(client, table: str, batch_size: int, timeout: Optional[float],
               stop: Optional[threading.Event] = None,
               pad_to: Optional[int] = None) -> Optional[ReplaySample]:
    """A batch of exactly ``batch_size`` items, or None.

    Takes what the rate limiter allows and waits for the rest. Returns None when no row
    came for ``timeout`` seconds (None: wait forever; rows already taken are dropped,
    as Reverb's datasets drop a partial batch), or when ``stop`` is set. ``pad_to``: as
    for ``Client.sample_batch`` (items of any length).
    """
    padding = {} if pad_to is None else {"pad_to": pad_to}  # (fixed tables: the same call)
    parts, have = [], 0
    last_rows = time.monotonic()
    while have < batch_size:
        if stop is not None and stop.is_set():
            return None
        wait = SLICE if timeout is None else min(
            SLICE, max(0.0, timeout - (time.monotonic() - last_rows)))
        try:
            part = client.sample_batch(table, batch_size - have, timeout=wait, **padding)
        except errors.DeadlineExceededError:
            if timeout is not None and time.monotonic() - last_rows >= timeout:
                return None
            continue
        parts.append(part)
        have += len(part.info.key)
        last_rows = time.monotonic()
    return parts[0] if len(parts) == 1 else concatenate(parts)


def priorities_from_td(td_errors, exponent: float, epsilon: float) -> np.ndarray:
    """``|td_errors| ** exponent + epsilon`` as float64 ``[B]`` on the host (the learner
    iterators' ``update_priorities``); reading a framework's array waits for it."""
    priorities = np.abs(np.asarray(td_errors, dtype=np.float64)).reshape(-1)
    if exponent != 1.0:
        priorities = priorities ** exponent
    return priorities + epsilon


def concatenate(parts) -> ReplaySample:
    """One ReplaySample from several partial batches (rows in order). Padded parts
    (items of any length) are padded again to the longest of all of them."""
    info = SampleInfo(*(np.concatenate(fields) for fields in zip(*(p.info for p in parts))))
    if not isinstance(parts[0], PaddedSample):
        data = specs.optree.tree_map(lambda *leaves: np.concatenate(leaves),
                                     *(p.data for p in parts))
        return ReplaySample(info, data)
    data = specs.optree.tree_map(_concatenate_padded, *(p.data for p in parts))
    padded = PaddedSample(info, data)
    padded.lengths = specs.optree.tree_map(lambda *lengths: np.concatenate(lengths),
                                           *(p.lengths for p in parts))
    return padded


def _concatenate_padded(*leaves):
    if leaves[0].ndim < 2:
        return np.concatenate(leaves)
    width = max(leaf.shape[1] for leaf in leaves)
    out = np.zeros((sum(len(leaf) for leaf in leaves), width) + leaves[0].shape[2:],
                   leaves[0].dtype)
    row = 0
    for leaf in leaves:  # (one per partial batch, not per item)
        out[row:row + len(leaf), :leaf.shape[1]] = leaf
        row += len(leaf)
    return out


def any_length_columns(engine) -> list:
    """Per column of ``engine`` 's items: whether it takes items of any length (its time
    dimension is None: the signature's, or a table without one whose first item came
    from a writer); [] while nothing says what the items look like."""
    layout = engine.known_layout()
    if layout is None:
        return []
    return [specs.varies_in_time(spec) for spec in layout[1]]


def check_pad_to(engine, pad_to) -> int:
    """``pad_to`` as an int, checked before anything is sampled.

    Raises:
      ValueError: not an integer >= 1, or the table has no column of any length.
    """
    if isinstance(pad_to, bool) or int(pad_to) != pad_to or pad_to < 1:
        raise ValueError(f"Table '{engine.name}': pad_to must be an integer >= 1 (the padded "
                         f"time dimension), got {pad_to!r}.")
    if not any(any_length_columns(engine)):
        raise ValueError(
            f"Table '{engine.name}': pad_to is for tables of items of any length (a "
            "signature whose time dimension is None); this table's items have fixed "
            "shapes, so leave pad_to out.")
    return int(pad_to)


def pad(sample: PaddedSample, width: int, engine) -> PaddedSample:
    """``sample`` with its columns of any length padded to ``width`` steps.

    Raises:
      ValueError: an item is longer than ``width`` (it was sampled all the same).
    """
    flags = any_length_columns(engine)
    leaves, treedef = specs.flatten(sample.data)
    lengths = specs.flatten(sample.lengths)[0]
    longest = max((int(n.max(initial=0)) for n, f in zip(lengths, flags) if f), default=0)
    if longest > width:
        raise ValueError(
            f"Table '{engine.name}': pad_to={width}, but a sampled item has {longest} steps "
            "(the batch counts as sampled). Give pad_to the longest item the writers make, "
            "or cut the items at the writer.")
    out = []
    for leaf, variable in zip(leaves, flags):
        if variable and leaf.shape[1] != width:
            wide = np.zeros((len(leaf), width) + leaf.shape[2:], leaf.dtype)
            wide[:, :leaf.shape[1]] = leaf
            leaf = wide
        out.append(leaf)
    padded = PaddedSample(sample.info, specs.optree.tree_unflatten(treedef, out))
    padded.lengths = sample.lengths
    return padded


def default_parallelism(client, table: str, batch_bytes: int) -> int:
    """How many batches to sample at once when the caller did not say: 2 for batches of
    ``PARALLEL_FROM_BYTES`` or more from a table whose sampler is not deterministic
    (uniform, prioritized), else 1, which keeps a FIFO, LIFO or heap table's order."""
    if batch_bytes < PARALLEL_FROM_BYTES:
        return 1
    return 1 if is_deterministic(client, table) else 2


def is_deterministic(client, table: str) -> bool:
    """Whether ``table`` 's sampler takes items in an order (FIFO, LIFO, heap), which
    sampling ahead or in parallel must keep, rather than at random."""
    return client.server_info()[table].sampler_options.get("is_deterministic", True)


def padded_batch(client, table: str, batch_size: int, timeout, pad_to) -> PaddedSample:
    """``client.sample_batch(table, batch_size, timeout, pad_to=pad_to)``: ``pad_to`` is
    checked first, so a wrong one takes nothing from the table."""
    engine = client._engine(table)
    width = check_pad_to(engine, pad_to)
    return pad(client.sample_batch(table, batch_size, timeout), width, engine)

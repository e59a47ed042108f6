"""The remote writers: steps and items are buffered on the caller's side and shipped in
chunks of operations, each applied whole by the buffer-side actor (``service.py``).

A chunk goes when ``chunk_items`` items wait, when ``max_chunk_steps`` steps wait, and
at ``flush``, ``end_episode`` and ``close``. A full chunk is not waited for: the next
one is built meanwhile, and sent once the first is applied (one chunk in flight per
writer, so the buffer's side applies them in order; an error of a chunk in flight is
raised by the writer's next send). A chunk the rate limiter held up past the
timeout stays applied but unacknowledged on the buffer side; the next send first
resends it (same sequence number), so it is inserted once.
"""

import collections
import math
import pickle
import uuid
from typing import Optional

import numpy as np

from shmreplay import errors, specs
from shmreplay._ray.column import RemoteColumn, history_of
from shmreplay._ray.errors import BufferServiceUnavailableError
from shmreplay._ray.service import NEED_CONTEXT


_NESTS = (dict, list, tuple, collections.OrderedDict, collections.defaultdict)


def _copied(data):
    """The step's arrays copied: the caller may reuse them before the chunk is sent."""
    if type(data) is dict:   # the usual flat step: no tree walk
        copy = {}
        for key, leaf in data.items():
            kind = type(leaf)
            if kind is np.ndarray:
                copy[key] = leaf.copy()
            elif kind in _NESTS:
                break
            else:
                copy[key] = leaf
        else:
            return copy
    return specs.optree.tree_map(
        lambda leaf: leaf.copy() if isinstance(leaf, np.ndarray) else leaf, data,
        none_is_leaf=True)


def _check_priority(priority):
    value = float(priority)
    if not (value >= 0.0 and math.isfinite(value)):
        raise errors.InvalidPriorityError(
            f"priority must be finite and >= 0, got {priority!r}.")
    return value


class _ChunkedWriter:
    """What both remote writers share: the operation log and its shipping."""

    _kind = None

    def __init__(self, remote, keep, config, chunk_items, max_chunk_steps):
        if chunk_items < 1 or max_chunk_steps < 1:
            raise ValueError("chunk_items and max_chunk_steps must be >= 1.")
        self._remote = remote
        self._id = uuid.uuid4().hex
        self._actor = remote._actor_for(self._id)
        self._keep = keep
        self._config = config
        self._chunk_items = chunk_items
        self._max_chunk_steps = max_chunk_steps
        self._seq = 0
        self._steps = 0                 # complete steps appended in this episode
        self._kept = collections.deque(maxlen=keep)   # recent steps: [(data, partial)]
        self._open = []                 # the open step's parts: [(data, True)]
        self._ops = []
        self._items = 0
        self._chunk_first_step = (0, 0)  # (complete steps, parts of the open step) before
        self._chunk_context = None      # the kept steps' parts before the chunk's first op
        self._unacked = None            # a chunk the rate limiter held up: resent first
        self._in_flight = None          # (chunk, Ray reference) of a chunk not waited for
        self._closed = False

    def _check_open(self):
        if self._closed:
            raise errors.ClosedError(f"{type(self).__name__} was closed.")

    def _positions(self) -> int:
        """The history's length: complete steps, and the open step (if any)."""
        return self._steps + (1 if self._open else 0)

    def _start_chunk(self):
        self._chunk_first_step = (self._steps, len(self._open))
        self._chunk_context = [part for step in self._kept for part in step] + self._open

    def _append(self, data, partial: bool = False):
        if not self._ops:
            self._start_chunk()
        data = _copied(data)
        if partial:
            self._ops.append(("p", data))
            self._open.append((data, True))
            return
        self._ops.append(("a", data))
        self._open.append((data, False))
        self._kept.append(self._open)
        self._open = []
        self._steps += 1
        if self._steps - self._chunk_first_step[0] >= self._max_chunk_steps:
            self._send(False, None, wait=False)

    def _add_item(self, op):
        if not self._ops:
            self._start_chunk()
        self._ops.append(op)
        self._items += 1
        if self._items >= self._chunk_items:
            self._send(False, None, wait=False)

    def _send(self, end_episode: bool, timeout: Optional[float], wait: bool = True):
        """Ships the operations waiting, after the chunk in flight is settled and any
        unacknowledged chunk resent. ``wait=False`` (a full chunk) leaves it in flight:
        the caller builds the next chunk while the buffer's side applies this one."""
        self._settle()
        if self._unacked is not None:
            self._ship(self._unacked, timeout)
            self._unacked = None
        if not self._ops and not end_episode:
            return
        self._seq += 1
        # One bytes object: Ray would carry each of the steps' small arrays as a buffer
        # of its own, at a cost per buffer.
        ops = pickle.dumps(self._ops, protocol=pickle.HIGHEST_PROTOCOL)
        chunk = (self._seq, self._chunk_first_step, self._chunk_context, ops, end_episode)
        self._ops, self._items, self._chunk_context = [], 0, None
        if end_episode:
            self._steps = 0
            self._kept.clear()
            self._open = []
        if not wait:
            self._in_flight = (chunk, self._remote._submit(
                self._actor, "apply_chunk", *self._arguments(chunk, None, None)))
            return
        try:
            self._ship(chunk, timeout)
        except (errors.DeadlineExceededError, BufferServiceUnavailableError):
            # Applied and waiting for the rate limiter, or unknown (the buffer side was
            # unreachable): resent first next time, and applied at most once.
            self._unacked = chunk
            raise
        # Any other error was raised by the chunk's own operations (bad data, a table
        # that does not exist): the chunk is dropped; the items before the operation
        # that failed may be in the buffer, as with a local writer.

    def _arguments(self, chunk, context, timeout):
        seq, first_step, _, ops, end_episode = chunk
        return (self._id, seq, self._kind, self._config, first_step, context, ops,
                end_episode, timeout)

    def _settle(self):
        """Waits for the chunk in flight; its errors are raised here (one call late)."""
        if self._in_flight is None:
            return
        chunk, ref = self._in_flight
        self._in_flight = None
        try:
            result = self._remote._result(ref, self._actor, "apply_chunk",
                                          *self._arguments(chunk, None, None))
            if result == NEED_CONTEXT:
                self._remote._call(self._actor, "apply_chunk",
                                   *self._arguments(chunk, chunk[2] or [], None))
        except BufferServiceUnavailableError:
            self._unacked = chunk
            raise

    def _ship(self, chunk, timeout):
        result = self._remote._call(self._actor, "apply_chunk",
                                    *self._arguments(chunk, None, timeout))
        if result == NEED_CONTEXT:  # a new or restarted buffer-side actor
            self._remote._call(self._actor, "apply_chunk",
                               *self._arguments(chunk, chunk[2] or [], timeout))

    def _close(self, ship_last: bool):
        if self._closed:
            return
        try:
            if ship_last:
                self._send(True, None)
            else:
                self._settle()
        finally:
            self._closed = True
            self._ops = []
            self._kept.clear()
            self._open = []
            try:
                self._remote._call(self._actor, "close_writer", self._id)
            except Exception:  # the buffer side is gone: nothing to release there
                pass

    @property
    def num_pending_items(self) -> int:
        """Items created here and not yet shipped."""
        return self._items


class RemoteTrajectoryWriter(_ChunkedWriter):
    """``TrajectoryWriter``'s calls, from any Ray task or actor (``RemoteClient``).

    ``append`` takes whole steps, or parts of one (``partial_step=True``) as locally;
    ``history[field][...]`` and ``create_item`` work as locally, within the last
    ``num_keep_alive_refs`` steps. ``end_episode`` always clears the history.
    """

    _kind = "trajectory"

    def __init__(self, remote, num_keep_alive_refs: int, chunk_items: int = 64,
                 max_chunk_steps: int = 1024):
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs must be >= 1, got {num_keep_alive_refs}.")
        super().__init__(remote, int(num_keep_alive_refs),
                         {"num_keep_alive_refs": int(num_keep_alive_refs)},
                         chunk_items, max_chunk_steps)
        self._history = None
        self._root = None           # the skeleton of every field seen (``history_of``)
        self._treedefs = set()      # the structures appended so far
        self._flat_keys = None      # the keys of a flat dict step, the usual case
        self._given = set()         # the fields the open step has

    def append(self, data, *, partial_step: bool = False):
        """Appends one step (a nest of arrays or scalars, copied here), or part of it.

        Args:
          data: The step's fields; new fields may appear in later steps.
          partial_step: Keep the step open: the next ``append`` adds fields to it. The
            open step takes a position in the history at once, as locally (its fields
            not given yet read as None there).

        Raises:
          ValueError: a field is set twice in the same (open) step.
          ClosedError: the writer was closed.
        """
        self._check_open()
        if not partial_step and not self._open and type(data) is dict \
                and self._flat_keys is not None and len(data) == len(self._flat_keys) \
                and all(key in data and type(data[key]) not in _NESTS
                        for key in self._flat_keys):
            self._append(data)      # the usual step: the same flat dict as before
            return
        treedef = specs.optree.tree_structure(data, none_is_leaf=True)
        self._flat_keys = None
        if not partial_step and not self._open and type(data) is dict \
                and all(type(leaf) not in _NESTS for leaf in data.values()):
            self._flat_keys = frozenset(data)
        if partial_step or self._open:
            fields = {tuple(path) for path in specs.optree.tree_paths(data)}  # (no Nones)
            twice = fields & self._given
            if twice:
                raise ValueError(
                    f"Field {min(twice)} has already been set in the active step by "
                    "previous (partial) append call and thus must be omitted or set to None.")
            self._given = self._given | fields if partial_step else set()
        if treedef not in self._treedefs:
            self._treedefs.add(treedef)
            self._root, self._history = history_of(self, self._root, data)
        self._append(data, partial_step)

    @property
    def history(self):
        """The appended steps' structure, each field indexable as locally (``int``,
        ``slice``, ``list``) within the last ``num_keep_alive_refs`` steps; gives
        ``RemoteColumn``s for ``create_item``."""
        if self._history is None:
            raise RuntimeError("history is not available before the first append.")
        return self._history

    @property
    def episode_steps(self) -> int:
        """Steps appended since the last ``end_episode``."""
        return self._steps

    def create_item(self, table: str, priority: float, trajectory):
        """Records an item over columns of ``history``; it is shipped with its chunk.

        Errors about the table or the data come from the buffer's side, raised by the
        call that ships the chunk (or the next one: a full chunk is not waited for).

        Raises:
          TypeError: a leaf is not a column of this writer's history.
          ValueError: an empty trajectory or column.
          InvalidPriorityError: a negative, NaN or infinite priority.
        """
        self._check_open()
        if type(trajectory) is dict:
            leaves = list(trajectory.values())
            if not all(type(leaf) is RemoteColumn for leaf in leaves):
                leaves = specs.optree.tree_leaves(trajectory, none_is_leaf=True)
        else:
            leaves = specs.optree.tree_leaves(trajectory, none_is_leaf=True)
        if not leaves:
            raise ValueError("create_item: the trajectory is empty.")
        for leaf in leaves:
            if not isinstance(leaf, RemoteColumn):
                raise TypeError("create_item: every leaf of the trajectory must be a column "
                                f"of this writer's history, got {type(leaf).__name__}.")
            if not leaf.steps:
                raise ValueError("create_item: a column is empty.")
        self._add_item(("i", table, _check_priority(priority), trajectory))

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None):
        """Ships what waits and waits until the buffer took it (all of it: the remote
        writer has no partial flush)."""
        self._check_open()
        self._send(False, None if timeout_ms is None else timeout_ms / 1000.0)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None):
        """Ships what waits, ends the episode on the buffer's side and clears the history
        (whatever ``clear_buffers`` says).

        Raises:
          DeadlineExceededError: ``timeout_ms`` passed while the rate limiter held the
            items up; the episode ends here, and on the buffer's side once the chunk,
            resent by the next call, is through.
        """
        self._check_open()
        self._given = set()
        self._send(True, None if timeout_ms is None else timeout_ms / 1000.0)

    def close(self):
        """Closes the writer; items not shipped yet are dropped (``flush`` first)."""
        self._close(False)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None and not self._closed:
            self.flush()
        self.close()


class RemoteWriter(_ChunkedWriter):
    """Reverb's legacy ``Writer`` calls (``append``, ``create_item(table, n, priority)``,
    ``flush``, ``close``), from any Ray task or actor."""

    _kind = "writer"

    def __init__(self, remote, max_sequence_length: int, chunk_items: int = 64,
                 max_chunk_steps: int = 1024):
        if max_sequence_length < 1:
            raise ValueError(f"max_sequence_length must be >= 1, got {max_sequence_length}.")
        super().__init__(remote, int(max_sequence_length),
                         {"max_sequence_length": int(max_sequence_length)},
                         chunk_items, max_chunk_steps)

    def append(self, data):
        """Appends one step (a nest of arrays or scalars, copied here)."""
        self._check_open()
        self._append(data)

    def create_item(self, table: str, num_timesteps: int, priority: float):
        """Records an item of the last ``num_timesteps`` steps; shipped with its chunk.

        Raises:
          ValueError: ``num_timesteps`` out of 1 .. ``max_sequence_length`` or more than
            the steps appended.
          InvalidPriorityError: a negative, NaN or infinite priority.
        """
        self._check_open()
        if int(num_timesteps) != num_timesteps or not 1 <= num_timesteps <= self._keep:
            raise ValueError(f"num_timesteps must be an integer in 1 .. "
                             f"max_sequence_length ({self._keep}), got {num_timesteps!r}.")
        if num_timesteps > self._steps:
            raise ValueError(f"num_timesteps ({num_timesteps}) is more than the "
                             f"{self._steps} step(s) appended.")
        self._add_item(("i", table, int(num_timesteps), _check_priority(priority)))

    def flush(self, timeout: Optional[float] = None):
        """Ships what waits and waits until the buffer took it.

        Raises:
          DeadlineExceededError: ``timeout`` (seconds) passed first; the chunk is
            resent by the next call and inserted once.
        """
        self._check_open()
        self._send(False, timeout)

    def close(self, retry_on_unavailable: bool = True, timeout: Optional[float] = None):
        """Ships what waits, then closes (the episode ends)."""
        if self._closed:
            raise ValueError("Writer is already closed.")
        self._close(True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._closed:
            self.close()

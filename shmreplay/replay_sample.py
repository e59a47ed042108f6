"""What sampling returns: ``ReplaySample(info, data)``, with Reverb's field names and dtypes."""

import dataclasses
from typing import Any, NamedTuple, Optional

import numpy as np

INFO_DTYPES = {
    "key": np.uint64,
    "probability": np.float64,
    "table_size": np.int64,
    "priority": np.float64,
    "times_sampled": np.int32,
}


_weights_kernel = None
_NAN = float("nan")
_FLOAT32, _FLOAT64, _INT64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)


def _load_weights_kernel():
    # numba kernels are imported on first use: importing shmreplay compiles nothing.
    global _weights_kernel
    from shmreplay._shm.kernels.table import importance_weights
    _weights_kernel = importance_weights
    return importance_weights


class SampleInfo(NamedTuple):
    """Metadata of sampled items.

    From ``Client.sample`` each field is a Python scalar; from ``Client.sample_batch``
    each field is a numpy array of shape ``[B]`` with the dtype in ``INFO_DTYPES``.

    Attributes:
      key: The item's key (uint64), for ``Client.mutate_priorities``. Never reused.
      probability: The probability with which the sampler picked the item.
      table_size: Items in the table when the item was sampled.
      priority: The item's priority when it was sampled.
      times_sampled: How often the item has been sampled, this time included.
    """

    key: Any
    probability: Any
    table_size: Any
    priority: Any
    times_sampled: Any

    def importance_weights(self, beta: float, normalize: bool = True) -> np.ndarray:
        """Importance-sampling weights ``(table_size * probability) ** -beta``.

        These correct the bias of prioritized replay (Schaul et al., 2016).

        Args:
          beta: The correction exponent, usually annealed from about 0.4 to 1.
          normalize: Divide by the largest weight of the batch, so weights are ``<= 1``.

        Returns:
          A float32 array shaped like ``probability``.
        """
        kernel = _weights_kernel or _load_weights_kernel()
        prob, size = self.probability, self.table_size
        # Batches from sample_batch pass as they are; anything else is converted.
        flat = type(prob) is np.ndarray and prob.ndim == 1
        if not flat or prob.dtype is not _FLOAT64:
            prob = np.asarray(prob, dtype=np.float64).reshape(-1)
        if type(size) is not np.ndarray or size.dtype is not _INT64 or size.ndim != 1:
            size = np.asarray(size, dtype=np.int64).reshape(-1)
        weights = np.empty(prob.shape[0], _FLOAT32)
        kernel(prob, size, float(beta), bool(normalize), weights)
        if not flat:
            return weights.reshape(np.shape(self.probability))
        return weights

    @classmethod
    def zeros(cls):
        """A ``SampleInfo`` of zeros (key 0, probability 0.0, ...), as Reverb's."""
        return cls(0, 0.0, 0, 0.0, 0)

    @classmethod
    def dtypes(cls):
        """The numpy dtype of each field."""
        return cls(*(np.dtype(INFO_DTYPES[f]) for f in cls._fields))


class BatchInfo(SampleInfo):
    """The ``SampleInfo`` of a reused small batch (``shmreplay._engine.batch_outputs``):
    a ``SampleInfo`` in every way (its repr and pickle say so), whose
    ``importance_weights`` may hand out the weights the sampling call already computed
    (when a learner asks for the same ``beta`` at every step): the same values, in an
    array of the batch's memory that only that call gets."""

    _weights = None  # its ``FusedWeights`` (None: as SampleInfo; e.g. after ``_replace``)

    def importance_weights(self, beta: float, normalize: bool = True) -> np.ndarray:
        fused = self._weights
        if fused is not None:
            # (inline, not a method of FusedWeights: a learner calls this at every step)
            weighed = fused._weighed
            try:
                hit = weighed[0] == beta and weighed[1] == (1.0 if normalize else 0.0)
            except ValueError:  # (arrays: the general path says what is wrong)
                hit = False
            if hit:
                weighed[0] = _NAN  # (a second call gets a new array)
                return fused._weights
            fused._weighing.asked(beta, normalize)
        return SampleInfo.importance_weights(self, beta, normalize)

    importance_weights.__doc__ = SampleInfo.importance_weights.__doc__

    def __repr__(self):
        return repr(SampleInfo._make(self))

    def __reduce__(self):
        return SampleInfo, tuple(self)


class ReplaySample(NamedTuple):
    """One sampled item (or batch): ``info`` is a ``SampleInfo``, ``data`` the item's nest."""

    info: SampleInfo
    data: Any


class PaddedSample(ReplaySample):
    """A batch of items of any length (``Client.sample_batch`` of a table whose
    signature has a ``None`` time dimension): still ``(info, data)``, where each column
    of ``data`` is padded with zeros to the longest item of the batch, and ``lengths``
    is a nest like ``data`` of int64 arrays ``[B]``: each item's length in that column
    (1 for a column without a time dimension). ``mask(lengths)`` turns one into a
    ``[B, T]`` boolean mask.
    """

    lengths: Any = None  # (an instance attribute: a NamedTuple subclass has no fields)

    @staticmethod
    def mask(lengths: np.ndarray, width: Optional[int] = None) -> np.ndarray:
        """``[B, width]`` True where a step is an item's own (not padding)."""
        width = int(lengths.max(initial=0)) if width is None else int(width)
        return np.arange(width)[None, :] < np.asarray(lengths)[:, None]


class _Message:
    """Proto-style reading for the info records: ``HasField`` answers for their
    sub-message fields, and a scalar field raises ``ValueError`` as a proto3 message's
    does (it has no presence)."""

    _MESSAGES = ()

    def HasField(self, name: str) -> bool:  # noqa: N802 (the protobuf name)
        if name in self._MESSAGES:
            return getattr(self, name) is not None
        raise ValueError(f'Protocol message {type(self).__name__} has no non-repeated '
                         f'submessage field "{name}" nor marked as optional')


@dataclasses.dataclass(frozen=True)
class RateLimiterCallStats(_Message):
    """Reverb's ``RateLimiterCallStats``: how many calls of one kind completed."""

    completed: int = 0


@dataclasses.dataclass(frozen=True)
class RateLimiterInfo(_Message):
    """The limiter's parameters and counters, as Reverb reports them
    (``info.rate_limiter_info.sample_stats.completed``). ``delete_stats`` is
    shmreplay's own."""

    _MESSAGES = ("insert_stats", "sample_stats", "delete_stats")

    samples_per_insert: float
    min_diff: float
    max_diff: float
    min_size_to_sample: int
    insert_stats: RateLimiterCallStats
    sample_stats: RateLimiterCallStats
    delete_stats: RateLimiterCallStats


@dataclasses.dataclass(frozen=True)
class TableWorkerTime(_Message):
    """Reverb's table worker's time accounting. There is no table worker thread here
    (callers run the table's operations themselves), so every field is 0."""

    running_ms: int = 0
    sampling_ms: int = 0
    inserting_ms: int = 0
    sleeping_ms: int = 0
    waiting_for_sampling_ms: int = 0
    waiting_for_inserts_ms: int = 0


class SelectorOptions(dict):
    """A selector's description, read as Reverb's ``KeyDistributionOptions`` proto is.

    A dict such as ``{'prioritized': {'priority_exponent': 0.8}, 'is_deterministic':
    False}`` or ``{'fifo': True, 'is_deterministic': True}`` whose keys also read as
    attributes (``options.prioritized.priority_exponent``). As in the proto, a field
    of the ``distribution`` oneof that is not set reads as its default (``options.fifo``
    of a Uniform sampler is False, ``options.heap.min_heap`` False,
    ``options.prioritized.priority_exponent`` 0.0), ``HasField`` says which one is set,
    and ``WhichOneof("distribution")`` names it.
    """

    __slots__ = ()
    _FLAGS = ("fifo", "uniform", "lifo")
    _MESSAGES = {"prioritized": {"priority_exponent": 0.0}, "heap": {"min_heap": False}}
    _SCALARS = {"is_deterministic": False, "priority_exponent": 0.0, "min_heap": False}

    def __getattr__(self, name):
        try:
            value = self[name]
        except KeyError:
            if name in SelectorOptions._FLAGS or name in SelectorOptions._SCALARS:
                return SelectorOptions._SCALARS.get(name, False)
            if name in SelectorOptions._MESSAGES:
                return SelectorOptions(SelectorOptions._MESSAGES[name])
            raise AttributeError(f"selector options have no field {name!r} "
                                 f"(they hold {sorted(self)})") from None
        return SelectorOptions(value) if type(value) is dict else value

    def HasField(self, name: str) -> bool:  # noqa: N802 (the protobuf name)
        """Whether ``name``, a field of the ``distribution`` oneof, is the one set."""
        if name in SelectorOptions._FLAGS:
            return bool(self.get(name, False))
        if name in SelectorOptions._MESSAGES:
            return name in self
        if name == "distribution":
            return self.WhichOneof("distribution") is not None
        raise ValueError(f'Protocol message KeyDistributionOptions has no non-repeated '
                         f'submessage field "{name}" nor marked as optional')

    def WhichOneof(self, group: str):  # noqa: N802 (the protobuf name)
        """The set field of the ``distribution`` oneof (``"fifo"``, ``"prioritized"``,
        ...), or None."""
        if group != "distribution":
            raise ValueError(f'Protocol message has no "{group}" field.')
        for name in (*SelectorOptions._FLAGS, *SelectorOptions._MESSAGES):
            if self.HasField(name):
                return name
        return None


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """A snapshot of one table, returned by ``Client.server_info()`` and ``Table.info``.

    The fields Reverb's ``TableInfo`` has hold what they hold there.
    ``sampler_options`` and ``remover_options`` are ``SelectorOptions``, dicts such as
    ``{'prioritized': {'priority_exponent': 0.8}, 'is_deterministic': False}`` or
    ``{'fifo': True, 'is_deterministic': True}`` that also read as Reverb's protos do
    (``info.sampler_options.prioritized.priority_exponent``, ``HasField("fifo")``).
    ``signature`` is the one the table was given (None without): its
    ``tf.TensorSpec`` leaves come back as ``tf.TensorSpec`` in a process that has
    imported TensorFlow (nothing imports it for you), as ``shmreplay.TensorSpec``
    elsewhere. ``num_episodes`` counts the distinct episodes among the items: all the
    items of one writer episode (a ``TrajectoryWriter`` between ``end_episode`` calls, a
    legacy ``Writer``'s life) are one, each item from ``insert`` is its own.
    ``num_deleted_episodes`` counts each time the last item of an episode left the
    table since it was created or reset (an episode may come back with a later item and
    leave again), as Reverb counts it.

    The other fields are shmreplay's own: ``num_inserted``, ``num_sampled`` and
    ``num_deleted`` count items since the table was created (``reset`` keeps them).

    ``num_stored_steps`` counts the steps the table's shared memory holds: for items
    written by a writer, each distinct step once however many items reference it; for
    items from ``insert``, one per item. ``storage_bytes`` is the memory the table's
    data segment occupies: all of its capacity, reserved when it was created.
    """

    name: str
    sampler_options: dict
    remover_options: dict
    max_size: int
    max_times_sampled: int
    rate_limiter_info: RateLimiterInfo
    signature: Optional[Any]
    current_size: int
    num_episodes: int = 0
    num_deleted_episodes: int = 0
    num_unique_samples: int = 0
    table_worker_time: TableWorkerTime = TableWorkerTime()
    num_inserted: int = 0
    num_sampled: int = 0
    num_deleted: int = 0
    num_stored_steps: int = 0
    storage_bytes: int = 0

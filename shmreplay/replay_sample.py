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
_FLOAT32, _FLOAT64, _INT64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)


def _load_weights_kernel():
    # numba kernels are imported on first use: importing shmreplay compiles nothing.
    global _weights_kernel
    from shmreplay._kernels.table import importance_weights
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
        return cls(0, 0.0, 0, 0.0, 0)

    @classmethod
    def dtypes(cls):
        """The numpy dtype of each field."""
        return cls(*(np.dtype(INFO_DTYPES[f]) for f in cls._fields))


class ReplaySample(NamedTuple):
    """One sampled item (or batch): ``info`` is a ``SampleInfo``, ``data`` the item's nest."""

    info: SampleInfo
    data: Any


@dataclasses.dataclass(frozen=True)
class RateLimiterCallStats:
    completed: int


@dataclasses.dataclass(frozen=True)
class RateLimiterInfo:
    """The limiter's parameters and counters, as Reverb reports them."""

    samples_per_insert: float
    min_diff: float
    max_diff: float
    min_size_to_sample: int
    insert_stats: RateLimiterCallStats
    sample_stats: RateLimiterCallStats
    delete_stats: RateLimiterCallStats


class SelectorOptions(dict):
    """A selector's description: a dict whose keys also read as attributes, as
    Reverb's ``KeyDistributionOptions`` do (``options.prioritized.priority_exponent``).

    A selector flag the options do not hold (``options.fifo`` of a Uniform sampler)
    reads as False, as an unset proto field does.
    """

    __slots__ = ()
    _FLAGS = frozenset(("uniform", "fifo", "lifo"))

    def __getattr__(self, name):
        try:
            value = self[name]
        except KeyError:
            if name in SelectorOptions._FLAGS:
                return False
            raise AttributeError(f"selector options have no field {name!r} "
                                 f"(they hold {sorted(self)})") from None
        return SelectorOptions(value) if type(value) is dict else value


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """A snapshot of one table, returned by ``Client.server_info()`` and ``Table.info``.

    ``sampler_options`` and ``remover_options`` are ``SelectorOptions``, dicts such as
    ``{'prioritized': {'priority_exponent': 0.8}, 'is_deterministic': False}`` or
    ``{'fifo': True, 'is_deterministic': True}`` that also read as attributes, like
    Reverb's protos: ``info.sampler_options.prioritized.priority_exponent``.

    ``num_stored_steps`` counts the steps the table's shared memory holds: for items
    written by a writer, each distinct step once however many items reference it; for
    items from ``insert``, one per item. ``storage_bytes`` is the memory the table's
    data actually occupies (pages written so far; untouched capacity costs nothing).
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
    num_inserted: int = 0
    num_sampled: int = 0
    num_deleted: int = 0
    num_stored_steps: int = 0
    storage_bytes: int = 0

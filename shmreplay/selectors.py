"""Item selectors: which item a table samples, and which one it evicts when full.

Each selector can serve as a table's ``sampler`` or its ``remover``, with Reverb's
semantics:

============== ======================================== ===========================
selector       picks                                    ``SampleInfo.probability``
============== ======================================== ===========================
Uniform        any item, uniformly                      ``1 / size``
Prioritized(a) item ``i`` with probability p_i^a / sum  ``p_i^a / sum_j p_j^a``
Fifo           the oldest inserted item                 ``1.0``
Lifo           the newest inserted item                 ``1.0``
MinHeap        the lowest priority                      ``1.0``
MaxHeap        the highest priority                     ``1.0``
============== ======================================== ===========================

``Prioritized`` treats ``0 ** a`` as 0 (a zero-priority item is never drawn) unless
every priority is zero, in which case it samples uniformly. Heaps break ties by the
least recently inserted *or updated* item. Fifo/Lifo order is insertion order and
priority updates do not change it.
"""

import math

from shmreplay._shm.kernels import codes


class ItemSelector:
    """Base class of the selectors. Use one of the concrete classes below."""

    kind = -1
    is_deterministic = True

    def __eq__(self, other):
        return type(self) is type(other) and self._params() == other._params()

    def __hash__(self):
        return hash((type(self).__name__, self._params()))

    def _params(self):
        return ()

    def __repr__(self):
        return f"{type(self).__name__}()"

    @property
    def options(self):
        """A Reverb-style description: ``{'uniform': True}``, ``{'prioritized': {...}}``."""
        return {_OPTION_NAMES[self.kind]: True, "is_deterministic": self.is_deterministic}


class Uniform(ItemSelector):
    """Samples every item with the same probability."""

    kind = codes.UNIFORM
    is_deterministic = False


class Prioritized(ItemSelector):
    """Samples item ``i`` with probability ``p_i ** priority_exponent / sum``.

    Args:
      priority_exponent: The exponent ``a`` applied to every priority. ``0`` makes the
        distribution uniform over items with non-zero priority.

    Raises:
      ValueError: if ``priority_exponent`` is negative, NaN or infinite.
    """

    kind = codes.PRIORITIZED
    is_deterministic = False

    def __init__(self, priority_exponent: float):
        exponent = float(priority_exponent)
        if not math.isfinite(exponent) or exponent < 0:
            raise ValueError(
                f"Prioritized: priority_exponent must be a finite number >= 0, got {priority_exponent!r}.")
        self.priority_exponent = exponent

    def _params(self):
        return (self.priority_exponent,)

    def __repr__(self):
        return f"Prioritized(priority_exponent={self.priority_exponent})"

    @property
    def options(self):
        """A Reverb-style description of the selector (``ItemSelector.options``)."""
        return {"prioritized": {"priority_exponent": self.priority_exponent},
                "is_deterministic": False}


class Fifo(ItemSelector):
    """Selects the oldest inserted item (first in, first out)."""

    kind = codes.FIFO


class Lifo(ItemSelector):
    """Selects the newest inserted item (last in, first out)."""

    kind = codes.LIFO


class MinHeap(ItemSelector):
    """Selects the item with the lowest priority (ties: least recently inserted or updated)."""

    kind = codes.MIN_HEAP

    @property
    def options(self):
        """A Reverb-style description of the selector (``ItemSelector.options``)."""
        return {"heap": {"min_heap": True}, "is_deterministic": True}


class MaxHeap(ItemSelector):
    """Selects the item with the highest priority (ties: least recently inserted or updated)."""

    kind = codes.MAX_HEAP

    @property
    def options(self):
        """A Reverb-style description of the selector (``ItemSelector.options``)."""
        return {"heap": {"min_heap": False}, "is_deterministic": True}


_OPTION_NAMES = {codes.UNIFORM: "uniform", codes.PRIORITIZED: "prioritized",
                 codes.FIFO: "fifo", codes.LIFO: "lifo",
                 codes.MIN_HEAP: "heap", codes.MAX_HEAP: "heap"}

__all__ = ["ItemSelector", "Uniform", "Prioritized", "Fifo", "Lifo", "MinHeap", "MaxHeap"]

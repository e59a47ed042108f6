"""Rate limiters: when a table lets inserts and samples proceed.

A limiter keeps three counters (``inserts``, ``samples``, ``deletes``) and four
parameters. With Reverb's exact rules::

    size         = inserts - deletes
    diff         = inserts * samples_per_insert - samples      # deletes never count here
    can_insert(n): inserts + n - deletes <= min_size_to_sample
                   or (inserts + n) * samples_per_insert - samples <= max_diff
    can_sample(n): inserts - deletes >= min_size_to_sample
                   and inserts * samples_per_insert - samples - n >= min_diff

Every sampled *item* counts as one sample (a batch of 256 is 256 samples). A call that
the limiter does not allow blocks (without spinning) until another process changes the
counters, or until its ``timeout`` raises ``DeadlineExceededError``.
"""

import sys
import warnings

_FLOAT_MAX = sys.float_info.max


class RateLimiter:
    """The general limiter. Prefer the named presets below.

    Args:
      samples_per_insert: How many samples each insert pays for (``> 0``).
      min_size_to_sample: Samples block until the table holds this many items (``>= 1``).
      min_diff: Lower bound of ``inserts * samples_per_insert - samples`` for sampling.
      max_diff: Upper bound of ``inserts * samples_per_insert - samples`` for inserting.

    Raises:
      ValueError: if ``samples_per_insert <= 0``, ``min_size_to_sample < 1`` or
        ``min_diff > max_diff``.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 min_diff: float, max_diff: float):
        samples_per_insert = float(samples_per_insert)
        min_diff, max_diff = float(min_diff), float(max_diff)
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}.")
        if int(min_size_to_sample) != min_size_to_sample or min_size_to_sample < 1:
            raise ValueError(
                f"min_size_to_sample must be an integer >= 1, got {min_size_to_sample!r}.")
        if min_diff > max_diff:
            raise ValueError(f"min_diff ({min_diff}) must not exceed max_diff ({max_diff}).")
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = int(min_size_to_sample)
        self.min_diff = min_diff
        self.max_diff = max_diff

    def _params(self):
        return (self.samples_per_insert, self.min_size_to_sample, self.min_diff, self.max_diff)

    def __eq__(self, other):
        return isinstance(other, RateLimiter) and self._params() == other._params()

    def __hash__(self):
        return hash(self._params())

    def __repr__(self):
        return (f"{type(self).__name__}(samples_per_insert={self.samples_per_insert}, "
                f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff}, "
                f"max_diff={self.max_diff})")

    def max_batch_insert(self) -> float:
        """The largest batch that one ``insert_batch`` call can ever be allowed to insert."""
        window = (self.max_diff - self.min_diff) / self.samples_per_insert
        return max(float(self.min_size_to_sample), window)


class MinSize(RateLimiter):
    """Blocks sampling until the table holds ``min_size_to_sample`` items; never blocks inserts.

    Raises:
      ValueError: if ``min_size_to_sample < 1``.
    """

    def __init__(self, min_size_to_sample: int):
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample!r}.")
        super().__init__(1.0, min_size_to_sample, -_FLOAT_MAX, _FLOAT_MAX)


class SampleToInsertRatio(RateLimiter):
    """Keeps the average number of samples per inserted item near ``samples_per_insert``.

    Once ``min_size_to_sample`` items are in, inserts block when they run ahead of
    samples by more than the error buffer, and samples block when they run ahead of
    inserts.

    Args:
      samples_per_insert: The target ratio of sampled items to inserted items.
      min_size_to_sample: Samples block until the table holds this many items.
      error_buffer: Either a number ``e`` (the band is ``spi * min_size +- e``) or a
        ``(min_diff, max_diff)`` pair used as is.

    Raises:
      ValueError: if ``samples_per_insert <= 0``, ``min_size_to_sample < 1``, the band
        is narrower than ``2 * max(1, samples_per_insert)``, or ``min_diff`` is above
        ``samples_per_insert * min_size_to_sample`` (that would deadlock).
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer):
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}.")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample!r}.")
        offset = samples_per_insert * min_size_to_sample
        if isinstance(error_buffer, (tuple, list)):
            if len(error_buffer) != 2:
                raise ValueError(
                    f"error_buffer must be a number or a (min_diff, max_diff) pair, got {error_buffer!r}.")
            min_diff, max_diff = map(float, error_buffer)
        else:
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                f"The error buffer [{min_diff}, {max_diff}] must span at least "
                f"2 * max(1.0, samples_per_insert) = {2 * max(1.0, samples_per_insert)}.")
        if min_diff > offset:
            raise ValueError(
                f"min_diff ({min_diff}) is above samples_per_insert * min_size_to_sample "
                f"({offset}): sampling could never start.")
        if max_diff < offset:
            warnings.warn(
                f"max_diff ({max_diff}) is below samples_per_insert * min_size_to_sample "
                f"({offset}): inserts will block before sampling can start unless sampling "
                "runs concurrently.", stacklevel=2)
        super().__init__(samples_per_insert, min_size_to_sample, min_diff, max_diff)


class Queue(RateLimiter):
    """The limiter of ``Table.queue``: at most ``size`` unsampled items. Do not use directly."""

    def __init__(self, size: int):
        super().__init__(1.0, 1, 0.0, float(size))


class Stack(RateLimiter):
    """The limiter of ``Table.stack``: at most ``size`` unsampled items. Do not use directly."""

    def __init__(self, size: int):
        super().__init__(1.0, 1, 0.0, float(size))


__all__ = ["RateLimiter", "MinSize", "SampleToInsertRatio", "Queue", "Stack"]

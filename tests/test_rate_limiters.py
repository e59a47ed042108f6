"""Rate limiters: constructor validation (Reverb's ``rate_limiters_test.py`` boundaries)
and the limiter formulas observed through live tables (Reverb's ``rate_limiter_test.cc``
restated black-box through ``Server`` / ``Client`` / ``Table.can_sample/can_insert``).

Reverb's rules (reference §1.6)::

    can_insert(n): inserts + n - deletes <= min_size  or  (inserts + n) * spi - samples <= max_diff
    can_sample(n): inserts - deletes >= min_size     and inserts * spi - samples - n >= min_diff
"""

import contextlib
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay.specs import TensorSpec
import _names

FLOAT_MAX = sys.float_info.max


# --------------------------------------------------------------------------------------
# Constructor validation: every case of Reverb's rate_limiters_test.py, exact boundaries.
# --------------------------------------------------------------------------------------

class TestSampleToInsertRatioValidation:

    def test_scalar_error_buffer_smaller_than_samples_per_insert(self):
        # band = [50 - 4, 50 + 4] spans 8 < 2 * max(1, 5) = 10.
        with pytest.raises(ValueError, match=r"span at least .*10"):
            rate_limiters.SampleToInsertRatio(
                samples_per_insert=5, min_size_to_sample=10, error_buffer=4)

    def test_scalar_error_buffer_smaller_than_one(self):
        # band spans 1.8 < 2 * max(1, 0.5) = 2.
        with pytest.raises(ValueError, match=r"span at least .*2"):
            rate_limiters.SampleToInsertRatio(
                samples_per_insert=0.5, min_size_to_sample=10, error_buffer=0.9)

    def test_scalar_error_buffer_just_large_enough(self):
        limiter = rate_limiters.SampleToInsertRatio(
            samples_per_insert=0.5, min_size_to_sample=10, error_buffer=1.1)
        # scalar error buffer: (spi, m, spi*m - eb, spi*m + eb)
        assert limiter.samples_per_insert == 0.5
        assert limiter.min_size_to_sample == 10
        assert limiter.min_diff == pytest.approx(5.0 - 1.1)
        assert limiter.max_diff == pytest.approx(5.0 + 1.1)

    def test_range_too_small_for_samples_per_insert(self):
        # (8, 12) spans 4 < 2 * 5.
        with pytest.raises(ValueError, match=r"span at least .*10"):
            rate_limiters.SampleToInsertRatio(
                samples_per_insert=5, min_size_to_sample=10, error_buffer=(8, 12))

    def test_range_smaller_than_two(self):
        # (9.5, 10.5) spans 1 < 2 * max(1, 0.1) = 2.
        with pytest.raises(ValueError, match=r"span at least .*2"):
            rate_limiters.SampleToInsertRatio(
                samples_per_insert=0.1, min_size_to_sample=10, error_buffer=(9.5, 10.5))

    def test_range_below_samples_per_insert_times_min_size_only_warns(self):
        # max_diff 9 < spi * m = 10: Reverb logs a warning (deadlock unless sampling is
        # concurrent) but accepts the limiter.
        with pytest.warns(UserWarning, match=r"max_diff .*9.*below"):
            limiter = rate_limiters.SampleToInsertRatio(
                samples_per_insert=1, min_size_to_sample=10, error_buffer=(5, 9))
        assert (limiter.min_diff, limiter.max_diff) == (5.0, 9.0)

    def test_range_above_samples_per_insert_times_min_size(self):
        # min_diff 11 > spi * m = 10: sampling could never start.
        with pytest.raises(ValueError, match=r"min_diff \(11(\.0)?\) is above"):
            rate_limiters.SampleToInsertRatio(
                samples_per_insert=1, min_size_to_sample=10, error_buffer=(11, 15))

    def test_min_size_to_sample_below_one(self):
        with pytest.raises(ValueError, match=r"min_size_to_sample must be >= 1, got 0"):
            rate_limiters.SampleToInsertRatio(
                samples_per_insert=1, min_size_to_sample=0, error_buffer=(-100, 100))

    def test_valid_range(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a valid band must not even warn
            limiter = rate_limiters.SampleToInsertRatio(
                samples_per_insert=1, min_size_to_sample=10, error_buffer=(7, 12))
        # a (lo, hi) error buffer is used as is
        assert (limiter.samples_per_insert, limiter.min_size_to_sample) == (1.0, 10)
        assert (limiter.min_diff, limiter.max_diff) == (7.0, 12.0)

    def test_samples_per_insert_one_is_valid(self):
        limiter = rate_limiters.SampleToInsertRatio(
            samples_per_insert=1, min_size_to_sample=10, error_buffer=100)
        assert (limiter.min_diff, limiter.max_diff) == (10.0 - 100, 10.0 + 100)

    @pytest.mark.parametrize("spi", [0, -1])
    def test_samples_per_insert_not_positive(self, spi):
        with pytest.raises(ValueError, match=rf"samples_per_insert must be > 0, got {spi}"):
            rate_limiters.SampleToInsertRatio(
                samples_per_insert=spi, min_size_to_sample=10, error_buffer=100)


class TestMinSizeValidation:

    @pytest.mark.parametrize("min_size", [-1, 0])
    def test_min_size_below_one(self, min_size):
        with pytest.raises(ValueError, match=rf"min_size_to_sample must be >= 1, got {min_size}"):
            rate_limiters.MinSize(min_size)

    def test_min_size_one_is_valid(self):
        limiter = rate_limiters.MinSize(1)
        # MinSize(m) == (1.0, m, -float_max, +float_max)
        assert limiter.samples_per_insert == 1.0
        assert limiter.min_size_to_sample == 1
        assert limiter.min_diff == -FLOAT_MAX
        assert limiter.max_diff == FLOAT_MAX


class TestPresetParameters:

    @pytest.mark.parametrize("cls", [rate_limiters.Queue, rate_limiters.Stack])
    def test_queue_and_stack(self, cls):
        limiter = cls(7)
        assert (limiter.samples_per_insert, limiter.min_size_to_sample,
                limiter.min_diff, limiter.max_diff) == (1.0, 1, 0.0, 7.0)

    def test_raw_rate_limiter_keeps_parameters(self):
        limiter = rate_limiters.RateLimiter(1.5, 2, -1, 3)
        assert (limiter.samples_per_insert, limiter.min_size_to_sample,
                limiter.min_diff, limiter.max_diff) == (1.5, 2, -1.0, 3.0)


# --------------------------------------------------------------------------------------
# Live tables: the formulas through a running buffer.
# --------------------------------------------------------------------------------------

TABLE = "limited"


def _new_name():
    return _names.unique()


@contextlib.contextmanager
def _serve(limiter, *, max_times_sampled=0, max_size=1000):
    """Yields (table, client) for one uniform/fifo table under ``limiter``."""
    table = shmreplay.Table(
        name=TABLE, sampler=selectors.Uniform(), remover=selectors.Fifo(),
        max_size=max_size, rate_limiter=limiter, max_times_sampled=max_times_sampled,
        signature=TensorSpec((), np.int64))
    with shmreplay.Server(tables=[table], name=_new_name()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield table, client
        finally:
            client.close()


_counter = iter(range(10**9))


def _insert(client, n=1, timeout=1.0):
    for _ in range(n):
        client.insert(np.int64(next(_counter)), priorities={TABLE: 1.0}, timeout=timeout)


def _sample(client, n=1, timeout=1.0):
    """Takes ``n`` samples one call at a time; returns the keys."""
    keys = []
    for _ in range(n):
        s = client.sample_batch(TABLE, batch_size=1, timeout=timeout)
        assert len(s.info.key) == 1
        keys.append(int(s.info.key[0]))
    return keys


def _in_thread(client, fn):
    """Starts ``fn(other_client)`` in a thread with its own Client; returns (thread, result)."""
    result = {}

    def run():
        with shmreplay.Client(client.server_address) as other:
            result["value"] = fn(other)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _assert_insert_blocked(client):
    with pytest.raises(errors.DeadlineExceededError):
        client.insert(np.int64(-1), priorities={TABLE: 1.0}, timeout=0.1)


def _assert_sample_blocked(client):
    with pytest.raises(errors.DeadlineExceededError):
        client.sample_batch(TABLE, batch_size=1, timeout=0.1)


def test_blocks_samples_until_min_inserts_reached():
    # rate_limiter_test.cc::BlocksSamplesUntilMinInsertsReached
    with _serve(rate_limiters.RateLimiter(1, 2, -1, 1)) as (table, client):
        assert not table.can_sample(1)
        _assert_sample_blocked(client)
        _insert(client)
        assert not table.can_sample(1)
        _assert_sample_blocked(client)
        _insert(client)
        assert table.can_sample(1)
        assert len(_sample(client)) == 1


def test_operations_within_the_buffer_are_not_blocked():
    # rate_limiter_test.cc::OperationsWithinTheBufferAreNotBlocked
    with _serve(rate_limiters.RateLimiter(1.5, 1, -3.0, 3.1)) as (table, client):
        assert table.can_insert(1)
        _insert(client)                  # free: inserts + 1 <= min_size
        assert table.can_insert(1)       # 2 * 1.5 = 3 <= 3.1
        _insert(client)
        for _ in range(6):               # diff walks 3 -> -3
            assert table.can_sample(1)
            _sample(client)
        assert not table.can_sample(1)   # 3 - 6 - 1 = -4 < -3
        _assert_sample_blocked(client)


def test_blocks_calls_that_exceed_the_min_max_limits():
    # rate_limiter_test.cc::BlocksCallsThatExceedsTheMinMaxLimits
    with _serve(rate_limiters.RateLimiter(1.5, 2, -1, 3)) as (table, client):
        _insert(client, 2)
        _sample(client)
        assert not table.can_insert(1)   # 3 * 1.5 - 1 = 3.5 > 3
        _assert_insert_blocked(client)
        _sample(client)
        assert table.can_insert(1)       # 4.5 - 2 = 2.5 <= 3
        _insert(client)


def test_can_sample():
    # rate_limiter_test.cc::CanSample
    with _serve(rate_limiters.RateLimiter(1, 1, -1, 1)) as (table, client):
        _insert(client)
        assert table.can_sample(1)
        assert table.can_sample(2)
        assert not table.can_sample(3)


def test_can_insert():
    # rate_limiter_test.cc::CanInsert
    with _serve(rate_limiters.RateLimiter(1.5, 2, 0, 5)) as (table, client):
        assert table.can_insert(1)
        assert table.can_insert(2)
        assert table.can_insert(3)       # 3 * 1.5 = 4.5 <= 5
        assert not table.can_insert(4)   # 6 > 5
        _insert(client, 3)
        assert not table.can_insert(1)
        _assert_insert_blocked(client)
        _sample(client, 2)
        assert table.can_insert(1)       # 6 - 2 = 4 <= 5
        assert not table.can_insert(2)   # 7.5 - 2 = 5.5 > 5


def test_unblocks_inserts_if_deleted_items_bring_size_below_min_size():
    # rate_limiter_test.cc::UnblocksInsertsIfDeletedItemsBringsSizeBelowMinSize
    with _serve(rate_limiters.RateLimiter(5, 2, 0, 5)) as (table, client):
        _insert(client, 2)
        [key] = _sample(client)
        assert not table.can_insert(1)
        _assert_insert_blocked(client)
        # a blocked insert wakes up when the delete makes room
        thread, result = _in_thread(client, lambda other: other.insert(
            np.int64(-7), priorities={TABLE: 1.0}, timeout=10))
        thread.join(0.1)
        assert thread.is_alive(), "insert should block"
        client.mutate_priorities(TABLE, deletes=[key])
        thread.join(5)
        assert not thread.is_alive(), "a delete that makes room must wake the blocked insert"
        assert "value" in result
        assert table.info.current_size == 2
        assert not table.can_insert(1)   # inserts + 1 - deletes = 3 > min_size again


def test_blocks_samples_if_delete_brings_size_below_min_size():
    # rate_limiter_test.cc::BlocksSamplesIfDeleteBringsSizeBelowMinSize
    with _serve(rate_limiters.RateLimiter(5, 2, 0, 5)) as (table, client):
        _insert(client, 2)
        [key] = _sample(client)
        assert table.can_sample(1)
        client.mutate_priorities(TABLE, deletes=[key])
        assert not table.can_sample(1)
        _assert_sample_blocked(client)

        # A blocked sample wakes up once a new insert completes.
        thread, result = _in_thread(client, lambda other: other.sample_batch(
            TABLE, batch_size=1, timeout=10))
        thread.join(0.1)
        assert thread.is_alive(), "sample should block while size < min_size_to_sample"
        _insert(client)
        thread.join(5)
        assert not thread.is_alive()
        assert len(result["value"].info.key) == 1
        assert table.info.current_size == 2


def test_worked_example_sample_to_insert_ratio():
    # Reference §1.6: spi=2, m=100, error_buffer=50 -> min_diff=150, max_diff=250.
    with _serve(rate_limiters.SampleToInsertRatio(2, 100, 50)) as (table, client):
        assert table.can_insert(100)     # the first 100 inserts are free
        assert table.can_insert(125)     # 2 * 125 = 250 <= 250
        assert not table.can_insert(126)
        values = np.arange(99, dtype=np.int64)
        client.insert_batch(values, priorities={TABLE: 1.0}, timeout=1)
        assert not table.can_sample(1)   # size 99 < 100
        _assert_sample_blocked(client)
        _insert(client)
        assert table.can_sample(50)      # 200 - 50 >= 150
        assert not table.can_sample(51)
        s = client.sample_batch(TABLE, batch_size=50, timeout=1)
        assert len(s.info.key) == 50
        assert not table.can_sample(1)
        _assert_sample_blocked(client)
        # inserts pay for samples: 2 * (100 + 50) - 50 = 250 <= 250, 51 would be 252
        assert table.can_insert(50)
        assert not table.can_insert(51)
        info = table.info.rate_limiter_info
        assert info.insert_stats.completed == 100
        assert info.sample_stats.completed == 50   # one per sampled item


def test_batch_waits_for_credit_then_returns_partial_on_timeout():
    # 100 inserts under (spi=2, m=100, eb=50) allow exactly 50 samples. A request for 80
    # takes those 50, waits for credit that never comes, and returns the 50 rows at the
    # timeout (rows already taken are never thrown away) without sampling one more.
    with _serve(rate_limiters.SampleToInsertRatio(2, 100, 50)) as (table, client):
        client.insert_batch(np.arange(100, dtype=np.int64), priorities={TABLE: 1.0}, timeout=1)
        start = time.monotonic()
        s = client.sample_batch(TABLE, batch_size=80, timeout=0.5)
        assert 0.4 < time.monotonic() - start < 3.0
        assert len(s.info.key) == 50
        assert len(s.data) == 50
        assert table.info.rate_limiter_info.sample_stats.completed == 50


def test_batch_is_completed_by_credit_from_a_later_insert():
    # 50 samples allowed now; 15 more inserts pay for 30 more: the batch of 80 fills up.
    with _serve(rate_limiters.SampleToInsertRatio(2, 100, 50)) as (table, client):
        client.insert_batch(np.arange(100, dtype=np.int64), priorities={TABLE: 1.0}, timeout=1)
        inserter = threading.Timer(
            0.2, lambda: client.insert_batch(np.arange(15, dtype=np.int64),
                                             priorities={TABLE: 1.0}, timeout=5))
        inserter.start()
        try:
            s = client.sample_batch(TABLE, batch_size=80, timeout=5)
        finally:
            inserter.join(timeout=10)
        assert len(s.info.key) == 80
        assert table.info.rate_limiter_info.sample_stats.completed == 80


def test_min_size_never_blocks_inserts_and_counts_batches_per_item():
    with _serve(rate_limiters.MinSize(3), max_size=5) as (table, client):
        assert table.can_insert(10**6)
        _insert(client, 2)
        assert not table.can_sample(1)
        _insert(client, 10)              # overflows max_size: evictions are deletes
        info = table.info
        assert info.current_size == 5
        assert info.rate_limiter_info.insert_stats.completed == 12
        assert info.rate_limiter_info.delete_stats.completed == 7
        s = client.sample_batch(TABLE, batch_size=64, timeout=1)
        assert len(s.info.key) == 64
        assert table.info.rate_limiter_info.sample_stats.completed == 64


def test_rate_limiter_info_echoes_parameters():
    limiter = rate_limiters.RateLimiter(1.5, 2, -1, 3)
    with _serve(limiter) as (table, client):
        for info in (table.info, client.server_info()[TABLE]):
            rl = info.rate_limiter_info
            assert rl.samples_per_insert == 1.5
            assert rl.min_size_to_sample == 2
            assert rl.min_diff == -1.0
            assert rl.max_diff == 3.0
            assert rl.insert_stats.completed == 0
            assert rl.sample_stats.completed == 0
        _insert(client, 2)
        _sample(client)
        rl = client.server_info()[TABLE].rate_limiter_info
        assert (rl.insert_stats.completed, rl.sample_stats.completed) == (2, 1)


def test_deletes_do_not_refund_sample_credit():
    # diff = inserts * spi - samples never subtracts deletes: deleting items does not
    # let more samples through (only the size test sees deletes).
    with _serve(rate_limiters.RateLimiter(1, 1, 0, 10)) as (table, client):
        _insert(client, 3)
        keys = _sample(client, 3)        # diff now 0
        assert not table.can_sample(1)
        client.mutate_priorities(TABLE, deletes=[keys[0]])
        assert table.info.current_size == 2
        assert not table.can_sample(1)
        _assert_sample_blocked(client)
        _insert(client)
        assert table.can_sample(1)
        assert not table.can_sample(2)


def test_fractional_samples_per_insert():
    # spi = 0.5: 3 inserts pay for 1.5 samples; min_diff -1 lets the diff reach -1, so
    # exactly 2 samples pass (1.5 - 2 = -0.5 >= -1, a third would give -1.5).
    with _serve(rate_limiters.RateLimiter(0.5, 1, -1, 10)) as (table, client):
        _insert(client, 3)
        assert table.can_sample(2)
        assert not table.can_sample(3)
        s = client.sample_batch(TABLE, batch_size=10, timeout=0.5)
        assert len(s.info.key) == 2
        assert not table.can_sample(1)
        _assert_sample_blocked(client)
        _insert(client, 2)               # 2.5 - 2 - 1 = -0.5 >= -1
        assert table.can_sample(1)
        assert not table.can_sample(2)

"""The recycled memory that large sampled batches are gathered into
(``shmreplay._engine.outputs``)."""

import gc

import numpy as np
import pytest

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay._engine import outputs as _outputs
import _names

BIG = (_outputs.POOL_FROM // 4096 + 1, 4096)  # just above the pooling size, in uint8


@pytest.fixture(autouse=True)
def empty_pool():
    gc.collect()
    _outputs.clear()
    yield
    _outputs.clear()


def test_small_arrays_are_plain_numpy_and_large_ones_aligned():
    small = _outputs.empty((4, 8), np.float32)
    assert small.base is None and small.shape == (4, 8) and small.dtype == np.float32
    big = _outputs.empty((BIG[0], 1024), np.float32)
    assert big.shape == (BIG[0], 1024) and big.dtype == np.float32
    assert big.flags.c_contiguous and big.ctypes.data % _outputs.ALIGN == 0
    assert _outputs.pooled_bytes() >= big.nbytes


def test_a_block_is_reused_only_after_every_view_of_it_is_gone():
    first = _outputs.empty(BIG, np.uint8)
    address = first.ctypes.data
    row = first[3]  # a view keeps the block as much as the array does
    del first
    second = _outputs.empty(BIG, np.uint8)
    assert second.ctypes.data != address
    del row
    third = _outputs.empty(BIG, np.uint8)
    assert third.ctypes.data == address


def test_arrays_handed_out_never_share_memory_while_alive():
    alive = [_outputs.empty(BIG, np.uint8) for _ in range(_outputs.MAX_BLOCKS + 3)]
    for index, array in enumerate(alive):
        array.fill(index % 251)
    for index, array in enumerate(alive):
        assert (array == index % 251).all()
    starts = sorted(a.ctypes.data for a in alive)
    assert all(b - a >= alive[0].nbytes for a, b in zip(starts, starts[1:]))
    assert len(_outputs._blocks) <= _outputs.MAX_BLOCKS


def test_idle_blocks_beyond_the_limit_are_released():
    burst = [_outputs.empty(BIG, np.uint8) for _ in range(3 * _outputs.MAX_IDLE)]
    assert len(_outputs._blocks) == 3 * _outputs.MAX_IDLE
    del burst
    kept = _outputs.empty(BIG, np.uint8)
    assert len(_outputs._blocks) <= _outputs.MAX_IDLE
    del kept


def test_a_larger_batch_replaces_idle_blocks_that_are_too_small():
    for _ in range(3):
        _outputs.empty(BIG, np.uint8)  # dropped at once: the same block each time
    assert len(_outputs._blocks) == 1
    larger = _outputs.empty((2 * BIG[0], BIG[1]), np.uint8)
    assert larger.nbytes == 2 * BIG[0] * BIG[1]
    assert len(_outputs._blocks) <= 2


def test_sampled_batches_kept_by_the_caller_are_never_overwritten():
    """A learner that keeps batch n while sampling n+1 (prefetch) must see n unchanged."""
    rows = _outputs.POOL_FROM // 2048 + 8  # obs of 2 KiB: a batch of ``rows`` is pooled
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 4 * rows,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=_names.unique("outputs")) as server:
        client = shmreplay.Client(server.name)
        ids = np.arange(4 * rows)
        client.insert_batch({"id": ids, "obs": np.repeat(ids[:, None], 512, 1).astype(np.int32)},
                            {"t": 1.0})
        kept = []
        for _ in range(20):
            sample = client.sample_batch("t", rows, timeout=5)
            assert sample.data["obs"].ctypes.data % _outputs.ALIGN == 0
            kept.append(sample)
            if len(kept) > 3:
                kept.pop(0)
            for old in kept:
                assert (old.data["obs"] == old.data["id"][:, None]).all()
        client.close()


def test_a_learner_that_drops_each_batch_reuses_the_same_memory():
    """The point of the pool: batch after batch lands in memory already written (no
    fresh pages to fault in), as long as the learner lets go of the previous batch."""
    rows = _outputs.POOL_FROM // 2048 + 8
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 2 * rows,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=_names.unique("outputs-reuse")) as server:
        client = shmreplay.Client(server.name)
        client.insert_batch({"obs": np.zeros((2 * rows, 512), np.int32)}, {"t": 1.0})
        addresses = {client.sample_batch("t", rows, timeout=5).data["obs"].ctypes.data
                     for _ in range(10)}
        assert len(addresses) == 1
        client.close()

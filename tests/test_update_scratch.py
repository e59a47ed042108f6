"""``update_priorities``' one-call kernel (``kernels.update_whole``) takes its scratch
from the handle's table offsets, 64 keys at a time: updates of more keys than that
(duplicates across the chunks included) must end as ``mutate_priorities`` ends them,
with every tree and heap consistent."""

import numpy as np
import pytest

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay._shm.kernels import table as kernels
import _names

CAPACITY = 300


def _twins(sampler, remover):
    tables = [shmreplay.Table(name, sampler, remover, CAPACITY, rate_limiters.MinSize(1))
              for name in ("fast", "dict")]
    return shmreplay.Server(tables, name=_names.unique("updscratch"))


@pytest.mark.parametrize("sampler,remover,count", [
    (selectors.MaxHeap(), selectors.Prioritized(0.7), 200),  # update_whole at any count
    (selectors.MinHeap(), selectors.Fifo(), 129),
    (selectors.Prioritized(0.6), selectors.MaxHeap(), 31),   # below the weighed kernel
    (selectors.Uniform(), selectors.Prioritized(1.0), kernels.TABLE_SCRATCH_KEYS),
])
def test_updates_of_many_keys_match_mutate_priorities(sampler, remover, count):
    rng = np.random.default_rng(count)
    with _twins(sampler, remover) as server, shmreplay.Client(server.name) as client:
        data = {"x": np.arange(CAPACITY, dtype=np.float32)}
        prios = rng.random(CAPACITY) + 0.1
        keys = {t: np.array(list(client.insert_batch(data, {t: prios})[t]), np.uint64)
                for t in ("fast", "dict")}
        picks = rng.choice(CAPACITY, count, replace=True)
        # A key repeated across the chunks of 64: the last priority must win.
        picks[0] = picks[-1] = picks[count // 2] = 7
        new = rng.random(count) * 5
        updated = client.update_priorities("fast", keys["fast"][picks], new)
        assert updated == count
        client.mutate_priorities("dict", {int(keys["dict"][p]): float(v)
                                          for p, v in zip(picks, new)})
        for name in ("fast", "dict"):
            assert client.verify(name) == []
        fast = client._engine("fast")._table_arrays[3]
        by_dict = client._engine("dict")._table_arrays[3]
        # (both tables put the same items in the same slots)
        np.testing.assert_array_equal(fast, by_dict)
        assert new[-1] in fast and new[0] not in fast  # the last of key 7's wins


def test_a_short_table_offsets_array_is_refused():
    segment = np.zeros(64, np.uint8)
    status = kernels.update_whole(segment, np.zeros(kernels.TABLE_SCRATCH, np.int64),
                                  np.zeros(2, np.uint64), np.zeros(2))
    assert status == kernels.BROKEN

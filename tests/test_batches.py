"""``shmreplay._batches``: the full batches and defaults both learner adapters use."""

import threading
import time

import numpy as np

import shmreplay
from shmreplay import _batches, rate_limiters, selectors
import _names


def serve(*tables):
    return shmreplay.Server(list(tables), name=_names.unique("batches"))


def test_a_batch_is_filled_across_calls_and_keeps_row_order():
    with serve(shmreplay.Table.queue("q", 10)) as server:
        client = shmreplay.Client(server.name)

        def insert_later():
            for value in range(4):
                time.sleep(0.05)
                client.insert({"x": np.float32(value)}, {"q": 1.0}, timeout=5)
        writer = threading.Thread(target=insert_later)
        writer.start()
        batch = _batches.full_batch(client, "q", 4, timeout=5)
        writer.join(timeout=5)
        assert batch.data["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert batch.info.key.dtype == np.uint64 and batch.info.key.shape == (4,)
        client.close()


def test_timeout_and_stop_end_a_batch_with_none():
    with serve(shmreplay.Table.queue("q", 10)) as server:
        client = shmreplay.Client(server.name)
        client.insert({"x": np.float32(1)}, {"q": 1.0}, timeout=5)
        start = time.monotonic()
        assert _batches.full_batch(client, "q", 2, timeout=0.2) is None  # one row only
        assert 0.15 < time.monotonic() - start < 2.0
        stop = threading.Event()
        stop.set()
        assert _batches.full_batch(client, "q", 2, timeout=None, stop=stop) is None
        client.close()


def test_two_calls_only_for_large_batches_of_order_free_tables():
    tables = [shmreplay.Table("u", selectors.Uniform(), selectors.Fifo(), 10,
                              rate_limiters.MinSize(1)),
              shmreplay.Table("p", selectors.Prioritized(0.6), selectors.Fifo(), 10,
                              rate_limiters.MinSize(1)),
              shmreplay.Table.queue("q", 10),
              shmreplay.Table("h", selectors.MaxHeap(), selectors.Fifo(), 10,
                              rate_limiters.MinSize(1))]
    with serve(*tables) as server:
        client = shmreplay.Client(server.name)
        large, small = _batches.PARALLEL_FROM_BYTES, _batches.PARALLEL_FROM_BYTES - 1
        assert [_batches.default_parallelism(client, t, large) for t in "upqh"] == [2, 2, 1, 1]
        assert [_batches.default_parallelism(client, t, small) for t in "upqh"] == [1, 1, 1, 1]
        client.close()

"""Single inserts of small items: staged, then one native call (``shmreplay._engine.staging``)."""

import threading

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay._engine import staging as _staging
import _names


def _table(max_size=4096, limiter=None):
    return shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), max_size,
                           limiter or rate_limiters.MinSize(1))


def _item(value, width=6):
    return {"x": np.full(width, value, np.float64), "v": np.int64(value),
            "ok": value % 3 == 0, "f": float(value)}


def _consistent(batch):
    v = batch.data["v"]
    return ((batch.data["x"] == v[:, None]).all() and (batch.data["ok"] == (v % 3 == 0)).all()
            and (batch.data["f"] == v).all())


def test_staged_items_come_back_whole_with_every_leaf_kind():
    with shmreplay.Server([_table()], name=_names.unique("staged")) as server:
        with shmreplay.Client(server.name) as client:
            keys = [client.insert(_item(v), {"t": 1.0})["t"] for v in range(100)]
            assert len(set(keys)) == 100 and all(k > 0 for k in keys)
            assert len(client._engine("t")._stagings) == 1  # the staged path ran
            batch = client.sample_batch("t", 64)
            assert _consistent(batch)
            assert set(batch.data["v"].tolist()) <= set(range(100))
            assert client.verify("t") == []


def test_threads_inserting_through_one_client_never_mix_their_items():
    with shmreplay.Server([_table(max_size=8192)], name=_names.unique("staged-threads")) as server:
        with shmreplay.Client(server.name) as client:
            failures = []

            def actor(base):
                try:
                    for i in range(500):
                        client.insert(_item(base + i), {"t": 1.0}, timeout=10)
                except Exception as exc:  # noqa: BLE001
                    failures.append(repr(exc))

            threads = [threading.Thread(target=actor, args=(k * 10_000,)) for k in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            assert not any(thread.is_alive() for thread in threads) and failures == []
            assert client.server_info()["t"].current_size == 2000
            batch = client.sample_batch("t", 2000)
            assert _consistent(batch)
            assert len(set(batch.data["v"].tolist())) > 1000  # distinct items, not one repeated
            assert client.verify("t") == []


def test_a_blocked_staged_insert_waits_then_goes_in():
    table = shmreplay.Table.queue("t", 2)
    with shmreplay.Server([table], name=_names.unique("staged-blocked")) as server:
        with shmreplay.Client(server.name) as client:
            client.insert(_item(1), {"t": 1.0})
            client.insert(_item(2), {"t": 1.0})
            with pytest.raises(errors.DeadlineExceededError):
                client.insert(_item(3), {"t": 1.0}, timeout=0.05)
            assert client.server_info()["t"].current_size == 2
            timer = threading.Timer(0.2, lambda: client.sample_batch("t", 1, timeout=5))
            timer.start()
            client.insert(_item(3), {"t": 1.0}, timeout=5)
            timer.join(timeout=5)
            values = client.sample_batch("t", 2, timeout=5).data["v"].tolist()
            assert values == [2, 3]


def test_items_too_large_to_stage_take_the_two_step_path():
    width = _staging.STAGE_BELOW // 8 + 1
    with shmreplay.Server([_table(max_size=16)], name=_names.unique("staged-large")) as server:
        with shmreplay.Client(server.name) as client:
            for v in range(20):
                client.insert(_item(v, width), {"t": 1.0})
            assert client._engine("t")._stagings is None
            batch = client.sample_batch("t", 16)
            assert _consistent(batch) and set(batch.data["v"].tolist()) <= set(range(4, 20))


def test_a_layout_past_its_block_is_refused_before_anything_changes():
    with shmreplay.Server([_table()], name=_names.unique("staged-layout")) as server:
        with shmreplay.Client(server.name) as client:
            client.insert(_item(1), {"t": 1.0})  # the first insert fixes the storage
            client.insert(_item(2), {"t": 1.0})
            stagings = client._engine("t")._stagings
            staging = stagings.pop()
            staging.layout[0] = staging.block.size  # the first row starts past the block
            stagings.append(staging)
            with pytest.raises(errors.BufferBrokenError, match="corrupt"):
                client.insert(_item(3), {"t": 1.0})
            info = client.server_info()["t"]
            assert info.current_size == 2 and info.num_inserted == 2
            assert client.verify("t") == []

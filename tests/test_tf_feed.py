"""Feeding a TensorFlow learner: ``make_dataset`` 's packed leaves and priority updates
from a ``tf.function`` (issue 20)."""


import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay import _tf_packing, rate_limiters, selectors
from shmreplay import tf as shmreplay_tf
from _serving import serve

# Leaves of every kind the packing meets: small numeric ones of sizes 1, 2, 4 and 8
# (packed), a bool (passed alone) and one above the pool threshold (passed alone).
WIDE = 70_000  # float32: 280 KB a row, above _outputs.POOL_FROM


def item(i):
    return {"u8": np.full(3, i, np.uint8), "i8": np.int8(-i), "u16": np.uint16(i),
            "f16": np.full(2, i, np.float16), "i32": np.int32(i), "f64": np.float64(i),
            "u64": np.uint64(i), "flag": np.bool_(i % 2),
            "wide": np.full(WIDE, i, np.float32)}


def spec_of(sample):
    return [tf.TensorSpec(leaf.shape, tf.as_dtype(leaf.dtype))
            for leaf in tf.nest.flatten(sample)]


def test_small_numeric_leaves_cross_as_one_array_and_come_back_exact():
    batch = {key: np.stack([item(i)[key] for i in range(4)]) for key in item(0)}
    leaves = tf.nest.flatten(batch)
    packing = _tf_packing.Packing(spec_of(batch))
    # one packed array, then the bool and the wide leaf as they are
    assert packing.output_dtypes == [tf.uint8, tf.bool, tf.float32]
    outputs = packing.pack(leaves)
    assert len(outputs) == 3 and outputs[0].ctypes.data % 64 == 0
    assert outputs[2] is batch["wide"]  # the large leaf is not copied
    back = packing.unpack([tf.constant(a) for a in outputs])
    for got, want in zip(back, leaves):
        assert got.dtype.as_numpy_dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want)


def test_packing_refuses_a_leaf_of_another_dtype_or_shape():
    batch = {"a": np.zeros((4, 2), np.float32), "b": np.zeros(4, np.int32)}
    packing = _tf_packing.Packing(spec_of(batch))
    with pytest.raises(ValueError, match="leaf 1 .* int64.*int32"):
        packing.pack([batch["a"], batch["b"].astype(np.int64)])
    with pytest.raises(ValueError, match="leaf 0"):
        packing.pack([np.zeros((4, 3), np.float32), batch["b"]])
    # same bytes, another dtype: refused, not reinterpreted
    with pytest.raises(ValueError, match="leaf 0"):
        packing.pack([batch["a"].view(np.int32), batch["b"]])


def test_make_dataset_packs_and_every_leaf_keeps_its_item(monkeypatch):
    calls = []
    pack = _tf_packing.Packing.pack
    monkeypatch.setattr(_tf_packing.Packing, "pack",
                        lambda self, leaves: calls.append(1) or pack(self, leaves))
    table = shmreplay.Table("u", selectors.Uniform(), selectors.Fifo(), 40,
                            rate_limiters.MinSize(1))
    with serve(table) as (name, client):
        keys = {}
        for i in range(1, 21):
            keys[int(client.insert(item(i), {"u": 1.0})["u"])] = i
        dataset = shmreplay_tf.make_dataset(name, "u", batch_size=8, max_batches=5)
        batches = list(dataset)
    assert len(batches) == 5 and len(calls) == 5
    for batch in batches:
        rows = [keys[int(key)] for key in batch.info.key.numpy()]
        for key, leaf in batch.data.items():
            want = np.stack([item(i)[key] for i in rows])
            assert leaf.dtype.as_numpy_dtype == want.dtype
            np.testing.assert_array_equal(leaf.numpy(), want)
        assert batch.info.table_size.dtype == tf.int64
        assert batch.info.probability.numpy().tolist() == [1 / 20] * 8

"""tf.data datasets over shmreplay tables, with Reverb's dataset API.

Import it as ``shmreplay.tf`` (it imports TensorFlow; ``import shmreplay`` does not)::

    from shmreplay import tf as shmreplay_tf

    dataset = shmreplay_tf.TrajectoryDataset.from_table_signature(
        "my-buffer", "replay", max_in_flight_samples_per_worker=512)
    for sample in dataset.batch(256).take(10):
        ...                                       # ReplaySample(info, data), [256, ...]

    # The fast path for training: whole batches straight from ``sample_batch``.
    dataset = shmreplay_tf.make_dataset("my-buffer", "replay", batch_size=256)

    # Faster for small items: batches passed to the tf.function as its argument.
    batches = shmreplay_tf.PackedBatches("my-buffer", "replay", batch_size=256)

Reverb's ``TFClient`` (insert, sample and update priorities as TensorFlow ops) is
here too: ``shmreplay_tf.TFClient("my-buffer")``.

Elements are ``ReplaySample(info, data)`` with Reverb's info dtypes (key uint64,
probability float64, table_size int64, priority float64, times_sampled int32).

How sampling maps onto tf.data: a worker takes up to
``max_in_flight_samples_per_worker`` items in one ``sample_batch`` call (the rate limiter
counts them then, as Reverb's server does) and the dataset hands them out one by one.
The worker never takes more than ``max_samples`` in all, takes its next items only
once the consumer has read the last ones, and waits in short slices so that a discarded
iterator stops it.
"""

from shmreplay._tf_batches import ReplayBuffer, make_dataset
from shmreplay._tf_client import TFClient
from shmreplay._tf_feed import PackedBatch, PackedBatches
from shmreplay._tf_patterns import PatternDataset, pattern_dataset_with_info
from shmreplay._tf_common import table_signature
from shmreplay._tf_items import ReplayDataset, TimestepDataset, TrajectoryDataset

__all__ = ["PackedBatch", "PackedBatches", "PatternDataset", "ReplayBuffer", "ReplayDataset",
           "TFClient", "TimestepDataset", "TrajectoryDataset", "make_dataset",
           "pattern_dataset_with_info", "table_signature"]

#!/usr/bin/env python
"""What reading items of any length through the TensorFlow datasets costs.

Three tables of 2_000 items, obs float32[T, 8] and step int64[T]:

* *fixed*: a signature with T = 8 (the fixed-shape path, unchanged);
* *any8*:  a signature with T = None, every item 8 steps (the same data: the
           difference to *fixed* is what the lengths and the cutting map cost);
* *any*:   T = None, items of 1 to 16 steps (8.5 on average).

For each, items/s delivered in eager ``next`` by
``TrajectoryDataset.from_table_signature(..., max_in_flight_samples_per_worker=64)``
(``.batch(64)``, or ``.padded_batch(64)`` on *any*, which is what a Reverb user
does with such items), and batches of 64 from ``make_dataset``. Timing:
each ``.batch`` also in a ``tf.function`` loop of 10 batches (what the pipeline
itself delivers, no Python per batch); the cases' repeats interleaved, the median of ``--repeat`` repeats of ``--seconds``.

    python benchmarks/bench_any_length_datasets.py [--repeat 5] [--seconds 1]
"""

import argparse
import statistics
import time

import numpy as np
import tensorflow as tf

import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay import tf as stf

ITEMS = 2_000
B = 64
K = 10


def _fill(client, table, lengths):
    with client.trajectory_writer(num_keep_alive_refs=16) as writer:
        value = 0
        for length in lengths:
            for _ in range(length):
                writer.append({"obs": np.full(8, value, np.float32), "step": np.int64(value)})
                value += 1
            writer.create_item(table, 1.0, {"obs": writer.history["obs"][-length:],
                                            "step": writer.history["step"][-length:]})
            writer.end_episode()


def _table(name, time_dim):
    signature = {"obs": shmreplay.TensorSpec((time_dim, 8), np.float32),
                 "step": shmreplay.TensorSpec((time_dim,), np.int64)}
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), ITEMS,
                           rate_limiters.MinSize(1), signature=signature)


def _looped(iterator):
    """``K`` batches per call, in one ``tf.function`` (no Python per batch)."""

    @tf.function
    def loop():
        for _ in tf.range(K):
            next(iterator)

    class Looped:
        def __next__(self):
            loop()
    return Looped()


def _rate(iterator, items_per_next, seconds):
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(iterator)
        count += items_per_next
    return count / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    name = f"bench-any-datasets-{time.monotonic_ns()}"
    rng = np.random.default_rng(0)
    tables = [_table("fixed", 8), _table("any8", None), _table("any", None)]
    with shmreplay.Server(tables, name=name) as server:
        client = server.localhost_client()
        _fill(client, "fixed", [8] * ITEMS)
        _fill(client, "any8", [8] * ITEMS)
        _fill(client, "any", rng.integers(1, 17, ITEMS).tolist())
        cases = {}
        for table in ("fixed", "any8", "any"):
            items = stf.TrajectoryDataset.from_table_signature(name, table, 64)
            batched = items.padded_batch(B) if table == "any" else items.batch(B)
            cases[f"TrajectoryDataset items, {table}"] = (iter(items), 1)
            cases[f"TrajectoryDataset .batch({B}), {table}"] = (iter(batched), B)
            cases[f"  the same, tf.function loop, {table}"] = (_looped(iter(batched)), K * B)
            cases[f"make_dataset({B}), {table}"] = (
                iter(stf.make_dataset(name, table, B, num_parallel_calls=1)), B)
        results = {case: [] for case in cases}
        for iterator, per in cases.values():  # warm-up
            _rate(iterator, per, 0.2)
        for _ in range(args.repeat):
            for case, (iterator, per) in cases.items():
                results[case].append(_rate(iterator, per, args.seconds))
        for case, rates in results.items():
            print(f"{case:45s} {statistics.median(rates):>12,.0f} items/s "
                  f"(min {min(rates):,.0f}, max {max(rates):,.0f})")
        client.close()


if __name__ == "__main__":
    main()

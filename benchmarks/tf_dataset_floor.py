"""The floor under a Python-backed tf.data dataset, against Reverb's C++ dataset op.

Issue 17 asks shmreplay's ``TFClient.dataset`` (and the datasets behind it) to be 10x
faster than Reverb's in seed 002's cases, which make a dataset and read a few items.
Any dataset that reads from Python needs at least one traced ``tf.data`` function (a
``numpy_function`` inside ``flat_map`` here, with nothing behind it: zeros), while
Reverb's ``TimestepDataset`` is one C++ op. This script times both, made and made + read
2 items, in one process and at one moment, so the ratio holds whatever the load:
if the empty Python-backed dataset costs more than a tenth of Reverb's op, no
Python-backed implementation can reach the target.

Needs dm-reverb (run it with the Reverb venv: ``/work/reverb-venv/bin/python
benchmarks/tf_dataset_floor.py``). Writes ``benchmarks/results/tf_dataset_floor.json``.
"""

import json
import os
import subprocess
import time

import numpy as np
import tensorflow as tf
import reverb

REPEATS, CALLS = 7, 10


def _zeros(_):
    return np.zeros((2, 5), np.float64)


def python_backed(_address):
    return tf.data.Dataset.range(1).flat_map(lambda i: tf.data.Dataset.from_tensor_slices(
        tf.numpy_function(_zeros, [i], tf.float64)))


def reverb_op(address):
    return reverb.TimestepDataset(address, "t", dtypes=(tf.float64,),
                                  shapes=(tf.TensorShape([5]),),
                                  max_in_flight_samples_per_worker=2)


def median_ms(make, address, items: int) -> float:
    def once():
        dataset = make(address)
        for _ in dataset.take(items):
            pass
    for _ in range(3):
        once()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(CALLS):
            once()
        times.append((time.perf_counter() - start) / CALLS)
    return sorted(times)[REPEATS // 2] * 1e3


def main():
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(),
                                         reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))])
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    for _ in range(10):
        client.insert([np.zeros(5)], {"t": 1.0})
    rows = []
    for items in (0, 2):
        for name, make in (("python-backed, empty", python_backed), ("reverb op", reverb_op)):
            rows.append({"dataset": name, "items read": items,
                         "ms": round(median_ms(make, address, items), 3)})
            print(rows[-1])
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
           "tensorflow": tf.__version__, "load": os.getloadavg(), "rows": rows}
    with open(os.path.join(repo, "benchmarks", "results", "tf_dataset_floor.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

"""A dataset iterator dropped while it waits on an empty table must not hang its
destructor or the process's exit: each case runs in a child process that attaches by
name, starts waiting, drops the iterator and exits, within a bound."""

import os
import subprocess
import sys

import numpy as np
import pytest

import shmreplay
from shmreplay.specs import TensorSpec
import _names

_CHILD = r"""
import sys, threading, time
import tensorflow as tf
from shmreplay import tf as shmreplay_tf

name, case = sys.argv[1:3]
if case.startswith("make_dataset"):
    dataset = shmreplay_tf.make_dataset(name, "q", batch_size=2, prefetch_size=1)
elif case.startswith("trajectory"):
    dataset = shmreplay_tf.TrajectoryDataset(name, "q", {"x": tf.float32}, {"x": ()}, 2)
else:
    dataset = shmreplay_tf.TimestepDataset(name, "q", {"x": tf.float32}, {"x": ()}, 2,
                                           num_workers_per_iterator=2)
if case.endswith("prefetch"):
    dataset = dataset.prefetch(1)
iterator = iter(dataset)
if case.endswith("thread"):  # next() waits in a thread that still holds the iterator
    threading.Thread(target=next, args=(iterator, None), daemon=True).start()
time.sleep(0.5)  # waiting now
del iterator
print("dropped", flush=True)
"""


# (last reproduced before this session's fixes; none hangs on today's code: kept so
# that none comes back)
@pytest.mark.parametrize("case", ["make_dataset", "trajectory-prefetch", "trajectory-thread",
                                  "timestep-workers-thread"])
def test_an_iterator_dropped_while_waiting_on_an_empty_table_lets_the_process_exit(case):
    table = shmreplay.Table.queue("q", 10, signature={"x": TensorSpec((), np.float32)})
    with shmreplay.Server([table], name=_names.unique("drop")) as server:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        try:
            done = subprocess.run([sys.executable, "-c", _CHILD, server.name, case], env=env,
                                  capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired as exc:  # (run() killed the child)
            pytest.fail(f"{case}: the child hung after dropping its iterator:\n{exc.stdout}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "dropped"

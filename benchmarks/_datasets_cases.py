"""The cases of ``bench_datasets.py``: the item shapes, the case catalogue, and the
callables of one (shape, B) group made in a worker process (TensorFlow's or JAX's).

Not a public module.
"""

import gc
import time

import numpy as np

import _common as C

CAPACITY = 100_000
QUICK_CAPACITY = {"small": 100_000, "frames": 2_000}
SHAPES = {
    "small": {"obs": ((8,), np.float32), "action": ((), np.int64),
              "reward": ((), np.float32), "next_obs": ((8,), np.float32)},
    "frames": {"obs": ((84, 84, 4), np.uint8), "action": ((), np.int64),
               "reward": ((), np.float32)},
}
TABLE = "replay"
BATCH_SIZES = (32, 256)
PREFETCH = 2
TARGET = 0.8
FILL_CHUNK = 2_000
LIBS = ("tf", "jax")
SKIP_BATCHES = 6  # untimed batches before each repeat of a prefetching case

# case key -> (worker, label, judged against the target)
CASES = {
    "baseline": (None, "sample_batch(table, B), before any dataset (baseline)", False),
    "sample_batch": (None, "sample_batch(table, B), interleaved", False),
    "md_eager": ("tf", "make_dataset(B, prefetch_size=2, npc=1), eager next()", True),
    "md_step": ("tf", "make_dataset, tf.function step(iterator)", True),
    "md_loop": ("tf", "make_dataset, tf.function loop of K steps", True),
    "md2_eager": ("tf", "make_dataset(B, num_parallel_calls=2), eager next()", True),
    "md2_step": ("tf", "make_dataset(npc=2), tf.function step(iterator)", True),
    "md2_loop": ("tf", "make_dataset(npc=2), tf.function loop of K steps", True),
    "traj_eager": ("tf", "TrajectoryDataset(2B in flight).batch(B), eager next()", True),
    "traj_step": ("tf", "TrajectoryDataset.batch, tf.function step(iterator)", True),
    "traj_loop": ("tf", "TrajectoryDataset.batch, tf.function loop of K steps", True),
    "jax": ("jax", "jax BatchIterator(B, prefetch=2, num_workers=1) + block_until_ready",
            True),
    "jax2": ("jax", "jax BatchIterator(B, prefetch=2, num_workers=2) + block_until_ready",
             True),
    "floor_eager": ("tf", "breakdown: eager next() on from_tensors(sample).repeat()", False),
    "floor_step": ("tf", "breakdown: tf.function step on from_tensors(sample).repeat()",
                   False),
    "floor_gen": ("tf", "breakdown: from_generator(fixed sample), tf.function loop", False),
    "floor_npf": ("tf", "breakdown: numpy_function(fixed sample) map, tf.function loop",
                  False),
    "floor_put": ("jax", "breakdown: sample_batch + jax.device_put per leaf, no thread",
                  False),
}


def timing_settings(quick):
    """``C.time_interleaved``'s settings of this benchmark."""
    return (dict(repeat=3, min_time=0.005, warmup=0.01) if quick
            else dict(repeat=9, min_time=0.2, warmup=0.5))


def loop_steps(quick):
    """K, the steps of one tf.function loop call."""
    return 4 if quick else 32


def item_nbytes(dname):
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
               for shape, dtype in SHAPES[dname].values())


def spec_text(dname):
    return ", ".join(f"{k} {np.dtype(d).name}{list(s)}" for k, (s, d) in SHAPES[dname].items())


# --------------------------------------------------------------------------- cases

class Cases:
    """The callables of one (shape, B) group, and what must be closed afterwards."""

    def __init__(self):
        self.fns = {}            # key -> callable delivering one call's items
        self.items = {}          # key -> items per call
        self.skips = {}          # key -> untimed calls before each repeat
        self.first_batch_ms = {}
        self.closers = []
        self.refs = []           # datasets, iterators, functions: dropped before the next

    def close(self, errors):
        for close in reversed(self.closers):
            try:
                close()
            except Exception as exc:  # noqa: BLE001
                C.record_error(errors, "shmreplay", "close", exc)
        self.closers.clear()
        self.fns.clear()
        self.refs.clear()
        gc.collect()  # tf.data iterators finalize their generators (and Clients) here


def build_tf_cases(cases, server_name, B, K, sample):
    """make_dataset and TrajectoryDataset.batch, each eager / step / loop, and the
    breakdown rows; one iterator per consumption mode."""
    import tensorflow as tf
    from shmreplay import tf as stf

    def reward_sum(x):
        return tf.reduce_sum(x.data["reward"])

    def make_step():
        @tf.function
        def step(iterator):
            return reward_sum(next(iterator))
        return step

    def make_loop():
        @tf.function
        def loop(iterator):
            total = tf.constant(0.0)
            for _ in tf.range(K):
                total += reward_sum(next(iterator))
            return total
        return loop

    builders = {
        "md": lambda: stf.make_dataset(server_name, TABLE, batch_size=B,
                                       prefetch_size=PREFETCH, num_parallel_calls=1),
        "md2": lambda: stf.make_dataset(server_name, TABLE, batch_size=B,
                                        prefetch_size=PREFETCH, num_parallel_calls=2),
        "traj": lambda: stf.TrajectoryDataset.from_table_signature(
            server_name, TABLE, max_in_flight_samples_per_worker=2 * B).batch(B),
    }
    for prefix, build in builders.items():
        for mode in ("eager", "step", "loop"):
            key = f"{prefix}_{mode}"
            t0 = time.perf_counter()
            dataset = build()
            it = iter(dataset)
            next(it)
            cases.first_batch_ms[key] = (time.perf_counter() - t0) * 1e3
            if mode == "eager":
                fn = it.__next__
            elif mode == "step":
                step = make_step()
                fn = (lambda s, i: lambda: s(i))(step, it)
                cases.refs.append(step)
            else:
                loop = make_loop()
                fn = (lambda lp, i: lambda: lp(i))(loop, it)
                cases.refs.append(loop)
            cases.refs += [dataset, it]
            cases.fns[key] = fn
            cases.items[key] = B * (K if mode == "loop" else 1)
            cases.skips[key] = 1 if mode == "loop" else SKIP_BATCHES

    # breakdown: TF's own per-batch cost, and from_generator's per element
    const = tf.data.Dataset.from_tensors(sample).repeat()
    it_e, it_s = iter(const), iter(const)
    step = make_step()
    cases.fns["floor_eager"] = it_e.__next__
    cases.fns["floor_step"] = (lambda s, i: lambda: s(i))(step, it_s)

    def fixed():
        while True:
            yield sample
    signature = tf.nest.map_structure(
        lambda a: tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)), sample)
    gen = tf.data.Dataset.from_generator(fixed, output_signature=signature)
    it_g = iter(gen)
    loop = make_loop()
    cases.fns["floor_gen"] = (lambda lp, i: lambda: lp(i))(loop, it_g)
    flat = tf.nest.flatten(sample)

    def fixed_leaves(_):
        return flat
    npf = tf.data.Dataset.range(1 << 62).map(lambda i: tf.nest.pack_sequence_as(
        sample, tf.numpy_function(fixed_leaves, [i], [tf.as_dtype(a.dtype) for a in flat])))
    it_n = iter(npf.prefetch(PREFETCH))
    loop_n = make_loop()
    cases.fns["floor_npf"] = (lambda lp, i: lambda: lp(i))(loop_n, it_n)
    cases.items.update(floor_eager=B, floor_step=B, floor_gen=B * K, floor_npf=B * K)
    cases.skips["floor_gen"] = cases.skips["floor_npf"] = 1
    cases.refs += [const, it_e, it_s, step, gen, it_g, loop, npf, it_n, loop_n]


def build_jax_cases(cases, client, B):
    import jax
    from shmreplay import jax as shm_jax
    block = jax.block_until_ready
    for key, workers in (("jax", 1), ("jax2", 2)):
        t0 = time.perf_counter()
        it = shm_jax.BatchIterator(client, TABLE, B, prefetch=PREFETCH, num_workers=workers)
        cases.closers.append(it.close)
        block(next(it))
        cases.first_batch_ms[key] = (time.perf_counter() - t0) * 1e3
        cases.fns[key] = (lambda nxt: lambda: block(nxt()))(it.__next__)
        cases.items[key] = B
        cases.skips[key] = SKIP_BATCHES

    # BatchIterator's work without its thread: a fresh sample each time (putting the
    # same numpy array again and again is not what the iterator does, and times differently)
    device = jax.devices()[0]
    put = jax.device_put
    leaves = jax.tree_util.tree_leaves
    sb = client.sample_batch

    def sample_and_put():
        return block([put(a, device) for a in leaves(sb(TABLE, B).data)])
    cases.fns["floor_put"] = sample_and_put
    cases.items["floor_put"] = B

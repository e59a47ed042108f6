"""The worker side of ``bench_multiprocess.py``: the transitions, and what each actor or
learner process runs (a timed loop of one library's operation).

Not a public module. An *ops factory* (``ShmActorOps``, ``ShmLearnerOps``,
``CpprbActorOps``, ``CpprbLearnerOps``) is picklable; called in the worker process, it
returns ``(op, chunk, closer)``: ``op()`` does one unit of work and returns the items it
handled, ``chunk`` is how many calls run between two looks at the clock.
"""

import time
import traceback

import numpy as np

ALPHA = 0.4
BETA = 0.4
BATCH = 256
TABLE = "replay"
CAPACITY = {"small": 2**16, "frames": 2**14}
FRAME = (84, 84, 4)
STARTUP_TIMEOUT = 180.0


# --------------------------------------------------------------------------- data

def env_dict(kind):
    if kind == "small":
        return {"obs": {"shape": 15}, "act": {"shape": 3}, "rew": {},
                "next_obs": {"shape": 15}, "done": {}}
    return {"obs": {"shape": FRAME, "dtype": np.uint8}, "act": {"dtype": np.int32},
            "rew": {}, "next_obs": {"shape": FRAME, "dtype": np.uint8}, "done": {}}


def make_transition(kind, rng):
    if kind == "small":
        return {"obs": rng.standard_normal(15).astype(np.float32),
                "act": rng.standard_normal(3).astype(np.float32),
                "rew": np.float32(rng.standard_normal()),
                "next_obs": rng.standard_normal(15).astype(np.float32),
                "done": np.float32(0.0)}
    return {"obs": rng.integers(0, 256, FRAME, dtype=np.uint8),
            "act": np.int32(rng.integers(0, 18)),
            "rew": np.float32(rng.standard_normal()),
            "next_obs": rng.integers(0, 256, FRAME, dtype=np.uint8),
            "done": np.float32(0.0)}


def make_batch(kind, rng, n):
    if kind == "small":
        return {"obs": rng.standard_normal((n, 15)).astype(np.float32),
                "act": rng.standard_normal((n, 3)).astype(np.float32),
                "rew": rng.standard_normal(n).astype(np.float32),
                "next_obs": rng.standard_normal((n, 15)).astype(np.float32),
                "done": np.zeros(n, np.float32)}
    return {"obs": rng.integers(0, 256, (n,) + FRAME, dtype=np.uint8),
            "act": rng.integers(0, 18, n).astype(np.int32),
            "rew": rng.standard_normal(n).astype(np.float32),
            "next_obs": rng.integers(0, 256, (n,) + FRAME, dtype=np.uint8),
            "done": np.zeros(n, np.float32)}


def fill_chunks(kind, capacity, rng, fn):
    """Calls ``fn(batch)`` with batches that add up to ``capacity`` items."""
    chunk = 4096 if kind == "small" else 512
    batch = make_batch(kind, rng, chunk)
    done = 0
    while done < capacity:
        n = min(chunk, capacity - done)
        fn(batch if n == chunk else {k: v[:n] for k, v in batch.items()})
        done += n


# --------------------------------------------------------------------------- worker loops
# ``ops`` is a zero-argument callable doing one unit of work and returning the items it
# handled; the loop is shared by both libraries so the measurement is identical.

def _timed_loop(op, seconds, chunk):
    perf = time.perf_counter
    n = 0
    t0 = perf()
    deadline = t0 + seconds
    while perf() < deadline:
        for _ in range(chunk):
            n += op()
    return n, perf() - t0


def worker_main(role, wid, make_ops, seconds, msgs, start_evt, warmup):
    try:
        t0 = time.perf_counter()
        op, chunk, closer = make_ops()
        for _ in range(warmup):
            op()
        msgs.put(("ready", role, wid, time.perf_counter() - t0))
        if not start_evt.wait(STARTUP_TIMEOUT + 60):
            raise RuntimeError("start event never came")
        n, elapsed = _timed_loop(op, seconds, chunk)
        closer()
        msgs.put(("done", role, wid, n, elapsed))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        msgs.put(("error", role, wid, traceback.format_exc()))


# shmreplay ops (spawned: everything is rebuilt from picklable arguments)

class ShmActorOps:
    def __init__(self, name, kind, seed):
        self.name, self.kind, self.seed = name, kind, seed

    def __call__(self):
        import shmreplay
        client = shmreplay.Client(self.name)
        tr = make_transition(self.kind, np.random.default_rng(self.seed))
        prio = {TABLE: 1.0}
        insert = client.insert

        def op():
            insert(tr, prio)
            return 1
        return op, (64 if self.kind == "small" else 16), client.close


class ShmLearnerOps:
    def __init__(self, name, seed):
        self.name, self.seed = name, seed

    def __call__(self):
        import shmreplay
        client = shmreplay.Client(self.name)
        rng = np.random.default_rng(self.seed)
        pool = [rng.random(BATCH) + 0.05 for _ in range(8)]
        sample_batch, update = client.sample_batch, client.update_priorities
        state = [0]

        def op():
            s = sample_batch(TABLE, BATCH)
            s.info.importance_weights(BETA)
            keys = s.info.key
            state[0] += 1
            update(TABLE, keys, pool[state[0] & 7][:len(keys)])
            return len(keys)
        return op, 4, client.close


# cpprb ops (forked: the buffer object is inherited)

class CpprbActorOps:
    def __init__(self, rb, kind, seed):
        self.rb, self.kind, self.seed = rb, kind, seed

    def __call__(self):
        tr = make_transition(self.kind, np.random.default_rng(self.seed))
        add = self.rb.add

        def op():
            add(**tr)
            return 1
        return op, (64 if self.kind == "small" else 16), (lambda: None)


class CpprbLearnerOps:
    def __init__(self, rb, seed):
        self.rb, self.seed = rb, seed

    def __call__(self):
        rng = np.random.default_rng(self.seed)
        pool = [rng.random(BATCH) + 0.05 for _ in range(8)]
        sample, update = self.rb.sample, self.rb.update_priorities
        state = [0]

        def op():
            s = sample(BATCH, beta=BETA)
            idx = s["indexes"]
            state[0] += 1
            update(idx, pool[state[0] & 7][:len(idx)])
            return len(idx)
        return op, 4, (lambda: None)

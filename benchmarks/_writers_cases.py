"""The cases of ``bench_writers.py``: the step pools, and each in-process case made as a
zero-argument callable that writes one environment step.

Not a public module. ``CASES`` names every case (Reverb's too) in print order; the cases
themselves are described in ``bench_writers.py``'s docstring. A ``*_case`` function
returns ``(fn, closer)``: ``fn()`` writes the next step of the pool, ``closer`` (or None)
closes what the case opened.
"""

import itertools
import os

import numpy as np

DATASETS = {
    "small": {"capacity": 100_000, "obs_shape": (8,), "obs_dtype": np.float32},
    "frames": {"capacity": 10_000, "obs_shape": (84, 84, 4), "obs_dtype": np.uint8},
}
POOL = 64
NUM_KEEP = 3
TABLES = {"legacy1": "legacy1", "legacy3": "legacy3", "traj3": "traj3", "traj_squeezed":
          "traj_squeezed", "traj_nstep": "traj_nstep", "insert": "insert",
          "floor": "floor", "traj_floor": "traj_floor"}
LIBS = ("numpy", "shmreplay", "cpprb", "reverb", "acme")
DEFAULT_LIBS = ("numpy", "shmreplay", "cpprb", "reverb")  # acme: only when asked for
IN_PROCESS_LIBS = ("numpy", "shmreplay", "cpprb")

# case key -> (library, label), in print order
CASES = {
    "raw": ("numpy", "raw numpy copy of the step (baseline)"),
    "shm_legacy1": ("shmreplay", "shmreplay Writer(3), 1-step items"),
    "shm_legacy3": ("shmreplay", "shmreplay Writer(3), 3-step items"),
    "shm_traj3": ("shmreplay", "shmreplay TrajectoryWriter(3), 3-step items"),
    "shm_traj_squeezed": ("shmreplay", "shmreplay TrajectoryWriter, squeezed [-1] items"),
    "shm_traj_nstep": ("shmreplay", "shmreplay TrajectoryWriter(4), 3-step transitions"),
    "shm_insert": ("shmreplay", "shmreplay Client.insert (whole 1-step item)"),
    "shm_floor": ("shmreplay", "mechanism floor: reserve, row copies, commit"),
    "calls_traj3": ("numpy", "TrajectoryWriter calls alone, over a writer doing nothing"),
    "shm_traj_floor": ("shmreplay", "TrajectoryWriter lower bound: those calls + the floor"),
    "cpprb_add": ("cpprb", "cpprb add"),
    "cpprb_next_of": ("cpprb", "cpprb add, next_of=obs"),
    "cpprb_stack": ("cpprb", "cpprb add, next_of + stack_compress=obs"),
    "cpprb_nstep": ("cpprb", "cpprb add, Nstep=3 + next_of=obs"),
    "reverb_legacy1": ("reverb", "Reverb Writer(1), 1-step items"),
    "reverb_legacy3": ("reverb", "Reverb Writer(3), 3-step items"),
    "reverb_traj3": ("reverb", "Reverb TrajectoryWriter(3), 3-step items"),
    "reverb_insert": ("reverb", "Reverb Client.insert (1-step item)"),
}
N_STEP = 3


def timing_settings(quick):
    """``C.time_interleaved``'s settings of this benchmark."""
    return (dict(repeat=3, min_time=0.005, warmup=0.02) if quick
            else dict(repeat=11, min_time=0.1, warmup=0.3))


# --------------------------------------------------------------------------- data

def make_pool(rng, ds):
    """POOL consecutive steps (dicts of numpy leaves) plus each step's next obs."""
    shape, dtype = ds["obs_shape"], ds["obs_dtype"]
    if dtype == np.uint8:
        frames = rng.integers(0, 256, (POOL + shape[-1],) + shape[:-1], dtype=np.uint8)
        # obs_t = frames t..t+3 stacked on the last axis (a sliding window)
        obs = np.stack([frames[i:i + POOL + 1] for i in range(shape[-1])], axis=-1)
        obs = np.ascontiguousarray(obs)
    else:
        obs = rng.standard_normal((POOL + 1,) + shape).astype(dtype)
    steps = []
    for t in range(POOL):
        steps.append({"obs": obs[t], "action": np.int64(t % 18),
                      "reward": np.float32(rng.standard_normal()),
                      "discount": np.float32(0.99)})
    next_obs = [obs[t + 1] for t in range(POOL)]
    return steps, next_obs


def step_nbytes(step):
    return sum(np.asarray(v).nbytes for v in step.values())


def rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cycler(items):
    return itertools.cycle(items).__next__


# --------------------------------------------------------------------------- cases

def raw_case(ds, steps):
    cap = ds["capacity"]
    rings = [(k, np.empty((cap,) + np.shape(v), np.asarray(v).dtype))
             for k, v in steps[0].items()]
    nxt, count = cycler(steps), itertools.count().__next__

    def raw():
        step = nxt()
        i = count() % cap
        for k, ring in rings:
            ring[i] = step[k]
    return raw, None


def shm_case(key, client, steps):
    """Returns ``(fn, closer)``; 3-step cases are primed with two steps."""
    nxt = cycler(steps)
    if key == "shm_legacy1":
        w = client.writer(NUM_KEEP)
        table = TABLES["legacy1"]

        def legacy1():
            w.append(nxt())
            w.create_item(table, 1, 1.0)
        return legacy1, w.close
    if key == "shm_legacy3":
        w = client.writer(NUM_KEEP)
        table = TABLES["legacy3"]
        for _ in range(NUM_KEEP - 1):
            w.append(nxt())

        def legacy3():
            w.append(nxt())
            w.create_item(table, 3, 1.0)
        return legacy3, w.close
    if key == "shm_traj3":
        tw = client.trajectory_writer(NUM_KEEP)
        table = TABLES["traj3"]
        for _ in range(NUM_KEEP - 1):
            tw.append(nxt())

        def traj3():
            step = nxt()
            tw.append(step)
            tw.create_item(table, 1.0, {k: tw.history[k][-3:] for k in step})
        return traj3, tw.close
    if key == "shm_traj_squeezed":
        tw = client.trajectory_writer(NUM_KEEP)
        table = TABLES["traj_squeezed"]
        tw.append(nxt())

        def traj_squeezed():
            step = nxt()
            tw.append(step)
            tw.create_item(table, 1.0, {k: tw.history[k][-1] for k in step})
        return traj_squeezed, tw.close
    if key == "shm_traj_nstep":
        tw = client.trajectory_writer(N_STEP + 1)
        table = TABLES["traj_nstep"]
        for _ in range(N_STEP):
            tw.append(nxt())

        def traj_nstep():
            tw.append(nxt())
            h = tw.history
            tw.create_item(table, 1.0, {
                "obs": h["obs"][-N_STEP - 1], "action": h["action"][-N_STEP - 1],
                "reward": h["reward"][-N_STEP:], "discount": h["discount"][-N_STEP:],
                "next_obs": h["obs"][-1]})
        return traj_nstep, tw.close
    if key == "shm_insert":
        table = TABLES["insert"]
        prio = {table: 1.0}
        insert = client.insert

        def insert_one():
            insert(nxt(), prio)
        return insert_one, None
    if key == "shm_floor":
        return floor_case(client, steps, nxt)
    if key == "shm_traj_floor":
        floor, _ = floor_case(client, steps, nxt, TABLES["traj_floor"])
        return trajectory_calls_case(steps, nxt, floor)
    raise KeyError(key)


def floor_case(client, steps, nxt, table=TABLES["floor"]):
    """The mechanism alone (private API): reserve a slot and a fresh row, copy the step's
    fields into the row, commit. A writer's first item defines the table's storage."""
    from shmreplay._engine import growth
    from shmreplay._shm.kernels import codes, table as kernels
    with client.writer(1) as w:
        w.append(steps[0])
        w.create_item(table, 1, 1.0)
        _, plan = w._plans[(table, 1)]
        keys = [field[0] for field in w._fields]
    engine = client._engine(table)
    arrays = engine.arrays
    targets = [(key, engine.columns[store]) for key, store in zip(keys, plan.stores)]
    known_rows, known_gens = np.full(1, -1, np.int64), np.full(1, -1, np.int64)
    ref_steps = plan.uniform_refs(1)
    out_rows, out_fresh = np.empty(1, np.int64), np.empty(1, np.int64)
    io, prob = np.zeros(3, np.int64), np.empty(2, np.float64)
    pid = os.getpid()

    def floor(step=None):
        if step is None:
            step = nxt()
        slot = kernels.reserve_item(*arrays, known_rows, known_gens, ref_steps, pid, 0, 0,
                                    out_rows, out_fresh, io)
        while slot == codes.GROW:  # the stores grow as the table fills (as writers do)
            growth.grow(engine, 1)
            slot = kernels.reserve_item(*arrays, known_rows, known_gens, ref_steps, pid, 0, 0,
                                        out_rows, out_fresh, io)
        if slot < 0:
            raise RuntimeError(f"floor case: reserve_item returned {slot}")
        row = int(out_rows[0])
        for key, column in targets:
            column[row] = step[key]
        kernels.commit_one(*arrays, slot, 1.0, prob, pid, 0)
    return floor, None


class _BareColumns:
    """``history[k]`` of the bare writer: slicing gives a column (a tuple)."""

    __slots__ = ("key",)

    def __init__(self, key):
        self.key = key

    def __getitem__(self, index):
        return (self.key, index)


class _BareTrajectoryWriter:
    """TrajectoryWriter's call shapes with no work behind them (see "TrajectoryWriter
    calls alone"): ``append`` checks each field's type, dtype and shape against the first
    step's and returns a ref per field, ``history[k][i]`` is a column, ``create_item``
    checks each leaf is a column and hands the last step to ``store``."""

    def __init__(self, keys, store):
        self.history = {key: _BareColumns(key) for key in keys}
        self._store = store
        self._first = None
        self._step = None
        self._count = 0

    def append(self, data):
        # The one check the API cannot skip: each field's type, dtype and shape against
        # the first step's (a mismatch must raise before anything is written).
        first = self._first
        if first is None:
            first = self._first = {k: (type(v), v.dtype, v.shape) for k, v in data.items()}
        for key, value in data.items():
            kind, dtype, shape = first[key]
            if type(value) is not kind or value.dtype != dtype or value.shape != shape:
                raise TypeError(f"field {key}: {value!r} does not match the first step")
        self._step = data
        self._count += 1
        count = self._count
        return {key: (count, key) for key in data}

    def create_item(self, table, priority, trajectory):
        for column in trajectory.values():
            if type(column) is not tuple:
                raise TypeError(f"{table}: not a column: {column!r}")
        if self._store is not None:
            self._store(self._step)


def trajectory_calls_case(steps, nxt, store=None):
    """The TrajectoryWriter case's per-step code over ``_BareTrajectoryWriter``."""
    tw = _BareTrajectoryWriter(list(steps[0]), store)
    table = TABLES["traj3"]

    def calls():
        step = nxt()
        tw.append(step)
        tw.create_item(table, 1.0, {k: tw.history[k][-3:] for k in step})
    return calls, None


def cpprb_case(key, cpprb, ds, steps, next_obs):
    obs = {"shape": ds["obs_shape"], "dtype": ds["obs_dtype"]}
    env = {"obs": obs, "action": {"dtype": np.int64}, "reward": {"dtype": np.float32},
           "discount": {"dtype": np.float32}}
    cap = ds["capacity"]
    with_next = [dict(s, next_obs=n) for s, n in zip(steps, next_obs)]
    if key == "cpprb_add":
        rb, data = cpprb.ReplayBuffer(cap, env), steps
    elif key == "cpprb_next_of":
        rb, data = cpprb.ReplayBuffer(cap, env, next_of=("obs",)), with_next
    elif key == "cpprb_stack":
        rb = cpprb.ReplayBuffer(cap, env, next_of=("obs",), stack_compress="obs")
        data = with_next
    elif key == "cpprb_nstep":
        env = {k: v for k, v in env.items() if k != "discount"}
        env["done"] = {"dtype": np.float32}
        rb = cpprb.ReplayBuffer(cap, env, next_of=("obs",),
                                Nstep={"size": 3, "rew": "reward", "gamma": 0.99,
                                       "next": "next_obs"})
        data = [{"obs": s["obs"], "next_obs": s["next_obs"], "action": s["action"],
                 "reward": s["reward"], "done": np.float32(0.0)} for s in with_next]
    else:
        raise KeyError(key)
    nxt, add = cycler(data), rb.add

    def cpprb_add():
        add(**nxt())
    return cpprb_add, None

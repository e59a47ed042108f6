#!/usr/bin/env python
"""The writer APIs, per step: shmreplay's writers against cpprb, a raw numpy copy and Reverb.

Two step shapes, each a dict ``{obs, action, reward, discount}``:

* *small*:  obs float32[8], action int64 scalar, reward and discount float32 scalars;
            tables of ``max_size`` 100_000;
* *frames*: obs uint8[84,84,4] (Atari-like, four stacked frames), the rest as above;
            tables of ``max_size`` 10_000.

Cases, each timed as the cost of one environment step (µs):

=========================  ===============================================================
raw numpy copy (baseline)  every leaf of the step copied into a preallocated ring slot:
                           ``ring[k][i % N] = step[k]``
shmreplay Writer, 1-step   ``w = client.writer(3)``; ``w.append(step)`` +
                           ``w.create_item(table, 1, 1.0)``
shmreplay Writer, 3-step   the same with ``create_item(table, 3, 1.0)`` (items of 3
                           overlapping steps: Reverb's tutorial pattern)
shmreplay TrajectoryWriter ``tw = client.trajectory_writer(3)``; ``tw.append(step)`` +
                           ``tw.create_item(table, 1.0, {k: tw.history[k][-3:] for k in step})``
shmreplay TrajectoryWriter ``{k: tw.history[k][-1] for k in step}``: one-step items of
squeezed refs              squeezed references (Acme's transition adders build items so)
shmreplay TrajectoryWriter n-step transitions (n = 3): ``obs`` and ``action`` at ``[-4]``,
n-step                     ``reward`` and ``discount`` ``[-3:]``, ``next_obs``
                           ``history["obs"][-1]`` (target for both: within 1.2x of the
                           ``[-3:]`` TrajectoryWriter case; issue 20)
shmreplay Client.insert    ``client.insert(step, {table: 1.0})`` (whole 1-step items; reference)
mechanism floor            what any writer of 1-step items must do, with none of the API's
                           checks or bookkeeping (private calls): one native call that
                           reserves a slot and a row, ``column[row] = step[k]`` per
                           field, one native call that commits
TrajectoryWriter calls     the TrajectoryWriter case's per-step code (``append``, four
alone                      ``history[k][-3:]``, ``create_item``) over a writer that does
                           only what cannot be skipped: ``append`` checks each field's
                           type, dtype and shape against the first step's; refs and
                           columns are tuples, the cheapest Python objects; ``create_item``
                           checks that each leaf is a column. No copy, no storage
TrajectoryWriter lower     those calls plus the mechanism floor (the step reserved, copied
bound                      and committed from the caller's arrays, as a 1-step item): less
                           than any TrajectoryWriter written in Python over these kernels
                           can cost, since it skips the copy at ``append``, the other
                           checks, and all bookkeeping (refs, episodes, expiry)
cpprb add                  ``ReplayBuffer(N, env_dict).add(**step)``
cpprb add, next_of         ``ReplayBuffer(..., next_of=("obs",))``; the step plus next_obs
                           (stored once: cpprb's memory saving for overlapping data)
cpprb add, stack_compress  frames only: ``next_of=("obs",), stack_compress="obs"``
cpprb add, Nstep 3         ``ReplayBuffer(..., next_of=("obs",), Nstep={"size": 3,
                           "rew": "reward", "gamma": 0.99, "next": "next_obs"})``; the step
                           has ``done`` instead of ``discount`` (cpprb needs it for Nstep)
Reverb (optional)          ``client.writer(1)`` / ``writer(3)`` / ``trajectory_writer(3)`` /
                           ``client.insert`` against an in-process ``reverb.Server``
=========================  ===============================================================

Steps cycle through a pool of 64 precomputed steps (the frames are a sliding window of
one frame stream, as ``stack_compress`` expects). Every shmreplay table uses
``Uniform()``, ``Fifo()`` and ``MinSize(1)``, one ``Server`` per step shape named
``bench-writers-*`` (removed at the end). Before timing, every case runs one pass of
``max_size`` steps (the buffer is then full and each step evicts the oldest item; that
first pass, page faults included, is reported as "first pass"), so the timed figures
are the steady state. Timing is timeit-style as in the other scripts: warm-up, calibrated
loop, median of repeats with the garbage collector off, repeats of all in-process cases
interleaved so background load hits them alike.

Reverb needs TensorFlow and numpy < 2, so it runs in its own virtualenv:
``--reverb-python PATH`` (or ``$REVERB_PYTHON``) runs this script there with
``--reverb-worker``. Reverb writers stream asynchronously, so a Reverb case is a block of
steps followed by ``flush()``, divided by the block length. Without it Reverb is "not
measured here" and the issue's figure (about 290 µs per one-step item) is quoted.

Acme's adders (``--libs acme``, not run by default; ``_acme_adders.py``): Acme's ``NStepTransitionAdder``
(n_step 5) and ``SequenceAdder`` (length 20, period 10) on both step shapes, µs per
environment step over episodes of 100 steps, the same adder code on shmreplay (through
``compat/shim``, in ``--acme-python``, default ``$ACME_PYTHON`` or /work/compat-venv) and
on Reverb (in ``--reverb-python``), one worker process each.

Memory: a fresh writer writes N steps of 3-step overlapping items into an empty table;
``info.num_stored_steps`` and ``info.storage_bytes`` against N x (bytes of one step).

Targets (the issue): under 20 µs per step for small transitions with all three writer
patterns; within 2x of the raw numpy copy for frames.

Usage:  python benchmarks/bench_writers.py [--quick] [--libs ...] [--reverb-python PATH]
                                          [--tag TAG] [--prefix NAME]
Writes: benchmarks/results/writers-<date>.{json,md} (quick: writers-quick.{json,md};
        with --tag: writers-TAG[-quick])
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import _acme_adders  # noqa: E402

import numpy as np  # noqa: E402

DATASETS = {
    "small": {"capacity": 100_000, "obs_shape": (8,), "obs_dtype": np.float32},
    "frames": {"capacity": 10_000, "obs_shape": (84, 84, 4), "obs_dtype": np.uint8},
}
POOL = 64
NUM_KEEP = 3
SMALL_TARGET_US = 20.0
FRAMES_TARGET_RATIO = 2.0
ISSUE_REVERB_US = 290.0
REVERB_BLOCK = 200
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
SHM_WRITERS = ("shm_legacy1", "shm_legacy3", "shm_traj3")
SHM_ITEMS = ("shm_traj_squeezed", "shm_traj_nstep")  # judged against shm_traj3
ITEM_TARGET = 1.2
N_STEP = 3


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
    from shmreplay._shm.kernels import table as kernels
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


# --------------------------------------------------------------------------- Reverb worker

def reverb_worker(args):
    """Runs inside a virtualenv with dm-reverb; prints one JSON line on stdout."""
    import importlib.metadata as md
    out = {"versions": {}, "datasets": {}, "errors": []}
    for dist in ("dm-reverb", "tensorflow", "tensorflow-cpu", "numpy"):
        try:
            out["versions"][dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    import reverb
    timing = _timing(args.quick)
    rng = np.random.default_rng(args.seed)
    block = 20 if args.quick else REVERB_BLOCK
    for dname in args.datasets.split(","):
        ds = DATASETS[dname]
        steps, _ = make_pool(rng, ds)
        cap = ds["capacity"]
        fill = min(cap, 500) if args.quick else cap
        tables = [reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                               cap, reverb.rate_limiters.MinSize(1))
                  for name in TABLES.values()]
        server = reverb.Server(tables=tables)
        res = {"block": block, "fill_steps": fill, "cases": {}, "first_pass_us": {}}
        try:
            client = reverb.Client(f"localhost:{server.port}")
            fns, closers = {}, []
            for key in ("reverb_legacy1", "reverb_legacy3", "reverb_traj3", "reverb_insert"):
                try:
                    fn, close, fill_fn = _reverb_case(key, client, steps, block)
                    t0 = time.perf_counter()
                    fill_fn(fill)
                    if key != "reverb_insert":  # that table is filled by a writer
                        res["first_pass_us"][key] = (time.perf_counter() - t0) / fill * 1e6
                    fn()
                    fns[key] = fn
                    closers.append(close)
                except Exception as exc:  # noqa: BLE001
                    out["errors"].append({"lib": "reverb", "where": f"{dname} {key}",
                                          "error": repr(exc),
                                          "traceback": traceback.format_exc()})
            timed = C.time_interleaved(fns, **timing)
            for key, t in timed.items():
                per = 1 if key == "reverb_insert" else block
                res["cases"][key] = {"median_us": t["median"] / per * 1e6,
                                     "best_us": t["best"] / per * 1e6,
                                     "number": t["number"], "repeat": t["repeat"],
                                     "steps_per_call": per}
            info = client.server_info()
            res["tables"] = {name: {"current_size": int(i.current_size)}
                             for name, i in info.items()}
            for close in closers:
                close()
        finally:
            server.stop()
        out["datasets"][dname] = res
    print(json.dumps(out), flush=True)
    return 0


def _reverb_case(key, client, steps, block):
    """(timed fn, closer, fill(n)) for one Reverb case."""
    nxt = cycler(steps)
    if key in ("reverb_legacy1", "reverb_legacy3"):
        n = 1 if key == "reverb_legacy1" else 3
        table = TABLES["legacy1" if n == 1 else "legacy3"]
        w = client.writer(n)
        for _ in range(n - 1):
            w.append(nxt())

        def run(count):
            for _ in range(count):
                w.append(nxt())
                w.create_item(table, n, 1.0)
            w.flush()
        return (lambda: run(block)), w.close, run
    if key == "reverb_traj3":
        tw = client.trajectory_writer(NUM_KEEP)
        table = TABLES["traj3"]
        for _ in range(NUM_KEEP - 1):
            tw.append(nxt())

        def run(count):
            for _ in range(count):
                step = nxt()
                tw.append(step)
                tw.create_item(table, 1.0, {k: tw.history[k][-3:] for k in step})
            tw.flush()
        return (lambda: run(block)), tw.close, run
    if key == "reverb_insert":
        table = TABLES["insert"]
        prio = {table: 1.0}

        def insert_one():
            client.insert(nxt(), prio)

        def fill(count):  # fill the table with a writer (insert is slow); same items
            with client.writer(1) as w:
                for _ in range(count):
                    w.append(nxt())
                    w.create_item(table, 1, 1.0)
        return insert_one, (lambda: None), fill
    raise KeyError(key)


def run_reverb(python, args, errors):
    """Runs the Reverb worker in ``python``; returns its JSON, or None."""
    cmd = [python, os.path.abspath(__file__), "--reverb-worker", "--seed", str(args.seed),
           "--datasets", args.datasets] + (["--quick"] if args.quick else [])
    return C.run_json_worker(cmd, errors, "reverb")


# --------------------------------------------------------------------------- main

def _timing(quick):
    return (dict(repeat=3, min_time=0.005, warmup=0.02) if quick
            else dict(repeat=11, min_time=0.1, warmup=0.3))


def _record_error(errors, lib, where, exc):
    tb = traceback.format_exc()
    print(f"{lib} {where} failed:\n{tb}")
    errors.append({"lib": lib, "where": where, "error": repr(exc), "traceback": tb})


def _table_info(info):
    return {"current_size": int(info.current_size),
            "num_stored_steps": int(info.num_stored_steps),
            "storage_bytes": int(info.storage_bytes)}


def run_dataset(dname, args, libs, shm, cpprb, rng, timing, errors):
    ds = DATASETS[dname]
    cap = ds["capacity"]
    fill = min(cap, 1000 if dname == "small" else 200) if args.quick else cap
    steps, next_obs = make_pool(rng, ds)
    res = {"capacity": cap, "fill_steps": fill, "step_bytes": step_nbytes(steps[0]),
           "cases": {}, "first_pass_us": {}, "rss_growth_bytes": {}, "tables": {},
           "memory": None, "loadavg_before": C.load_average()}
    print(f"\n== {dname}: obs {ds['obs_dtype'].__name__}{list(ds['obs_shape'])}, "
          f"max_size {cap}, first pass {fill} steps per case", flush=True)

    keys = []
    if "numpy" in libs:
        keys += ["raw", "calls_traj3"]
    if shm is not None:
        keys += ["shm_legacy1", "shm_legacy3", "shm_traj3", "shm_traj_squeezed",
                 "shm_traj_nstep", "shm_insert", "shm_floor", "shm_traj_floor"]
    if cpprb is not None:
        keys += ["cpprb_add", "cpprb_next_of"] + (["cpprb_stack"] if dname == "frames" else [])
        keys.append("cpprb_nstep")

    server = client = None
    closers = []
    fns = {}
    try:
        if shm is not None:
            from shmreplay import rate_limiters, selectors
            tables = [shm.Table(name, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                                max_size=cap, rate_limiter=rate_limiters.MinSize(1))
                      for name in TABLES.values()]
            try:
                server = shm.Server(tables=tables, name=f"{args.prefix}-{dname}-{os.getpid()}")
                client = shm.Client(server.name)
            except Exception as exc:  # noqa: BLE001
                _record_error(errors, "shmreplay", f"{dname} setup", exc)
                keys = [k for k in keys if not k.startswith("shm_")]
        with (server if server is not None else _null()):
            for key in keys:
                lib = CASES[key][0]
                try:
                    rss0 = rss_bytes()
                    if key == "raw":
                        fn, close = raw_case(ds, steps)
                    elif key == "calls_traj3":
                        fn, close = trajectory_calls_case(steps, cycler(steps))
                    elif lib == "shmreplay":
                        fn, close = shm_case(key, client, steps)
                    else:
                        fn, close = cpprb_case(key, cpprb, ds, steps, next_obs)
                    if close is not None:
                        closers.append(close)
                    t0 = time.perf_counter()
                    for _ in itertools.repeat(None, fill):
                        fn()
                    res["first_pass_us"][key] = (time.perf_counter() - t0) / fill * 1e6
                    rss1 = rss_bytes()
                    if rss0 is not None and rss1 is not None:
                        res["rss_growth_bytes"][key] = rss1 - rss0
                    fns[key] = fn
                except Exception as exc:  # noqa: BLE001 - report, never work around
                    _record_error(errors, lib, f"{dname} {key}", exc)
            print("first pass (µs/step): " + ", ".join(
                f"{k} {v:.1f}" for k, v in res["first_pass_us"].items()), flush=True)
            if fns:
                try:
                    timed = C.time_interleaved(fns, **timing)
                except Exception as exc:  # noqa: BLE001
                    _record_error(errors, "/".join(fns), f"{dname} timing", exc)
                    timed = {}
                for key, t in timed.items():
                    res["cases"][key] = {"median_us": t["median"] * 1e6,
                                         "best_us": t["best"] * 1e6,
                                         "number": t["number"], "repeat": t["repeat"]}
                    print(f"  {CASES[key][1]:48s} {t['median'] * 1e6:9.2f} µs/step "
                          f"(best {t['best'] * 1e6:.2f})", flush=True)
            if client is not None:
                try:
                    info = client.server_info()
                    res["tables"] = {name: _table_info(i) for name, i in info.items()}
                    res["memory"] = memory_check(shm, dname, ds, steps, args)
                except Exception as exc:  # noqa: BLE001
                    _record_error(errors, "shmreplay", f"{dname} info/memory", exc)
            for close in closers:
                try:
                    close()
                except Exception as exc:  # noqa: BLE001
                    _record_error(errors, "shmreplay", f"{dname} writer close", exc)
            closers = []
            if client is not None:
                client.close()
                client = None
    finally:
        if client is not None:
            client.close()
        if server is not None:
            server.stop()  # idempotent; the with block has stopped it already
    res["loadavg_after"] = C.load_average()
    return res


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def memory_check(shm, dname, ds, steps, args):
    """A fresh writer of each kind writes N steps of 3-step overlapping items into an
    empty table; what the table then stores."""
    from shmreplay import rate_limiters, selectors
    cap = ds["capacity"]
    n = min(cap // 2, 300) if args.quick else cap // 2
    names = ("mem-legacy3", "mem-traj3")
    tables = [shm.Table(name, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                        max_size=cap, rate_limiter=rate_limiters.MinSize(1)) for name in names]
    out = {"steps": n, "step_bytes": step_nbytes(steps[0])}
    with shm.Server(tables=tables, name=f"{args.prefix}-mem-{dname}-{os.getpid()}") as server:
        with shm.Client(server.name) as client:
            nxt = cycler(steps)
            with client.writer(NUM_KEEP) as w:
                for i in range(n):
                    w.append(nxt())
                    if i >= NUM_KEEP - 1:
                        w.create_item(names[0], 3, 1.0)
            nxt = cycler(steps)
            tw = client.trajectory_writer(NUM_KEEP)
            for i in range(n):
                step = nxt()
                tw.append(step)
                if i >= NUM_KEEP - 1:
                    tw.create_item(names[1], 1.0, {k: tw.history[k][-3:] for k in step})
            tw.flush()
            tw.close()
            info = client.server_info()
            for name in names:
                out[name] = _table_info(info[name])
    out["n_times_step_bytes"] = n * out["step_bytes"]
    out["whole_items_bytes"] = (n - NUM_KEEP + 1) * NUM_KEEP * out["step_bytes"]
    return out


def _us(res, key):
    c = res["cases"].get(key)
    return c["median_us"] if c else None


def _div(a, b):
    return a / b if a is not None and b else None


def build_report(info, args, timing, results, reverb, errors):
    """(markdown, printable text, summary dict)."""
    md = []
    text = []
    targets = {}
    for dname, res in results.items():
        if reverb and dname in reverb.get("datasets", {}):
            rv = reverb["datasets"][dname]
            for key, c in rv["cases"].items():
                res["cases"][key] = dict(c, separate_process=True)
            for key, v in rv["first_pass_us"].items():
                res["first_pass_us"][key] = v
        raw = _us(res, "raw")
        cp = _us(res, "cpprb_add")
        headers = ["case", "µs/step (median)", "best", "first pass µs/step", "÷ raw copy",
                   "cpprb add ÷ case"]
        rows = []
        for key, (lib, label) in CASES.items():
            if key not in res["cases"] and key not in res["first_pass_us"]:
                if lib == "reverb" and key == "reverb_legacy1" and not reverb:
                    rows.append([label, f"not measured here (issue: ~{ISSUE_REVERB_US:g})",
                                 "", "", "", ""])
                continue
            c = res["cases"].get(key)
            m = c["median_us"] if c else None
            rows.append([label, C.fmt_num(m, 2), C.fmt_num(c and c["best_us"], 2),
                         C.fmt_num(res["first_pass_us"].get(key), 1),
                         C.fmt_ratio(_div(m, raw)), C.fmt_ratio(_div(cp, m))])
        ds = DATASETS[dname]
        title = (f"{dname}: obs {ds['obs_dtype'].__name__}{list(ds['obs_shape'])}, action "
                 f"int64, reward/discount float32 ({res['step_bytes']} bytes/step); "
                 f"max_size {res['capacity']}")
        md += [f"#### {title}", "", C.render_table(headers, rows, markdown=True), ""]
        text += [title, C.render_table(headers, rows), ""]

        # shmreplay against each cpprb mode
        cp_keys = [k for k in ("cpprb_add", "cpprb_next_of", "cpprb_stack", "cpprb_nstep")
                   if k in res["cases"]]
        shm_keys = [k for k in SHM_WRITERS + ("shm_insert",) if k in res["cases"]]
        if cp_keys and shm_keys:
            h2 = ["cpprb µs ÷ shmreplay µs"] + [CASES[k][1].replace("cpprb ", "")
                                                 for k in cp_keys]
            r2 = [[CASES[s][1]] + [C.fmt_ratio(_div(_us(res, c), _us(res, s)))
                                   for c in cp_keys] for s in shm_keys]
            md += [C.render_table(h2, r2, markdown=True), ""]
            text += [C.render_table(h2, r2), ""]

        t = {}
        for key in SHM_WRITERS:
            m = _us(res, key)
            if m is None:
                continue
            if dname == "small":
                t[key] = {"us": m, "target": f"< {SMALL_TARGET_US:g} µs",
                          "met": m < SMALL_TARGET_US}
            else:
                r = _div(m, raw)
                t[key] = {"us": m, "ratio_to_raw": r, "target": f"<= {FRAMES_TARGET_RATIO:g}x raw",
                          "met": None if r is None else r <= FRAMES_TARGET_RATIO}
        window = _us(res, "shm_traj3")
        for key in SHM_ITEMS:
            m = _us(res, key)
            if m is not None and window is not None:
                t[key] = {"us": m, "ratio_to_window": m / window,
                          "target": f"<= {ITEM_TARGET:g}x the [-3:] TrajectoryWriter case",
                          "met": m / window <= ITEM_TARGET}
        bound = _us(res, "shm_traj_floor")
        if dname == "frames" and bound is not None:
            # Not a writer: what any Python TrajectoryWriter over these kernels exceeds.
            t["shm_traj_floor"] = {"us": bound, "ratio_to_raw": _div(bound, raw),
                                   "target": "lower bound, not judged", "met": None}
        if args.quick:  # first touches of unfilled tables and rings dominate: no verdict
            for v in t.values():
                v["met"] = None
                v["target"] += " (not judged in quick mode)"
        targets[dname] = t

        mem = res.get("memory")
        if mem:
            h3 = ["table (3-step overlapping items)", "steps written", "items",
                  "num_stored_steps", "storage_bytes", "N × step bytes", "÷ N × step bytes",
                  "whole 3-step items would take"]
            r3 = []
            for name, label in (("mem-legacy3", "Writer(3), create_item(t, 3)"),
                                ("mem-traj3", "TrajectoryWriter(3), history[-3:]")):
                i = mem[name]
                r3.append([label, mem["steps"], i["current_size"], i["num_stored_steps"],
                           _mib(i["storage_bytes"]), _mib(mem["n_times_step_bytes"]),
                           C.fmt_ratio(_div(i["storage_bytes"], mem["n_times_step_bytes"])),
                           _mib(mem["whole_items_bytes"])])
            md += [f"Memory ({dname}), fresh table, {mem['steps']} steps, "
                   f"{mem['step_bytes']} bytes per step:", "",
                   C.render_table(h3, r3, markdown=True), ""]
            text += [f"memory ({dname}):", C.render_table(h3, r3), ""]
        if res.get("tables"):
            h4 = ["timed table, after the run" + ("" if args.quick else " (full)"), "items",
                  "num_stored_steps", "storage_bytes", "÷ items × step bytes"]
            r4 = []
            for name, i in res["tables"].items():
                r4.append([name, i["current_size"], i["num_stored_steps"],
                           _mib(i["storage_bytes"]),
                           C.fmt_ratio(_div(i["storage_bytes"],
                                            i["current_size"] * res["step_bytes"]))])
            if dname == "frames" and res["rss_growth_bytes"]:
                for key in ("raw", "cpprb_add", "cpprb_next_of", "cpprb_stack", "cpprb_nstep"):
                    if key in res["rss_growth_bytes"]:
                        r4.append([f"{CASES[key][1]} (process RSS growth over the first pass)",
                                   res["fill_steps"], "", _mib(res["rss_growth_bytes"][key]),
                                   C.fmt_ratio(_div(res["rss_growth_bytes"][key],
                                                    res["fill_steps"] * res["step_bytes"]))])
            md += [C.render_table(h4, r4, markdown=True), ""]
            text += [C.render_table(h4, r4), ""]
        md += [f"Load average before/after this part: {res['loadavg_before']} / "
               f"{res['loadavg_after']}", ""]

    lines = []
    for dname, t in targets.items():
        for key, v in t.items():
            if "ratio_to_window" in v:
                val = f"{v['us']:.1f} µs, {v['ratio_to_window']:.2f}x the [-3:] case"
            elif dname == "small":
                val = f"{v['us']:.1f} µs"
            else:
                val = f"{C.fmt_ratio(v.get('ratio_to_raw'))} of raw ({v['us']:.1f} µs)"
            ok = "n/a" if v["met"] is None else ("yes" if v["met"] else "NO")
            lines.append(f"{dname}, {CASES[key][1]}: {val}; target {v['target']}: {ok}")
    return md, text, targets, lines


def _dirty_files():
    """Uncommitted changes under shmreplay/ (the working copy is what is measured)."""
    try:
        out = subprocess.run(["git", "-C", C.REPO_ROOT, "status", "--porcelain", "--",
                              "shmreplay"], capture_output=True, text=True, timeout=5)
        return [ln[3:] for ln in out.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.SubprocessError):
        return None


def _mib(n):
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def run(args):
    timing = _timing(args.quick)
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    unknown = set(libs) - set(LIBS)
    if unknown:
        raise SystemExit(f"unknown --libs {sorted(unknown)}; choose from {LIBS}")
    rng = np.random.default_rng(args.seed)
    errors = []
    shm = cpprb = None
    if "shmreplay" in libs:
        shm, why = C.load_shmreplay()
        if shm is None or not hasattr(shm.Client, "trajectory_writer"):
            why = why or "shmreplay lacks Client.trajectory_writer"
            print("shmreplay unavailable:", why)
            errors.append({"lib": "shmreplay", "where": "import", "error": why})
            shm = None
    if "cpprb" in libs:
        cpprb, why = C.load_cpprb()
        if cpprb is None:
            print("cpprb unavailable:", why)
            errors.append({"lib": "cpprb", "where": "import", "error": why})
    info = C.machine_info()
    info["shmreplay_uncommitted"] = _dirty_files()
    for ln in C.machine_lines(info):
        print(ln)
    print(f"shmreplay uncommitted changes measured: {info['shmreplay_uncommitted']}")
    print(f"mode: {'quick' if args.quick else 'full'}; timing {timing}")

    results = {}
    for dname in args.datasets.split(",") if set(libs) & set(IN_PROCESS_LIBS) else ():
        results[dname] = run_dataset(dname, args, libs, shm, cpprb, rng, timing, errors)

    reverb = None
    reverb_python = args.reverb_python or os.environ.get("REVERB_PYTHON")
    reverb_note = (f"Reverb: not measured here (no --reverb-python given); the issue quotes "
                   f"about {ISSUE_REVERB_US:g} µs per one-step item")
    if "reverb" in libs and reverb_python:
        reverb = run_reverb(reverb_python, args, errors)
        if reverb:
            v = reverb["versions"]
            reverb_note = (
                f"Reverb: dm-reverb {v.get('dm-reverb')}, tensorflow "
                f"{v.get('tensorflow') or v.get('tensorflow-cpu')}, numpy {v.get('numpy')}, "
                f"in a separate virtualenv process (not interleaved with the cases above); "
                f"in-process reverb.Server, client over localhost gRPC; a writer case is a "
                f"block of {reverb['datasets'][next(iter(reverb['datasets']))]['block']} steps "
                f"+ flush(), per step; insert fills its table with a writer first; "
                f"the issue quotes about {ISSUE_REVERB_US:g} µs per one-step item")
        else:
            reverb_note = (f"Reverb: the worker failed (see errors); the issue quotes about "
                           f"{ISSUE_REVERB_US:g} µs per one-step item (not measured here)")

    acme = {}
    if "acme" in libs:
        acme_python = (args.acme_python or os.environ.get("ACME_PYTHON")
                       or (_acme_adders.DEFAULT_ACME_PYTHON
                           if os.path.exists(_acme_adders.DEFAULT_ACME_PYTHON) else None))
        acme = _acme_adders.run(os.path.abspath(__file__),
                                {"shmreplay": acme_python, "reverb": reverb_python,
                                 "null": acme_python}, args,
                                errors, rounds=args.acme_rounds)
    md_body, text, targets, target_lines = build_report(info, args, timing, results, reverb,
                                                        errors)
    acme_md, acme_text, acme_lines = _acme_adders.report(acme, C)
    md_body += acme_md
    text += acme_text
    target_lines += acme_lines
    print()
    print("\n".join(text))
    print("\n".join(target_lines))

    dirty = info.get("shmreplay_uncommitted")
    notes = [
        "shmreplay measured as in the working copy"
        + (f", with uncommitted changes to {', '.join(dirty)}" if dirty else ""),
        f"mode: {'quick' if args.quick else 'full'}; µs per environment step, median of "
        f"{timing['repeat']} repeats (loop ≥ {timing['min_time']} s each, GC off), in-process "
        "cases interleaved; '÷ raw copy' = case / raw numpy copy; 'cpprb add ÷ case' > 1: "
        "the case is cheaper than cpprb's plain add",
        "steady state: before timing each case ran one pass of "
        + ", ".join(f"{d} {r['fill_steps']}" for d, r in results.items())
        + " steps ('first pass', one measurement, page faults included), so "
        + ("tables and rings are full and every step evicts the oldest item"
           if not args.quick else "(quick mode: tables are NOT full)"),
        "shmreplay: Uniform sampler, Fifo remover, MinSize(1); Writer(3) / "
        "trajectory_writer(3); cpprb ReplayBuffer (single process, no lock); raw copy: "
        "ring[i % N] = leaf for each of the 4 leaves",
        reverb_note,
    ]
    if not results:  # --libs acme (and reverb): only the Acme section below
        notes = notes[:1] + [f"mode: {'quick' if args.quick else 'full'}; only Acme's adders "
                             f"(--libs {args.libs})"]
    notes += target_lines
    title = "Writers: per-step cost of " + ", ".join(
        (["shmreplay's writers, cpprb, raw numpy copy"] if results else [])
        + (["Reverb"] if reverb else []) + (["Acme's adders"]
                                            if acme else []))
    md = C.markdown_header(title, info, notes)
    md += "\n" + "\n".join(md_body) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- {e['lib']} {e['where']}: `{e['error']}`"
                                          for e in errors) + "\n"
    payload = {"benchmark": "writers", "quick": args.quick, "machine": info,
               "config": {"datasets": {k: {"capacity": v["capacity"],
                                           "obs_shape": v["obs_shape"],
                                           "obs_dtype": v["obs_dtype"].__name__}
                                       for k, v in DATASETS.items()},
                          "pool": POOL, "timing": timing, "seed": args.seed,
                          "targets": {"small_us": SMALL_TARGET_US,
                                      "frames_ratio_to_raw": FRAMES_TARGET_RATIO}},
               "cases": {k: {"lib": v[0], "label": v[1]} for k, v in CASES.items()},
               "results": results,
               "reverb": reverb if reverb else {"measured": False, "note": reverb_note,
                                                "issue_figure_us": ISSUE_REVERB_US},
               "acme_adders": acme or {"measured": False},
               "targets": targets, "summary": target_lines, "errors": errors}
    stem = "writers" + (f"-{args.tag}" if args.tag else "" if args.quick
                        else f"-{info['date'][:10]}") + ("-quick" if args.quick else "")
    paths = C.write_results(stem, payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    # Only this script's segments: other processes (a test run) may hold bench-* ones.
    left = C.leftover_segments(f"shmreplay.{args.prefix}-")
    if left:
        print(f"WARNING: left in /dev/shm: {left}", file=sys.stderr)
    return 1 if (errors or left) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="few short repeats, tables not filled (a smoke run, a few seconds)")
    p.add_argument("--libs", default=",".join(DEFAULT_LIBS),
                   help=f"comma-separated subset of {','.join(LIBS)} (default: all but acme)")
    p.add_argument("--datasets", default="small,frames", help="small,frames or one of them")
    p.add_argument("--reverb-python", default=None,
                   help="python of a virtualenv with dm-reverb (default: $REVERB_PYTHON)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="bench-writers", help="shared-memory name prefix")
    p.add_argument("--tag", default="", help="a name for this run's result files")
    p.add_argument("--acme-python", default=None,
                   help="python of a virtualenv with dm-acme, for Acme's adders on shmreplay "
                        f"(default: $ACME_PYTHON, else {_acme_adders.DEFAULT_ACME_PYTHON})")
    p.add_argument("--acme-rounds", type=int, default=3,
                   help="worker rounds per backend for Acme's adders (alternating)")
    p.add_argument("--reverb-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--acme-worker", choices=_acme_adders.BACKENDS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reverb_worker:
        return reverb_worker(args)
    if args.acme_worker:
        return _acme_adders.worker(args.acme_worker, DATASETS, args.datasets.split(","),
                                   make_pool, _timing(args.quick), args.quick, args.seed,
                                   args.prefix)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

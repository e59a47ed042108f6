#!/usr/bin/env python
"""Items per second delivered to one consumer in one process: sample_batch vs the datasets.

A table of 100_000 items (``Uniform()`` sampler, ``Fifo()`` remover, ``MinSize(1)``),
filled before timing, for two item shapes:

* *small*:  obs float32[8], action int64, reward float32, next_obs float32[8];
* *frames*: obs uint8[84,84,4], action int64, reward float32 (about 2.8 GB of shared
            memory for 100_000 items).

For batch sizes B = 32 and 256, one consumer takes batches from:

==============  ============================================================================
sample_batch    ``client.sample_batch(table, B)`` in a loop, numpy out (the baseline)
make_dataset    ``shmreplay.tf.make_dataset(name, table, batch_size=B, prefetch_size=2,
                num_parallel_calls=1)`` (one call at a time: keeps a FIFO table's
                order), and the same with ``num_parallel_calls=2`` (two calls overlap:
                for tables with no order; the default picks it for batches >= 1 MiB)
traj.batch      ``shmreplay.tf.TrajectoryDataset.from_table_signature(name, table,
                max_in_flight_samples_per_worker=2 * B).batch(B)`` (a per-item dataset
                re-batched by tf.data)
jax             ``shmreplay.jax.BatchIterator(client, table, B, prefetch=2,
                num_workers=1)``, each batch passed to ``jax.block_until_ready``; and the
                same with ``num_workers=2`` (the default for batches >= 1 MiB)
==============  ============================================================================

Each TensorFlow dataset is consumed three ways, each from its own iterator made once:

* *eager*: ``next(iterator)``, which is what ``for sample in dataset`` does per batch;
* *tf.function step*: ``step(iterator)``, a ``tf.function`` that takes the iterator, calls
  ``next`` and returns ``tf.reduce_sum(sample.data["reward"])`` (a training step's input
  side: one Python call per batch);
* *tf.function loop*: one ``tf.function`` call runs ``K`` such steps in a ``tf.range``
  loop (Keras' ``steps_per_execution`` pattern: no Python per batch, so this is the rate
  at which the pipeline itself produces batches).

Breakdown rows (not judged; they say where the time goes): eager ``next`` and a
``tf.function`` step over ``Dataset.from_tensors(sample).repeat()`` with the same
``ReplaySample`` structure (TF's own per-batch cost, no sampling); ``from_generator``
yielding one fixed sample, in the ``tf.function`` loop (its per-element cost, no
sampling); ``sample_batch`` + ``jax.device_put`` of each data leaf + ``block_until_ready``
in the consumer's thread (``BatchIterator``'s work without its thread and queue).

TensorFlow and JAX run in separate worker processes (``--worker tf`` / ``--worker jax``,
started by this script; they attach to the tables by name), so that neither disturbs
the other and each has its own baseline. Each worker first times ``sample_batch`` alone
for every shape and B, before it makes any dataset: the **baseline** (a process that
calls ``sample_batch`` itself builds no dataset). It then times all its cases of one (shape, B) interleaved,
``sample_batch`` again among them ("interleaved"): a ``from_generator`` dataset makes
TensorFlow fix glibc's mmap threshold at 128 KiB (``mallopt``), after which a freshly
allocated batch array of 128 KiB or more is freshly mapped and page-faulted; shmreplay
gathers large batches into recycled memory (``shmreplay._engine.outputs``) so that the two
baseline rows should agree.

Timing is timeit-style as in the other scripts: every case is a zero-argument callable
that delivers one batch (the loop case: ``K`` batches); warm-up, a loop count calibrated
per case, the median of repeats (9 full, 3 quick) with the garbage collector off, the
repeats of the cases interleaved so background load hits them alike. Before each timed
repeat a prefetching case first delivers a few batches untimed, so that the batches its
thread prepared while other cases ran are not counted. Reported: items/s = items per
call / median seconds per call, and its ratio to the baseline. "First batch" is one
measurement of making the dataset, ``iter`` and the first ``next``.

Target (the issue): "a batched dataset delivers at least 80% of the items/s that
sample_batch delivers in the same process for the same batch size" (ratio >= 0.8).

Usage:  python benchmarks/bench_datasets.py [--quick] [--datasets small,frames]
                                            [--batch-sizes 32,256] [--libs tf,jax]
Writes: benchmarks/results/datasets-<date>.{json,md} (quick: datasets-quick.{json,md})
"""

import argparse
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import numpy as np  # noqa: E402

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


def _timing(quick):
    return (dict(repeat=3, min_time=0.005, warmup=0.01) if quick
            else dict(repeat=9, min_time=0.2, warmup=0.5))


def _loop_steps(quick):
    return 4 if quick else 32


def item_nbytes(dname):
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
               for shape, dtype in SHAPES[dname].values())


def _record_error(errors, lib, where, exc):
    tb = traceback.format_exc()
    print(f"{lib} {where} failed:\n{tb}", flush=True)
    errors.append({"lib": lib, "where": where, "error": repr(exc), "traceback": tb})


# --------------------------------------------------------------------------- timing

def time_steady(fns, skips, *, repeat, min_time, warmup, max_number=1_000_000):
    """``_common.time_interleaved`` with ``skips[k]`` untimed calls of case ``k`` just
    before each of its timed repeats (a prefetching pipeline's head start is not timed).

    Returns ``{label: {"median", "best", "number", "repeat"}}`` (seconds per call).
    """
    perf = time.perf_counter
    numbers = {k: C._warm_and_calibrate(f, min_time, warmup, max_number)
               for k, f in fns.items()}
    per_call = {k: [] for k in fns}
    order = list(fns)
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(repeat):
            for k in (order if r % 2 == 0 else order[::-1]):
                fn, number = fns[k], numbers[k]
                for _ in range(skips.get(k, 0)):
                    fn()
                t0 = perf()
                for _ in itertools.repeat(None, number):
                    fn()
                per_call[k].append((perf() - t0) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {k: {"median": statistics.median(v), "best": min(v), "number": numbers[k],
                "repeat": repeat} for k, v in per_call.items()}


# --------------------------------------------------------------------------- worker

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
                _record_error(errors, "shmreplay", "close", exc)
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


def _row(n, t):
    return {"items_per_call": n, "median_us_per_call": t["median"] * 1e6,
            "best_us_per_call": t["best"] * 1e6, "items_per_s": n / t["median"],
            "best_items_per_s": n / t["best"], "number": t["number"], "repeat": t["repeat"]}


def worker(args):
    """Runs one library's cases against existing tables (``--servers shape=name,...``);
    prints one JSON line."""
    lib = args.worker
    timing = _timing(args.quick)
    K = _loop_steps(args.quick)
    servers = dict(kv.split("=", 1) for kv in args.servers.split(","))
    out = {"lib": lib, "versions": {}, "shapes": {d: {} for d in servers}, "errors": []}
    errors = out["errors"]
    import shmreplay
    try:
        if lib == "tf":
            import tensorflow as tf
            from shmreplay import tf as _stf  # noqa: F401 - fail here, not per group
            out["versions"]["tensorflow"] = tf.__version__
        else:
            import jax
            from shmreplay import jax as _sj  # noqa: F401
            out["versions"]["jax"] = jax.__version__
            out["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception as exc:  # noqa: BLE001
        _record_error(errors, f"shmreplay.{lib}", "import", exc)
        print(json.dumps(out, default=str), flush=True)
        return 1
    clients = {}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    try:
        for dname, name in servers.items():
            clients[dname] = shmreplay.Client(name)
        # the baseline: sample_batch in this process before any dataset exists
        for dname, client in clients.items():
            for B in sizes:
                sb = client.sample_batch
                t = C.time_per_call((lambda f, b: lambda: f(TABLE, b))(sb, B), **timing)
                out["shapes"][dname][str(B)] = {"batch_size": B, "loop_steps": K,
                                                "cases": {"baseline": _row(B, t)},
                                                "first_batch_ms": {}}
                print(f"  [{lib}] {dname} B={B}: {CASES['baseline'][1]} "
                      f"{C.fmt_num(B / t['median'])} items/s", flush=True)
        for dname, client in clients.items():
            for B in sizes:
                g = out["shapes"][dname][str(B)]
                where = f"{dname} B={B}"
                g["loadavg_before"] = C.load_average()
                cases = Cases()
                try:
                    sample = client.sample_batch(TABLE, B)
                    sb = client.sample_batch
                    cases.fns["sample_batch"] = (lambda f, b: lambda: f(TABLE, b))(sb, B)
                    cases.items["sample_batch"] = B
                    try:
                        if lib == "tf":
                            build_tf_cases(cases, servers[dname], B, K, sample)
                        else:
                            build_jax_cases(cases, client, B)
                    except Exception as exc:  # noqa: BLE001 - report, never work around
                        _record_error(errors, f"shmreplay.{lib}", f"{where} setup", exc)
                    g["first_batch_ms"] = dict(cases.first_batch_ms)
                    fns = {k: cases.fns[k] for k in CASES if k in cases.fns}
                    try:
                        timed = time_steady(fns, cases.skips, **timing)
                    except Exception as exc:  # noqa: BLE001
                        _record_error(errors, f"shmreplay.{lib}", f"{where} timing", exc)
                        timed = {}
                    for key, t in timed.items():
                        g["cases"][key] = _row(cases.items[key], t)
                        print(f"  [{lib}] {where}: {CASES[key][1]} "
                              f"{C.fmt_num(g['cases'][key]['items_per_s'])} items/s",
                              flush=True)
                finally:
                    cases.close(errors)
                g["loadavg_after"] = C.load_average()
    except Exception as exc:  # noqa: BLE001
        _record_error(errors, f"shmreplay.{lib}", "run", exc)
    finally:
        for client in clients.values():
            client.close()
    print(json.dumps(out, default=str), flush=True)
    return 1 if errors else 0


def run_worker(lib, servers, args, errors):
    """Starts ``--worker lib`` on the tables ``{shape: buffer name}``; echoes its
    progress; returns its JSON."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib,
           "--servers", ",".join(f"{d}={n}" for d, n in servers.items()),
           "--batch-sizes", args.batch_sizes] + (["--quick"] if args.quick else [])
    with tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        except OSError as exc:
            errors.append({"lib": lib, "where": "worker", "error": repr(exc)})
            return None
        result = None
        for line in proc.stdout:
            if line.startswith("{"):
                result = json.loads(line)
            else:
                print(line, end="", flush=True)
        rc = proc.wait()
        err.seek(0)
        tail = err.read()[-3000:]
    if result is None:
        errors.append({"lib": lib, "where": "worker", "error": f"exit {rc}",
                       "stderr_tail": tail})
        print(f"{lib} worker exited {rc}:\n{tail}")
        return None
    errors.extend(result.get("errors", []))
    return result


# --------------------------------------------------------------------------- parent

def fill_table(client, dname, capacity, rng):
    """``capacity`` items by ``insert_batch`` (a pool of ``FILL_CHUNK`` random items
    inserted repeatedly)."""
    chunk = min(FILL_CHUNK, capacity)
    batch = {}
    for k, (shape, dtype) in SHAPES[dname].items():
        if dtype == np.uint8:
            batch[k] = rng.integers(0, 256, (chunk,) + shape, dtype=np.uint8)
        elif np.issubdtype(dtype, np.integer):
            batch[k] = rng.integers(0, 18, (chunk,) + shape).astype(dtype)
        else:
            batch[k] = rng.standard_normal((chunk,) + shape).astype(dtype)
    left = capacity
    while left > 0:
        n = min(chunk, left)
        part = batch if n == chunk else {k: v[:n] for k, v in batch.items()}
        client.insert_batch(part, {TABLE: 1.0})
        left -= n


def _dirty_files():
    """Uncommitted changes under shmreplay/ (the working copy is what is measured)."""
    try:
        out = subprocess.run(["git", "-C", C.REPO_ROOT, "status", "--porcelain", "--",
                              "shmreplay"], capture_output=True, text=True, timeout=5)
        return [ln[3:] for ln in out.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.SubprocessError):
        return None


def _spec_text(dname):
    return ", ".join(f"{k} {np.dtype(d).name}{list(s)}" for k, (s, d) in SHAPES[dname].items())


def run(args):
    timing = _timing(args.quick)
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    unknown = set(libs) - set(LIBS)
    if unknown:
        raise SystemExit(f"unknown --libs {sorted(unknown)}; choose from {LIBS}")
    dnames = [d.strip() for d in args.datasets.split(",")]
    rng = np.random.default_rng(args.seed)
    errors = []
    shm, why = C.load_shmreplay()
    if shm is None:
        print("shmreplay unavailable:", why)
        return 1
    info = C.machine_info()
    for dist in ("tensorflow", "tensorflow-cpu", "jax", "jaxlib"):
        info["versions"][dist] = C._version(dist)
    info["shmreplay_uncommitted"] = _dirty_files()
    info["switch_interval_s"] = sys.getswitchinterval()
    for ln in C.machine_lines(info):
        print(ln)
    print(f"shmreplay uncommitted changes measured: {info['shmreplay_uncommitted']}")
    print(f"mode: {'quick' if args.quick else 'full'}; timing {timing}; "
          f"loop K = {_loop_steps(args.quick)}", flush=True)

    from shmreplay import rate_limiters, selectors
    results = {}
    servers = {}
    try:
        for dname in dnames:
            capacity = QUICK_CAPACITY[dname] if args.quick else CAPACITY
            res = {"capacity": capacity, "item_bytes": item_nbytes(dname), "groups": {}}
            results[dname] = res
            tables = [shm.Table(TABLE, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                                max_size=capacity, rate_limiter=rate_limiters.MinSize(1))]
            servers[dname] = shm.Server(tables=tables,
                                        name=f"bench-datasets-{dname}-{os.getpid()}")
            with shm.Client(servers[dname].name) as client:
                t0 = time.perf_counter()
                fill_table(client, dname, capacity, rng)
                res["fill_s"] = time.perf_counter() - t0
                res["current_size"] = int(client.server_info()[TABLE].current_size)
            print(f"{dname}: {_spec_text(dname)} ({res['item_bytes']} bytes/item); "
                  f"{res['current_size']} items filled in {res['fill_s']:.1f} s", flush=True)
        for lib in libs:
            print(f"\n== {lib} worker", flush=True)
            out = run_worker(lib, {d: s.name for d, s in servers.items()}, args, errors)
            if out is None:
                continue
            info.setdefault("worker_versions", {}).update(out.get("versions", {}))
            if out.get("jax_devices"):
                info["jax_devices"] = out["jax_devices"]
            for dname, groups in out["shapes"].items():
                for B, g in groups.items():
                    results[dname]["groups"].setdefault(B, {})[lib] = g
    except Exception as exc:  # noqa: BLE001
        _record_error(errors, "shmreplay", "setup", exc)
    finally:
        for server in servers.values():
            server.stop()

    md_body, text, targets, target_lines = build_report(results, args)
    print()
    print("\n".join(text))
    print("\n".join(target_lines))

    dirty = info.get("shmreplay_uncommitted")
    notes = [
        "shmreplay measured as in the working copy"
        + (f", with uncommitted changes to {', '.join(dirty)}" if dirty else ""),
        f"mode: {'quick' if args.quick else 'full'}; one consumer; items/s = items per call "
        f"/ median of {timing['repeat']} repeats (loop ≥ {timing['min_time']} s each, GC off); "
        "the cases of one (shape, B, library) interleaved, prefetching cases first deliver "
        f"{SKIP_BATCHES} batches (loops: one call) untimed before each repeat",
        "ratio = items/s ÷ the baseline: sample_batch timed in the same worker process "
        "before it made any dataset; 'sample_batch, interleaved' is the same call timed "
        "among the cases (in the TF worker, after from_generator fixed glibc's mmap "
        "threshold at 128 KiB)",
        "table of " + ", ".join(f"{d} {r['capacity']}" for d, r in results.items())
        + " items, Uniform sampler, Fifo remover, MinSize(1), filled before timing "
        "(sampling removes nothing); TF and JAX each in its own worker process",
        "eager next() = one iteration of `for sample in dataset`; tf.function step = "
        "`step(iterator)` returning tf.reduce_sum(sample.data['reward']) per batch; "
        f"tf.function loop = {_loop_steps(args.quick)} such steps in a tf.range loop per call",
        f"TensorFlow {info['versions'].get('tensorflow') or info['versions'].get('tensorflow-cpu')}"
        f" (default tf.data options and thread pools), JAX {info['versions'].get('jax')} "
        f"on {', '.join(info.get('jax_devices', ['n/a']))}; Python GIL switch interval "
        f"{info['switch_interval_s'] * 1e3:g} ms",
    ] + target_lines
    md = C.markdown_header("Datasets: items/s delivered to one consumer, against sample_batch",
                           info, notes)
    md += "\n" + "\n".join(md_body) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- {e['lib']} {e['where']}: `{e['error']}`"
                                          for e in errors) + "\n"
    payload = {"benchmark": "datasets", "quick": args.quick, "machine": info,
               "config": {"shapes": {d: {k: {"shape": s, "dtype": np.dtype(t).name}
                                         for k, (s, t) in v.items()}
                                     for d, v in SHAPES.items()},
                          "capacity": {d: r["capacity"] for d, r in results.items()},
                          "batch_sizes": args.batch_sizes, "prefetch": PREFETCH,
                          "loop_steps": _loop_steps(args.quick), "timing": timing,
                          "skip_batches": SKIP_BATCHES, "target_ratio": TARGET,
                          "seed": args.seed},
               "cases": {k: {"worker": v[0], "label": v[1], "judged": v[2]}
                         for k, v in CASES.items()},
               "results": results, "targets": targets, "summary": target_lines,
               "errors": errors}
    stem = "datasets-quick" if args.quick else f"datasets-{info['date'][:10]}"
    paths = C.write_results(stem, payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    # Only this script's segments: other processes (a test run) may hold bench-* ones.
    left = C.leftover_segments("shmreplay.bench-datasets-")
    if left:
        print(f"WARNING: left in /dev/shm: {left}", file=sys.stderr)
    return 1 if (errors or left) else 0


# --------------------------------------------------------------------------- report

def build_report(results, args):
    """(markdown lines, printable lines, targets dict, target summary lines)."""
    md, text, targets, lines = [], [], {}, []
    headers = ["case", "items/s", "µs/batch", "÷ baseline", f"≥ {TARGET:g}",
               "first batch ms"]
    for dname, res in results.items():
        for B, per_lib in res["groups"].items():
            rows = []
            loads = []
            for lib, g in per_lib.items():
                base = g["cases"].get("baseline")
                base_rate = base["items_per_s"] if base else None
                for key, (wlib, label, judged) in CASES.items():
                    c = g["cases"].get(key)
                    if c is None or (wlib is not None and wlib != lib):
                        continue
                    ratio = c["items_per_s"] / base_rate if base_rate else None
                    c["ratio"] = ratio
                    ok = ""
                    if judged and ratio is not None:
                        ok = "(quick)" if args.quick else ("yes" if ratio >= TARGET else "NO")
                        targets.setdefault(dname, {}).setdefault(B, {})[key] = {
                            "items_per_s": c["items_per_s"], "ratio": ratio,
                            "met": None if args.quick else ratio >= TARGET}
                    fb = g["first_batch_ms"].get(key)
                    us_batch = c["median_us_per_call"] * int(B) / c["items_per_call"]
                    rows.append([f"[{lib}] {label}", C.fmt_num(c["items_per_s"]),
                                 C.fmt_num(us_batch, 1), C.fmt_ratio(ratio), ok,
                                 "" if fb is None else f"{fb:.1f}"])
                loads.append(f"{lib} worker {g.get('loadavg_before')} / "
                             f"{g.get('loadavg_after')}")
            title = (f"{dname} ({_spec_text(dname)}; {res['item_bytes']} bytes/item; "
                     f"table {res.get('current_size')} items), B = {B}")
            md += [f"#### {title}", "", C.render_table(headers, rows, markdown=True), "",
                   "Load average before/after: " + "; ".join(loads), ""]
            text += [title, C.render_table(headers, rows), ""]
    for dname, per_b in targets.items():
        for B, t in per_b.items():
            met = [k for k, v in t.items() if v["met"]]
            ratios = ", ".join(f"{k} {C.fmt_ratio(v['ratio'])}" for k, v in t.items())
            verdict = ("not judged in quick mode" if args.quick else
                       f"{len(met)}/{len(t)} meet ≥ {TARGET:g}"
                       + (f" ({', '.join(met)})" if met else ""))
            lines.append(f"{dname}, B={B}: {verdict}; ratios {ratios}")
    return md, text, targets, lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="few short repeats, a smaller frames table (a smoke run)")
    p.add_argument("--datasets", default="small,frames", help="small,frames or one of them")
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    p.add_argument("--libs", default=",".join(LIBS),
                   help=f"comma-separated subset of {','.join(LIBS)} (one worker process each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    p.add_argument("--servers", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

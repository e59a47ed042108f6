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

The code: this script parses the arguments, fills the tables, starts the workers and
writes the results; ``_datasets_cases.py`` makes the cases, ``_datasets_worker.py`` is the
worker process (and its start), ``_datasets_report.py`` renders the tables.

Usage:  python benchmarks/bench_datasets.py [--quick] [--datasets small,frames]
                                            [--batch-sizes 32,256] [--libs tf,jax]
Writes: benchmarks/results/datasets-<date>.{json,md} (quick: datasets-quick.{json,md})
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _datasets_cases import (BATCH_SIZES, CAPACITY, CASES, FILL_CHUNK, LIBS,  # noqa: E402
                             PREFETCH, QUICK_CAPACITY, SHAPES, SKIP_BATCHES, TABLE, TARGET,
                             item_nbytes, loop_steps, spec_text, timing_settings)
from _datasets_report import build_report  # noqa: E402
from _datasets_worker import run_worker, worker  # noqa: E402

import numpy as np  # noqa: E402


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

def run(args):
    timing = timing_settings(args.quick)
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
    info["shmreplay_uncommitted"] = C.dirty_files()
    info["switch_interval_s"] = sys.getswitchinterval()
    for ln in C.machine_lines(info):
        print(ln)
    print(f"shmreplay uncommitted changes measured: {info['shmreplay_uncommitted']}")
    print(f"mode: {'quick' if args.quick else 'full'}; timing {timing}; "
          f"loop K = {loop_steps(args.quick)}", flush=True)

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
            print(f"{dname}: {spec_text(dname)} ({res['item_bytes']} bytes/item); "
                  f"{res['current_size']} items filled in {res['fill_s']:.1f} s", flush=True)
        for lib in libs:
            print(f"\n== {lib} worker", flush=True)
            out = run_worker(__file__, lib, {d: s.name for d, s in servers.items()}, args, errors)
            if out is None:
                continue
            info.setdefault("worker_versions", {}).update(out.get("versions", {}))
            if out.get("jax_devices"):
                info["jax_devices"] = out["jax_devices"]
            for dname, groups in out["shapes"].items():
                for B, g in groups.items():
                    results[dname]["groups"].setdefault(B, {})[lib] = g
    except Exception as exc:  # noqa: BLE001
        C.record_error(errors, "shmreplay", "setup", exc)
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
        f"tf.function loop = {loop_steps(args.quick)} such steps in a tf.range loop per call",
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
                          "loop_steps": loop_steps(args.quick), "timing": timing,
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

#!/usr/bin/env python
"""Train steps per second: a step on a constant batch against the same step fed from a table.

What a learner's user sees is train steps per second, so this measures the learner's
step, not the sampling: the same compiled step runs on a batch already in memory
("constant") and on batches fed from shmreplay ("fed"), and the ratio fed / constant
says how much of the learner's speed the feed costs.

Rows (issue 20, second half):

* learners: JAX, ``shmreplay.jax.BatchIterator`` and a ``jax.jit`` step; TensorFlow,
  ``shmreplay.tf.make_dataset`` (and ``shmreplay.tf.PackedBatches``, case
  ``fed_packed``) and a ``tf.function`` step;
* workloads: *transitions* (obs f32[15], act f32[3], rew f32, next_obs f32[15], done
  f32; a Q-network MLP 256x256 on obs+act, TD loss, SGD), batch 256, ``Prioritized(0.6)``
  table of 32,768 items, importance weights in the step and priorities ``|td| + 1e-6``
  updated after every step; *atari* (obs, next_obs u8[84,84,4], action i32, reward,
  discount f32; the Nature-DQN convnet, Q-learning loss, SGD), batch 32, uniform table
  of 3,000 items. The TF step takes its targets from a frozen copy of the network
  (the same work; since 2026-11-28, after a long run diverged to NaN); the JAX step from
  the network itself;
* without an actor, and with one actor in a spawned process inserting single items at
  ``--actor-rate`` per second into the same table (the constant step is then measured
  with that actor running too).

Each row runs in its own process (JAX and TensorFlow never share one). Within it,
``--rounds`` rounds alternate constant and fed (the order flips each round), each
``--seconds`` long (three times that for atari, a few steps a second on a busy
2-core machine) after a warm-up and, each time, ``LEAD_STEPS`` untimed steps (so a
fed case does not start with batches its feed prepared while other cases ran); steps/s
of every round are kept, and the table's
figures are medians over rounds. The constant JAX loop never waits for a step's result
(the fastest a JAX learner can go); the fed one does whatever the feed needs.

Fed variants (all in the JSON; the table uses ``fed``):

* ``host`` (both): the framework's own floor for fresh data, with no shmreplay, no
  iterator and no thread: one batch sampled once, as numpy arrays copied to fresh
  memory every step and passed to the step as its argument (JAX: the jitted step moves
  them in its call; TF: the ``tf.function`` converts them). What ingesting a new
  batch from host memory costs the step;
* ``floor`` (both): the same feeding machinery over one batch sampled once, no
  priority updates: JAX, a ``BatchIterator`` whose client's ``sample_batch`` returns
  that batch; TF, a ``range`` mapped through one ``numpy_function`` returning it
  (packed as ``make_dataset`` packs), prefetch 2, into the same ``tf.function``. What
  feeding a learner from host memory costs on this machine, with no shmreplay work;
* ``gather`` (JAX): the least any replay must do, with no replay: numpy gathering 256
  random rows of columns as large as the table's (no sampling structure, no
  priorities, no update), passed to the step as ``host`` 's are;
* JAX: ``fed``: ``update_priorities(keys, td, wait=False)`` (queued, applied by the
  iterator's thread when the step has computed ``td``); ``fed_wait``: the default
  ``wait=True``, which waits for the step before the next one is dispatched;
  ``fed_inline`` and ``floor_inline``: ``fed`` and ``floor`` with ``prefetch=0`` (no
  thread: ``next`` samples in the learner's thread, the updates are applied by its
  later calls);
* TF: ``fed``: a ``tf.function`` takes the iterator of ``make_dataset`` (its default
  ``batches_per_call``), calls ``next`` and runs the step;
  it returns the keys and TD errors and ``Client.update_priorities`` runs beside it,
  after each call (the tensors are computed by then: ``.numpy()`` is free);
  ``fed_packed`` (its own table rows, "TF, ``PackedBatches``"): ``next`` of a
  ``shmreplay.tf.PackedBatches`` samples in the learner's thread and packs the batch
  in one tensor, the ``tf.function`` takes it as its argument and unpacks it, and
  ``PackedBatches.update_priorities`` sets ``|td| + 1e-6`` after the call;
  ``gather_packed``: its floor with no replay, numpy gathering 256 random rows of
  columns as large as the table's, packed and passed the same way;
  ``fed_k1``: the same with ``batches_per_call=1`` (one ``numpy_function`` call per
  batch); ``fed_no_update``: ``fed`` without the priority updates (what they cost);
  ``fed_in_graph``: the same with ``TFClient.update_priorities`` inside the function;
  ``fed_eager_loop``: ``for sample in dataset`` (eager ``next``) with the step taking
  the sample as its argument and the update beside it; ``constant_arg``: the
  constant batch passed as the argument of the ``tf.function`` (the constant case
  itself takes it from ``from_tensors(batch).repeat()``, through the same
  ``next(iterator)`` as the fed step); ``floor_k8`` (tables whose leaves all pack into
  one array): the floor with one ``numpy_function`` call per 8 batches, split by
  ``unbatch``.

Reverb (``--reverb-python PATH``, default ``$REVERB_PYTHON``): the TF rows also fed by
Reverb's own ``TrajectoryDataset`` in Reverb's virtualenv, rows ``reverb`` (how: the
docstring of ``_learner_feed_reverb.py``).

Run ``python benchmarks/bench_learner_feed.py`` (about 15 minutes on a busy 2-core machine); ``--quick`` for a
smoke run. Results: ``benchmarks/results/learner-feed-<date>[-suffix].json`` and ``.md``.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import _learner_feed_reverb as RV  # noqa: E402
from _learner_feed_cases import TABLE, jax_cases, tf_cases  # noqa: E402
from _learner_timing import LEAD_STEPS, alternate  # noqa: E402
from _learner_models import WORKLOADS, make_items  # noqa: E402

# --------------------------------------------------------------------------- items

def make_server(shmreplay, name, workload):
    from shmreplay import rate_limiters, selectors
    spec = WORKLOADS[workload]
    sampler = selectors.Prioritized(0.6) if spec["per"] else selectors.Uniform()
    server = shmreplay.Server([shmreplay.Table(
        TABLE, sampler=sampler, remover=selectors.Fifo(), max_size=spec["size"],
        rate_limiter=rate_limiters.MinSize(1))], name=name)
    client = shmreplay.Client(name)
    rng = np.random.default_rng(0)
    for start in range(0, spec["size"], 500):
        n = min(500, spec["size"] - start)
        client.insert_batch(make_items(workload, n, rng),
                            priorities={TABLE: rng.random(n) + 0.1})
    return server, client


def actor(name, workload, rate, stop):
    """Inserts single items at ``rate`` per second until ``stop`` is set."""
    import shmreplay
    client = shmreplay.Client(name)
    rng = np.random.default_rng(1)
    pool = make_items(workload, 64, rng)
    items = [{k: v[i] for k, v in pool.items()} for i in range(64)]
    t0, n = time.monotonic(), 0
    while not stop.is_set():
        client.insert(items[n % 64], priorities={TABLE: 1.0})
        n += 1
        ahead = t0 + n / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    client.close()


# --------------------------------------------------------------------------- one row

def run_row(args):
    """One (framework, workload, actor) row in this process; prints its JSON."""
    import shmreplay
    name = f"{args.prefix}-{os.getpid()}"
    server, client = make_server(shmreplay, name, args.workload)
    refs, procs = [], []
    stop = None
    try:
        if args.actor:
            ctx = multiprocessing.get_context("spawn")
            stop = ctx.Event()
            procs.append(ctx.Process(target=actor, args=(name, args.workload,
                                                         args.actor_rate, stop)))
            procs[0].start()
        build = jax_cases if args.framework == "jax" else tf_cases
        cases = build(client, name, args.workload, refs)
        scale = WORKLOADS[args.workload]["time"]
        rates, cpu = alternate(cases, args.rounds, args.seconds * scale, args.warmup * scale)
    finally:
        if stop is not None:
            stop.set()
        _common.reap(procs)
        for ref in refs:
            close = getattr(ref, "close", None)
            if callable(close):
                close()
        refs.clear()
        client.close()
        server.stop()
    print("ROW " + json.dumps({"framework": args.framework, "workload": args.workload,
                               "actor": bool(args.actor), "steps_per_s": rates,
                               "cpu_s_per_step": cpu}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frameworks", default="jax,tf")
    parser.add_argument("--workloads", default="transitions,atari")
    parser.add_argument("--actors", default="off,on", help="off, on, or off,on")
    parser.add_argument("--actor-rate", type=float, default=1000.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--prefix", default="shmreplay.bench-feed",
                        help="shared-memory name prefix of the buffers")
    parser.add_argument("--suffix", default="", help="results file name suffix")
    parser.add_argument("--reverb-python", default=None,
                        help="python of a virtualenv with dm-reverb (default: $REVERB_PYTHON)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--row", nargs=3, metavar=("FRAMEWORK", "WORKLOAD", "ACTOR"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.warmup = 2, 1.0, 1.0
    if args.row:
        args.framework, args.workload, actor_flag = args.row
        args.actor = actor_flag == "on"
        return run_row(args)

    info = _common.machine_info()
    rows = []
    for framework in args.frameworks.split(","):
        for workload in args.workloads.split(","):
            for actor_flag in args.actors.split(","):
                cmd = [sys.executable, os.path.abspath(__file__), "--row", framework,
                       workload, actor_flag, "--rounds", str(args.rounds), "--seconds",
                       str(args.seconds), "--warmup", str(args.warmup), "--prefix",
                       args.prefix, "--actor-rate", str(args.actor_rate)]
                out = subprocess.run(cmd, capture_output=True, text=True,
                                     timeout=900 + 16 * args.rounds * args.seconds)
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
                if out.returncode or not lines:
                    print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                    rows.append({"framework": framework, "workload": workload,
                                 "actor": actor_flag == "on", "error": out.stderr[-2000:]})
                    continue
                row = json.loads(lines[-1][4:])
                rows.append(row)
                print(row_line(row), flush=True)
    for row in RV.run_rows(args):
        rows.append(row)
        print(row_line(row) if "error" not in row else row["error"], flush=True)
    report(rows, info, args)
    _common.check_clean()


def medians(row):
    return {k: statistics.median(v) for k, v in row["steps_per_s"].items()}


def paired_ratio(row, label="fed"):
    """The median over rounds of (label's steps/s) / (constant's, same round)."""
    rates = row["steps_per_s"]
    return statistics.median(f / c for f, c in zip(rates[label], rates["constant"]))


def cpu_us(row, label):
    return 1e6 * statistics.median(row["cpu_s_per_step"][label])


def row_line(row):
    m = medians(row)
    rates = row["steps_per_s"]
    parts = [f"{row['framework']:3} {row['workload']:11} actor={'on ' if row['actor'] else 'off'}"]
    for label, values in rates.items():
        parts.append(f"{label} {m[label]:8.1f} ({', '.join(f'{v:.0f}' for v in values)})")
    parts += [f"{k}/constant {paired_ratio(row, k):.2f}" for k in m if k != "constant"]
    parts += [f"cpu/step {k} {cpu_us(row, k):.0f}us" for k in m]
    return "  ".join(parts)


def report(rows, info, args):
    headers = ["learner", "workload", "actor", "constant batch (steps/s)",
               "fed from the table", "ratio", "CPU per step: constant / fed (ms)"]
    names = {"jax": "JAX, `BatchIterator`", "tf": "TF, `make_dataset` + `tf.function`",
             "reverb": "TF, Reverb `TrajectoryDataset` + `tf.function`"}
    loads = {"transitions": "transitions, MLP 256x256, batch 256, PER",
             "atari": "Atari frames, Nature-DQN convnet, batch 32"}
    table = []
    for row in rows:
        if "error" in row:
            table.append([names[row["framework"]], loads[row["workload"]],
                          "on" if row["actor"] else "off", "error", "", "", ""])
            continue
        m = medians(row)
        row["median_steps_per_s"] = m
        row["ratio"] = {label: paired_ratio(row, label) for label in m if label != "constant"}
        table.append([names[row["framework"]], loads[row["workload"]],
                      "on" if row["actor"] else "off", f"{m['constant']:,.1f}",
                      f"{m['fed']:,.1f}", f"{row['ratio']['fed']:.2f}",
                      f"{cpu_us(row, 'constant') / 1e3:.2f} / {cpu_us(row, 'fed') / 1e3:.2f}"])
    notes = [f"{args.rounds} rounds of {args.seconds} s per case (atari: "
             f"{args.seconds * WORKLOADS['atari']['time']} s), the cases alternating, each "
             f"after {LEAD_STEPS} untimed steps; steps/s: medians over rounds; ratio: the "
             "median over rounds of fed / constant in the same round; CPU: the whole "
             "process's (all threads) per step, median",
             f"actor (rows 'on'): single inserts at {args.actor_rate:.0f}/s in a spawned "
             "process, running while both constant and fed are measured",
             "rows 'Reverb': the same step fed by Reverb's `TrajectoryDataset` (batched, "
             "prefetch 2) from a `reverb.Server` table like the shmreplay one, priorities by "
             "`mutate_priorities` beside the step (see `_learner_feed_reverb.py`)",
             f"load average at end {_common.load_average()}"]
    md = _common.markdown_report("Learner feed: train steps/s, constant batch vs fed",
                                 info, notes, headers, table)
    variants = [(r, label) for r in rows for label in r.get("steps_per_s", {})
                if label not in ("constant", "fed")]
    if variants:
        md += ("\nOther ways to feed the same step (steps/s, median; paired ratio to "
               "constant):\n\n")
        for r, label in variants:
            md += (f"- {r['framework']} {r['workload']}, actor {'on' if r['actor'] else 'off'}, "
                   f"`{label}`: {medians(r)[label]:,.1f} ({r['ratio'][label]:.2f})\n")
    print(md)
    if not args.no_write:
        stem = "learner-feed-" + info["date"][:10] + (f"-{args.suffix}" if args.suffix else "")
        for path in _common.write_results(stem, {"machine": info, "args": vars(args),
                                                  "rows": rows}, md):
            print("wrote", path)


if __name__ == "__main__":
    main()

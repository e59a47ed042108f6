#!/usr/bin/env python
"""shmreplay's TFClient vs Reverb's, on seed 002's TFClient cases, side by side in one run.

Seed 002 (a Reverb client survey with a cpprb benchmark) times Reverb's TFClient:

- insert N steps, N = 1, 11, 101: one ``TFClient.insert`` per step, each step's five
  arrays made into ``tf.constant`` s in the loop (as the seed's ``add_tf_client`` does);
- sample N items, N = 2, 16, 128: one ``TFClient.sample`` per item;
- the dataset: ``TFClient.dataset(table, dtypes, shapes)``, made per call as the seed
  does ("dataset made": its kernel returns an unconsumed ``islice``) and also made and
  read for N items ("dataset read");
- Reverb's dataset classes (not in the seed): ``TrajectoryDataset`` and
  ``TimestepDataset`` made and read for their first element ("dataset class").

One transition is ``[obs f64[15], act f64[3], rew f64[1], next_obs f64[15], done f64[1]]``
(the seed's arrays; its ``done`` for a whole batch in every step is a typo, not copied).
Tables: ``Uniform`` and ``Prioritized(0.8)``, ``Fifo``, 4096 items, ``MinSize(1)``,
filled with 4096 transitions before sampling.

Reverb 0.14 has no ``TFClient.dataset`` (removed in 2022 in favour of the datasets):
its side of that case is ``reverb.TimestepDataset`` with the same 100 items in flight,
which is what ``TFClient.dataset`` returned. Both libraries run eagerly; inserts are also
timed with their input tensors made beforehand ("eager, inputs made": the call alone),
and the per-call cases inside a ``tf.function`` (one call per step or item). The floors
time what TensorFlow itself costs per call with no replay at all (see ``floor_fns``):
Reverb / floor is the most any replay behind these APIs could gain over Reverb.

Usage:  python benchmarks/bench_tf_client.py [--quick] [--libs reverb,shmreplay]
        (Reverb needs its own venv: dm-reverb 0.14.0, tensorflow 2.15.1, numpy<2, and
        ``pip install -e .`` there.)
Writes: benchmarks/results/tf_client[-quick].{json,md}
"""

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import numpy as np  # noqa: E402

CAPACITY = 4096
ALPHA = 0.8
INSERT_STEPS = (1, 11, 101)
SAMPLE_ITEMS = (2, 16, 128)
TARGET = 10.0
SHAPES = [15, 3, 1, 15, 1]


def transitions(rng, n):
    return [[rng.random(shape) for shape in SHAPES] for _ in range(n)]


class Side:
    """One library: a server with a uniform and a prioritized table, a TFClient, and the
    seed's calls as zero-argument callables."""

    def __init__(self, lib, tf, rng):
        self.lib, self.tf, self.rng = lib, tf, rng
        self.dtypes = [tf.float64] * len(SHAPES)
        self.name = lib.__name__
        tables = [lib.Table(name, sampler=sampler, remover=lib.selectors.Fifo(),
                            max_size=CAPACITY, rate_limiter=lib.rate_limiters.MinSize(1))
                  for name, sampler in (("uniform", lib.selectors.Uniform()),
                                        ("prioritized", lib.selectors.Prioritized(ALPHA)))]
        if self.name == "reverb":
            self.server = lib.Server(tables=tables)
            address = f"localhost:{self.server.port}"
        else:
            self.server = lib.Server(tables, name=f"bench-tfclient-{os.getpid()}")
            address = self.server.name
        self.client = lib.Client(address)
        self.tf_client = lib.TFClient(address)
        self.address = address

    def fill(self):
        for step in transitions(self.rng, CAPACITY):
            priority = float(self.rng.random()) + 0.05
            self.client.insert(step, {"uniform": 1.0, "prioritized": priority})

    def case(self, op, mode, table, n):
        tf, tfc = self.tf, self.tf_client
        dtypes = self.dtypes
        if op == "insert":
            steps = transitions(self.rng, n)
            if mode == "eager, inputs made":  # the TFClient call alone
                tables, prios = tf.constant([table]), tf.constant([1.0], tf.float64)
                inputs = [[tf.constant(x) for x in step] for step in steps]
                return lambda: [tfc.insert(data, tables, prios) for data in inputs]
            if mode == "eager":
                def insert():
                    for step in steps:  # the seed's add_tf_client
                        tfc.insert([tf.constant(x) for x in step], tf.constant([table]),
                                   tf.constant([1.0], dtype=tf.float64))
                return insert
            tables, prios = tf.constant([table]), tf.constant([1.0], tf.float64)
            inputs = [[tf.constant(x) for x in step] for step in steps]

            @tf.function
            def insert_step(data):
                tfc.insert(data, tables, prios)
            return lambda: [insert_step(data) for data in inputs]
        if op == "sample":
            if mode == "eager":
                return lambda: [tfc.sample(table, dtypes) for _ in range(n)]  # sample_tf_client
            sample_item = tf.function(lambda: tfc.sample(table, dtypes))
            return lambda: [sample_item() for _ in range(n)]
        # "dataset made": the seed's kernel (an unconsumed islice); "dataset read": made,
        # then read for n items
        shapes = [tf.TensorShape([s]) for s in SHAPES]
        if op == "dataset class":  # Reverb's dataset classes: made, first element read
            # (an inserted item is a trajectory of one step: [1, s] in both libraries)
            trajectory_shapes = [tf.TensorShape([1, s]) for s in SHAPES]
            cls = getattr(self.lib if self.name == "reverb" else self.lib.tf, mode)
            args = trajectory_shapes if mode == "TrajectoryDataset" else shapes
            return lambda: next(iter(cls(self.address, table, dtypes, args,
                                         max_in_flight_samples_per_worker=100)))
        if self.name == "reverb":
            make = lambda: self.lib.TimestepDataset(  # noqa: E731
                self.address, table, dtypes, shapes, max_in_flight_samples_per_worker=100)
        else:
            make = lambda: tfc.dataset(tf.constant([table]), dtypes, SHAPES)  # noqa: E731
        if op == "dataset made":
            return lambda: itertools.islice(make(), n)
        return lambda: list(itertools.islice(make(), n))

    def close(self):
        self.client.close() if hasattr(self.client, "close") else None
        self.server.stop()


def floor_fns(tf):
    """What TensorFlow alone costs per call of each case, with no replay: the tensors an
    eager call must make, a tf.function calling a numpy_function that does nothing with
    the same inputs and outputs, a dataset iterator made (and read once)."""
    step = transitions(np.random.default_rng(0), 1)[0]
    tables, prios = tf.constant(["uniform"]), tf.constant([1.0], tf.float64)
    inputs = [tf.constant(x) for x in step]
    outputs = [np.uint64(1), np.float64(0.5), np.int64(9), np.float64(1.0), np.int32(1)] + step
    dtypes = [tf.as_dtype(np.asarray(x).dtype) for x in outputs]

    def insert_inputs():  # the seed's loop body without the insert
        [tf.constant(x) for x in step]
        tf.constant(["uniform"])
        tf.constant([1.0], dtype=tf.float64)

    def sample_outputs():
        [tf.constant(x) for x in outputs]

    def nothing(*args):
        return np.int32(0)

    def sample_nothing():
        return outputs

    insert_op = tf.function(lambda data: tf.numpy_function(nothing, [tables, prios] + data,
                                                           tf.int32))
    sample_op = tf.function(lambda: tf.numpy_function(sample_nothing, [], dtypes))
    # An iterator with the options shmreplay's datasets set (no autotuning thread, no
    # injected prefetch): what making and reading any such pipeline costs.
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    dataset = tf.data.Dataset.range(1).with_options(options)
    return {"insert eager": insert_inputs, "sample eager": sample_outputs,
            "insert tf.function": lambda: insert_op(inputs), "sample tf.function": sample_op,
            "dataset made": lambda: iter(dataset), "dataset read": lambda: next(iter(dataset))}


def floor_of(op, mode, floors_us):
    """The case's floor per call (µs): what TensorFlow costs whoever does the replay."""
    if op == "dataset class":  # made and read once
        return floors_us["dataset read"]
    if op.startswith("dataset"):
        return floors_us[op]
    if mode == "eager, inputs made":
        return None
    return floors_us[f"{op} {mode}"]


def cases():
    out = []
    for table in ("uniform", "prioritized"):
        for mode in ("eager", "eager, inputs made", "tf.function"):
            out += [("insert", mode, table, n) for n in INSERT_STEPS]
            if mode != "eager, inputs made":
                out += [("sample", mode, table, n) for n in SAMPLE_ITEMS]
        out.append(("dataset made", "eager", table, 1))
        out += [("dataset read", "eager", table, n) for n in SAMPLE_ITEMS]
        out += [("dataset class", cls, table, 1)
                for cls in ("TrajectoryDataset", "TimestepDataset")]
    return out


def load(name):
    try:
        module = __import__(name)
        if name == "shmreplay":
            import shmreplay.tf  # noqa: F401 (TFClient lives there)
        return module, None
    except Exception as exc:  # noqa: BLE001
        return None, f"import {name} failed: {type(exc).__name__}: {exc}"


def run(args):
    import tensorflow as tf
    timing = (dict(repeat=3, min_time=0.01, warmup=0.02) if args.quick
              else dict(repeat=7, min_time=0.1, warmup=0.1))
    info = C.machine_info()
    info["versions"]["tensorflow"] = tf.__version__
    rng = np.random.default_rng(args.seed)
    sides, errors, results = [], [], []
    for name in [s.strip() for s in args.libs.split(",") if s.strip()]:
        module, why = load(name)
        if module is None:
            print(f"{name} unavailable: {why}")
            errors.append({"lib": name, "where": "import", "error": why})
            continue
        info["versions"]["dm-reverb" if name == "reverb" else name] = C._version(
            "dm-reverb" if name == "reverb" else name) or info["versions"].get(name)
        sides.append(Side(module, tf, rng))
    try:
        for side in sides:
            side.fill()
        for op, mode, table, n in cases():
            row = {"op": op, "mode": mode, "table": table, "n": n}
            fns = {}
            for side in sides:
                fn = C.prepared_case(side.name, f"{op} {mode} {table} {n}",
                                     lambda: side.case(op, mode, table, n), errors)
                if fn is not None:
                    fns[side.name] = fn
            timed = C.time_interleaved(fns, **timing) if fns else {}
            for name, t in timed.items():
                row[name] = {"median_ms": t["median"] * 1e3, "per_unit_us": t["median"] * 1e6 / n,
                             "best_ms": t["best"] * 1e3, "number": t["number"]}
            a, b = row.get("reverb"), row.get("shmreplay")
            row["ratio"] = a["median_ms"] / b["median_ms"] if a and b else None
            results.append(row)
            print(f"  {op:12s} {mode:18s} {table:11s} {n:4d}  reverb "
                  f"{C.fmt_num(a and a['median_ms'], 3):>8s} ms  shmreplay "
                  f"{C.fmt_num(b and b['median_ms'], 3):>8s} ms  ratio {C.fmt_ratio(row['ratio'])}",
                  flush=True)
        floors = {label: t["median"] * 1e6 for label, t in
                  C.time_interleaved(floor_fns(tf), **timing).items()}
        for row in results:
            floor = floor_of(row["op"], row["mode"], floors)
            calls = 1 if row["op"].startswith("dataset") else row["n"]
            row["floor_ms"] = None if floor is None else floor * calls / 1e3
            a = row.get("reverb")
            row["best_ratio"] = a["median_ms"] / row["floor_ms"] if a and row["floor_ms"] else None
    finally:
        for side in sides:
            side.close()

    headers = ["case", "mode", "table", "N", "Reverb ms", "shmreplay ms", "shmreplay µs/unit",
               "Reverb/shmreplay", f">= {TARGET:g}x", "TF floor ms", "Reverb/floor"]
    rows = []
    for r in results:
        a, b = r.get("reverb"), r.get("shmreplay")
        rows.append([r["op"], r["mode"], r["table"], r["n"], C.fmt_num(a and a["median_ms"], 3),
                     C.fmt_num(b and b["median_ms"], 3), C.fmt_num(b and b["per_unit_us"], 1),
                     C.fmt_ratio(r["ratio"]),
                     "n/a" if r["ratio"] is None else ("yes" if r["ratio"] >= TARGET else "NO"),
                     C.fmt_num(r.get("floor_ms"), 3), C.fmt_ratio(r.get("best_ratio"))])
    ratios = [r["ratio"] for r in results if r["ratio"] is not None]
    summary = (f"min ratio {min(ratios):.1f}x, geometric mean "
               f"{float(np.exp(np.mean(np.log(ratios)))):.1f}x; "
               f"{sum(x >= TARGET for x in ratios)}/{len(ratios)} cases >= {TARGET:g}x"
               if ratios else "no ratios (one side missing)")
    print("\n" + C.render_table(headers, rows) + "\n\n" + summary)
    print("floors (µs per call): " + ", ".join(f"{k}: {v:.1f}" for k, v in floors.items()))
    notes = [f"mode: {'quick' if args.quick else 'full'}; median of {timing['repeat']} repeats, "
             "ms per case (N calls); ratio = Reverb / shmreplay (higher: shmreplay faster)",
             f"tables of {CAPACITY} (uniform; prioritized alpha {ALPHA}), filled before "
             "sampling; one step = [f64[15], f64[3], f64[1], f64[15], f64[1]]; same process, "
             "Reverb via localhost:PORT, shmreplay via the buffer's name",
             "insert: one TFClient.insert per step (eager: the step's tf.constants made in "
             "the loop, as in seed 002); sample: one TFClient.sample per item; dataset: "
             "made per call (seed) or made and read for N items (Reverb 0.14: "
             "TimestepDataset, what its removed TFClient.dataset returned)",
             "floors, µs per call (TensorFlow alone, no replay): " + ", ".join(
                 f"{k} {v:.1f}" for k, v in floors.items()) + "; TF floor ms = the case's "
             "floor x its calls; Reverb/floor = the most any replay behind these APIs "
             "could gain over Reverb",
             summary]
    md = C.markdown_report("TFClient: shmreplay vs Reverb (seed 002's cases)", info, notes,
                           headers, rows, errors)
    payload = {"benchmark": "tf_client", "quick": args.quick, "machine": info,
               "config": {"capacity": CAPACITY, "alpha": ALPHA, "insert_steps": INSERT_STEPS,
                          "sample_items": SAMPLE_ITEMS, "timing": timing,
                          "target_ratio": TARGET, "seed": args.seed},
               "results": results, "floors_us": floors, "summary": summary, "errors": errors}
    paths = C.write_results("tf_client" + ("-quick" if args.quick else ""), payload, md)
    print("wrote", ", ".join(paths))
    C.check_clean()
    return 1 if any(e["lib"] == "shmreplay" for e in errors) else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--libs", default="reverb,shmreplay")
    parser.add_argument("--seed", type=int, default=0)
    sys.exit(run(parser.parse_args()))


if __name__ == "__main__":
    main()

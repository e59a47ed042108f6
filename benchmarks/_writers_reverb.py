"""Reverb's side of ``bench_writers.py``: the writer cases through Reverb's ``Client``.

Not a public module. Reverb needs TensorFlow and numpy < 2, so it runs in its own
virtualenv: ``bench_writers.py --reverb-python PATH`` (or ``$REVERB_PYTHON``) starts
``PATH bench_writers.py --reverb-worker``, which calls ``reverb_worker`` here; the worker
prints one JSON line on stdout, which ``run_reverb`` reads back.
"""

import json
import os
import time
import traceback

import numpy as np

import _common as C
from _writers_cases import (DATASETS, NUM_KEEP, TABLES, cycler, make_pool,
                            timing_settings)

ISSUE_REVERB_US = 290.0
REVERB_BLOCK = 200


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
    timing = timing_settings(args.quick)
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


def run_reverb(script, python, args, errors):
    """Runs the Reverb worker (``script --reverb-worker``) in ``python``; returns its
    JSON, or None."""
    cmd = [python, os.path.abspath(script), "--reverb-worker", "--seed", str(args.seed),
           "--datasets", args.datasets] + (["--quick"] if args.quick else [])
    return C.run_json_worker(cmd, errors, "reverb")

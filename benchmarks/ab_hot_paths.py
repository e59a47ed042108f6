#!/usr/bin/env python
"""Before/after: the hot paths of two checkouts of shmreplay, timed side by side.

Each round starts one worker process per checkout (``PYTHONPATH`` set to it; each with
its own numba cache directory, filled before the first round) and the two alternate,
so that background load hits both alike. A worker times, timeit-style (warm-up,
calibrated loop, median of repeats, GC off), in microseconds per call:

* ``insert 1``: ``client.insert`` of one small transition (the actor's path);
* ``insert_batch 11``: 11 transitions in one call;
* ``sample 2`` / ``sample 256``: ``sample_batch`` from a uniform table of 4,096 items;
* ``prio sample+update 32``: ``sample_batch`` of 32 from a prioritized table, then
  ``update_priorities`` of their keys (the learner's step);
* ``TrajectoryWriter step``: ``append`` of one step and ``create_item`` of a 3-step
  window (Acme's usual item);
* ``Writer step``: the legacy ``Writer``'s ``append`` + ``create_item(3)``.

The result is the median over rounds of each side's medians, and the ratio after /
before (> 1: slower). Written to ``benchmarks/results/ab_hot_paths.{json,md}``.

Usage:  python benchmarks/ab_hot_paths.py BEFORE_DIR AFTER_DIR [--rounds 3] [--quick]
            [--caches BEFORE_CACHE AFTER_CACHE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

CASES = ["insert 1", "insert_batch 11", "sample 2", "sample 256", "prio sample+update 32",
         "TrajectoryWriter step", "Writer step"]


def worker(quick: bool):
    """Times every case in this process (``PYTHONPATH`` decides which shmreplay)."""
    import numpy as np
    import shmreplay
    from shmreplay import rate_limiters, selectors
    from shmreplay.specs import TensorSpec

    spec = {"obs": TensorSpec((15,), np.float32), "act": TensorSpec((3,), np.float32),
            "rew": TensorSpec((), np.float32), "next_obs": TensorSpec((15,), np.float32),
            "done": TensorSpec((), np.float32)}
    one = {"obs": np.ones(15, np.float32), "act": np.ones(3, np.float32),
           "rew": np.float32(1), "next_obs": np.ones(15, np.float32), "done": np.float32(0)}
    batch = {k: np.stack([v] * 11) for k, v in one.items()}
    tables = [
        shmreplay.Table("uniform", selectors.Uniform(), selectors.Fifo(), 4096,
                        rate_limiters.MinSize(1), signature=spec),
        shmreplay.Table("prio", selectors.Prioritized(0.6), selectors.Fifo(), 4096,
                        rate_limiters.MinSize(1), signature=spec),
        shmreplay.Table("steps", selectors.Uniform(), selectors.Fifo(), 4096,
                        rate_limiters.MinSize(1)),
    ]
    timing = dict(repeat=3, min_time=0.01) if quick else dict(repeat=9, min_time=0.05)
    with shmreplay.Server(tables, name=f"bench-ab-{os.getpid()}") as server:
        client = shmreplay.Client(server.name)
        full = {k: np.stack([v] * 4096) for k, v in one.items()}
        client.insert_batch(full, {"uniform": 1.0})
        client.insert_batch(full, {"prio": 1.0})
        writer = client.trajectory_writer(3)
        legacy = client.writer(3)
        step = {"obs": np.ones(15, np.float32), "rew": np.float32(1)}
        for _ in range(3):
            writer.append(step)
            legacy.append(step)

        def trajectory_step():
            writer.append(step)
            history = writer.history
            writer.create_item("steps", 1.0, {"obs": history["obs"][-3:],
                                              "rew": history["rew"][-3:]})

        def legacy_step():
            legacy.append(step)
            legacy.create_item("steps", 3, 1.0)

        def prio_step():
            sample = client.sample_batch("prio", 32)
            client.update_priorities("prio", sample.info.key,
                                     np.ones(len(sample.info.key)))

        fns = {
            "insert 1": lambda: client.insert(one, {"uniform": 1.0}),
            "insert_batch 11": lambda: client.insert_batch(batch, {"uniform": 1.0}),
            "sample 2": lambda: client.sample_batch("uniform", 2),
            "sample 256": lambda: client.sample_batch("uniform", 256),
            "prio sample+update 32": prio_step,
            "TrajectoryWriter step": trajectory_step,
            "Writer step": legacy_step,
        }
        figures = C.time_interleaved(fns, **timing)
        writer.close()
        legacy.close()
        client.close()
    print(json.dumps({case: figures[case]["median"] * 1e6 for case in CASES}))


def _run_side(path, cache, quick):
    env = dict(os.environ, PYTHONPATH=path, NUMBA_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"]
                         + (["--quick"] if quick else []),
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"worker for {path} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", nargs="?")
    parser.add_argument("after", nargs="?")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--caches", nargs=2, metavar=("BEFORE_CACHE", "AFTER_CACHE"),
                        help="numba cache directories to use (default: new, empty ones)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.quick)
        return 0
    sides = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    caches = ({side: os.path.abspath(path) for side, path in zip(sides, args.caches)}
              if args.caches else
              {side: tempfile.mkdtemp(prefix=f"shmreplay-ab-{side}-") for side in sides})
    results = {side: [] for side in sides}
    for side in sides:  # fill each side's numba cache (not timed)
        _run_side(sides[side], caches[side], True)
    for round_ in range(args.rounds):
        for side in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
            results[side].append(_run_side(sides[side], caches[side], args.quick))
    medians = {side: {case: statistics.median(r[case] for r in runs) for case in CASES}
               for side, runs in results.items()}
    rows = [[case, C.fmt_num(medians["before"][case], 2), C.fmt_num(medians["after"][case], 2),
             f"{medians['after'][case] / medians['before'][case]:.3f}"] for case in CASES]
    headers = ["case (us per call)", "before", "after", "after / before"]
    print(C.render_table(headers, rows))
    info = C.machine_info()
    notes = [f"before: {sides['before']}, after: {sides['after']}; {args.rounds} rounds, "
             "alternating; median of each side's per-round medians"]
    C.write_results("ab_hot_paths", {"machine": info, "sides": sides, "rounds": results,
                                     "medians": medians},
                    C.markdown_report("Hot paths, before and after", info, notes, headers,
                                      rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

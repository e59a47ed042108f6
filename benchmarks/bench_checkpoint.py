#!/usr/bin/env python
"""Checkpoint and restore speed, and how long a checkpoint pauses each table.

Two full tables, one process, files on the local disk (page cache, then fsync):

* ``small``: a prioritized table of 1,000,000 small transitions (obs, next_obs
  float32[15], act float32[3], rew, done float32: 140 bytes of data per item).
* ``frames``: a uniform table of 20,000 Atari-like frames (obs uint8[84, 84, 4]).

For each: ``Client.checkpoint(path)`` (wall time, and the longest time a table's lock
was held: the pause inserts and samples see), the file's size, and
``Server(checkpoint=path)`` (restore into a new buffer). Side by side, with the same
data: cpprb's ``save_transitions`` / ``load_transitions`` (an npz of the data only, no
priorities or counters; cpprb documents that full state is not saved), and the floor:
``np.save`` of the same arrays into one file plus fsync.

Usage:  python benchmarks/bench_checkpoint.py [--quick]
Writes: benchmarks/results/checkpoint[-quick].{json,md}

A/B of shmreplay alone against another checkout (its ``shmreplay`` package, this
script's measurement), each side in a fresh process, alternately, ``--repeats`` times:

        python benchmarks/bench_checkpoint.py --ab /path/to/other/checkout [--repeats 5]
Writes: benchmarks/results/checkpoint-ab-<date>[-quick].{json,md} (medians)
"""

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import numpy as np  # noqa: E402


def _small(n):
    rng = np.random.default_rng(0)
    return {"obs": rng.random((n, 15), np.float32), "next_obs": rng.random((n, 15), np.float32),
            "act": rng.random((n, 3), np.float32), "rew": rng.random(n, np.float32),
            "done": np.zeros(n, np.float32)}


def _frames(n):
    rng = np.random.default_rng(0)
    return {"obs": rng.integers(0, 255, (n, 84, 84, 4), np.uint8)}


def _fsync_file(path):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def bench_shmreplay(shmreplay, name, data, prioritized, directory, repeats=1):
    """Saves and restores ``repeats`` times (the medians; the first call of a process
    also pays for loading kernels and warming caches)."""
    from shmreplay import rate_limiters, selectors
    try:
        from shmreplay._ops import checkpoint as _checkpoint
    except ImportError:  # a checkout from before the folders (an A/B's other side)
        _checkpoint = importlib.import_module("shmreplay._checkpoint")
    n = len(next(iter(data.values())))
    sampler = selectors.Prioritized(0.6) if prioritized else selectors.Uniform()
    table = shmreplay.Table("t", sampler, selectors.Fifo(), n, rate_limiters.MinSize(1))
    path = os.path.join(directory, f"{name}.shmreplay")
    with shmreplay.Server([table], name=f"bench-ckpt-{os.getpid()}") as server:
        client = shmreplay.Client(server.name)
        step = 50_000 if prioritized else 2_000
        priorities = np.random.default_rng(1).random(n) + 0.1
        for start in range(0, n, step):
            chunk = {k: v[start:start + step] for k, v in data.items()}
            client.insert_batch(chunk, {"t": priorities[start:start + step]})
        saves, holds, restores = [], [], []
        for _ in range(repeats):
            started = time.perf_counter()
            summary = _checkpoint.save(client._buffer.engines, path, server.name,
                                       progress=False)
            saves.append(time.perf_counter() - started)
            holds.append(summary.max_hold_seconds)
        client.close()
    for _ in range(repeats):
        started = time.perf_counter()
        with shmreplay.Server(name=f"bench-rest-{os.getpid()}", checkpoint=path) as restored:
            restores.append(time.perf_counter() - started)
            assert restored._tables[0].info.current_size == n
    size = os.path.getsize(path)
    os.unlink(path)
    return {"save_s": statistics.median(saves), "max_hold_s": statistics.median(holds),
            "restore_s": statistics.median(restores), "file_bytes": size}


def bench_cpprb(cpprb, name, data, directory):
    n = len(next(iter(data.values())))
    env_dict = {k: {"shape": v.shape[1:] or 1, "dtype": v.dtype} for k, v in data.items()}
    buffer = cpprb.ReplayBuffer(n, env_dict)
    step = 50_000
    for start in range(0, n, step):
        buffer.add(**{k: v[start:start + step] for k, v in data.items()})
    path = os.path.join(directory, f"{name}-cpprb.npz")
    started = time.perf_counter()
    buffer.save_transitions(path, safe=True)
    _fsync_file(path)
    save_seconds = time.perf_counter() - started
    fresh = cpprb.ReplayBuffer(n, env_dict)
    started = time.perf_counter()
    fresh.load_transitions(path)
    restore_seconds = time.perf_counter() - started
    assert fresh.get_stored_size() == n
    size = os.path.getsize(path)
    os.unlink(path)
    return {"save_s": save_seconds, "restore_s": restore_seconds, "file_bytes": size}


def bench_numpy_floor(name, data, directory):
    path = os.path.join(directory, f"{name}-raw.npy")
    started = time.perf_counter()
    with open(path, "wb") as f:
        for array in data.values():
            np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    save_seconds = time.perf_counter() - started
    started = time.perf_counter()
    with open(path, "rb") as f:
        loaded = [np.load(f) for _ in data]
    restore_seconds = time.perf_counter() - started
    assert all(a.shape == b.shape for a, b in zip(loaded, data.values()))
    size = os.path.getsize(path)
    os.unlink(path)
    return {"save_s": save_seconds, "restore_s": restore_seconds, "file_bytes": size}


def _cases(quick):
    scale = 10 if quick else 1
    return [("small", lambda: _small(1_000_000 // scale), True),
            ("frames", lambda: _frames(20_000 // scale), False)]


def ab_worker(tree, quick, inner):
    """One side of an A/B: shmreplay from ``tree``; prints its results as JSON."""
    sys.path.insert(0, tree)
    shmreplay, why = C.load_shmreplay()
    if shmreplay is None:
        raise SystemExit(why)
    assert os.path.dirname(os.path.dirname(os.path.abspath(shmreplay.__file__))) == tree
    directory = tempfile.mkdtemp(prefix="shmreplay-bench-ckpt-", dir=os.path.expanduser("~"))
    results = {}
    try:
        for name, make, prioritized in _cases(quick):
            results[name] = bench_shmreplay(shmreplay, name, make(), prioritized, directory,
                                            repeats=inner)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(results))


def ab(other, repeats, quick, inner):
    """Runs ``ab_worker`` for ``other`` and this checkout alternately; writes medians."""
    trees = {"other": os.path.abspath(other), "this": C.REPO_ROOT}
    info = C.machine_info()
    runs = {side: [] for side in trees}
    for round_ in range(repeats):
        order = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
        for side in order:
            command = [sys.executable, os.path.abspath(__file__), "--ab-worker", trees[side],
                       "--inner", str(inner)]
            out = subprocess.run(command + (["--quick"] if quick else []), check=True,
                                 capture_output=True, text=True, timeout=1800)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(side, runs[side][-1], flush=True)
    medians = {side: {case: {k: statistics.median(r[case][k] for r in runs[side])
                             for k in runs[side][0][case]} for case in runs[side][0]}
               for side in trees}
    commits = {side: _commit(tree) for side, tree in trees.items()}
    headers = ["case", "measure", f"other ({commits['other']})", f"this ({commits['this']})",
               "this / other"]
    rows = []
    for case in medians["this"]:
        for key, label in (("save_s", "save s"), ("restore_s", "restore s"),
                           ("max_hold_s", "max pause s"), ("file_bytes", "file bytes")):
            a, b = medians["other"][case][key], medians["this"][case][key]
            cell = (lambda x: f"{x:.3f}") if key.endswith("_s") else (lambda x: f"{x:,.0f}")
            rows.append([case, label, cell(a), cell(b), C.fmt_ratio(b / a)])
    notes = [f"other: {trees['other']}; this: {trees['this']}",
             f"medians of {repeats} runs per side, each in a fresh process, sides "
             f"alternating (ABBA...); a run's figure is the median of its {inner} saves "
             "and restores", "files on the local disk; every save ends with fsync",
             f"load average at the end {C.load_average()}"]
    markdown = (C.markdown_header("Checkpoint and restore: A/B", info, notes) + "\n"
                + C.render_table(headers, rows, markdown=True))
    print(C.render_table(headers, rows))
    stem = f"checkpoint-ab-{info['date'][:10]}" + ("-quick" if quick else "")
    payload = {"machine": info, "trees": trees, "commits": commits, "medians": medians,
               "runs": runs}
    for path in C.write_results(stem, payload, markdown):
        print("wrote", path)


def _commit(tree):
    out = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, timeout=5)
    return out.stdout.strip() or "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--quick", action="store_true", help="a tenth of the items")
    parser.add_argument("--ab", metavar="CHECKOUT",
                        help="A/B of shmreplay alone: CHECKOUT's package against this one's")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side of --ab")
    parser.add_argument("--inner", type=int, default=3,
                        help="saves and restores per run of --ab (their median)")
    parser.add_argument("--ab-worker", metavar="CHECKOUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ab_worker:
        return ab_worker(os.path.abspath(args.ab_worker), args.quick, args.inner)
    if args.ab:
        return ab(args.ab, args.repeats, args.quick, args.inner)
    shmreplay, why = C.load_shmreplay()
    cpprb, why_cpprb = C.load_cpprb()
    info = C.machine_info()
    cases = [(name, make(), prioritized) for name, make, prioritized in _cases(args.quick)]
    directory = tempfile.mkdtemp(prefix="shmreplay-bench-ckpt-", dir=os.path.expanduser("~"))
    results = {}
    try:
        for name, data, prioritized in cases:
            mib = sum(v.nbytes for v in data.values()) / 2**20
            row = {"items": len(next(iter(data.values()))), "data_mib": mib,
                   "floor": bench_numpy_floor(name, data, directory)}
            if shmreplay is not None:
                row["shmreplay"] = bench_shmreplay(shmreplay, name, data, prioritized, directory)
            if cpprb is not None:
                row["cpprb"] = bench_cpprb(cpprb, name, data, directory)
            results[name] = row
            del data
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    headers = ["case", "data MiB", "lib", "save s", "MiB/s", "max pause s", "restore s",
               "file MiB", "save vs floor", "restore vs floor"]
    rows = []
    for name, row in results.items():
        floor = row["floor"]
        for lib in ("shmreplay", "cpprb", "floor"):
            if lib not in row:
                continue
            r = row[lib]
            rows.append([name, C.fmt_num(row["data_mib"]), lib, f"{r['save_s']:.3f}",
                         C.fmt_num(row["data_mib"] / r["save_s"]),
                         f"{r['max_hold_s']:.3f}" if "max_hold_s" in r else "-",
                         f"{r['restore_s']:.3f}", C.fmt_num(r["file_bytes"] / 2**20),
                         C.fmt_ratio(r["save_s"] / floor["save_s"]),
                         C.fmt_ratio(r["restore_s"] / floor["restore_s"])])
    notes = ["files on the local disk (ext4 on virtio); every save ends with fsync",
             "max pause: the longest time one table's lock was held (inserts and samples wait)",
             "cpprb saves the data only (no priorities, counters or order); so does the floor"]
    if why:
        notes.append(f"shmreplay: n/a ({why})")
    if why_cpprb:
        notes.append(f"cpprb: n/a ({why_cpprb})")
    markdown = (C.markdown_header("Checkpoint and restore", info, notes) + "\n"
                + C.render_table(headers, rows, markdown=True))
    print(C.render_table(headers, rows))
    stem = "checkpoint-quick" if args.quick else "checkpoint"
    for path in C.write_results(stem, {"machine": info, "results": results}, markdown):
        print("wrote", path)
    C.check_clean()


if __name__ == "__main__":
    main()

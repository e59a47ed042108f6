"""What a learner's sampling and priority updates cost when its step has just filled the
caches (issue 20's learner feed).

A learner samples a batch and updates the batch's priorities between train steps, and a
step of an MLP on 256 rows walks through a few MiB (weights, gradients, activations).
So the table's sum tree, item records and rows are no longer in the core's caches when
the next batch is drawn. This script times, on the learner-feed benchmark's table
(``Prioritized(0.6)``, 32,768 transitions), ``sample_batch(256)`` and
``sample_batch(256)`` + ``update_priorities`` of its keys, with ``--flush`` MiB of other
memory read and written between calls (0: the same call repeated, caches warm), so the
figures bracket what the table costs inside a training loop.

Run ``python benchmarks/bench_sample_cache.py``; results:
``benchmarks/results/sample-cache[-TAG].{json,md}``.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _learner_models import WORKLOADS, make_items  # noqa: E402

TABLE = "replay"


def make_table(shmreplay, name):
    from shmreplay import rate_limiters, selectors
    size = WORKLOADS["transitions"]["size"]
    server = shmreplay.Server([shmreplay.Table(
        TABLE, sampler=selectors.Prioritized(0.6), remover=selectors.Fifo(), max_size=size,
        rate_limiter=rate_limiters.MinSize(1))], name=name)
    client = shmreplay.Client(name)
    rng = np.random.default_rng(0)
    for start in range(0, size, 4096):
        n = min(4096, size - start)
        client.insert_batch(make_items("transitions", n, rng), {TABLE: rng.random(n) + 0.1})
    return server, client


def median_us(call, other_memory, calls):
    """Median µs of ``call()``, ``other_memory`` (a float64 array, or None) touched before
    each call, one write per cache line, outside the timed span."""
    times = []
    perf = time.perf_counter_ns
    for _ in range(calls):
        if other_memory is not None:
            other_memory[::8] += 1.0
        start = perf()
        call()
        times.append(perf() - start)
    times.sort()
    return times[len(times) // 2] / 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flush", default="0,1,4,16", help="MiB touched between calls")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    shmreplay, why = _common.load_shmreplay()
    if shmreplay is None:
        sys.exit(f"shmreplay is not usable: {why}")
    info = _common.machine_info()
    server, client = make_table(shmreplay, f"shmreplay.bench-cache-{os.getpid()}")
    rng = np.random.default_rng(1)
    batch = args.batch
    last = {}

    def sample():
        last["keys"] = client.sample_batch(TABLE, batch).info.key

    def sample_update():
        keys = client.sample_batch(TABLE, batch).info.key
        client.update_priorities(TABLE, keys, rng.random(batch) + 0.1)

    flushes = [int(x) for x in args.flush.split(",")]
    cases = {"sample": sample, "sample+update": sample_update}
    results = {case: {str(mib): [] for mib in flushes} for case in cases}
    try:
        for _ in range(args.rounds):  # rounds alternate every case and flush size
            for mib in flushes:
                other = None if mib == 0 else np.ones((mib << 20) // 8)
                for case, call in cases.items():
                    median_us(call, other, 20)  # (warm-up)
                    results[case][str(mib)].append(median_us(call, other, args.calls))
    finally:
        client.close()
        server.stop()
    rows = []
    for case in cases:
        warm = np.median(results[case][str(flushes[0])])
        for mib in flushes:
            us = float(np.median(results[case][str(mib)]))
            rows.append([case, f"{mib}", f"{us:.1f}", f"{us / warm:.2f}x"])
    headers = ["call", "MiB touched between calls", "median µs", f"vs {flushes[0]} MiB"]
    print(_common.render_table(headers, rows))
    notes = [f"table: Prioritized(0.6), {WORKLOADS['transitions']['size']:,} transitions "
             f"(the learner-feed table); batch {batch}; {args.rounds} rounds, each the "
             f"median of {args.calls} calls per case and size",
             "between calls (not timed): one write per 64-byte line of an array of that size"]
    payload = {"benchmark": "sample_cache", "machine": info, "args": vars(args),
               "median_us_per_round": results}
    stem = "sample-cache" + (f"-{args.tag}" if args.tag else "")
    md = _common.markdown_report("Sampling with cold caches", info, notes, headers, rows)
    for path in _common.write_results(stem, payload, md):
        print("wrote", path)


if __name__ == "__main__":
    main()

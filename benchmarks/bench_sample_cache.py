"""What a learner's sampling and priority updates cost when its step has just filled the
caches (issue 20's learner feed).

A learner samples a batch and updates the batch's priorities between train steps, and a
step of an MLP on 256 rows walks through a few MiB (weights, gradients, activations).
So the table's sum tree, item records and rows are no longer in the core's caches when
the next batch is drawn. This script times, on the learner-feed benchmark's table
(``Prioritized(0.6)``, 32,768 transitions), ``sample_batch(256)`` and
``sample_batch(256)`` + ``update_priorities`` of its keys, with ``--flush`` MiB of other
memory read and written between calls (0: the same call repeated, caches warm), so the
figures bracket what the table costs inside a training loop. Beside them, in the same
rounds: cpprb's prioritized buffer doing the same, and a numpy gather of the batch's
rows (the least any replay must read; see ``reference_cases``). ``--gap-ms`` adds calls
spaced by that long a busy loop that touches no memory: on the shared 2-core VM the
table's lines are gone after a step's time even then.

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


def reference_cases(batch, priorities):
    """What bounds the table work from outside: cpprb's ``PrioritizedReplayBuffer`` with
    the same items, alpha and priorities (sample with beta 0.4, then the update of its
    indexes), and the *gather floor*: numpy taking ``batch`` random rows of the same five
    columns, with no sampling structure, no item records and no update: the least any
    replay must read for a batch."""
    rng = np.random.default_rng(0)
    size = WORKLOADS["transitions"]["size"]
    items = make_items("transitions", size, rng)
    columns = {name: np.ascontiguousarray(column) for name, column in items.items()}

    def gather_floor():
        rows = rng.integers(0, size, batch)
        return {name: column.take(rows, axis=0) for name, column in columns.items()}

    cases = {"gather floor (numpy)": gather_floor}
    cpprb, why = _common.load_cpprb()
    if cpprb is None:
        print("cpprb unavailable:", why)
        return cases
    fields = {"obs": {"shape": 15}, "act": {"shape": 3}, "rew": {}, "next_obs": {"shape": 15},
              "done": {}}
    buffer = cpprb.PrioritizedReplayBuffer(size, fields, alpha=0.6)
    buffer.add(**items, priorities=rng.random(size) + 0.1)

    def cpprb_sample():
        buffer.sample(batch, beta=0.4)

    def cpprb_sample_update():
        buffer.update_priorities(buffer.sample(batch, beta=0.4)["indexes"], priorities)

    cases.update({"cpprb sample": cpprb_sample, "cpprb sample+update": cpprb_sample_update})
    return cases


def median_us(call, between, calls):
    """Median µs of ``call()``, with ``between()`` (or nothing) run before each call,
    outside the timed span."""
    times = []
    perf = time.perf_counter_ns
    for _ in range(calls):
        if between is not None:
            between()
        start = perf()
        call()
        times.append(perf() - start)
    times.sort()
    return times[len(times) // 2] / 1e3


def touch(mib):
    """Writes one float64 per 64-byte line of an array of ``mib`` MiB: a step's traffic."""
    other = np.ones((mib << 20) // 8)

    def between():
        other[::8] += 1.0
    return between


def spin(ms):
    """Keeps the core busy for ``ms`` without touching memory: only time passes."""
    def between():
        end = time.perf_counter_ns() + int(ms * 1e6)
        while time.perf_counter_ns() < end:
            pass
    return between


def conditions(args):
    """``(key, label, between)`` for each way the calls are spaced: the same call
    repeated (``0``), after MiB of other memory (``1``, ``4``, ``16``), and after
    ``--gap-ms`` of a busy core that touches no memory (``spin<ms>``)."""
    found = []
    for mib in (int(x) for x in args.flush.split(",")):
        found.append((str(mib), f"{mib} MiB touched", None if mib == 0 else touch(mib)))
    for ms in (float(x) for x in args.gap_ms.split(",") if x):
        found.append((f"spin{ms:g}ms", f"{ms:g} ms of a busy core", spin(ms)))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flush", default="0,1,4,16", help="MiB touched between calls")
    parser.add_argument("--gap-ms", default="1.8",
                        help="ms of a busy core between calls (a train step's time)")
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
    batch = args.batch
    priorities = np.random.default_rng(1).random(batch) + 0.1

    def sample():
        client.sample_batch(TABLE, batch)

    def sample_update():
        keys = client.sample_batch(TABLE, batch).info.key
        client.update_priorities(TABLE, keys, priorities)

    spacings = conditions(args)
    cases = {"sample": sample, "sample+update": sample_update}
    cases.update(reference_cases(batch, priorities))
    results = {case: {key: [] for key, _, _ in spacings} for case in cases}
    try:
        for _ in range(args.rounds):  # rounds alternate every case and spacing
            for key, _, between in spacings:
                for case, call in cases.items():
                    median_us(call, between, 20)  # (warm-up)
                    results[case][key].append(median_us(call, between, args.calls))
    finally:
        client.close()
        server.stop()
    rows = []
    for case in cases:
        warm = np.median(results[case][spacings[0][0]])
        for key, label, _ in spacings:
            us = float(np.median(results[case][key]))
            rows.append([case, label, f"{us:.1f}", f"{us / warm:.2f}x"])
    for key, label, _ in spacings:
        ours = float(np.median(results["sample+update"][key]))
        floor = results.get("gather floor (numpy)")
        peer = results.get("cpprb sample+update")
        parts = [f"{label}: shmreplay's sample+update {ours:.0f} µs"]
        if floor:
            parts.append(f"{ours / float(np.median(floor[key])):.2f}x the gather floor")
        if peer:
            parts.append(f"cpprb's takes {float(np.median(peer[key])) / ours:.2f}x as long")
        print("; ".join(parts))
    headers = ["call", "between calls", "median µs", f"vs {spacings[0][1]}"]
    print(_common.render_table(headers, rows))
    notes = [f"table: Prioritized(0.6), {WORKLOADS['transitions']['size']:,} transitions "
             f"(the learner-feed table); batch {batch}; {args.rounds} rounds, each the "
             f"median of {args.calls} calls per case and spacing",
             "between calls (not timed): one write per 64-byte line of an array of that "
             "size, or a loop reading the clock for that long"]
    payload = {"benchmark": "sample_cache", "machine": info, "args": vars(args),
               "median_us_per_round": results}
    stem = "sample-cache" + (f"-{args.tag}" if args.tag else "")
    md = _common.markdown_report("Sampling with cold caches", info, notes, headers, rows)
    for path in _common.write_results(stem, payload, md):
        print("wrote", path)


if __name__ == "__main__":
    main()

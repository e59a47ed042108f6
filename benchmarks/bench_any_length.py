#!/usr/bin/env python
"""``sample_batch(256)`` of items of any length against the same items at a fixed length.

Two tables, filled by a ``TrajectoryWriter`` with the same steps (``obs`` float32[8],
``action`` int64, ``reward`` float32):

* *fixed*:  signature ``[20, ...]``; every item is the last 20 steps;
* *any*:    signature ``[None, ...]``; item lengths cycle through 1 .. 39 (mean 20), so
            a batch of 256 is padded to about 39 steps;
* *any, all 20*: signature ``[None, ...]``, every item 20 steps (the first item's
            length: the references sit in the slot heads, no padding).

Each table holds ``--items`` items (default 10,000). The figure is the time of one
``sample_batch(256)`` (median of ``--repeats`` rounds of ``--calls`` calls), and the
time per sampled step, since the padded batch carries about twice the steps. Results go
to ``benchmarks/results/any-length-<date>.json``.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np

import shmreplay
from shmreplay import rate_limiters, selectors

CELLS = {"obs": ((8,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}


def _signature(length):
    return {k: shmreplay.TensorSpec((length,) + shape, dtype) for k, (shape, dtype)
            in CELLS.items()}


def _fill(client, table, items, lengths):
    steps = max(lengths) + 1
    with client.trajectory_writer(num_keep_alive_refs=steps) as writer:
        for i in range(items + steps):
            writer.append({k: np.full(shape, i, dtype) for k, (shape, dtype) in CELLS.items()})
            length = lengths[i % len(lengths)]
            if i + 1 >= length and i >= steps:
                writer.create_item(table, 1.0, {k: writer.history[k][-length:] for k in CELLS})


def _time(client, table, calls, repeats):
    client.sample_batch(table, 256)  # (warm)
    rounds = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            client.sample_batch(table, 256)
        rounds.append((time.perf_counter() - started) / calls)
    return statistics.median(rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shmreplay.warm_up()
    tables = [shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), args.items,
                              rate_limiters.MinSize(1), signature=_signature(length))
              for name, length in (("fixed", 20), ("any", None), ("any_20", None))]
    name = f"bench-any-length-{os.getpid()}"
    result = {}
    with shmreplay.Server(tables, name=name) as server:
        client = server.localhost_client()
        _fill(client, "fixed", args.items, [20])
        _fill(client, "any", args.items, list(range(1, 40)))
        _fill(client, "any_20", args.items, [20])
        for table in ("fixed", "any", "any_20"):
            seconds = _time(client, table, args.calls, args.repeats)
            batch = client.sample_batch(table, 256)
            lengths = getattr(batch, "lengths", None)
            own_steps = int(lengths["obs"].sum()) if lengths is not None else 256 * 20
            result[table] = {"us_per_call": seconds * 1e6,
                             "padded_steps": int(batch.data["obs"].shape[1]),
                             "ns_per_own_step": seconds * 1e9 / own_steps}
        client.close()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": commit, "machine": f"{platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} cores", "load": os.getloadavg()[0], "args": vars(args),
              "sample_batch_256": result,
              "ratio_any_to_fixed": result["any"]["us_per_call"] / result["fixed"]["us_per_call"],
              "ratio_any_20_to_fixed": (result["any_20"]["us_per_call"]
                                        / result["fixed"]["us_per_call"])}
    print(json.dumps(report, indent=2))
    out = os.path.join(os.path.dirname(__file__), "results",
                       f"any-length-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as file:
        json.dump(report, file, indent=2)


if __name__ == "__main__":
    main()

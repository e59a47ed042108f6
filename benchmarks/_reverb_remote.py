"""The Reverb side of bench_ray.py: a reverb.Server in this process and N client
processes that insert through Reverb's gRPC client (localhost), the same workloads as
bench_ray's remote actors. Runs in a virtualenv with dm-reverb (``--reverb-python``);
needs only reverb and numpy; prints one JSON line on stdout.

    python benchmarks/_reverb_remote.py --seconds 2 --clients 1,2 --repeats 3
"""

import argparse
import importlib.metadata
import json
import multiprocessing
import time

import numpy as np

FRAME = (84, 84, 4)   # as bench_ray.py


def _step(i):
    return {"obs": np.full(8, i, np.float32), "action": np.int32(i % 4),
            "reward": np.float32(1.0)}


def _percentiles(latencies):
    if not latencies:
        return None, None
    values = np.asarray(latencies) * 1e3
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def _run_case(port, case, seconds, barrier, results):
    """One client process: waits at ``barrier`` (all start together), runs ``case``
    for ``seconds``, puts ``(items, elapsed, p50 ms, p99 ms)`` on ``results``."""
    import reverb
    client = reverb.Client(f"localhost:{port}")
    kind, size = case
    latencies = []
    if kind == "frames":
        frame = np.random.default_rng(0).integers(0, 255, FRAME, dtype=np.uint8)
    barrier.wait(timeout=300)
    count, start = 0, time.perf_counter()
    end = start + seconds
    if kind == "insert":
        while time.perf_counter() < end:
            t = time.perf_counter()
            client.insert(_step(count), {"replay": 1.0})
            latencies.append(time.perf_counter() - t)
            count += 1
    else:   # a TrajectoryWriter, 1-step items, acknowledged (flushed) every `size` items
        table = "frames" if kind == "frames" else "replay"
        with client.trajectory_writer(1) as writer:
            while time.perf_counter() < end:
                t = time.perf_counter()
                for _ in range(size):
                    writer.append({"frame": frame} if kind == "frames" else _step(count))
                    history = writer.history
                    writer.create_item(table, 1.0, {key: history[key][-1] for key in history})
                    count += 1
                writer.flush()
                latencies.append(time.perf_counter() - t)
    results.put((count, time.perf_counter() - start) + _percentiles(latencies))


CASES = [("insert", 1, "Reverb client.insert (one item per call)"),
         ("writer", 64, "Reverb trajectory_writer, flush every 64 items"),
         ("writer", 1024, "Reverb trajectory_writer, flush every 1024 items"),
         ("frames", 8, "Reverb trajectory_writer of frames, flush every 8"),
         ("frames", 64, "Reverb trajectory_writer of frames, flush every 64")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--clients", default="1")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import reverb
    out = {"versions": {}, "runs": {}}
    for dist in ("dm-reverb", "tensorflow", "numpy"):
        try:
            out["versions"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    tables = [reverb.Table("replay", reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                           1_000_000, reverb.rate_limiters.MinSize(1)),
              reverb.Table("frames", reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                           1_000, reverb.rate_limiters.MinSize(1))]
    server = reverb.Server(tables=tables)
    spawn = multiprocessing.get_context("spawn")
    try:
        for clients in [int(n) for n in args.clients.split(",")]:
            for repeat in range(args.repeats):
                for kind, size, label in CASES:
                    results = spawn.Queue()
                    barrier = spawn.Barrier(clients)   # after they imported reverb
                    procs = [spawn.Process(target=_run_case, args=(
                        server.port, (kind, size), args.seconds, barrier, results))
                        for _ in range(clients)]
                    for proc in procs:
                        proc.start()
                    got = [results.get(timeout=300) for _ in procs]
                    for proc in procs:
                        proc.join(30)
                    key = f"{label}, {clients} client(s)"
                    run = out["runs"].setdefault(key, {"kind": kind, "size": size,
                                                       "clients": clients, "repeats": []})
                    run["repeats"].append({
                        "items_per_s": sum(c for c, *_ in got) / max(e for _, e, *_ in got),
                        "p50_ms": float(np.median([g[2] for g in got])),
                        "p99_ms": float(np.max([g[3] for g in got]))})
    finally:
        server.stop()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

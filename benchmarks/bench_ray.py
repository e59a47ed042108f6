"""Remote inserts through Ray (shmreplay.ray) against local ``Client`` and Reverb's gRPC client.

Starts a 2-node Ray cluster on this machine (1 CPU each, 100 MB object stores): the
buffer and its BufferService on the head node, ``--actors`` remote actors on the other
node that insert through the RemoteClient:

* small transitions (obs float32[8], action int32, reward float32): ``insert`` (one Ray
  call per item), ``insert_batch`` (B = 64, 1024) and the trajectory writer (1-step
  items, several ``chunk_items``); the learner's process's local ``Client.insert`` and
  writer beside them;
* frames (uint8[84, 84, 4], an Atari observation stack): ``insert_batch`` of B = 8 and
  64 frames, and the bound: the same payload through Ray alone, the same call
  (``ray.get`` of an actor call that takes the batch) to an actor on the buffer's node
  made with the BufferService's actor options, which drops it. The buffer-side actor
  times its own part of each frames call (the ledger check, the local
  ``insert_batch``, the ledger write).

Each line runs ``--repeats`` times for ``--seconds``, the lines interleaved; a line's
figure is the median of its runs (all runs are in the JSON), with the calls' latency
(p50, p99). ``--reverb-python PATH`` runs the same workloads through Reverb's gRPC client
(a reverb.Server and N client processes, ``benchmarks/_reverb_remote.py``) in that
virtualenv. Writes results/ray[-SUFFIX].json and .md (machine, date, commit, load).

    python benchmarks/bench_ray.py [--seconds 2] [--repeats 3] [--actors 1]
        [--reverb-python /path/to/venv/bin/python] [--suffix 2026-11-27]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (puts the working copy first on sys.path)

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import shmreplay  # noqa: E402
import shmreplay.ray  # noqa: E402
from shmreplay._ray.remote import RemoteClient  # noqa: E402
from shmreplay._ray.service import BufferActor  # noqa: E402

MB = 2 ** 20
FRAME = (84, 84, 4)   # 28,224 bytes
FRAME_MB = np.prod(FRAME) / 1e6


def _step(i):
    return {"obs": np.full(8, i, np.float32), "action": np.int32(i % 4),
            "reward": np.float32(1.0)}


def _writer_step(writer, counter):
    """One step of a writer (local or remote) and its one-step item, as the actors do."""
    def step():
        writer.append(_step(next(counter)))
        history = writer.history
        writer.create_item("replay", 1.0, {key: history[key][-1]
                                           for key in ("obs", "action", "reward")})
    return step


def _timed(seconds, call, per_call):
    """Runs ``call()`` for ``seconds``: ``(items, elapsed, p50 ms, p99 ms)``."""
    latencies, count = [], 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t)
        count += per_call
    elapsed = time.perf_counter() - start
    values = np.asarray(latencies) * 1e3
    return count, elapsed, float(np.percentile(values, 50)), float(np.percentile(values, 99))


@ray.remote(num_cpus=0)
class Sender:
    """On the remote node: inserts through the RemoteClient (or, for the bound, through
    Ray alone to ``sink``)."""

    def __init__(self, remote, sink=None):
        self.remote, self.sink = remote, sink

    def insert(self, seconds):
        counter = iter(range(1 << 62))
        return _timed(seconds, lambda: self.remote.insert(_step(next(counter)),
                                                          {"replay": 1.0}), 1)

    def insert_batch(self, seconds, batch):
        data = {"obs": np.zeros((batch, 8), np.float32),
                "action": np.zeros(batch, np.int32), "reward": np.ones(batch, np.float32)}
        return _timed(seconds, lambda: self.remote.insert_batch(data, {"replay": 1.0}),
                      batch)

    def writer(self, seconds, chunk_items):
        counter = iter(range(1 << 62))
        with self.remote.trajectory_writer(1, chunk_items=chunk_items) as writer:
            return _timed(seconds, _writer_step(writer, counter), 1)

    def frames(self, seconds, batch, bound=None):
        data = {"frame": np.random.default_rng(0).integers(0, 255, (batch,) + FRAME,
                                                           dtype=np.uint8)}
        if bound:   # "take" (Ray alone) or "copy" (Ray, and one copy of the batch)
            method = getattr(self.sink, bound)
            return _timed(seconds, lambda: ray.get(method.remote(data)), batch)
        return _timed(seconds, lambda: self.remote.insert_batch(data, {"frames": 1.0}),
                      batch)


class Sink:
    """On the buffer's node: takes a payload and drops it (what Ray alone carries), or
    copies it once first (Ray and the one copy that landing it in the buffer needs)."""

    def __init__(self):
        self._rows = None

    def take(self, data):
        return None

    def copy(self, data):
        """Copies the frames into memory of its own, as a local insert_batch must."""
        frames = data["frame"]
        if self._rows is None or self._rows.shape[0] < len(frames):
            self._rows = np.empty_like(frames)
        self._rows[:len(frames)] = frames


class TimedBufferActor(BufferActor):
    """The buffer-side actor, timing its part of each ``insert_batch``."""

    def __init__(self, *args):
        super().__init__(*args)
        self._times = []

    def insert_batch(self, writer_id, seq, data, priorities, timeout):
        t0 = time.perf_counter()
        done, result = self._done(writer_id, seq)
        if done:
            return result
        t1 = time.perf_counter()
        keys = self._client.insert_batch(data, priorities, timeout)
        t2 = time.perf_counter()
        result = self._applied(writer_id, seq, keys)
        self._times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
        return result

    def times(self):
        """Median ms per call of (ledger check, local insert_batch, ledger write)."""
        times, self._times = self._times, []
        if not times:
            return None
        return dict(zip(("ledger_check_ms", "local_insert_batch_ms", "ledger_write_ms"),
                        (float(np.median(column)) * 1e3 for column in zip(*times))))


def _local(name, seconds, kind):
    client = shmreplay.Client(name)
    counter = iter(range(1 << 62))
    try:
        if kind == "insert":
            return _timed(seconds, lambda: client.insert(_step(next(counter)),
                                                         {"replay": 1.0}), 1)
        with client.trajectory_writer(1) as writer:
            return _timed(seconds, _writer_step(writer, counter), 1)
    finally:
        client.close()


def _gather(refs):
    """Sums the actors' runs: ``{items_per_s, p50_ms, p99_ms}``."""
    got = ray.get(refs, timeout=600)
    return {"items_per_s": sum(g[0] for g in got) / max(g[1] for g in got),
            "p50_ms": float(np.median([g[2] for g in got])),
            "p99_ms": float(max(g[3] for g in got))}


def run_ray(args, runs):
    """The Ray side: fills ``runs`` ({label: {"repeats": [...]}})."""
    nodes = Cluster(initialize_head=True,
                    head_node_args={"num_cpus": 1, "object_store_memory": 100 * MB})
    try:
        nodes.add_node(num_cpus=1, object_store_memory=100 * MB)
        ray.init(address=nodes.address, log_to_driver=False)
        nodes.wait_for_nodes(timeout=120)
        here = ray.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
        on_other = NodeAffinitySchedulingStrategy(other, soft=False)
        buffer_side = dict(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                           num_cpus=0, max_concurrency=16)   # as BufferService's actors
        tables = [shmreplay.Table("replay", shmreplay.selectors.Uniform(),
                                  shmreplay.selectors.Fifo(), 1_000_000,
                                  shmreplay.rate_limiters.MinSize(1)),
                  shmreplay.Table("frames", shmreplay.selectors.Uniform(),
                                  shmreplay.selectors.Fifo(), 1_000,
                                  shmreplay.rate_limiters.MinSize(1))]
        with shmreplay.Server(tables, name=f"{args.prefix}-{os.getpid()}") as server, \
                shmreplay.ray.BufferService(server) as service:
            timed = ray.remote(TimedBufferActor).options(**buffer_side).remote(server.name,
                                                                                None)
            sink = ray.remote(Sink).options(**buffer_side).remote()
            ray.get([timed.ping.remote(), sink.take.remote(None)], timeout=120)
            senders = [Sender.options(scheduling_strategy=on_other).remote(
                service.client()) for _ in range(args.actors)]
            framers = [Sender.options(scheduling_strategy=on_other).remote(
                RemoteClient([timed], server.name), sink) for _ in range(args.actors)]
            n = f"{args.actors} actor(s)"
            lines = [(f"remote insert, {n}", senders, "insert", ()),
                     *[(f"remote insert_batch B={b}, {n}", senders, "insert_batch", (b,))
                       for b in (64, 1024)],
                     *[(f"remote trajectory_writer chunk_items={c}, {n}", senders, "writer",
                        (c,)) for c in (16, 256, 1024)]]
            for b in (8, 64):
                lines += [(f"remote insert_batch of frames B={b}, {n}", framers, "frames",
                           (b,)),
                          (f"Ray alone, same frames B={b}, {n}", framers, "frames",
                           (b, "take")),
                          (f"Ray and one copy, same frames B={b}, {n}", framers, "frames",
                           (b, "copy"))]
            lines = [line for line in lines if args.only in line[0]]
            for repeat in range(args.repeats):
                for kind in ("insert", "writer") if args.only in "local" else ():
                    label = f"local Client.{kind}" if kind == "insert" else \
                        "local trajectory_writer"
                    count, elapsed, p50, p99 = _local(server.name, args.seconds, kind)
                    _record(runs, label, {"items_per_s": count / elapsed, "p50_ms": p50,
                                          "p99_ms": p99})
                for label, actors, method, extra in (lines if repeat % 2 == 0
                                                     else lines[::-1]):
                    result = _gather([getattr(actor, method).remote(args.seconds, *extra)
                                      for actor in actors])
                    if method == "frames" and len(extra) == 1:
                        result["buffer_side"] = ray.get(timed.times.remote(), timeout=60)
                    _record(runs, label, result)
            ray.get(timed.remove_ledger.remote(), timeout=60)
            for actor in senders + framers + [timed, sink]:
                ray.kill(actor)
    finally:
        ray.shutdown()
        nodes.shutdown()


def _record(runs, label, result):
    if "frames" in label:
        result["mb_per_s"] = result["items_per_s"] * FRAME_MB
    result["loadavg"] = C.load_average()
    runs.setdefault(label, {"repeats": []})["repeats"].append(result)
    extra = f" {result['mb_per_s']:7,.0f} MB/s" if "mb_per_s" in result else ""
    print(f"{label:55s} {result['items_per_s']:12,.0f} items/s{extra}  p50 "
          f"{result['p50_ms']:8.2f} ms  p99 {result['p99_ms']:8.2f} ms  load "
          f"{result['loadavg'][0]}", flush=True)


def run_reverb(python, args, errors):
    """Runs ``_reverb_remote.py`` in ``python``; its ``runs``, or None."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reverb_remote.py")
    cmd = [python, script, "--seconds", str(args.seconds), "--repeats", str(args.repeats),
           "--clients", str(args.actors)]
    out = C.run_json_worker(cmd, errors, "reverb", timeout=3600)
    if out is None:
        return None
    for run in out["runs"].values():
        for result in run["repeats"]:
            if run["kind"] == "frames":
                result["mb_per_s"] = result["items_per_s"] * FRAME_MB
    return out


def _median(run, key):
    values = [r[key] for r in run["repeats"] if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(runs):
    """Each line's medians, and the frames' ratio to the bound."""
    summary = {}
    for label, run in runs.items():
        line = {key: _median(run, key) for key in ("items_per_s", "mb_per_s", "p50_ms",
                                                    "p99_ms")}
        sides = [r["buffer_side"] for r in run["repeats"] if r.get("buffer_side")]
        if sides:
            line["buffer_side_ms"] = {key: statistics.median(s[key] for s in sides)
                                      for key in sides[0]}
        summary[label] = {key: value for key, value in line.items() if value is not None}
    for label in list(summary):
        if label.startswith("remote insert_batch of frames"):
            for key, name in (("of_ray_alone", "Ray alone, same frames"),
                              ("of_ray_and_copy", "Ray and one copy, same frames")):
                bound = summary.get(label.replace("remote insert_batch of frames", name))
                if bound:
                    summary[label][key] = summary[label]["mb_per_s"] / bound["mb_per_s"]
    return summary


def markdown(info, args, summary, reverb):
    rows = []
    for label, line in summary.items():
        rows.append([label, C.fmt_num(line.get("items_per_s")),
                     C.fmt_num(line.get("mb_per_s")) if "mb_per_s" in line else "",
                     f"{line['p50_ms']:.2f} / {line['p99_ms']:.2f}",
                     f"{line['of_ray_alone']:.0%}" if "of_ray_alone" in line else "",
                     f"{line['of_ray_and_copy']:.0%}" if "of_ray_and_copy" in line else ""])
    notes = [f"{args.repeats} runs of {args.seconds:g} s per line, interleaved; medians",
             f"Ray {ray.__version__}; 2 nodes of 1 CPU on this machine",
             "Reverb: " + (f"dm-reverb {reverb['versions'].get('dm-reverb')}, in-process "
                           "reverb.Server, client processes over localhost gRPC"
                           if reverb else "not measured (no --reverb-python)")]
    return C.markdown_report("Remote inserts: shmreplay.ray and Reverb", info, notes,
                             ["line", "items/s", "MB/s", "call p50 / p99 ms",
                              "of Ray alone", "of Ray and one copy"], rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--actors", type=int, default=1,
                        help="remote actors (and Reverb client processes) at once")
    parser.add_argument("--reverb-python", default=os.environ.get("REVERB_PYTHON"),
                        help="python of a virtualenv with dm-reverb (default: $REVERB_PYTHON)")
    parser.add_argument("--suffix", default=None, help="results/ray-SUFFIX.json")
    parser.add_argument("--prefix", default="bench-ray", help="the buffer's name prefix")
    parser.add_argument("--only", default="", help="only the lines whose label has this")
    args = parser.parse_args(argv)
    info = C.machine_info()
    info["versions"]["ray"] = ray.__version__
    runs, errors, reverb = {}, [], None
    run_ray(args, runs)
    if args.reverb_python:
        reverb = run_reverb(args.reverb_python, args, errors)
        if reverb:
            runs.update(reverb["runs"])
            for label, run in reverb["runs"].items():
                print(f"{label:55s} {_median(run, 'items_per_s'):12,.0f} items/s")
    info["loadavg_at_end"] = C.load_average()
    summary = summarize(runs)
    payload = {"machine": info, "args": vars(args), "summary": summary, "runs": runs,
               "reverb_versions": reverb["versions"] if reverb else None, "errors": errors}
    stem = "ray" + (f"-{args.suffix}" if args.suffix else "")
    for path in C.write_results(stem, payload, markdown(info, args, summary, reverb)):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

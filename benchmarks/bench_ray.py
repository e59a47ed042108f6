"""Remote inserts through Ray (shmreplay.ray) against local ``Client.insert``.

Starts a 2-node Ray cluster on this machine (1 CPU each, 100 MB object stores): the
buffer and its BufferService on the head node, one remote actor on the other node
that inserts small transitions (obs float32[8], action int32, reward float32) through
the RemoteClient, by ``insert`` (one Ray call per item), ``insert_batch`` and the
trajectory writer with several chunk sizes. Prints items/s and writes
benchmarks/results/bench_ray.json.

    python benchmarks/bench_ray.py [--seconds 2]
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import shmreplay  # noqa: E402
import shmreplay.ray  # noqa: E402

MB = 2 ** 20


def _step(i):
    return {"obs": np.full(8, i, np.float32), "action": np.int32(i % 4),
            "reward": np.float32(1.0)}


@ray.remote(num_cpus=0)
class Actor:
    def __init__(self, remote):
        self.remote = remote

    def insert(self, seconds):
        count, end = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            self.remote.insert(_step(count), {"replay": 1.0})
            count += 1
        return count, time.perf_counter() - start

    def insert_batch(self, seconds, batch):
        data = {"obs": np.zeros((batch, 8), np.float32),
                "action": np.zeros(batch, np.int32), "reward": np.ones(batch, np.float32)}
        count, end = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            self.remote.insert_batch(data, {"replay": 1.0})
            count += batch
        return count, time.perf_counter() - start

    def writer(self, seconds, chunk_items):
        count, end = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        with self.remote.trajectory_writer(1, chunk_items=chunk_items) as writer:
            while time.perf_counter() < end:
                writer.append(_step(count))
                history = writer.history
                writer.create_item("replay", 1.0, {key: history[key][-1]
                                                   for key in ("obs", "action", "reward")})
                count += 1
        return count, time.perf_counter() - start


FRAME = (84, 84, 4)   # an Atari observation stack, uint8: 28,224 bytes


@ray.remote(num_cpus=0)
class Sink:
    """On the buffer's node: takes a payload and drops it (what Ray alone carries)."""

    def take(self, data):
        return None


@ray.remote(num_cpus=0)
class FrameActor:
    def __init__(self, remote, sink):
        self.remote, self.sink = remote, sink

    def frames(self, seconds, batch):
        data = {"frame": np.random.default_rng(0).integers(0, 255, (batch,) + FRAME,
                                                           dtype=np.uint8)}
        count, end = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            self.remote.insert_batch(data, {"frames": 1.0})
            count += batch
        return count, time.perf_counter() - start

    def bound(self, seconds, batch):
        data = {"frame": np.random.default_rng(0).integers(0, 255, (batch,) + FRAME,
                                                           dtype=np.uint8)}
        count, end = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            ray.get(self.sink.take.remote(data))
            count += batch
        return count, time.perf_counter() - start


def _local_rate(name, seconds):
    client = shmreplay.Client(name)
    count, end = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        client.insert(_step(count), {"replay": 1.0})
        count += 1
    client.close()
    return count / (time.perf_counter() - start)


def _local_writer_rate(name, seconds):
    client = shmreplay.Client(name)
    count, end = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    with client.trajectory_writer(1) as writer:
        while time.perf_counter() < end:
            writer.append(_step(count))
            history = writer.history
            writer.create_item("replay", 1.0, {key: history[key][-1]
                                               for key in ("obs", "action", "reward")})
            count += 1
    client.close()
    return count / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    nodes = Cluster(initialize_head=True,
                    head_node_args={"num_cpus": 1, "object_store_memory": 100 * MB})
    results = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "ray": ray.__version__}, "items_per_s": {}}
    try:
        nodes.add_node(num_cpus=1, object_store_memory=100 * MB)
        ray.init(address=nodes.address, log_to_driver=False)
        nodes.wait_for_nodes(timeout=60)
        here = ray.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here)
        table = shmreplay.Table("replay", shmreplay.selectors.Uniform(),
                                shmreplay.selectors.Fifo(), 1_000_000,
                                shmreplay.rate_limiters.MinSize(1))
        frames = shmreplay.Table("frames", shmreplay.selectors.Uniform(),
                                 shmreplay.selectors.Fifo(), 1_000,
                                 shmreplay.rate_limiters.MinSize(1))
        with shmreplay.Server([table, frames], name=f"ray-bench-{os.getpid()}") as server, \
                shmreplay.ray.BufferService(server) as service:
            rates = results["items_per_s"]
            rates["local Client.insert"] = _local_rate(server.name, args.seconds)
            rates["local trajectory_writer"] = _local_writer_rate(server.name, args.seconds)
            actor = Actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                other, soft=False)).remote(service.client())
            runs = [("remote insert", actor.insert, ())]
            runs += [(f"remote insert_batch B={b}", actor.insert_batch, (b,))
                     for b in (64, 1024)]
            runs += [(f"remote trajectory_writer chunk_items={c}", actor.writer, (c,))
                     for c in (16, 256, 1024, 4096)]
            for label, method, extra in runs:
                count, elapsed = ray.get(method.remote(args.seconds, *extra), timeout=300)
                rates[label] = count / elapsed
                print(f"{label:45s} {rates[label]:12,.0f} items/s", flush=True)
            for label in ("local Client.insert", "local trajectory_writer"):
                print(f"{label:45s} {rates[label]:12,.0f} items/s")
            ray.kill(actor)
            sink = Sink.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                here, soft=False)).remote()
            framer = FrameActor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                other, soft=False)).remote(service.client(), sink)
            frame_mb = np.prod(FRAME) / 1e6
            results["frames_mb_per_s"] = megabytes = {}
            for batch in (8, 64):
                for label, method in ((f"remote insert_batch of frames B={batch}",
                                       framer.frames),
                                      (f"Ray alone, same payload B={batch}", framer.bound)):
                    count, elapsed = ray.get(method.remote(args.seconds, batch), timeout=300)
                    megabytes[label] = count * frame_mb / elapsed
                    print(f"{label:45s} {count / elapsed:12,.0f} frames/s "
                          f"{megabytes[label]:8,.0f} MB/s", flush=True)
            ray.kill(framer)
            ray.kill(sink)
    finally:
        ray.shutdown()
        nodes.shutdown()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        "bench_ray.json")
    with open(path, "w") as file:
        json.dump(results, file, indent=2)
    print("wrote", path)


if __name__ == "__main__":
    main()

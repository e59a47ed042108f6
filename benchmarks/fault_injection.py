#!/usr/bin/env python
"""Fault injection: busy actors and learners stopped, resumed and killed at random.

Actors (``--actors``, default 3) insert one item or a batch of 4 at a time, each call
with a random timeout of 0.05, 0.2 or 0.5 s; learners (``--learners``, 2) sample
batches of 32 with such timeouts and update the priorities of what they drew (no
timeout: that call waits, as Reverb's does). Every worker is started with
``multiprocessing`` spawn and attaches by name. For ``--seconds`` (60) a controller
picks a worker every few milliseconds and

* stops it (SIGSTOP) for 5 to 300 ms, then resumes it (SIGCONT): 9 faults in 10;
  stopped at a random moment, a busy worker is often inside a locked kernel, holding
  the table's lock while it is stopped;
* or kills it (SIGKILL) and starts a new one in its place.

What must hold, and is checked at the end:

* **Timeouts**: no call with a timeout returned (or raised) later than its timeout plus
  100 ms. A worker that was itself stopped during its call is excused for that call
  (the time it spent stopped is not the library's); the others count.
* **Nothing lost**: every insert an actor saw return (acknowledged in shared memory,
  the value first and then the count covering it, so a SIGKILL cannot leave it
  half-written) is in the table at the end, and no item is torn.
* **Consistency**: the table verifies clean.

The table holds every item inserted during the run (max_size 400,000), so nothing is
evicted and "lost" means lost. Results: ``benchmarks/results/faults.{json,md}``.

Usage:  python benchmarks/fault_injection.py [--seconds 60] [--actors 3] [--learners 2]
            [--seed 0] [--no-save]
"""

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TIMEOUTS = (0.05, 0.2, 0.5)
ALLOWANCE = 0.1  # what a timeout may overrun by
READY_TIMEOUT = 120.0  # s: spawning and attaching every worker, at most
KILL_SHARE = 0.1  # of the faults; the others stop and resume
MAX_SIZE = 400_000
SPAWN = mp.get_context("spawn")


def _signature():
    from shmreplay.specs import TensorSpec
    return {"x": TensorSpec((8,), np.float64), "v": TensorSpec((), np.int64)}


def _items(values):
    values = np.asarray(values, np.int64)
    return {"x": np.repeat(values[:, None].astype(np.float64), 8, axis=1), "v": values}


ACKS_PER_WORKER = MAX_SIZE // 4


class Shared:
    """What the workers report, in shared memory a SIGKILL cannot tear, and no lock a
    killed worker could leave held: each worker position (a killed worker's successor
    takes its position) writes only its own entries."""

    def __init__(self, workers):
        self.acks = SPAWN.RawArray("q", workers * ACKS_PER_WORKER)
        self.acked = SPAWN.RawArray("q", workers)
        # Per position: calls with a timeout, overruns, worst overrun (us), calls excused,
        # and the number of times it was stopped (the controller bumps it before SIGSTOP).
        self.calls = SPAWN.RawArray("q", workers)
        self.overruns = SPAWN.RawArray("q", workers)
        self.worst_us = SPAWN.RawArray("q", workers)
        self.excused = SPAWN.RawArray("q", workers)
        self.stops = SPAWN.RawArray("q", workers)
        self.ready = SPAWN.RawArray("q", workers)  # attached and running

    def acknowledge(self, index, values):
        at = self.acked[index]
        base = index * ACKS_PER_WORKER
        for j, value in enumerate(values):
            self.acks[base + at + j] = int(value)  # the values first, then the count
        self.acked[index] = at + len(values)

    def acknowledged(self):
        return {value for index in range(len(self.acked))
                for value in self.acks[index * ACKS_PER_WORKER:
                                       index * ACKS_PER_WORKER + self.acked[index]]}


def _timed(shared, index, call, timeout, allowance, what="call"):
    """Runs ``call``; records whether it overran ``timeout`` (excused if this worker was
    stopped meanwhile). Returns its result, or None if it raised a timeout."""
    from shmreplay import errors
    stops = shared.stops[index]
    started = time.monotonic()
    try:
        result = call()
    except errors.DeadlineExceededError:
        result = None
    took = time.monotonic() - started
    shared.calls[index] += 1
    if took > timeout + allowance:
        if shared.stops[index] != stops:
            shared.excused[index] += 1
        else:
            shared.overruns[index] += 1
            shared.worst_us[index] = max(shared.worst_us[index],
                                         int((took - timeout) * 1e6))
            print(f"overrun: worker {index} pid {os.getpid()} {what} "
                  f"timeout {timeout} took {took:.3f} s", file=sys.stderr, flush=True)
    return result


def actor(name, index, shared, seed, base, allowance):
    import shmreplay
    client = shmreplay.Client(name)
    rng = random.Random(seed)
    first = base  # values unique to this incarnation
    while True:
        count = 1 if rng.random() < 0.7 else 4
        if shared.acked[index] + count > ACKS_PER_WORKER:
            time.sleep(0.01)
            continue
        first += count
        values = np.arange(first, first + count)
        timeout = rng.choice(TIMEOUTS)
        if count == 1:
            item = {"x": np.full(8, float(first)), "v": np.int64(first)}
            done = _timed(shared, index, lambda: client.insert(
                item, {"t": 1.0}, timeout=timeout), timeout, allowance, "insert")
        else:
            done = _timed(shared, index, lambda: client.insert_batch(
                _items(values), {"t": np.full(count, 1.0)}, timeout=timeout), timeout, allowance,
                          "insert_batch")
        if done is not None:
            shared.acknowledge(index, values)
        shared.ready[index] = 1  # (after a first call: its kernels are loaded)
        time.sleep(rng.random() * 0.004)


def learner(name, index, shared, seed, base, allowance):
    import shmreplay
    client = shmreplay.Client(name)
    rng = random.Random(seed)
    while True:
        timeout = rng.choice(TIMEOUTS)
        batch = _timed(shared, index, lambda: client.sample_batch("t", 32, timeout=timeout),
                       timeout, allowance, "sample_batch")
        shared.ready[index] = 1
        if batch is None:
            continue
        data = batch.data
        assert (data["x"] == data["v"][:, None]).all(), "a torn item was sampled"
        client.update_priorities("t", batch.info.key,
                                 np.array([rng.uniform(0.5, 2.0) for _ in data["v"]]))


def run(seconds=60.0, actors=3, learners=2, seed=0, name=None, allowance=ALLOWANCE,
        at_least=(0, 0), longest=None):
    """The whole run; returns the figures (a dict) and raises nothing on a violation.
    A call counts as an overrun when it took longer than its timeout + ``allowance``.

    ``at_least=(stops, calls)``: the run goes on past ``seconds`` (up to ``longest``)
    until it made that many stops and the workers that many calls with a timeout (on a
    busy machine restarted workers take seconds to attach again)."""
    import shmreplay
    rng = random.Random(seed)
    name = name or f"faults-{os.getpid()}"
    table = shmreplay.Table("t", shmreplay.selectors.Prioritized(0.6),
                            shmreplay.selectors.Fifo(), MAX_SIZE,
                            shmreplay.rate_limiters.MinSize(1), signature=_signature())
    kinds = ["actor"] * actors + ["learner"] * learners
    shared = Shared(len(kinds))
    faults = {"stops": 0, "kills": 0, "stopped_while_locked": 0}
    with shmreplay.Server([table], name=name) as server:
        client = shmreplay.Client(server.name)
        engine = client._engine("t")

        incarnations = [0]

        def start(index):
            target = actor if kinds[index] == "actor" else learner
            incarnations[0] += 1
            shared.ready[index] = 0
            process = SPAWN.Process(target=target, args=(
                server.name, index, shared, rng.randrange(2 ** 31),
                incarnations[0] * 10_000_000, allowance), daemon=True)
            process.start()
            return process

        workers = [start(i) for i in range(len(kinds))]
        try:
            # The faults' time starts once every worker has attached: on a busy machine
            # spawning and importing take seconds, and a run must not end before it began.
            ready_by = time.monotonic() + READY_TIMEOUT
            while not all(shared.ready[i] for i in range(len(kinds))):
                if time.monotonic() > ready_by:
                    raise TimeoutError(f"the workers did not attach within {READY_TIMEOUT} s")
                time.sleep(0.05)
            ended = time.monotonic() + seconds
            give_up = time.monotonic() + (longest or seconds)
            stopped = {}  # index -> when to resume it
            while time.monotonic() < ended or (
                    (faults["stops"] < at_least[0] or sum(shared.calls) < at_least[1])
                    and time.monotonic() < give_up):
                time.sleep(rng.uniform(0.005, 0.05))
                now = time.monotonic()
                for index, when in list(stopped.items()):
                    if when <= now:
                        os.kill(workers[index].pid, signal.SIGCONT)
                        del stopped[index]
                running = [i for i in range(len(workers))
                           if shared.ready[i] and i not in stopped]
                if not running or len(stopped) >= len(workers) // 2 + 1:
                    continue  # (workers import and attach; some must keep running)
                index = rng.choice(running)
                process = workers[index]
                if rng.random() < KILL_SHARE:
                    process.kill()
                    process.join(10)
                    faults["kills"] += 1
                    workers[index] = start(index)
                    continue
                shared.stops[index] += 1
                os.kill(process.pid, signal.SIGSTOP)
                faults["stops"] += 1
                stopped[index] = now + rng.uniform(0.005, 0.3)
                time.sleep(0.001)
                if _holds_lock(engine, process.pid):
                    faults["stopped_while_locked"] += 1
        finally:
            for process in workers:
                if process.is_alive():
                    os.kill(process.pid, signal.SIGCONT)
                    process.kill()
                process.join(10)
        acked = shared.acknowledged()
        from shmreplay._engine import snapshot as _snapshot
        arrays = _snapshot.snapshot_table(engine).arrays
        empty = np.empty(0, np.int64)  # (no item ever inserted: no storage)
        values, rows = arrays.get("store0", empty), arrays.get("store1", empty[:, None])
        torn = int((rows != values[:, None].astype(np.float64)).any(axis=1).sum())
        missing = len(acked - set(values.tolist()))
        problems = client.verify("t")
        client.close()
    return {
        "seconds": seconds, "actors": actors, "learners": learners, "seed": seed,
        "allowance_ms": allowance * 1000,
        **faults,
        "calls_with_timeout": int(sum(shared.calls)),
        "overruns": int(sum(shared.overruns)),
        "worst_overrun_ms": max(shared.worst_us) / 1000,
        "excused_calls": int(sum(shared.excused)),
        "acknowledged": len(acked), "missing": missing, "torn": torn,
        "verify": problems,
    }


def _holds_lock(engine, pid) -> bool:
    """Whether the (stopped) process ``pid`` holds the table's lock: its thread id is the
    mutex's owner."""
    from shmreplay._shm import lock_waits as _lock_waits
    tid = _lock_waits.lock_holder(engine.ctrl)
    if tid == 0:
        return False
    try:
        with open(f"/proc/{tid}/status") as status:
            return any(line.split()[1:] == [str(pid)] for line in status
                       if line.startswith("Tgid:"))
    except OSError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    import _common as C
    C.load_shmreplay()
    info = C.machine_info()
    figures = run(args.seconds, args.actors, args.learners, args.seed)
    ok = (figures["overruns"] == 0 and figures["missing"] == 0 and figures["torn"] == 0
          and not figures["verify"])
    rows = [[key, str(value)] for key, value in figures.items()]
    print(C.render_table(["figure", "value"], rows))
    print("OK" if ok else "VIOLATED")
    if not args.no_save:
        C.write_results("faults", {"machine": info, "figures": figures, "ok": ok},
                        C.markdown_report("Fault injection (SIGSTOP/SIGCONT/SIGKILL)", info,
                                          [__doc__.split("\n\n")[1]], ["figure", "value"],
                                          rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The parent's side of ``bench_soak.py``: the buffer, the workers' start and stop, the
wake-up probes, and the readings of each window (counters, memory, CPU).

Not a public module.
"""

import math
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import time

import numpy as np

import _common as C
from _soak_workers import (ACTOR_ACK, ACTOR_INSERTS, ALPHA, BATCH, BETA, CALL_TIMEOUT,
                           CONTROL_WORDS, ERROR_BUFFER, INS_PROBE_ID, INS_PROBE_T0,
                           LEARNER_ACK, LEARNER_CALLS, LEARNER_ITEMS, LEARNER_SEEN, MAX_SIZE,
                           MIN_SIZE, PAUSE_ACTORS, PAUSE_LEARNER, PHASE, PROBE_PRIORITY,
                           REFERENCE, RUN, SERIAL, SMP_PROBE_ID, SMP_PROBE_T0, SPI,
                           STARTUP_TIMEOUT, STEP_TIMEOUT, STOP, TABLE, WAIT_POLL, transition,
                           worker)


def _wait(condition, what, pump):
    """Waits (polling, bounded by STEP_TIMEOUT) until ``condition()``; checks workers."""
    deadline = time.monotonic() + STEP_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"probe stalled: {what} did not happen in {STEP_TIMEOUT:g} s")
        pump()
        time.sleep(WAIT_POLL)


class Soak:
    def __init__(self, shm, args, name):
        from shmreplay import rate_limiters, selectors
        self.args = args
        self.name = name
        self.n = args.actors
        limiter = rate_limiters.SampleToInsertRatio(SPI, MIN_SIZE, ERROR_BUFFER)
        self.server = shm.Server(
            [shm.Table(TABLE, selectors.Prioritized(ALPHA), selectors.Fifo(), MAX_SIZE, limiter),
             shm.Table(REFERENCE, selectors.Prioritized(ALPHA), selectors.Fifo(), 10_000,
                       rate_limiters.MinSize(1))], name=name)
        try:
            self._setup(shm, args)
        except BaseException:
            self.server.stop()
            raise

    def _setup(self, shm, args):
        self.client = shm.Client(self.server.name)
        # The waiter counts of the table (read-only instrumentation: nothing public says
        # "a call is waiting right now", and a probe must know that it is).
        from shmreplay._shm import layout as _layout
        self._ctrl = self.client._engine(TABLE).ctrl
        self._items_waiters, self._space_waiters = _layout.C_ITEMS_WAITERS, _layout.C_SPACE_WAITERS
        self.ctx = mp.get_context("spawn")
        self.control = self.ctx.RawArray("q", CONTROL_WORDS)
        self.msgs = self.ctx.Queue()
        self.procs = []
        self.results = {}
        self.probe_ids = {"sample": 0, "insert": 0}
        self.probe_calls = {"sample": [], "insert": []}   # the unblocking calls' durations
        rng = np.random.default_rng(args.seed + 999)
        k = math.ceil(BATCH / SPI)
        self.probe_batch = {key: np.stack([value] * k)
                            for key, value in transition(rng, -1).items()}
        self.probe_prios = np.full(k, PROBE_PRIORITY)
        # Every call the workers make, once here first: numba loads (or compiles and
        # caches) the kernels in this process, so the workers only load them.
        warm = transition(rng, -1)
        self.client.insert(warm, {REFERENCE: 1.0}, timeout=CALL_TIMEOUT)
        self.client.insert_batch(self.probe_batch, {REFERENCE: self.probe_prios},
                                 timeout=CALL_TIMEOUT)
        sample = self.client.sample_batch(REFERENCE, 8, timeout=CALL_TIMEOUT)
        sample.info.importance_weights(BETA)
        self.client.update_priorities(REFERENCE, sample.info.key, np.ones(len(sample.info.key)))

    # workers ------------------------------------------------------------------------------

    def start(self):
        roles = [("actor", i) for i in range(self.n)] + [("learner", 0)]
        for role, i in roles:
            p = self.ctx.Process(target=worker, name=f"bench-soak-{role}-{i}",
                                 args=(role, i, self.name, self.control, self.msgs,
                                       self.args.seed + 1 + i + (100 if role == "learner" else 0)))
            p.start()
            self.procs.append((role, i, p))
        ready = set()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while len(ready) < len(roles):
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not ready after {STARTUP_TIMEOUT:g} s")
            message = self._next_message(0.5)
            if message and message[0] == "ready":
                ready.add((message[1], message[2]))

    def _next_message(self, timeout):
        try:
            message = self.msgs.get(timeout=timeout)
        except queue_mod.Empty:
            dead = [p for _, _, p in self.procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{dead[0].name} died with exit code {dead[0].exitcode}")
            return None
        if message[0] == "error":
            raise RuntimeError(f"{message[1]} {message[2]} failed:\n{message[3]}")
        if message[0] == "done":
            self.results[(message[1], message[2])] = message[3]
        return message

    def wait_full(self):
        """Waits until the table is full: the steady state. (A sample probe needs at least
        ``min_size_to_sample`` items: below that, its insert would not free the learner.)"""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while self.client.server_info()[TABLE].current_size < MAX_SIZE:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the table did not fill in {STARTUP_TIMEOUT:g} s")
            self.pump()
            time.sleep(0.05)

    def pump(self):
        """Surfaces a worker's error or death without waiting."""
        while self._next_message(0) is not None:
            pass

    def pids(self):
        return {"parent": os.getpid(),
                **{f"{role}{i}" if role == "actor" else role: p.pid
                   for role, i, p in self.procs}}

    def finish(self):
        """Stops the workers; returns their results. The buffer is stopped after a grace
        period, which wakes any call still waiting (they then exit)."""
        self.control[PHASE] = STOP
        deadline = time.monotonic() + 10
        while len(self.results) < len(self.procs) and time.monotonic() < deadline:
            self._next_message(0.2)
        if len(self.results) < len(self.procs):
            self.server.stop()
            deadline = time.monotonic() + 10
            while len(self.results) < len(self.procs) and time.monotonic() < deadline:
                self._next_message(0.2)
        return self.results

    def close(self):
        self.control[PHASE] = STOP
        self._ctrl = None  # no view into the mapping may outlive it
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - views may still be held; the stop below matters
            pass
        self.server.stop()
        C.reap([p for _, _, p in self.procs])

    # probes -------------------------------------------------------------------------------

    def _pause(self, phase):
        self.control[SERIAL] += 1
        self.control[PHASE] = phase
        return self.control[SERIAL]

    def sample_probe(self):
        serial = self._pause(PAUSE_ACTORS)
        control, ctrl = self.control, self._ctrl
        _wait(lambda: all(control[ACTOR_ACK + i] == serial for i in range(self.n)),
              "the actors pausing", self.pump)
        _wait(lambda: ctrl[self._items_waiters] >= 1, "the learner waiting", self.pump)
        probe = self.probe_ids["sample"] = self.probe_ids["sample"] + 1
        self.probe_batch["probe"][:] = probe
        t0 = time.monotonic_ns()
        self.probe_batch["t_ns"][:] = t0
        control[SMP_PROBE_T0] = t0
        control[SMP_PROBE_ID] = probe
        self.client.insert_batch(self.probe_batch, {TABLE: self.probe_prios},
                                 timeout=CALL_TIMEOUT)
        self.probe_calls["sample"].append(time.monotonic_ns() - t0)
        _wait(lambda: control[LEARNER_SEEN] == probe, "the learner's return", self.pump)
        control[PHASE] = RUN

    def insert_probe(self):
        serial = self._pause(PAUSE_LEARNER)
        control, ctrl = self.control, self._ctrl
        _wait(lambda: control[LEARNER_ACK] == serial, "the learner pausing", self.pump)
        _wait(lambda: ctrl[self._space_waiters] >= self.n, "every actor waiting", self.pump)
        probe = self.probe_ids["insert"] = self.probe_ids["insert"] + 1
        t0 = time.monotonic_ns()
        control[INS_PROBE_T0] = t0
        control[INS_PROBE_ID] = probe
        self.client.sample_batch(TABLE, int(SPI) * self.n, timeout=CALL_TIMEOUT)
        self.probe_calls["insert"].append(time.monotonic_ns() - t0)
        _wait(lambda: all(control[ACTOR_ACK + i] == serial for i in range(self.n)),
              "every actor's return", self.pump)
        control[PHASE] = RUN

    def reference_calls(self, count=500):
        """The probes' two calls on a table that nobody waits on: what they cost without
        waking anyone (the part of a measured wake-up that precedes the commit is less)."""
        batch = dict(self.probe_batch, probe=np.zeros_like(self.probe_batch["probe"]),
                     t_ns=np.zeros_like(self.probe_batch["t_ns"]))
        calls = {"insert": [], "sample": []}
        for _ in range(count):
            t0 = time.monotonic_ns()
            self.client.insert_batch(batch, {REFERENCE: self.probe_prios}, timeout=CALL_TIMEOUT)
            t1 = time.monotonic_ns()
            self.client.sample_batch(REFERENCE, int(SPI) * self.n, timeout=CALL_TIMEOUT)
            calls["insert"].append(t1 - t0)
            calls["sample"].append(time.monotonic_ns() - t1)
        return calls

    # measurements -------------------------------------------------------------------------

    def counters(self):
        info = self.client.server_info()[TABLE]
        return {"t": time.monotonic(), "inserted": info.num_inserted,
                "sampled": info.num_sampled, "size": info.current_size,
                "actors": [int(self.control[ACTOR_INSERTS + i]) for i in range(self.n)],
                "learner_items": int(self.control[LEARNER_ITEMS]),
                "learner_calls": int(self.control[LEARNER_CALLS]),
                "probes": dict(self.probe_ids), "cpu": _cpu_ticks(self.pids().values())}

    def shm_bytes(self):
        prefix = "shmreplay." + self.name
        total = 0
        for entry in os.listdir("/dev/shm"):
            if entry == prefix or entry.startswith(prefix + ".t"):
                try:
                    total += os.stat(os.path.join("/dev/shm", entry)).st_blocks * 512
                except FileNotFoundError:
                    pass
        return total


def check_clean(name):
    """This run's segments left in /dev/shm (should be none); other runs' are not ours."""
    prefix = f"shmreplay.{name}"
    left = [entry for entry in C.leftover_segments(marker=prefix)
            if entry in (prefix, "sem." + prefix) or entry.startswith((prefix + ".",
                                                                       "sem." + prefix + "."))]
    if left:
        print(f"WARNING: left in /dev/shm: {left}", file=sys.stderr)
    return left


def status_kib(pid):
    """``{VmRSS, RssAnon, RssShmem}`` in KiB from /proc/PID/status (None if gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "RssAnon", "RssShmem"):
                    out[key] = int(line.split()[1])
    except OSError:
        return None
    return out


def _cpu_ticks(pids):
    """``(busy, steal, total)`` ticks of the whole machine (/proc/stat) and ``ours``, the
    user + system ticks of the given processes (/proc/PID/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
    ours = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            ours += int(rest[11]) + int(rest[12])  # fields 14 and 15: utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return {"busy": user + nice + system + irq + softirq, "steal": steal,
            "total": sum(fields), "ours": ours}


def window_record(before, after, shm_bytes, memory):
    dt = after["t"] - before["t"]
    cpu = {k: after["cpu"][k] - before["cpu"][k] for k in after["cpu"]}
    total = max(cpu["total"], 1)
    return {
        "t_end_s": None,  # filled by the caller (seconds since the measured start)
        "seconds": round(dt, 3),
        "inserts_s": (after["inserted"] - before["inserted"]) / dt,
        "samples_s": (after["sampled"] - before["sampled"]) / dt,
        "per_actor_inserts_s": [(a - b) / dt for a, b in zip(after["actors"], before["actors"])],
        "learner_items_s": (after["learner_items"] - before["learner_items"]) / dt,
        "learner_calls_s": (after["learner_calls"] - before["learner_calls"]) / dt,
        "probes": {k: after["probes"][k] - before["probes"][k] for k in after["probes"]},
        "table_size": after["size"],
        "shm_bytes": shm_bytes,
        "memory_kib": memory,
        # Shares of the machine's CPU time (all cores): this benchmark's processes, every
        # other process (another run on the machine would show here), and the time the
        # hypervisor gave to other guests.
        "cpu_ours_pct": 100 * cpu["ours"] / total,
        "cpu_others_pct": max(0.0, 100 * (cpu["busy"] - cpu["ours"]) / total),
        "cpu_steal_pct": 100 * cpu["steal"] / total,
    }

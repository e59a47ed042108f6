#!/usr/bin/env python
"""Soak: actors and a learner run for minutes against one rate-limited prioritized table.

Several actor processes (``--actors``, default 3) insert small transitions, one per call,
each carrying the ``time.monotonic_ns()`` taken just before its insert call (column
``t_ns``). One learner process loops ``sample_batch(table, 256)`` + importance weights +
``update_priorities``. The table is ``Prioritized(0.6)`` / ``Fifo`` with
``SampleToInsertRatio(8, 1000, 2560)``, so whichever side runs ahead blocks. Every worker
is started with ``multiprocessing`` spawn and attaches by name; all calls have timeouts.

The run starts once the table is full, after a warm-up (5 s; 3 with ``--quick``).
Every ``--window`` seconds (10; 2 with ``--quick``) the parent records: inserts/s and
sampled items/s (from ``TableInfo`` counters), the buffer's shared memory (``st_blocks``
of its ``/dev/shm`` segments) and the ``VmRSS`` (and ``RssAnon``) of every process, so
that throughput decay or memory growth would show.

Wake-up latency of blocked calls, measured by probes every ``--probe-every`` s (0.25),
alternating the two kinds:

* *sample wake-up*: the parent pauses the actors and waits until the learner's
  ``sample_batch`` is registered as waiting (the table's waiter count). It then inserts,
  as the only writer, a batch of ``ceil(256 / 8)`` items stamped with
  ``t_ns = time.monotonic_ns()`` taken just before the call, at a priority so high that
  the next draw takes them; that one commit gives the learner credit for a full batch.
  The learner finds the stamped items in the batch its waiting call returns and records
  ``monotonic_ns() after the return - t_ns``. CLOCK_MONOTONIC is system-wide on Linux.
* *insert wake-up*: the parent pauses the learner and waits until every actor's insert is
  registered as waiting (the rate limiter's max_diff). It then samples, as the only
  sampler, ``8 * actors`` items (credit for one insert per actor), with ``t0 =
  monotonic_ns()`` taken just before that call and published in shared memory before it.
  Each actor whose waiting insert (started before ``t0``) returns records
  ``return - t0``.

Both include the unblocking call's own time from its start to its commit, so they are
upper bounds on the wake-up proper. That part is at most what the same call costs on a
second table of the buffer that nobody waits on ("reference table", timed 500 times after
the warm-up); the "probe call" rows give the unblocking call's duration when it does wake
someone (the futex wake and the scheduler's handling of it). The paused side sleeps
during a probe, so a probe measures the wake-up itself, not the queueing behind busy
peers; with 3 actors woken at once on 2 cores, the later ones still wait for a core.

Usage:  python benchmarks/bench_soak.py [--seconds 180] [--quick] [--actors 3]
            [--window 10] [--probe-every 0.25] [--seed 0]
Writes: benchmarks/results/soak[-quick].{json,md}
"""

import argparse
import math
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import numpy as np  # noqa: E402

TABLE = "replay"
REFERENCE = "reference"   # a table nobody waits on: the probe calls' cost without a wake-up
MAX_SIZE = 100_000
BATCH = 256
ALPHA = 0.6
BETA = 0.4
SPI = 8.0                 # samples per insert
MIN_SIZE = 1000
ERROR_BUFFER = 10 * BATCH  # the band is SPI * MIN_SIZE +- this
PROBE_PRIORITY = 1e9      # probe items: the learner's next draw takes them
CALL_TIMEOUT = 30.0       # every blocking call of a worker
STEP_TIMEOUT = 10.0       # every wait of the parent for a worker's state
STARTUP_TIMEOUT = 180.0
OBS = 8

# Words of the shared control block (int64).
(PHASE, SERIAL, SMP_PROBE_ID, SMP_PROBE_T0, INS_PROBE_ID, INS_PROBE_T0, LEARNER_ACK,
 LEARNER_SEEN, LEARNER_CALLS, LEARNER_ITEMS) = range(10)
ACTOR_ACK = 16            # + actor index
ACTOR_INSERTS = 48        # + actor index
CONTROL_WORDS = 80
MAX_ACTORS = 32
RUN, PAUSE_ACTORS, PAUSE_LEARNER, STOP = range(4)
POLL = 0.001              # how often a paused worker looks at the control block
WAIT_POLL = 0.0002        # how often the parent does, while it runs a probe


# --------------------------------------------------------------------------- workers

def _transition(rng, actor):
    return {"obs": rng.standard_normal(OBS).astype(np.float32),
            "action": np.int32(rng.integers(0, 4)),
            "reward": np.float32(rng.standard_normal()),
            "discount": np.float32(0.99),
            "next_obs": rng.standard_normal(OBS).astype(np.float32),
            "actor": np.int32(actor),
            "probe": np.zeros((), np.int64),    # 0, or the id of a sample probe
            "t_ns": np.zeros((), np.int64)}     # monotonic_ns() before the insert call


def _paused():
    """One poll interval of a paused worker; exits if the parent died (it was killed)."""
    if os.getppid() != _PARENT[0]:
        os._exit(3)
    time.sleep(POLL)


_PARENT = [0]


def _worker(role, index, name, control, msgs, seed):
    """Runs one actor or the learner; reports ("ready" | "done" | "error", ...)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates the shutdown
    _PARENT[0] = os.getppid()
    try:
        import shmreplay
        from shmreplay import errors
        client = shmreplay.Client(name)
        try:
            result = (_actor if role == "actor" else _learner)(
                client, errors, index, control, msgs, seed)
        finally:
            client.close()
        msgs.put(("done", role, index, result))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        msgs.put(("error", role, index, traceback.format_exc()))


def _actor(client, errors, index, control, msgs, seed):
    rng = np.random.default_rng(seed)
    item = _transition(rng, index)
    stamp = item["t_ns"]
    prio = {TABLE: 1.0}
    insert = client.insert
    now = time.monotonic_ns
    insert(item, prio, timeout=CALL_TIMEOUT)  # warm-up: attach the columns, load kernels
    msgs.put(("ready", "actor", index, None))
    wakeups = []                              # (probe id, ns from unblocking call to return)
    seen = 0
    inserted = 0
    while True:
        phase = control[PHASE]
        if phase == STOP:
            break
        if phase == PAUSE_ACTORS:
            control[ACTOR_ACK + index] = control[SERIAL]
            _paused()
            continue
        t_call = now()
        stamp[...] = t_call
        try:
            insert(item, prio, timeout=CALL_TIMEOUT)
        except errors.BufferBrokenError:
            if control[PHASE] == STOP:
                break  # the parent stopped the buffer to end the run
            raise
        t_return = now()
        inserted += 1
        control[ACTOR_INSERTS + index] = inserted
        if control[INS_PROBE_ID] != seen:
            seen = control[INS_PROBE_ID]
            t0 = control[INS_PROBE_T0]
            if t_call < t0:  # this insert was waiting when the probe's sample began
                wakeups.append((int(seen), t_return - t0))
            control[ACTOR_ACK + index] = control[SERIAL]
            while control[PHASE] == PAUSE_LEARNER:
                _paused()
    return {"inserted": inserted, "wakeups": wakeups}


def _learner(client, errors, index, control, msgs, seed):
    rng = np.random.default_rng(seed)
    pool = [rng.random(BATCH) + 0.05 for _ in range(8)]
    sample_batch, update = client.sample_batch, client.update_priorities
    now = time.monotonic_ns
    for _ in range(20):  # warm-up on the parent's reference table: load every kernel now
        warm = sample_batch(REFERENCE, 8, timeout=CALL_TIMEOUT)
        warm.info.importance_weights(BETA)
        update(REFERENCE, warm.info.key, pool[0][:len(warm.info.key)])
    msgs.put(("ready", "learner", index, None))
    wakeups = []         # (probe id, ns from the probe's t_ns to the return)
    missed = []          # probes whose items were not in the returned batch (t0 used)
    seen = 0
    calls = items = 0
    while True:
        phase = control[PHASE]
        if phase == STOP:
            break
        if phase == PAUSE_LEARNER:
            control[LEARNER_ACK] = control[SERIAL]
            _paused()
            continue
        t_call = now()
        try:
            sample = sample_batch(TABLE, BATCH, timeout=CALL_TIMEOUT)
        except errors.BufferBrokenError:
            if control[PHASE] == STOP:
                break
            raise
        t_return = now()
        if control[SMP_PROBE_ID] != seen:
            seen = control[SMP_PROBE_ID]
            t0 = control[SMP_PROBE_T0]
            if t_call < t0:  # this call was waiting when the probe's insert began
                hit = sample.data["probe"] == seen
                if hit.any():
                    wakeups.append((int(seen), t_return - int(sample.data["t_ns"][hit].min())))
                else:
                    missed.append((int(seen), t_return - t0))
            control[LEARNER_SEEN] = seen
        sample.info.importance_weights(BETA)
        keys = sample.info.key
        calls += 1
        update(TABLE, keys, pool[calls & 7][:len(keys)])
        items += len(keys)
        control[LEARNER_CALLS] = calls
        control[LEARNER_ITEMS] = items
    return {"calls": calls, "items": items, "wakeups": wakeups, "missed": missed}


# --------------------------------------------------------------------------- parent

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
                            for key, value in _transition(rng, -1).items()}
        self.probe_prios = np.full(k, PROBE_PRIORITY)
        # Every call the workers make, once here first: numba loads (or compiles and
        # caches) the kernels in this process, so the workers only load them.
        warm = _transition(rng, -1)
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
            p = self.ctx.Process(target=_worker, name=f"bench-soak-{role}-{i}",
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


def _check_clean(name):
    """This run's segments left in /dev/shm (should be none); other runs' are not ours."""
    prefix = f"shmreplay.{name}"
    left = [entry for entry in C.leftover_segments(marker=prefix)
            if entry in (prefix, "sem." + prefix) or entry.startswith((prefix + ".",
                                                                       "sem." + prefix + "."))]
    if left:
        print(f"WARNING: left in /dev/shm: {left}", file=sys.stderr)
    return left


def _status_kib(pid):
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


def _window(before, after, shm_bytes, memory):
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


def _percentiles(values_ns):
    if not values_ns:
        return None
    v = np.sort(np.asarray(values_ns, np.float64)) / 1e3  # µs
    return {"n": int(v.size), "p50_us": float(np.percentile(v, 50)),
            "p90_us": float(np.percentile(v, 90)), "p99_us": float(np.percentile(v, 99)),
            "max_us": float(v[-1]), "mean_us": float(v.mean())}


def _slope_per_min(ts, ys):
    """Least-squares slope of ``ys`` against ``ts`` (seconds), per minute."""
    if len(ts) < 2:
        return None
    return float(np.polyfit(np.asarray(ts, float), np.asarray(ys, float), 1)[0] * 60)


def _fmt_us(x):
    return "n/a" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.1f}")


def run(args):
    shm, why = C.load_shmreplay()
    if shm is None:
        print("shmreplay unavailable:", why)
        return 1
    if not 1 <= args.actors <= MAX_ACTORS:
        raise SystemExit(f"--actors must be in 1..{MAX_ACTORS}")
    seconds = args.seconds if args.seconds is not None else (16.0 if args.quick else 180.0)
    window = args.window if args.window is not None else (2.0 if args.quick else 10.0)
    warmup = 3.0 if args.quick else 5.0
    info = C.machine_info()
    for line in C.machine_lines(info):
        print(line)
    print(f"mode: {'quick' if args.quick else 'full'}; {seconds:g} s measured after {warmup:g} s "
          f"of warm-up; windows of {window:g} s; {args.actors} actors + 1 learner; "
          f"probes every {args.probe_every:g} s\n")

    name = f"bench-soak-{os.getpid()}"

    def terminated(signum, frame):  # SIGTERM: the same orderly stop as Ctrl-C
        raise KeyboardInterrupt
    # Installed before the Server exists: its handler stops the buffer, then calls this one.
    signal.signal(signal.SIGTERM, terminated)
    soak = None
    windows, errors = [], []
    interrupted = False
    results = {}
    pids = {}
    warm_ids = {"sample": 0, "insert": 0}
    reference = {"insert": [], "sample": []}
    try:
        soak = Soak(shm, args, name)
        soak.start()
        soak.wait_full()
        pids = soak.pids()
        kinds = [soak.sample_probe, soak.insert_probe]
        probes_run = 0
        t_warm = time.monotonic()
        while time.monotonic() - t_warm < warmup:  # probes too: their first calls load code
            kinds[probes_run % 2]()
            probes_run += 1
            soak.pump()
            time.sleep(args.probe_every)
        warm_ids = dict(soak.probe_ids)  # probes up to these ids are not reported
        reference = soak.reference_calls()
        soak.probe_calls = {"sample": [], "insert": []}
        header = (f"{'t (s)':>6s} {'inserts/s':>10s} {'samples/s':>10s} {'size':>7s} "
                  f"{'shm MiB':>8s}  CPU % ours/others/steal  RSS MiB (" + " ".join(pids) + ")")
        print(header)
        start = time.monotonic()
        before = soak.counters()
        next_window = start + window
        next_probe = start + args.probe_every
        while True:
            now = time.monotonic()
            if now >= next_window:
                after = soak.counters()
                memory = {k: _status_kib(pid) for k, pid in pids.items()}
                w = _window(before, after, soak.shm_bytes(), memory)
                w["t_end_s"] = round(after["t"] - start, 2)
                windows.append(w)
                rss = " ".join(f"{(m or {}).get('VmRSS', 0) / 1024:.1f}" for m in memory.values())
                cpu = (f"{w['cpu_ours_pct']:.0f}/{w['cpu_others_pct']:.0f}/"
                       f"{w['cpu_steal_pct']:.0f}")
                print(f"{w['t_end_s']:6.1f} {C.fmt_num(w['inserts_s']):>10s} "
                      f"{C.fmt_num(w['samples_s']):>10s} {w['table_size']:7d} "
                      f"{w['shm_bytes'] / 2**20:8.1f}  {cpu:>23s}  {rss}", flush=True)
                before = after
                if after["t"] - start >= seconds - 1e-6:
                    break
                while next_window <= time.monotonic():  # late (a stall): one longer window
                    next_window += window
                next_window = min(next_window, start + seconds)
                continue
            if now >= next_probe:
                kinds[probes_run % 2]()
                probes_run += 1
                next_probe += args.probe_every
                if next_probe < time.monotonic():  # never queue probes up
                    next_probe = time.monotonic() + args.probe_every
                continue
            soak.pump()
            time.sleep(max(0.0, min(next_window, next_probe) - time.monotonic()))
        results = soak.finish()
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the workers and removing the buffer", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - report, never work around
        tb = traceback.format_exc()
        print("FAILED\n" + tb, file=sys.stderr)
        errors.append({"error": repr(exc), "traceback": tb})
    finally:
        if soak is not None:
            soak.close()
    if interrupted:
        _check_clean(name)
        return 130

    # ---- summary ------------------------------------------------------------------------
    learner = results.get(("learner", 0), {})
    sample_wake = [ns for probe, ns in learner.get("wakeups", []) if probe > warm_ids["sample"]]
    missed = [m for m in learner.get("missed", []) if m[0] > warm_ids["sample"]]
    by_probe = {}
    for i in range(args.actors):
        for probe, ns in results.get(("actor", i), {}).get("wakeups", []):
            if probe > warm_ids["insert"]:
                by_probe.setdefault(probe, []).append(ns)
    insert_wake = [ns for values in by_probe.values() for ns in values]
    insert_first = [min(values) for values in by_probe.values()]
    insert_last = [max(values) for values in by_probe.values() if len(values) == args.actors]
    latency = {
        "sample_wakeup": _percentiles(sample_wake),
        "sample_wakeup_missed_items": len(missed),
        "insert_wakeup_all": _percentiles(insert_wake),
        "insert_wakeup_first_per_probe": _percentiles(insert_first),
        "insert_wakeup_last_per_probe": _percentiles(insert_last),
        "probe_call_insert_batch": _percentiles(soak.probe_calls["sample"] if soak else []),
        "probe_call_sample": _percentiles(soak.probe_calls["insert"] if soak else []),
        "reference_insert_batch": _percentiles(reference["insert"]),
        "reference_sample": _percentiles(reference["sample"]),
        "probes": ({k: v - warm_ids[k] for k, v in soak.probe_ids.items()} if soak else {}),
    }
    ts = [w["t_end_s"] for w in windows]
    ins = [w["inserts_s"] for w in windows]
    smp = [w["samples_s"] for w in windows]
    shm_b = [w["shm_bytes"] for w in windows]

    def rss(key, field="VmRSS"):
        return [((w["memory_kib"].get(key) or {}).get(field) or 0) / 1024 for w in windows]

    trend = {}
    if windows:
        trend = {
            "inserts_s_first_last": [ins[0], ins[-1]],
            "inserts_s_min_max": [min(ins), max(ins)],
            "inserts_s_slope_pct_per_min": (100 * _slope_per_min(ts, ins) / statistics.mean(ins)
                                            if len(ins) > 1 else None),
            "samples_s_first_last": [smp[0], smp[-1]],
            "samples_s_min_max": [min(smp), max(smp)],
            "samples_s_slope_pct_per_min": (100 * _slope_per_min(ts, smp) / statistics.mean(smp)
                                            if len(smp) > 1 else None),
            "shm_mib_first_last": [shm_b[0] / 2**20, shm_b[-1] / 2**20],
            "rss_mib_first_last": {k: [rss(k)[0], rss(k)[-1]] for k in pids},
            "rss_anon_mib_first_last": {k: [rss(k, "RssAnon")[0], rss(k, "RssAnon")[-1]]
                                        for k in pids},
        }

    win_headers = ["t (s)", "inserts/s", "samples/s", "learner calls/s", "size", "shm MiB",
                   "CPU % ours/others/steal"] + [f"{k} RSS MiB" for k in pids]
    win_rows = []
    for w in windows:
        win_rows.append([f"{w['t_end_s']:.0f}", C.fmt_num(w["inserts_s"]),
                         C.fmt_num(w["samples_s"]), C.fmt_num(w["learner_calls_s"]),
                         w["table_size"], f"{w['shm_bytes'] / 2**20:.1f}",
                         f"{w['cpu_ours_pct']:.0f} / {w['cpu_others_pct']:.0f} / "
                         f"{w['cpu_steal_pct']:.0f}"] +
                        [f"{((w['memory_kib'].get(k) or {}).get('VmRSS') or 0) / 1024:.1f}"
                         for k in pids])
    lat_headers = ["wake-up", "n", "p50 µs", "p90 µs", "p99 µs", "max µs"]
    lat_rows = []
    for label, key in (("sample: probe insert -> learner's sample_batch returns",
                        "sample_wakeup"),
                       ("insert: probe sample -> each waiting actor's insert returns",
                        "insert_wakeup_all"),
                       ("insert: first actor back, per probe", "insert_wakeup_first_per_probe"),
                       ("insert: last actor back, per probe", "insert_wakeup_last_per_probe"),
                       (f"probe call: insert_batch of {math.ceil(BATCH / SPI)} (start to return)",
                        "probe_call_insert_batch"),
                       (f"probe call: sample_batch of {int(SPI) * args.actors} (start to return)",
                        "probe_call_sample"),
                       ("same insert_batch, nobody waiting (reference table)",
                        "reference_insert_batch"),
                       ("same sample_batch, nobody waiting (reference table)",
                        "reference_sample")):
        p = latency[key]
        lat_rows.append([label] + (["0", "n/a", "n/a", "n/a", "n/a"] if p is None else
                                   [p["n"], _fmt_us(p["p50_us"]), _fmt_us(p["p90_us"]),
                                    _fmt_us(p["p99_us"]), _fmt_us(p["max_us"])]))
    trend_rows = []
    if trend:
        trend_rows = [
            ["inserts/s first / last window", f"{C.fmt_num(ins[0])} / {C.fmt_num(ins[-1])}"],
            ["inserts/s min / max", f"{C.fmt_num(min(ins))} / {C.fmt_num(max(ins))}"],
            ["inserts/s trend (least squares)",
             f"{trend['inserts_s_slope_pct_per_min']:+.2f} %/min"
             if trend["inserts_s_slope_pct_per_min"] is not None else "n/a"],
            ["samples/s first / last window", f"{C.fmt_num(smp[0])} / {C.fmt_num(smp[-1])}"],
            ["samples/s trend (least squares)",
             f"{trend['samples_s_slope_pct_per_min']:+.2f} %/min"
             if trend["samples_s_slope_pct_per_min"] is not None else "n/a"],
            ["shared memory first / last window (MiB)",
             f"{shm_b[0] / 2**20:.1f} / {shm_b[-1] / 2**20:.1f}"],
        ] + [[f"{k} VmRSS (RssAnon) first / last (MiB)",
              f"{rss(k)[0]:.1f} ({rss(k, 'RssAnon')[0]:.1f}) / "
              f"{rss(k)[-1]:.1f} ({rss(k, 'RssAnon')[-1]:.1f})"] for k in pids]

    print()
    print(C.render_table(win_headers, win_rows))
    print()
    print(C.render_table(["trend", "value"], trend_rows))
    print()
    print(C.render_table(lat_headers, lat_rows))
    if missed:
        print(f"\n{len(missed)} sample probe(s) returned without the probe's items in the "
              "batch (timed from the published t0 instead; not in the percentiles)")
    notes = [
        f"mode: {'quick' if args.quick else 'full'}; {seconds:g} s measured after "
        f"{warmup:g} s warm-up, windows of {window:g} s",
        f"{args.actors} actor processes insert one transition per call (obs f32[{OBS}] x2, "
        "action, reward, discount, actor, probe, t_ns); 1 learner: sample_batch(256) + "
        f"importance weights + update_priorities; Prioritized({ALPHA}), Fifo, max_size "
        f"{MAX_SIZE}, SampleToInsertRatio({SPI:g}, {MIN_SIZE}, {ERROR_BUFFER}); spawn",
        "inserts/s and samples/s from TableInfo counters (sampled items, incl. probes); "
        "shm = st_blocks of the buffer's /dev/shm segments; RSS = VmRSS of each process "
        "(it counts the shared pages a process touched; RssAnon in the JSON); CPU % = "
        "shares of all cores' time (/proc/stat): this benchmark's processes, all other "
        "processes, and steal (time the hypervisor gave to other guests)",
        f"wake-ups: probes every {args.probe_every:g} s, alternating; the paused side sleeps. "
        "Sample: the parent inserts 32 items stamped with monotonic_ns() (t_ns) while the "
        "actors are paused and the learner's sample_batch is registered waiting; latency = "
        "the learner's return - t_ns of those items in its batch. Insert: the parent samples "
        "8 x actors items while the learner is paused and every actor's insert is registered "
        "waiting; latency = each actor's return - monotonic_ns() before that sample call. "
        "Both include the unblocking call's own time up to its commit: at most what the same "
        "call costs on a table nobody waits on (the 'reference table' rows)",
        f"{info['cores_usable']} usable cores for {args.actors + 2} processes "
        "(parent mostly sleeps): oversubscribed",
    ]
    md = C.markdown_header("Soak: actors + learner on a rate-limited prioritized table", info,
                           notes)
    md += "\n" + C.render_table(win_headers, win_rows, markdown=True) + "\n\n"
    md += C.render_table(["trend", "value"], trend_rows, markdown=True) + "\n\n"
    md += C.render_table(lat_headers, lat_rows, markdown=True) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- `{e['error']}`" for e in errors) + "\n"
    payload = {"benchmark": "soak", "quick": args.quick, "machine": info,
               "config": {"seconds": seconds, "warmup": warmup, "window": window,
                          "actors": args.actors, "probe_every": args.probe_every,
                          "batch": BATCH, "alpha": ALPHA, "beta": BETA,
                          "samples_per_insert": SPI, "min_size_to_sample": MIN_SIZE,
                          "error_buffer": ERROR_BUFFER, "max_size": MAX_SIZE,
                          "probe_priority": PROBE_PRIORITY, "seed": args.seed},
               "pids": pids, "windows": windows, "trend": trend, "latency": latency,
               "per_process": {f"{r}{i}": {k: v for k, v in res.items()
                                           if k not in ("wakeups", "missed")}
                               for (r, i), res in results.items()},
               "errors": errors}
    paths = C.write_results("soak" + ("-quick" if args.quick else ""), payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    left = _check_clean(name)
    return 1 if (errors or left) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=None,
                   help="measured duration (default 180; 16 with --quick)")
    p.add_argument("--quick", action="store_true", help="about 20 s in all")
    p.add_argument("--actors", type=int, default=3)
    p.add_argument("--window", type=float, default=None,
                   help="seconds per reported window (default 10; 2 with --quick)")
    p.add_argument("--probe-every", type=float, default=0.25,
                   help="seconds between wake-up probes (they alternate sample / insert)")
    p.add_argument("--seed", type=int, default=0)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

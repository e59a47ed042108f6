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

The code: this script parses the arguments and runs the measured loop;
``_soak_workers.py`` holds the actors' and the learner's loops (and the settings and
control-block words they share with the parent), ``_soak_parent.py`` the parent's side
(workers, probes, each window's readings), ``_soak_report.py`` the summary.

Usage:  python benchmarks/bench_soak.py [--seconds 180] [--quick] [--actors 3]
            [--window 10] [--probe-every 0.25] [--seed 0]
Writes: benchmarks/results/soak[-quick].{json,md}
"""

import argparse
import os
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from _soak_parent import Soak, check_clean, status_kib, window_record  # noqa: E402
from _soak_report import summarize  # noqa: E402
from _soak_workers import MAX_ACTORS  # noqa: E402


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
                memory = {k: status_kib(pid) for k, pid in pids.items()}
                w = window_record(before, after, soak.shm_bytes(), memory)
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
        check_clean(name)
        return 130
    md, payload = summarize(args, info, soak, seconds=seconds, window=window, warmup=warmup,
                            windows=windows, pids=pids, results=results, warm_ids=warm_ids,
                            reference=reference, errors=errors)
    paths = C.write_results("soak" + ("-quick" if args.quick else ""), payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    left = check_clean(name)
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

#!/usr/bin/env python
"""The writer APIs, per step: shmreplay's writers against cpprb, a raw numpy copy and Reverb.

Two step shapes, each a dict ``{obs, action, reward, discount}``:

* *small*:  obs float32[8], action int64 scalar, reward and discount float32 scalars;
            tables of ``max_size`` 100_000;
* *frames*: obs uint8[84,84,4] (Atari-like, four stacked frames), the rest as above;
            tables of ``max_size`` 10_000.

Cases, each timed as the cost of one environment step (µs):

=========================  ===============================================================
raw numpy copy (baseline)  every leaf of the step copied into a preallocated ring slot:
                           ``ring[k][i % N] = step[k]``
shmreplay Writer, 1-step   ``w = client.writer(3)``; ``w.append(step)`` +
                           ``w.create_item(table, 1, 1.0)``
shmreplay Writer, 3-step   the same with ``create_item(table, 3, 1.0)`` (items of 3
                           overlapping steps: Reverb's tutorial pattern)
shmreplay TrajectoryWriter ``tw = client.trajectory_writer(3)``; ``tw.append(step)`` +
                           ``tw.create_item(table, 1.0, {k: tw.history[k][-3:] for k in step})``
shmreplay TrajectoryWriter ``{k: tw.history[k][-1] for k in step}``: one-step items of
squeezed refs              squeezed references (Acme's transition adders build items so)
shmreplay TrajectoryWriter n-step transitions (n = 3): ``obs`` and ``action`` at ``[-4]``,
n-step                     ``reward`` and ``discount`` ``[-3:]``, ``next_obs``
                           ``history["obs"][-1]`` (target for both: within 1.2x of the
                           ``[-3:]`` TrajectoryWriter case; issue 20)
shmreplay Client.insert    ``client.insert(step, {table: 1.0})`` (whole 1-step items; reference)
mechanism floor            what any writer of 1-step items must do, with none of the API's
                           checks or bookkeeping (private calls): one native call that
                           reserves a slot and a row, ``column[row] = step[k]`` per
                           field, one native call that commits
TrajectoryWriter calls     the TrajectoryWriter case's per-step code (``append``, four
alone                      ``history[k][-3:]``, ``create_item``) over a writer that does
                           only what cannot be skipped: ``append`` checks each field's
                           type, dtype and shape against the first step's; refs and
                           columns are tuples, the cheapest Python objects; ``create_item``
                           checks that each leaf is a column. No copy, no storage
TrajectoryWriter lower     those calls plus the mechanism floor (the step reserved, copied
bound                      and committed from the caller's arrays, as a 1-step item): less
                           than any TrajectoryWriter written in Python over these kernels
                           can cost, since it skips the copy at ``append``, the other
                           checks, and all bookkeeping (refs, episodes, expiry)
cpprb add                  ``ReplayBuffer(N, env_dict).add(**step)``
cpprb add, next_of         ``ReplayBuffer(..., next_of=("obs",))``; the step plus next_obs
                           (stored once: cpprb's memory saving for overlapping data)
cpprb add, stack_compress  frames only: ``next_of=("obs",), stack_compress="obs"``
cpprb add, Nstep 3         ``ReplayBuffer(..., next_of=("obs",), Nstep={"size": 3,
                           "rew": "reward", "gamma": 0.99, "next": "next_obs"})``; the step
                           has ``done`` instead of ``discount`` (cpprb needs it for Nstep)
Reverb (optional)          ``client.writer(1)`` / ``writer(3)`` / ``trajectory_writer(3)`` /
                           ``client.insert`` against an in-process ``reverb.Server``
=========================  ===============================================================

Steps cycle through a pool of 64 precomputed steps (the frames are a sliding window of
one frame stream, as ``stack_compress`` expects). Every shmreplay table uses
``Uniform()``, ``Fifo()`` and ``MinSize(1)``, one ``Server`` per step shape named
``bench-writers-*`` (removed at the end). Before timing, every case runs one pass of
``max_size`` steps (the buffer is then full and each step evicts the oldest item; that
first pass, page faults included, is reported as "first pass"), so the timed figures
are the steady state. Timing is timeit-style as in the other scripts: warm-up, calibrated
loop, median of repeats with the garbage collector off, repeats of all in-process cases
interleaved so background load hits them alike.

Reverb needs TensorFlow and numpy < 2, so it runs in its own virtualenv:
``--reverb-python PATH`` (or ``$REVERB_PYTHON``) runs this script there with
``--reverb-worker``. Reverb writers stream asynchronously, so a Reverb case is a block of
steps followed by ``flush()``, divided by the block length. Without it Reverb is "not
measured here" and the issue's figure (about 290 µs per one-step item) is quoted.

Acme's adders (``--libs acme``, not run by default; ``_acme_adders.py``): Acme's ``NStepTransitionAdder``
(n_step 5) and ``SequenceAdder`` (length 20, period 10) on both step shapes, µs per
environment step over episodes of 100 steps, the same adder code on shmreplay (through
``compat/shim``, in ``--acme-python``, default ``$ACME_PYTHON`` or /work/compat-venv) and
on Reverb (in ``--reverb-python``), one worker process each.

Memory: a fresh writer writes N steps of 3-step overlapping items into an empty table;
``info.num_stored_steps`` and ``info.storage_bytes`` against N x (bytes of one step).

Targets (the issue): under 20 µs per step for small transitions with all three writer
patterns; within 2x of the raw numpy copy for frames.

The code: this script parses the arguments, runs the parts and writes the results;
``_writers_cases.py`` makes the cases, ``_writers_measure.py`` times one step shape's
cases (and the memory check), ``_writers_reverb.py`` is Reverb's worker, and
``_writers_report.py`` renders the tables and judges the targets.

Usage:  python benchmarks/bench_writers.py [--quick] [--libs ...] [--reverb-python PATH]
                                          [--tag TAG] [--prefix NAME]
Writes: benchmarks/results/writers-<date>.{json,md} (quick: writers-quick.{json,md};
        with --tag: writers-TAG[-quick])
"""


import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import _acme_adders  # noqa: E402
from _writers_cases import (CASES, DATASETS, DEFAULT_LIBS, IN_PROCESS_LIBS, LIBS,  # noqa: E402
                            POOL, make_pool, timing_settings)
from _writers_measure import run_dataset  # noqa: E402
from _writers_report import FRAMES_TARGET_RATIO, SMALL_TARGET_US, build_report  # noqa: E402
from _writers_reverb import ISSUE_REVERB_US, reverb_worker, run_reverb  # noqa: E402

import numpy as np  # noqa: E402


def run(args):
    timing = timing_settings(args.quick)
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    unknown = set(libs) - set(LIBS)
    if unknown:
        raise SystemExit(f"unknown --libs {sorted(unknown)}; choose from {LIBS}")
    rng = np.random.default_rng(args.seed)
    errors = []
    shm = cpprb = None
    if "shmreplay" in libs:
        shm, why = C.load_shmreplay()
        if shm is None or not hasattr(shm.Client, "trajectory_writer"):
            why = why or "shmreplay lacks Client.trajectory_writer"
            print("shmreplay unavailable:", why)
            errors.append({"lib": "shmreplay", "where": "import", "error": why})
            shm = None
    if "cpprb" in libs:
        cpprb, why = C.load_cpprb()
        if cpprb is None:
            print("cpprb unavailable:", why)
            errors.append({"lib": "cpprb", "where": "import", "error": why})
    info = C.machine_info()
    info["shmreplay_uncommitted"] = C.dirty_files()
    for ln in C.machine_lines(info):
        print(ln)
    print(f"shmreplay uncommitted changes measured: {info['shmreplay_uncommitted']}")
    print(f"mode: {'quick' if args.quick else 'full'}; timing {timing}")

    results = {}
    for dname in args.datasets.split(",") if set(libs) & set(IN_PROCESS_LIBS) else ():
        results[dname] = run_dataset(dname, args, libs, shm, cpprb, rng, timing, errors)

    reverb = None
    reverb_python = args.reverb_python or os.environ.get("REVERB_PYTHON")
    reverb_note = (f"Reverb: not measured here (no --reverb-python given); the issue quotes "
                   f"about {ISSUE_REVERB_US:g} µs per one-step item")
    if "reverb" in libs and reverb_python:
        reverb = run_reverb(__file__, reverb_python, args, errors)
        if reverb:
            v = reverb["versions"]
            reverb_note = (
                f"Reverb: dm-reverb {v.get('dm-reverb')}, tensorflow "
                f"{v.get('tensorflow') or v.get('tensorflow-cpu')}, numpy {v.get('numpy')}, "
                f"in a separate virtualenv process (not interleaved with the cases above); "
                f"in-process reverb.Server, client over localhost gRPC; a writer case is a "
                f"block of {reverb['datasets'][next(iter(reverb['datasets']))]['block']} steps "
                f"+ flush(), per step; insert fills its table with a writer first; "
                f"the issue quotes about {ISSUE_REVERB_US:g} µs per one-step item")
        else:
            reverb_note = (f"Reverb: the worker failed (see errors); the issue quotes about "
                           f"{ISSUE_REVERB_US:g} µs per one-step item (not measured here)")

    acme = {}
    if "acme" in libs:
        acme_python = (args.acme_python or os.environ.get("ACME_PYTHON")
                       or (_acme_adders.DEFAULT_ACME_PYTHON
                           if os.path.exists(_acme_adders.DEFAULT_ACME_PYTHON) else None))
        acme = _acme_adders.run(os.path.abspath(__file__),
                                {"shmreplay": acme_python, "reverb": reverb_python,
                                 "null": acme_python}, args,
                                errors, rounds=args.acme_rounds)
    md_body, text, targets, target_lines = build_report(info, args, timing, results, reverb,
                                                        errors)
    acme_md, acme_text, acme_lines = _acme_adders.report(acme, C)
    md_body += acme_md
    text += acme_text
    target_lines += acme_lines
    print()
    print("\n".join(text))
    print("\n".join(target_lines))

    dirty = info.get("shmreplay_uncommitted")
    notes = [
        "shmreplay measured as in the working copy"
        + (f", with uncommitted changes to {', '.join(dirty)}" if dirty else ""),
        f"mode: {'quick' if args.quick else 'full'}; µs per environment step, median of "
        f"{timing['repeat']} repeats (loop ≥ {timing['min_time']} s each, GC off), in-process "
        "cases interleaved; '÷ raw copy' = case / raw numpy copy; 'cpprb add ÷ case' > 1: "
        "the case is cheaper than cpprb's plain add",
        "steady state: before timing each case ran one pass of "
        + ", ".join(f"{d} {r['fill_steps']}" for d, r in results.items())
        + " steps ('first pass', one measurement, page faults included), so "
        + ("tables and rings are full and every step evicts the oldest item"
           if not args.quick else "(quick mode: tables are NOT full)"),
        "shmreplay: Uniform sampler, Fifo remover, MinSize(1); Writer(3) / "
        "trajectory_writer(3); cpprb ReplayBuffer (single process, no lock); raw copy: "
        "ring[i % N] = leaf for each of the 4 leaves",
        reverb_note,
    ]
    if not results:  # --libs acme (and reverb): only the Acme section below
        notes = notes[:1] + [f"mode: {'quick' if args.quick else 'full'}; only Acme's adders "
                             f"(--libs {args.libs})"]
    notes += target_lines
    title = "Writers: per-step cost of " + ", ".join(
        (["shmreplay's writers, cpprb, raw numpy copy"] if results else [])
        + (["Reverb"] if reverb else []) + (["Acme's adders"]
                                            if acme else []))
    md = C.markdown_header(title, info, notes)
    md += "\n" + "\n".join(md_body) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- {e['lib']} {e['where']}: `{e['error']}`"
                                          for e in errors) + "\n"
    payload = {"benchmark": "writers", "quick": args.quick, "machine": info,
               "config": {"datasets": {k: {"capacity": v["capacity"],
                                           "obs_shape": v["obs_shape"],
                                           "obs_dtype": v["obs_dtype"].__name__}
                                       for k, v in DATASETS.items()},
                          "pool": POOL, "timing": timing, "seed": args.seed,
                          "targets": {"small_us": SMALL_TARGET_US,
                                      "frames_ratio_to_raw": FRAMES_TARGET_RATIO}},
               "cases": {k: {"lib": v[0], "label": v[1]} for k, v in CASES.items()},
               "results": results,
               "reverb": reverb if reverb else {"measured": False, "note": reverb_note,
                                                "issue_figure_us": ISSUE_REVERB_US},
               "acme_adders": acme or {"measured": False},
               "targets": targets, "summary": target_lines, "errors": errors}
    stem = "writers" + (f"-{args.tag}" if args.tag else "" if args.quick
                        else f"-{info['date'][:10]}") + ("-quick" if args.quick else "")
    paths = C.write_results(stem, payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    # Only this script's segments: other processes (a test run) may hold bench-* ones.
    left = C.leftover_segments(f"shmreplay.{args.prefix}-")
    if left:
        print(f"WARNING: left in /dev/shm: {left}", file=sys.stderr)
    return 1 if (errors or left) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="few short repeats, tables not filled (a smoke run, a few seconds)")
    p.add_argument("--libs", default=",".join(DEFAULT_LIBS),
                   help=f"comma-separated subset of {','.join(LIBS)} (default: all but acme)")
    p.add_argument("--datasets", default="small,frames", help="small,frames or one of them")
    p.add_argument("--reverb-python", default=None,
                   help="python of a virtualenv with dm-reverb (default: $REVERB_PYTHON)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="bench-writers", help="shared-memory name prefix")
    p.add_argument("--tag", default="", help="a name for this run's result files")
    p.add_argument("--acme-python", default=None,
                   help="python of a virtualenv with dm-acme, for Acme's adders on shmreplay "
                        f"(default: $ACME_PYTHON, else {_acme_adders.DEFAULT_ACME_PYTHON})")
    p.add_argument("--acme-rounds", type=int, default=3,
                   help="worker rounds per backend for Acme's adders (alternating)")
    p.add_argument("--reverb-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--acme-worker", choices=_acme_adders.BACKENDS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reverb_worker:
        return reverb_worker(args)
    if args.acme_worker:
        return _acme_adders.worker(args.acme_worker, DATASETS, args.datasets.split(","),
                                   make_pool, timing_settings(args.quick), args.quick, args.seed,
                                   args.prefix)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

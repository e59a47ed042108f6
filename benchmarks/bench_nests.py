#!/usr/bin/env python
"""Every nest form at full speed (issue 20): the same transition as a flat dict, tuple,
list, namedtuple and nested dict, through ``insert``, ``insert_batch``, the legacy
``Writer`` and ``TrajectoryWriter``; and ``TrajectoryWriter`` items of squeezed
references, mixed windows and squeezed references, and n-step transitions against the
usual ``[-n:]`` windows.

The transition is cpprb's benchmark one (``bench_vs_cpprb.py``): obs float32[15], act
float32[3], rew float32, next_obs float32[15], done float32; tables of 4096 (Uniform,
Fifo, MinSize(1)), one process.

Cases (µs per call; for the writers, per environment step: ``append`` + ``create_item``):

* ``insert 1``, ``insert_batch 11``, ``insert_batch 101``: each form into a table its
  first item defined;
* ``Writer``: ``writer(2)``, ``append(step)`` + ``create_item(table, 1, 1.0)``;
* ``TrajectoryWriter``: ``trajectory_writer(3)``, ``append(step)`` + an item of
  ``[-3:]`` windows of every field, built from ``history`` in the form's own way
  (``{k: h[k][-3:]}``, ``[c[-3:] for c in h]``, ``Transition(*...)``, ...);
* writer items (dict steps): ``window`` ``{k: h[k][-3:]}``; ``squeezed``
  ``{k: h[k][-1]}`` (Acme's transition adders); ``mixed`` obs/rew ``[-2:]`` windows with
  squeezed act/done/next_obs; ``n-step`` (n = 3) obs and act at ``[-4]``, rew and done
  ``[-3:]``, next_obs ``obs[-1]``;
* partial steps (dict steps, an item of ``[-3:]`` windows of every field per step):
  each step as one ``append`` (``whole``), or as 2 or 3 ``append`` calls of some of its
  fields, all but the last with ``partial_step=True`` (as Acme's adders append).

Targets: each form within 1.15x of the flat dict in every row; squeezed, mixed and
n-step items within 1.2x of the window item; steps of 2 and 3 parts within 1.2x of the
whole step. Timing: ``_common.time_interleaved`` (the
forms of one row interleaved, median of repeats, GC off).

``SHMREPLAY_BENCH_CODE=PATH`` imports shmreplay from the checkout at PATH (an A/B against
another checkout: run the script once per checkout, in alternation, with ``--tag``).

Usage:  python benchmarks/bench_nests.py [--quick] [--tag TAG]
Writes: benchmarks/results/nests-<date>[-TAG].{json,md} (quick: nests-quick[-TAG])
"""

import argparse
import collections
import datetime
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import numpy as np  # noqa: E402

CAPACITY = 4096
FORMS = ("dict", "tuple", "list", "namedtuple", "nested_dict")
FIELDS = ("obs", "act", "rew", "next_obs", "done")
Transition = collections.namedtuple("Transition", FIELDS)
FORM_TARGET = 1.15
ITEM_TARGET = 1.2
POOL = 64
N_STEP = 3
# A step's fields in the parts appended one after the other (the last one not partial).
PARTS = {"whole": (FIELDS,), "2 parts": (("obs", "next_obs"), ("act", "rew", "done")),
         "3 parts": (("obs",), ("next_obs", "act"), ("rew", "done"))}


def transition(rng, n=None):
    lead = () if n is None else (n,)
    scalar = (lambda: np.float32(rng.standard_normal())) if n is None else (
        lambda: rng.standard_normal(n).astype(np.float32))
    return {"obs": rng.standard_normal(lead + (15,)).astype(np.float32),
            "act": rng.standard_normal(lead + (3,)).astype(np.float32),
            "rew": scalar(), "next_obs": rng.standard_normal(lead + (15,)).astype(np.float32),
            "done": scalar()}


def as_form(form, d):
    if form == "dict":
        return d
    if form == "tuple":
        return tuple(d[k] for k in FIELDS)
    if form == "list":
        return [d[k] for k in FIELDS]
    if form == "namedtuple":
        return Transition(**d)
    if form == "nested_dict":
        return {"o": {"obs": d["obs"], "next_obs": d["next_obs"]}, "act": d["act"],
                "rew": d["rew"], "done": d["done"]}
    raise KeyError(form)


def windows(form, h, n=3):
    """An item of ``[-n:]`` windows of every field of ``history`` ``h``, as a user of
    that form writes it."""
    if form == "dict":
        return {k: h[k][-n:] for k in FIELDS}
    if form == "tuple":
        return tuple(c[-n:] for c in h)
    if form == "list":
        return [c[-n:] for c in h]
    if form == "namedtuple":
        return Transition(*[c[-n:] for c in h])
    o = h["o"]
    return {"o": {"obs": o["obs"][-n:], "next_obs": o["next_obs"][-n:]},
            "act": h["act"][-n:], "rew": h["rew"][-n:], "done": h["done"][-n:]}


ITEMS = {
    "window": lambda h: {k: h[k][-3:] for k in FIELDS},
    "squeezed": lambda h: {k: h[k][-1] for k in FIELDS},
    "mixed": lambda h: {"obs": h["obs"][-2:], "act": h["act"][-1], "rew": h["rew"][-2:],
                        "next_obs": h["next_obs"][-1], "done": h["done"][-1]},
    "n-step": lambda h: {"obs": h["obs"][-N_STEP - 1], "act": h["act"][-N_STEP - 1],
                         "rew": h["rew"][-N_STEP:], "done": h["done"][-N_STEP:],
                         "next_obs": h["obs"][-1]},
}


def table(shm, name):
    from shmreplay import rate_limiters, selectors
    return shm.Table(name, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                     max_size=CAPACITY, rate_limiter=rate_limiters.MinSize(1))


def build_cases(shm, client, rng):
    """``{row: {column: fn}}``: each row's cases are timed together (interleaved)."""
    rows = {}
    single = [transition(rng) for _ in range(POOL)]
    for op, n in (("insert", 1), ("insert_batch", 11), ("insert_batch", 101)):
        row = rows[f"{op} {n}"] = {}
        for form in FORMS:
            name = f"{form}-{op}-{n}"
            if n == 1:
                data = [as_form(form, d) for d in single]
                insert, prio = client.insert, {name: 1.0}
                nxt = itertools.cycle(data).__next__
                insert(data[0], prio)
                row[form] = (lambda insert=insert, nxt=nxt, prio=prio: insert(nxt(), prio))
            else:
                batch = as_form(form, transition(rng, n))
                insert_batch, prio = client.insert_batch, {name: 1.0}
                insert_batch(batch, prio)
                row[form] = (lambda f=insert_batch, b=batch, p=prio: f(b, p))
    row = rows["Writer 1-step"] = {}
    for form in FORMS:
        name, data = f"{form}-writer", [as_form(form, d) for d in single]
        writer, nxt = client.writer(2), itertools.cycle(data).__next__

        def legacy(w=writer, nxt=nxt, name=name):
            w.append(nxt())
            w.create_item(name, 1, 1.0)
        row[form] = legacy
    row = rows["TrajectoryWriter [-3:]"] = {}
    for form in FORMS:
        name, data = f"{form}-traj", [as_form(form, d) for d in single]
        tw, nxt = client.trajectory_writer(3), itertools.cycle(data).__next__
        for _ in range(2):
            tw.append(nxt())

        def traj(tw=tw, nxt=nxt, name=name, form=form):
            tw.append(nxt())
            tw.create_item(name, 1.0, windows(form, tw.history))
        row[form] = traj
    row = rows["TrajectoryWriter items"] = {}
    for kind, make in ITEMS.items():
        name = f"item-{kind}"
        tw, nxt = client.trajectory_writer(N_STEP + 1), itertools.cycle(single).__next__
        for _ in range(N_STEP):
            tw.append(nxt())

        def item(tw=tw, nxt=nxt, name=name, make=make):
            tw.append(nxt())
            tw.create_item(name, 1.0, make(tw.history))
        row[kind] = item
    row = rows["TrajectoryWriter partial steps"] = {}
    for kind, parts in PARTS.items():
        name = f"partial-{kind.replace(' ', '')}"
        tw = client.trajectory_writer(3)
        split = [[({k: d[k] for k in keys}, i < len(parts) - 1) for i, keys in enumerate(parts)]
                 for d in single]
        nxt = itertools.cycle(split).__next__
        for _ in range(2):
            for data, partial in nxt():
                tw.append(data, partial_step=partial)

        def stepped(tw=tw, nxt=nxt, name=name):
            for data, partial in nxt():
                tw.append(data, partial_step=partial)
            h = tw.history
            tw.create_item(name, 1.0, {k: h[k][-3:] for k in FIELDS})
        row[kind] = stepped
    return rows


def table_names():
    names = [f"{form}-{op}-{n}" for op, n in (("insert", 1), ("insert_batch", 11),
                                               ("insert_batch", 101)) for form in FORMS]
    names += [f"{form}-writer" for form in FORMS] + [f"{form}-traj" for form in FORMS]
    return (names + [f"item-{kind}" for kind in ITEMS]
            + [f"partial-{kind.replace(' ', '')}" for kind in PARTS])


def run(args):
    shm, why = C.load_shmreplay()
    if shm is None:
        raise SystemExit(why)
    timing = (dict(repeat=3, min_time=0.005, warmup=0.02) if args.quick
              else dict(repeat=9, min_time=0.05, warmup=0.2))
    rng = np.random.default_rng(args.seed)
    info = C.machine_info()
    info["shmreplay_from"] = os.path.dirname(os.path.dirname(os.path.abspath(shm.__file__)))
    for line in C.machine_lines(info):
        print(line)
    results, best = {}, {}
    server = shm.Server(tables=[table(shm, n) for n in table_names()],
                        name=f"{args.prefix}-{os.getpid()}")
    client = shm.Client(server.name)
    try:
        for row, fns in build_cases(shm, client, rng).items():
            timed = C.time_interleaved(fns, **timing)
            results[row] = {k: t["median"] * 1e6 for k, t in timed.items()}
            best[row] = {k: t["best"] * 1e6 for k, t in timed.items()}
            base = "dict" if "dict" in fns else "whole" if "whole" in fns else "window"
            print(f"  {row:24s} " + "  ".join(
                f"{k} {v:7.2f} ({v / results[row][base]:.2f}x)"
                for k, v in results[row].items()), flush=True)
    finally:
        client.close()
        server.stop()
    headers = ["row"] + list(FORMS)
    table_rows = []
    for row, figures in results.items():
        if "dict" not in figures:
            continue
        table_rows.append([row] + [f"{figures[f]:.2f} ({figures[f] / figures['dict']:.2f}x)"
                                   for f in FORMS])
    items = results["TrajectoryWriter items"]
    item_rows = [[kind, f"{us:.2f}", f"{us / items['window']:.2f}x"]
                 for kind, us in items.items()]
    parts = results["TrajectoryWriter partial steps"]
    item_rows += [[f"{kind} (per step)", f"{us:.2f}", f"{us / parts['whole']:.2f}x (/ whole)"]
                  for kind, us in parts.items()]

    def worst(figures):
        forms = max(v / f["dict"] for f in figures.values() if "dict" in f for v in f.values())
        items = figures["TrajectoryWriter items"]
        parts = figures["TrajectoryWriter partial steps"]
        return (forms, max(us / items["window"] for us in items.values()),
                max(us / parts["whole"] for us in parts.values()))

    (worst_form, worst_item, worst_part), (best_form, best_item, best_part) = (
        worst(results), worst(best))
    summary = (f"medians: worst form / flat dict {worst_form:.2f}x (target {FORM_TARGET}x), "
               f"worst item / window {worst_item:.2f}x (target {ITEM_TARGET}x), worst "
               f"partial step / whole {worst_part:.2f}x (target {ITEM_TARGET}x); best of the "
               f"repeats: {best_form:.2f}x, {best_item:.2f}x and {best_part:.2f}x")
    print("\n" + C.render_table(headers, table_rows))
    print("\n" + C.render_table(["writer item", "µs per step", "/ window"], item_rows))
    print("\n" + summary)
    notes = [f"mode: {'quick' if args.quick else 'full'}; median µs per call (writers: per "
             "step), the forms of a row interleaved; (x) = / the flat dict (or the window "
             "item)", f"shmreplay imported from {info['shmreplay_from']}", summary]
    md = C.markdown_report("Every nest form (issue 20)", info, notes, headers, table_rows)
    md += "\n\n" + C.render_table(["writer item", "µs per step", "/ window"], item_rows,
                                  markdown=True) + "\n"
    payload = {"benchmark": "nests", "quick": args.quick, "machine": info, "tag": args.tag,
               "config": {"capacity": CAPACITY, "forms": FORMS, "n_step": N_STEP,
                          "timing": timing, "seed": args.seed},
               "results_us": results, "best_us": best, "summary": summary}
    stem = ("nests-quick" if args.quick else f"nests-{datetime.date.today().isoformat()}") + (
        f"-{args.tag}" if args.tag else "")
    paths = C.write_results(stem, payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few short repeats (a smoke run)")
    p.add_argument("--tag", default="", help="a name for this run's result files")
    p.add_argument("--prefix", default="bench-nests", help="shared-memory name prefix")
    p.add_argument("--seed", type=int, default=0)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

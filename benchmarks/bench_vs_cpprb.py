#!/usr/bin/env python
"""shmreplay vs cpprb on cpprb's published "cpprb vs Reverb" configuration, in one process.

Configuration (cpprb's benchmark 2): buffer 4096; one transition is
``{obs: float32[15], act: float32[3], rew: float32, next_obs: float32[15], done: float32}``;
add 1, 11 and 101 transitions per call; sample batches of 2, 32 and 256; a uniform and a
prioritized buffer (priority exponent alpha = 0.4, importance-sampling beta = 0.4).

cpprb side:   ``ReplayBuffer`` / ``PrioritizedReplayBuffer(alpha=0.4)``; ``add(**batch)``
              (no explicit priorities: cpprb then uses its max priority, its fastest path);
              ``sample(B)`` / ``sample(B, beta=0.4)``; "sample+update" adds
              ``update_priorities(indexes, prios)``.
shmreplay:    the public Client API only. One Server per sampler with one table
              ``Table(name, Uniform() | Prioritized(0.4), Fifo(), 4096, MinSize(1))``;
              add 1 = ``client.insert(tr, {table: 1.0})``; add N =
              ``client.insert_batch(batch, {table: 1.0 | prios[N]})``; sample =
              ``client.sample_batch(table, B)`` (+ ``info.importance_weights(0.4)`` when
              prioritized); "sample+update" adds ``client.update_priorities(table, keys, prios)``.

Nest forms (``--forms``, issue 20): the published form is the dict above; ``list``
inserts ``[obs, act, rew, next_obs, done]`` and ``namedtuple`` a
``Transition(obs, act, rew, next_obs, done)`` (Reverb's tutorial and Acme's forms), each
into its own tables (which that form's first item defines), every case again; the forms'
figures are interleaved with cpprb's in the same repeats.

Reverb (``--reverb-python PATH``, default ``$REVERB_PYTHON``): the same cases through
Reverb's Python ``Client`` in a subprocess of that virtualenv (Reverb needs TensorFlow and
numpy < 2), after the cpprb and shmreplay cases of the same run; how it is driven is in
``_vs_cpprb_reverb.py``. Its figures go to the JSON's ``reverb`` section (versions,
timing, load, every API) and to each result row (``reverb``: a ``writer(1)`` for adds,
``Client.sample`` for samples; ``reverb[insert]``: ``Client.insert`` per step), with
``ratio_reverb`` = Reverb / shmreplay. Without a Reverb python the run says so and
measures the other two.

Each case is timed timeit-style (warm-up, calibrated loop, median of repeats, GC off; the
repeats of the two libraries alternate so background load hits both alike) and
reported in microseconds per call; ratio = cpprb / shmreplay (> 1: shmreplay is faster).
Target: ratio >= 2 in every case.

Usage:  python benchmarks/bench_vs_cpprb.py [--quick] [--libs cpprb,shmreplay,reverb]
                                            [--forms dict,list,namedtuple] [--tag TAG]
                                            [--reverb-python PATH] [--prefix P]
Writes: benchmarks/results/vs_cpprb[-TAG][-quick].{json,md}
"""

import argparse
import collections
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import _vs_cpprb_reverb as RV  # noqa: E402

import numpy as np  # noqa: E402

CAPACITY = 4096
ALPHA = 0.4
BETA = 0.4
ADD_STEPS = (1, 11, 101)
BATCH_SIZES = (2, 32, 256)
TARGET = 2.0

FIELDS = ("obs", "act", "rew", "next_obs", "done")
Transition = collections.namedtuple("Transition", FIELDS)
FORMS = ("dict", "list", "namedtuple")

ENV_DICT = {"obs": {"shape": 15}, "act": {"shape": 3}, "rew": {},
            "next_obs": {"shape": 15}, "done": {}}


def make_transition(rng):
    return {
        "obs": rng.standard_normal(15).astype(np.float32),
        "act": rng.standard_normal(3).astype(np.float32),
        "rew": np.float32(rng.standard_normal()),
        "next_obs": rng.standard_normal(15).astype(np.float32),
        "done": np.float32(0.0),
    }


def make_batch(rng, n):
    return {
        "obs": rng.standard_normal((n, 15)).astype(np.float32),
        "act": rng.standard_normal((n, 3)).astype(np.float32),
        "rew": rng.standard_normal(n).astype(np.float32),
        "next_obs": rng.standard_normal((n, 15)).astype(np.float32),
        "done": (rng.random(n) < 0.01).astype(np.float32),
    }


def as_form(form, data):
    """A transition (or batch) dict as nest ``form``."""
    if form == "dict":
        return data
    if form == "list":
        return [data[k] for k in FIELDS]
    if form == "namedtuple":
        return Transition(**data)
    raise ValueError(f"unknown form {form!r} (one of {', '.join(FORMS)})")


def cases():
    """(op, sampler, n) in print order."""
    out = []
    for sampler in ("uniform", "prioritized"):
        for n in ADD_STEPS:
            out.append(("add", sampler, n))
    for sampler in ("uniform", "prioritized"):
        for b in BATCH_SIZES:
            out.append(("sample", sampler, b))
    for b in BATCH_SIZES:
        out.append(("sample+update", "prioritized", b))
    return out


# --------------------------------------------------------------------------- cpprb

class CpprbSide:
    name = "cpprb"

    def __init__(self, cpprb, rng):
        self.rbs = {
            "uniform": cpprb.ReplayBuffer(CAPACITY, ENV_DICT),
            "prioritized": cpprb.PrioritizedReplayBuffer(CAPACITY, ENV_DICT, alpha=ALPHA),
        }
        self.rng = rng

    def fill(self):
        batch = make_batch(self.rng, CAPACITY)
        self.rbs["uniform"].add(**batch)
        self.rbs["prioritized"].add(**batch, priorities=self.rng.random(CAPACITY) + 0.05)

    def case_fn(self, op, sampler, n):
        rb = self.rbs[sampler]
        if op == "add":
            data = make_transition(self.rng) if n == 1 else make_batch(self.rng, n)
            add = rb.add
            return lambda: add(**data)
        if op == "sample" and sampler == "uniform":
            sample = rb.sample
            return lambda: sample(n)
        if op == "sample":
            sample = rb.sample
            return lambda: sample(n, beta=BETA)
        prios = self.rng.random(n) + 0.05
        sample, update = rb.sample, rb.update_priorities

        def sample_update():
            s = sample(n, beta=BETA)
            update(s["indexes"], prios)
        return sample_update

    def close(self):
        self.rbs.clear()


# --------------------------------------------------------------------------- shmreplay

class ShmreplaySide:
    def __init__(self, shm, rng, form="dict", prefix="bench-vs"):
        from shmreplay import rate_limiters, selectors
        self.rng = rng
        self.form = form
        self.name = "shmreplay" if form == "dict" else f"shmreplay[{form}]"
        self.servers, self.clients = {}, {}
        pid = os.getpid()
        samplers = {"uniform": selectors.Uniform(), "prioritized": selectors.Prioritized(ALPHA)}
        try:
            for sampler, sel in samplers.items():
                table = shm.Table(sampler, sampler=sel, remover=selectors.Fifo(),
                                  max_size=CAPACITY, rate_limiter=rate_limiters.MinSize(1))
                server = shm.Server(tables=[table],
                                    name=f"{prefix}-{sampler[0]}-{form[0]}-{pid}")
                self.servers[sampler] = server
                self.clients[sampler] = shm.Client(server.name)
        except BaseException:
            self.close()
            raise

    def fill(self):
        batch = as_form(self.form, make_batch(self.rng, CAPACITY))
        self.clients["uniform"].insert_batch(batch, {"uniform": 1.0})
        self.clients["prioritized"].insert_batch(
            batch, {"prioritized": self.rng.random(CAPACITY) + 0.05})

    def check(self):
        """One sample of each table, checked against the contract (shapes, info dtypes)."""
        for sampler, client in self.clients.items():
            s = client.sample_batch(sampler, 32)
            data = s.data if self.form == "dict" else dict(zip(FIELDS, s.data))
            if self.form == "namedtuple" and type(s.data).__name__ != "Transition":
                raise AssertionError(f"{sampler}: sampled {type(s.data)}, want Transition")
            shapes = {k: np.shape(v) for k, v in data.items()}
            want = {"obs": (32, 15), "act": (32, 3), "rew": (32,), "next_obs": (32, 15),
                    "done": (32,)}
            if shapes != want:
                raise AssertionError(f"{sampler}: sample_batch data shapes {shapes}, want {want}")
            if np.asarray(s.info.key).dtype != np.uint64 or len(s.info.key) != 32:
                raise AssertionError(f"{sampler}: info.key {np.asarray(s.info.key).dtype} "
                                     f"len {len(s.info.key)}")

    def case_fn(self, op, sampler, n):
        client = self.clients[sampler]
        table = sampler
        if op == "add":
            if n == 1:
                data = as_form(self.form, make_transition(self.rng))
                prio = {table: 1.0}
                insert = client.insert
                return lambda: insert(data, prio)
            data = as_form(self.form, make_batch(self.rng, n))
            prio = {table: 1.0 if sampler == "uniform" else self.rng.random(n) + 0.05}
            insert_batch = client.insert_batch
            return lambda: insert_batch(data, prio)
        sample_batch = client.sample_batch
        if op == "sample" and sampler == "uniform":
            return lambda: sample_batch(table, n)
        if op == "sample":
            def sample_weights():
                s = sample_batch(table, n)
                s.info.importance_weights(BETA)
            return sample_weights
        prios = self.rng.random(n) + 0.05
        update = client.update_priorities

        def sample_update():
            s = sample_batch(table, n)
            s.info.importance_weights(BETA)
            update(table, s.info.key, prios)
        return sample_update

    def close(self):
        for client in self.clients.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        for server in self.servers.values():
            server.stop()
        self.clients.clear()
        self.servers.clear()


# --------------------------------------------------------------------------- main

def _timing(quick):
    return (dict(repeat=3, min_time=0.005, warmup=0.02) if quick
            else dict(repeat=9, min_time=0.05, warmup=0.2))


def run_reverb(args, libs, results, errors):
    """Runs Reverb's cases in its virtualenv; merges them into ``results``; returns the
    JSON's ``reverb`` section."""
    python = args.reverb_python or os.environ.get("REVERB_PYTHON")
    if "reverb" not in libs or not python:
        why = ("not in --libs" if "reverb" not in libs
               else "no --reverb-python given and $REVERB_PYTHON unset")
        print(f"Reverb: not measured ({why})")
        return {"measured": False, "note": f"Reverb not measured: {why}"}
    out = RV.run_worker(python, os.path.abspath(__file__), args, errors)
    if out is None:
        return {"measured": False, "note": "the Reverb worker failed (see errors)"}
    for row, rv in zip(results, out["results"]):
        if (row["op"], row["sampler"], row["n"]) != (rv["op"], rv["sampler"], rv["n"]):
            raise AssertionError(f"Reverb's case {rv} is not {row}")
        row["reverb"] = rv.get("writer" if row["op"] == "add" else "client")
        if row["op"] == "add":
            row["reverb[insert]"] = rv.get("insert")
        ours = row.get("shmreplay")
        row["ratio_reverb"] = (row["reverb"]["median_us"] / ours["median_us"]
                               if row["reverb"] and ours else None)
        print(f"  {row['op']:13s} {row['sampler']:11s} {row['n']:4d}  Reverb "
              f"{C.fmt_num(row['reverb'] and row['reverb']['median_us'], 1):>9s} us"
              + (f"  (insert per step {C.fmt_num(row['reverb[insert]'] and row['reverb[insert]']['median_us'], 1)} us)"
                 if row["op"] == "add" else "")
              + f"  reverb/shmreplay {C.fmt_ratio(row['ratio_reverb'])}", flush=True)
    return {"measured": True, "versions": out["versions"], "timing": out["timing"],
            "loadavg_at_start": out["loadavg_at_start"], "results": out["results"],
            "how": RV.__doc__.split("How Reverb is driven")[1].strip()}


def run(args):
    timing = _timing(args.quick)
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    rng = np.random.default_rng(args.seed)
    errors = []
    sides = []
    if "cpprb" in libs:
        cpprb, why = C.load_cpprb()
        if cpprb is None:
            print("cpprb unavailable:", why)
            errors.append({"lib": "cpprb", "where": "import", "error": why})
        else:
            sides.append(CpprbSide(cpprb, rng))
    shm_sides = []
    if "shmreplay" in libs:
        shm, why = C.load_shmreplay()
        if shm is None:
            print("shmreplay unavailable:", why)
            errors.append({"lib": "shmreplay", "where": "import", "error": why})
        else:
            try:
                for form in args.forms.split(","):
                    side = ShmreplaySide(shm, rng, form.strip(), args.prefix)
                    shm_sides.append(side)
                    sides.append(side)
            except Exception as exc:  # noqa: BLE001 - report, never work around
                tb = traceback.format_exc()
                print("shmreplay setup failed:\n" + tb)
                errors.append({"lib": "shmreplay", "where": "setup", "error": repr(exc),
                               "traceback": tb})
    info = C.machine_info()
    for ln in C.machine_lines(info):
        print(ln)
    print(f"mode: {'quick' if args.quick else 'full'}; timing {timing}\n")

    results = []
    try:
        filled = set()
        for op, sampler, n in cases():
            row = {"op": op, "sampler": sampler, "n": n}
            fns = {}
            for side in list(sides):
                if op != "add" and side.name not in filled:
                    try:
                        side.fill()
                        if side in shm_sides:
                            side.check()
                    except Exception as exc:  # noqa: BLE001
                        tb = traceback.format_exc()
                        print(f"{side.name} fill/check failed:\n{tb}")
                        errors.append({"lib": side.name, "where": "fill/check",
                                       "error": repr(exc), "traceback": tb})
                    filled.add(side.name)
                fn = C.prepared_case(side.name, f"{op} {sampler} {n}",
                                     lambda: side.case_fn(op, sampler, n), errors)
                if fn is None:
                    row[side.name] = None
                else:
                    fns[side.name] = fn
            if fns:
                try:
                    timed = C.time_interleaved(fns, **timing)
                except Exception as exc:  # noqa: BLE001
                    tb = traceback.format_exc()
                    print(f"{op} {sampler} {n} failed while timing:\n{tb}")
                    errors.append({"lib": "/".join(fns), "where": f"{op} {sampler} {n} (timing)",
                                   "error": repr(exc), "traceback": tb})
                    timed = {}
                for name, t in timed.items():
                    row[name] = {"median_us": t["median"] * 1e6, "best_us": t["best"] * 1e6,
                                 "number": t["number"], "repeat": t["repeat"]}
            a, b = row.get("cpprb"), row.get("shmreplay")
            row["ratio"] = a["median_us"] / b["median_us"] if a and b else None
            for side in (side for side in shm_sides if side.form != "dict"):
                other = row.get(side.name)
                row[f"ratio[{side.form}]"] = (a["median_us"] / other["median_us"]
                                              if a and other else None)
            results.append(row)
            extra = "".join(
                f"  {side.form} {C.fmt_num(row.get(side.name) and row[side.name]['median_us'], 2)}"
                f" us ({C.fmt_ratio(row[f'ratio[{side.form}]'])})"
                for side in shm_sides if f"ratio[{side.form}]" in row)
            print(f"  {op:13s} {sampler:11s} {n:4d}  "
                  f"cpprb {C.fmt_num(a and a['median_us'], 2):>8s} us  "
                  f"shmreplay {C.fmt_num(b and b['median_us'], 2):>8s} us  "
                  f"ratio {C.fmt_ratio(row['ratio'])}{extra}", flush=True)
    finally:
        for side in sides:
            side.close()
    reverb = run_reverb(args, libs, results, errors)

    others = [side for side in shm_sides if side.form != "dict"]
    headers = ["case", "sampler", "steps/batch", "cpprb µs", "shmreplay µs",
               "cpprb/shmreplay"]
    for side in others:
        headers += [f"{side.form} µs", f"cpprb/{side.form}"]
    if reverb["measured"]:
        headers += ["Reverb µs", "Reverb/shmreplay"]
    headers.append(f">= {TARGET:g}x (cpprb/shmreplay)")
    rows = []
    ratios = []
    for r in results:
        a, b = r.get("cpprb"), r.get("shmreplay")
        line = [r["op"], r["sampler"], r["n"], C.fmt_num(a and a["median_us"], 2),
                C.fmt_num(b and b["median_us"], 2), C.fmt_ratio(r["ratio"])]
        row_ratios = [r["ratio"]] if "shmreplay" in r else []
        for side in others:
            got = r.get(side.name)
            line += [C.fmt_num(got and got["median_us"], 2),
                     C.fmt_ratio(r[f"ratio[{side.form}]"])]
            row_ratios.append(r[f"ratio[{side.form}]"])
        if reverb["measured"]:
            got = r.get("reverb")
            line += [C.fmt_num(got and got["median_us"], 1), C.fmt_ratio(r.get("ratio_reverb"))]
        known = [x for x in row_ratios if x is not None]
        ratios += known
        line.append("n/a" if not known else ("yes" if min(known) >= TARGET else "NO"))
        rows.append(line)
    summary = (f"min ratio {min(ratios):.2f}x, geometric mean "
               f"{float(np.exp(np.mean(np.log(ratios)))):.2f}x; "
               f"{sum(x >= TARGET for x in ratios)}/{len(ratios)} case-forms >= {TARGET:g}x "
               f"(forms: {args.forms})"
               if ratios else "no ratios (one side missing)")
    print()
    print(C.render_table(headers, rows))
    print("\n" + summary)

    notes = [f"mode: {'quick' if args.quick else 'full'}; median of {timing['repeat']} repeats, "
             "µs per call; ratio = cpprb / shmreplay (higher: shmreplay faster)",
             f"buffer {CAPACITY}, obs/next_obs float32[15], act float32[3], rew/done float32; "
             f"alpha {ALPHA}, beta {BETA}; same process, shmreplay via Client(server.name)",
             "cpprb PER add without explicit priorities (its faster path); shmreplay PER add "
             "with priorities; prioritized sample includes importance weights in both",
             f"nest forms: {args.forms} (list: [obs, act, rew, next_obs, done]; namedtuple: "
             "Transition of those fields; each form in tables its first item defined)",
             summary]
    if reverb["measured"]:
        v = reverb["versions"]
        notes.insert(3, f"Reverb: dm-reverb {v.get('dm-reverb')}, tensorflow "
                        f"{v.get('tensorflow') or v.get('tensorflow-cpu')}, numpy {v.get('numpy')} "
                        f"(its own virtualenv, a subprocess after the other two; load "
                        f"{reverb['loadavg_at_start']} at its start); add = Client.writer(1), "
                        "append + create_item per step, flush per call (Client.insert per step "
                        "in the JSON as reverb[insert]); sample = Client.sample (+ weights, "
                        "+ mutate_priorities); ratio Reverb/shmreplay (higher: shmreplay faster)")
    else:
        notes.insert(3, reverb["note"])
    md = C.markdown_report("shmreplay vs cpprb (cpprb's Reverb-comparison configuration)",
                           info, notes, headers, rows, errors)
    payload = {"benchmark": "vs_cpprb", "quick": args.quick, "machine": info,
               "config": {"capacity": CAPACITY, "alpha": ALPHA, "beta": BETA,
                          "add_steps": ADD_STEPS, "batch_sizes": BATCH_SIZES,
                          "timing": timing, "target_ratio": TARGET, "seed": args.seed,
                          "forms": args.forms},
               "results": results, "summary": summary, "reverb": reverb, "errors": errors}
    stem = "vs_cpprb" + (f"-{args.tag}" if args.tag else "") + ("-quick" if args.quick else "")
    paths = C.write_results(stem, payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    left = C.check_clean(f"shmreplay.{args.prefix}-")
    return 1 if (errors or left) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few short repeats (a smoke run)")
    p.add_argument("--libs", default="cpprb,shmreplay,reverb",
                   help="comma-separated subset of cpprb,shmreplay,reverb")
    p.add_argument("--reverb-python", default=None,
                   help="python of a virtualenv with dm-reverb (default: $REVERB_PYTHON)")
    p.add_argument("--reverb-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--forms", default="dict",
                   help="comma-separated nest forms of shmreplay's data: dict (published), "
                        "list, namedtuple")
    p.add_argument("--tag", default="", help="a name for this run's result files")
    p.add_argument("--prefix", default="bench-vs", help="shared-memory name prefix")
    args = p.parse_args(argv)
    if args.reverb_worker:
        return RV.worker(cases(), CAPACITY, ALPHA, BETA, _timing(args.quick), args.seed)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

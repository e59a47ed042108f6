#!/usr/bin/env python
"""Large buffers and the memory-copy floor, in one process.

Part 1, learner rate vs capacity: a prioritized table (alpha 0.4) of small transitions
(obs/next_obs float32[15], act float32[3], rew, done float32) filled to capacity with
``insert_batch``; one learner call = ``client.sample_batch(table, 256)`` +
``info.importance_weights(0.4)`` + ``client.update_priorities(table, keys, prios)``.
Measured at every power of two from 2**14 to 2**20 items (the capacity plot's curve); the
ratio rate(2**14) / rate(2**20) should stay within 2x. For contrast, cpprb's single-process ``PrioritizedReplayBuffer`` and its shared-memory
``MPPrioritizedReplayBuffer`` (no explorers) do ``sample(256, beta=0.4)`` +
``update_priorities`` at the same capacities. All of them (21 buffers, about 1 GB) are
filled first and then timed interleaved, so a change of load hits the whole curve alike.

Part 2, the floor: a uniform table of Atari-like frames, filled; ``sample_batch(256)``
versus numpy gathering 256 random rows of local arrays of the same shapes with
``np.take(local, idx, axis=0, out=preallocated, mode="clip")`` (indices drawn beforehand,
so only the copy is timed; with the default ``mode="raise"`` numpy buffers ``out=`` and is
about 2x slower, so that variant and ``local[idx]`` are shown too and the ratio is taken
against the fastest of the three). Two items: ``{obs: uint8[84,84,4]}`` alone, and the full transition
(obs, next_obs uint8[84,84,4], act int32, rew, done float32: numpy takes every column).
Target: shmreplay within 1.5x of numpy.

Usage:  python benchmarks/bench_large.py [--quick] [--libs cpprb,shmreplay] [--prefix P]
                                          [--tag TAG]
Writes: benchmarks/results/large[-TAG][-quick].{json,md}
"""

import argparse
import gc
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import numpy as np  # noqa: E402

ALPHA = 0.4
BETA = 0.4
BATCH = 256
CAPACITIES = tuple(2**k for k in range(14, 21))  # 2^14 .. 2^20, every power of two
FLOOR_CAPACITY = 2**14
FRAME = (84, 84, 4)
TARGET_CAPACITY_RATIO = 2.0
TARGET_FLOOR_RATIO = 1.5

SMALL_ENV = {"obs": {"shape": 15}, "act": {"shape": 3}, "rew": {},
             "next_obs": {"shape": 15}, "done": {}}


def small_batch(rng, n):
    return {"obs": rng.standard_normal((n, 15)).astype(np.float32),
            "act": rng.standard_normal((n, 3)).astype(np.float32),
            "rew": rng.standard_normal(n).astype(np.float32),
            "next_obs": rng.standard_normal((n, 15)).astype(np.float32),
            "done": np.zeros(n, np.float32)}


def frame_batch(rng, n, full):
    b = {"obs": rng.integers(0, 256, (n,) + FRAME, dtype=np.uint8)}
    if full:
        b.update(act=rng.integers(0, 18, n).astype(np.int32),
                 rew=rng.standard_normal(n).astype(np.float32),
                 next_obs=rng.integers(0, 256, (n,) + FRAME, dtype=np.uint8),
                 done=np.zeros(n, np.float32))
    return b


def fill(capacity, chunk, make, add):
    batch = make(chunk)
    done = 0
    while done < capacity:
        n = min(chunk, capacity - done)
        add(batch if n == chunk else {k: v[:n] for k, v in batch.items()})
        done += n


def prio_pool(rng):
    pool = [rng.random(BATCH) + 0.05 for _ in range(8)]
    return pool


# --------------------------------------------------------------------------- part 1

def shm_learner_fn(shm, client, table, rng):
    pool = prio_pool(rng)
    sample_batch, update = client.sample_batch, client.update_priorities
    state = [0]

    def op():
        s = sample_batch(table, BATCH)
        s.info.importance_weights(BETA)
        keys = s.info.key
        state[0] += 1
        update(table, keys, pool[state[0] & 7][:len(keys)])
    return op


def cpprb_learner_fn(rb, rng):
    pool = prio_pool(rng)
    sample, update = rb.sample, rb.update_priorities
    state = [0]

    def op():
        s = sample(BATCH, beta=BETA)
        state[0] += 1
        update(s["indexes"], pool[state[0] & 7])
    return op


def _shm_side(shm, cap, rng, prefix, keep):
    """A filled prioritized table of ``cap`` items; its learner call."""
    from shmreplay import rate_limiters, selectors
    table = shm.Table("per", sampler=selectors.Prioritized(ALPHA), remover=selectors.Fifo(),
                      max_size=cap, rate_limiter=rate_limiters.MinSize(1))
    server = shm.Server(tables=[table], name=f"{prefix}-large-{cap}-{os.getpid()}")
    keep.append(server.stop)
    client = shm.Client(server.name)
    keep.append(client.close)
    fill(cap, min(cap, 65536), lambda n: small_batch(rng, n),
         lambda b: client.insert_batch(b, {"per": rng.random(len(b["rew"])) + .05}))
    size = client.server_info()["per"].current_size
    if size != cap:
        raise AssertionError(f"table holds {size} items after filling {cap}")
    return shm_learner_fn(shm, client, "per", rng)


def _cpprb_side(cpprb, variant, cap, rng, keep):
    import multiprocessing as mp
    if variant == "PrioritizedReplayBuffer":
        rb = cpprb.PrioritizedReplayBuffer(cap, SMALL_ENV, alpha=ALPHA)
    else:
        rb = cpprb.MPPrioritizedReplayBuffer(cap, SMALL_ENV, alpha=ALPHA,
                                             ctx=mp.get_context("fork"))
    keep.append(rb)
    fill(cap, min(cap, 65536), lambda n: small_batch(rng, n),
         lambda b: rb.add(**b, priorities=rng.random(len(b["rew"])) + .05))
    return cpprb_learner_fn(rb, rng)


def part_capacity(libs, shm, cpprb, timing, rng, errors, prefix):
    """Every (library, capacity) learner call, all held at once and timed interleaved,
    so that a change of the machine's load hits every point of the curves alike."""
    sides = []  # (lib, variant, cap, make)
    for cap in CAPACITIES:
        if shm is not None:
            sides.append(("shmreplay", "Client.sample_batch+update", cap,
                          lambda keep, cap=cap: _shm_side(shm, cap, rng, prefix, keep)))
        if cpprb is not None:
            for variant in ("PrioritizedReplayBuffer", "MPPrioritizedReplayBuffer"):
                sides.append(("cpprb", variant + " sample+update", cap,
                              lambda keep, v=variant, cap=cap: _cpprb_side(cpprb, v, cap,
                                                                           rng, keep)))
    keep, fns, labels = [], {}, {}
    rows = []
    try:
        for lib, variant, cap, make in sides:
            label = f"{lib} {variant} {cap}"
            try:
                fns[label] = make(keep)
                labels[label] = (lib, variant, cap)
            except Exception as exc:  # noqa: BLE001 - report, never work around
                tb = traceback.format_exc()
                print(f"{lib} {variant} capacity {cap} failed:\n{tb}")
                errors.append({"lib": lib, "where": f"{variant} capacity {cap}",
                               "error": repr(exc), "traceback": tb})
        print(f"  {len(fns)} learner calls filled; timing them interleaved", flush=True)
        timed = C.time_interleaved(fns, **timing) if fns else {}
    finally:
        for item in reversed(keep):
            try:
                if callable(item):
                    item()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        keep.clear()
        gc.collect()
    for label, t in timed.items():
        lib, variant, cap = labels[label]
        rows.append({"lib": lib, "variant": variant, "capacity": cap, "us": t["median"] * 1e6,
                     "best_us": t["best"] * 1e6, "items_s": BATCH / t["median"]})
        print(f"  {lib:9s} {variant:42s} cap 2^{cap.bit_length() - 1}: "
              f"{t['median'] * 1e6:9.1f} us/call  {C.fmt_num(BATCH / t['median'])} items/s",
              flush=True)
    return rows


# --------------------------------------------------------------------------- part 2

def part_floor(shm, timing, rng, errors, prefix):
    rows = []
    idx_pool = [rng.integers(0, FLOOR_CAPACITY, BATCH) for _ in range(16)]
    for full in (False, True):
        item = "full transition" if full else "obs only"
        local = frame_batch(rng, FLOOR_CAPACITY, full)
        # numpy floor: preallocated output, same shapes, random rows.
        outs = {k: np.empty((BATCH,) + v.shape[1:], v.dtype) for k, v in local.items()}
        state = [0]

        def gatherer(kind):
            def np_take_clip():  # the floor: out= without mode='raise' buffering
                state[0] += 1
                idx = idx_pool[state[0] & 15]
                for k, arr in local.items():
                    np.take(arr, idx, axis=0, out=outs[k], mode="clip")

            def np_take_raise():  # default mode='raise': numpy buffers out= (slower)
                state[0] += 1
                idx = idx_pool[state[0] & 15]
                for k, arr in local.items():
                    np.take(arr, idx, axis=0, out=outs[k])

            def np_fancy():  # a fresh output each call
                state[0] += 1
                idx = idx_pool[state[0] & 15]
                return {k: arr[idx] for k, arr in local.items()}
            return {"take_clip": np_take_clip, "take_raise": np_take_raise,
                    "fancy": np_fancy}[kind]

        t_np = {k: C.time_per_call(gatherer(k), **timing)["median"]
                for k in ("take_clip", "take_raise", "fancy")}
        floor = min(t_np.values())
        row = {"item": item, "bytes_per_row": int(sum(v[0].nbytes for v in local.values())),
               "numpy_take_out_clip_us": t_np["take_clip"] * 1e6,
               "numpy_take_out_raise_us": t_np["take_raise"] * 1e6,
               "numpy_fancy_us": t_np["fancy"] * 1e6,
               "numpy_floor_us": floor * 1e6,
               "shmreplay_us": None, "ratio": None}
        if shm is not None:
            from shmreplay import rate_limiters, selectors
            try:
                table = shm.Table("frames", sampler=selectors.Uniform(),
                                  remover=selectors.Fifo(), max_size=FLOOR_CAPACITY,
                                  rate_limiter=rate_limiters.MinSize(1))
                server = shm.Server(tables=[table],
                                    name=f"{prefix}-floor-{int(full)}-{os.getpid()}")
                try:
                    client = shm.Client(server.name)
                    for start in range(0, FLOOR_CAPACITY, 1024):
                        client.insert_batch({k: v[start:start + 1024] for k, v in local.items()},
                                            {"frames": 1.0})
                    s = client.sample_batch("frames", BATCH)
                    got = {k: np.shape(v) for k, v in s.data.items()}
                    want = {k: (BATCH,) + v.shape[1:] for k, v in local.items()}
                    if got != want:
                        raise AssertionError(f"sample_batch shapes {got}, want {want}")
                    sample_batch = client.sample_batch
                    t = C.time_per_call(lambda: sample_batch("frames", BATCH), **timing)
                    row["shmreplay_us"] = t["median"] * 1e6
                    row["shmreplay_best_us"] = t["best"] * 1e6
                    row["ratio"] = t["median"] / floor
                    client.close()
                finally:
                    server.stop()
            except Exception as exc:  # noqa: BLE001
                tb = traceback.format_exc()
                print(f"shmreplay floor ({item}) failed:\n{tb}")
                errors.append({"lib": "shmreplay", "where": f"floor {item}",
                               "error": repr(exc), "traceback": tb})
        del local, outs
        gc.collect()
        rows.append(row)
        print(f"  floor {item:16s} numpy take(out=,clip) {row['numpy_take_out_clip_us']:8.1f} us, "
              f"take(out=) {row['numpy_take_out_raise_us']:8.1f} us, "
              f"a[idx] {row['numpy_fancy_us']:8.1f} us, "
              f"shmreplay {C.fmt_num(row['shmreplay_us'])} us, "
              f"ratio {C.fmt_ratio(row['ratio'])}", flush=True)
    return rows


# --------------------------------------------------------------------------- main

def run(args):
    timing = (dict(repeat=3, min_time=0.01, warmup=0.05) if args.quick
              else dict(repeat=9, min_time=0.05, warmup=0.3))
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    errors = []
    shm = cpprb = None
    if "shmreplay" in libs:
        shm, why = C.load_shmreplay()
        if shm is None:
            print("shmreplay unavailable:", why)
            errors.append({"lib": "shmreplay", "where": "import", "error": why})
    if "cpprb" in libs:
        cpprb, why = C.load_cpprb()
        if cpprb is None:
            print("cpprb unavailable:", why)
            errors.append({"lib": "cpprb", "where": "import", "error": why})
    info = C.machine_info()
    for ln in C.machine_lines(info):
        print(ln)
    print(f"mode: {'quick' if args.quick else 'full'}; timing {timing}\n")
    rng = np.random.default_rng(args.seed)

    cap_rows = part_capacity(libs, shm, cpprb, timing, rng, errors, args.prefix)
    floor_rows = part_floor(shm, timing, rng, errors, args.prefix)

    # capacity table: one row per (lib, variant), columns per capacity, ratio small/large
    lo, hi = CAPACITIES[0], CAPACITIES[-1]
    headers1 = ["lib", "learner call", f"µs @2^{lo.bit_length() - 1}",
                f"items/s @2^{lo.bit_length() - 1}", f"µs @2^{hi.bit_length() - 1}",
                f"items/s @2^{hi.bit_length() - 1}", "slowdown", f"<= {TARGET_CAPACITY_RATIO:g}x"]
    rows1 = []
    seen = []
    for r in cap_rows:
        if (r["lib"], r["variant"]) not in seen:
            seen.append((r["lib"], r["variant"]))
    summary1 = []
    for lib, variant in seen:
        a = next((r for r in cap_rows if (r["lib"], r["variant"], r["capacity"])
                  == (lib, variant, lo)), None)
        b = next((r for r in cap_rows if (r["lib"], r["variant"], r["capacity"])
                  == (lib, variant, hi)), None)
        slow = b["us"] / a["us"] if a and b else None
        met = "-" if slow is None else ("yes" if slow <= TARGET_CAPACITY_RATIO else "NO")
        rows1.append([lib, variant, C.fmt_num(a and a["us"]), C.fmt_num(a and a["items_s"]),
                      C.fmt_num(b and b["us"]), C.fmt_num(b and b["items_s"]),
                      C.fmt_ratio(slow), met if lib == "shmreplay" else "-"])
        summary1.append({"lib": lib, "variant": variant, "slowdown": slow})
    headers_curve = ["lib", "learner call"] + [f"µs @2^{c.bit_length() - 1}" for c in CAPACITIES]
    rows_curve = [[lib, variant] + [C.fmt_num(next((r["us"] for r in cap_rows if
                                                     (r["lib"], r["variant"], r["capacity"])
                                                     == (lib, variant, c)), None))
                                    for c in CAPACITIES] for lib, variant in seen]
    headers2 = ["frames item (256 rows)", "MB/batch", "np.take(out=, mode=clip) µs",
                "np.take(out=) µs", "a[idx] µs", "shmreplay sample_batch µs",
                "shmreplay / fastest numpy", f"<= {TARGET_FLOOR_RATIO:g}x"]
    rows2 = [[r["item"], f"{r['bytes_per_row'] * BATCH / 1e6:.2f}",
              C.fmt_num(r["numpy_take_out_clip_us"]), C.fmt_num(r["numpy_take_out_raise_us"]),
              C.fmt_num(r["numpy_fancy_us"]),
              C.fmt_num(r["shmreplay_us"]), C.fmt_ratio(r["ratio"]),
              "-" if r["ratio"] is None else
              ("yes" if r["ratio"] <= TARGET_FLOOR_RATIO else "NO")] for r in floor_rows]
    print()
    print(C.render_table(headers1, rows1))
    print()
    print(C.render_table(headers_curve, rows_curve))
    print()
    print(C.render_table(headers2, rows2))

    notes = [f"mode: {'quick' if args.quick else 'full'}; median of {timing['repeat']} repeats",
             f"learner call = sample {BATCH} (+ IS weights, beta {BETA}) + update_priorities; "
             f"alpha {ALPHA}; tables filled to capacity; slowdown = µs@2^20 / µs@2^14",
             f"floor: uniform table of {FLOOR_CAPACITY} frames, filled; numpy gathers "
             "precomputed random rows of local arrays; ratio against the fastest numpy variant "
             "(np.take with out= and the default mode='raise' buffers the output, so "
             "mode='clip' is the real floor)"]
    md = C.markdown_header("Large buffers and the copy floor", info, notes)
    md += "\n" + C.render_table(headers1, rows1, markdown=True) + "\n\n"
    md += C.render_table(headers_curve, rows_curve, markdown=True) + "\n\n"
    md += C.render_table(headers2, rows2, markdown=True) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- {e['lib']} {e['where']}: `{e['error']}`"
                                          for e in errors) + "\n"
    payload = {"benchmark": "large", "quick": args.quick, "machine": info,
               "config": {"capacities": CAPACITIES, "floor_capacity": FLOOR_CAPACITY,
                          "batch": BATCH, "alpha": ALPHA, "beta": BETA, "timing": timing,
                          "seed": args.seed},
               "capacity": cap_rows, "capacity_summary": summary1, "floor": floor_rows,
               "errors": errors}
    stem = "large" + (f"-{args.tag}" if args.tag else "") + ("-quick" if args.quick else "")
    paths = C.write_results(stem, payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    left = C.check_clean(f"shmreplay.{args.prefix}-")
    return 1 if (errors or left) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few short repeats (a smoke run)")
    p.add_argument("--libs", default="cpprb,shmreplay", help="cpprb,shmreplay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="bench", help="shared-memory name prefix")
    p.add_argument("--tag", default="", help="a name for this run's result files")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

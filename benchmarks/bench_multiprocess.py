#!/usr/bin/env python
"""Multi-process throughput: actors inserting one transition per call while a learner
samples prioritized batches of 256 and updates their priorities.

shmreplay: the parent creates a Server with one table
``Table("replay", Prioritized(0.4), Fifo(), capacity, MinSize(1))`` and fills it with
``insert_batch``. Actor processes (``multiprocessing`` spawn) attach by name with
``shmreplay.Client(name)`` and loop ``client.insert(transition, {"replay": 1.0})``; the
learner process (spawn) attaches the same way and loops
``s = client.sample_batch("replay", 256)``, ``s.info.importance_weights(0.4)``,
``client.update_priorities("replay", s.info.key, prios)``.

cpprb peer: ``MPPrioritizedReplayBuffer(capacity, env_dict, alpha=0.4)`` (fork context,
default shared-memory backend), filled first; explorer processes loop ``rb.add(**transition)``
(no explicit priority: cpprb's fastest path), the learner loops
``rb.sample(256, beta=0.4)`` + ``rb.update_priorities(indexes, prios)``. The whole cpprb
case runs inside a forked driver process so its shared memory is released afterwards.

Every worker attaches and warms up (numba compiles) first; then all start together and run
for ``--seconds`` of wall time; each reports its count and its own elapsed time.

Transitions: "small" = obs/next_obs float32[15], act float32[3], rew, done float32
(capacity 2**16); "frames" = obs/next_obs uint8[84,84,4], act int32, rew, done float32
(capacity 2**14, about 0.9 GiB per buffer).

Targets (issue 2): one actor's single-transition insert rate with the learner running
>= 20x cpprb's; the learner > 1M items/s sampled+updated.

Usage:  python benchmarks/bench_multiprocess.py [--quick] [--seconds 5]
            [--kinds small,frames] [--libs cpprb,shmreplay] [--no-reference]
Writes: benchmarks/results/multiprocess[-quick].{json,md}
"""

import argparse
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

import numpy as np  # noqa: E402

ALPHA = 0.4
BETA = 0.4
BATCH = 256
TABLE = "replay"
CAPACITY = {"small": 2**16, "frames": 2**14}
FRAME = (84, 84, 4)
STARTUP_TIMEOUT = 180.0
TARGET_INSERT_RATIO = 20.0
TARGET_LEARNER = 1e6
# What issue 2 quotes for cpprb's MPPrioritizedReplayBuffer (1 explorer adding one transition
# per call while the learner runs), measured earlier on this machine class.
ISSUE_CPPRB = {"insert": 5.3e3, "learner": 400e3}


# --------------------------------------------------------------------------- data

def env_dict(kind):
    if kind == "small":
        return {"obs": {"shape": 15}, "act": {"shape": 3}, "rew": {},
                "next_obs": {"shape": 15}, "done": {}}
    return {"obs": {"shape": FRAME, "dtype": np.uint8}, "act": {"dtype": np.int32},
            "rew": {}, "next_obs": {"shape": FRAME, "dtype": np.uint8}, "done": {}}


def make_transition(kind, rng):
    if kind == "small":
        return {"obs": rng.standard_normal(15).astype(np.float32),
                "act": rng.standard_normal(3).astype(np.float32),
                "rew": np.float32(rng.standard_normal()),
                "next_obs": rng.standard_normal(15).astype(np.float32),
                "done": np.float32(0.0)}
    return {"obs": rng.integers(0, 256, FRAME, dtype=np.uint8),
            "act": np.int32(rng.integers(0, 18)),
            "rew": np.float32(rng.standard_normal()),
            "next_obs": rng.integers(0, 256, FRAME, dtype=np.uint8),
            "done": np.float32(0.0)}


def make_batch(kind, rng, n):
    if kind == "small":
        return {"obs": rng.standard_normal((n, 15)).astype(np.float32),
                "act": rng.standard_normal((n, 3)).astype(np.float32),
                "rew": rng.standard_normal(n).astype(np.float32),
                "next_obs": rng.standard_normal((n, 15)).astype(np.float32),
                "done": np.zeros(n, np.float32)}
    return {"obs": rng.integers(0, 256, (n,) + FRAME, dtype=np.uint8),
            "act": rng.integers(0, 18, n).astype(np.int32),
            "rew": rng.standard_normal(n).astype(np.float32),
            "next_obs": rng.integers(0, 256, (n,) + FRAME, dtype=np.uint8),
            "done": np.zeros(n, np.float32)}


def fill_chunks(kind, capacity, rng, fn):
    """Calls ``fn(batch)`` with batches that add up to ``capacity`` items."""
    chunk = 4096 if kind == "small" else 512
    batch = make_batch(kind, rng, chunk)
    done = 0
    while done < capacity:
        n = min(chunk, capacity - done)
        fn(batch if n == chunk else {k: v[:n] for k, v in batch.items()})
        done += n


# --------------------------------------------------------------------------- worker loops
# ``ops`` is a zero-argument callable doing one unit of work and returning the items it
# handled; the loop is shared by both libraries so the measurement is identical.

def _timed_loop(op, seconds, chunk):
    perf = time.perf_counter
    n = 0
    t0 = perf()
    deadline = t0 + seconds
    while perf() < deadline:
        for _ in range(chunk):
            n += op()
    return n, perf() - t0


def _worker_main(role, wid, make_ops, seconds, msgs, start_evt, warmup):
    try:
        t0 = time.perf_counter()
        op, chunk, closer = make_ops()
        for _ in range(warmup):
            op()
        msgs.put(("ready", role, wid, time.perf_counter() - t0))
        if not start_evt.wait(STARTUP_TIMEOUT + 60):
            raise RuntimeError("start event never came")
        n, elapsed = _timed_loop(op, seconds, chunk)
        closer()
        msgs.put(("done", role, wid, n, elapsed))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        msgs.put(("error", role, wid, traceback.format_exc()))


# shmreplay ops (spawned: everything is rebuilt from picklable arguments)

class ShmActorOps:
    def __init__(self, name, kind, seed):
        self.name, self.kind, self.seed = name, kind, seed

    def __call__(self):
        import shmreplay
        client = shmreplay.Client(self.name)
        tr = make_transition(self.kind, np.random.default_rng(self.seed))
        prio = {TABLE: 1.0}
        insert = client.insert

        def op():
            insert(tr, prio)
            return 1
        return op, (64 if self.kind == "small" else 16), client.close


class ShmLearnerOps:
    def __init__(self, name, seed):
        self.name, self.seed = name, seed

    def __call__(self):
        import shmreplay
        client = shmreplay.Client(self.name)
        rng = np.random.default_rng(self.seed)
        pool = [rng.random(BATCH) + 0.05 for _ in range(8)]
        sample_batch, update = client.sample_batch, client.update_priorities
        state = [0]

        def op():
            s = sample_batch(TABLE, BATCH)
            s.info.importance_weights(BETA)
            keys = s.info.key
            state[0] += 1
            update(TABLE, keys, pool[state[0] & 7][:len(keys)])
            return len(keys)
        return op, 4, client.close


# cpprb ops (forked: the buffer object is inherited)

class CpprbActorOps:
    def __init__(self, rb, kind, seed):
        self.rb, self.kind, self.seed = rb, kind, seed

    def __call__(self):
        tr = make_transition(self.kind, np.random.default_rng(self.seed))
        add = self.rb.add

        def op():
            add(**tr)
            return 1
        return op, (64 if self.kind == "small" else 16), (lambda: None)


class CpprbLearnerOps:
    def __init__(self, rb, seed):
        self.rb, self.seed = rb, seed

    def __call__(self):
        rng = np.random.default_rng(self.seed)
        pool = [rng.random(BATCH) + 0.05 for _ in range(8)]
        sample, update = self.rb.sample, self.rb.update_priorities
        state = [0]

        def op():
            s = sample(BATCH, beta=BETA)
            idx = s["indexes"]
            state[0] += 1
            update(idx, pool[state[0] & 7][:len(idx)])
            return len(idx)
        return op, 4, (lambda: None)


# --------------------------------------------------------------------------- orchestration

def run_workers(ctx, actor_ops, learner_ops, seconds):
    """Starts one process per ops factory, waits until all are warm, starts them together.

    Returns ``{"actors": [(n, elapsed)], "learner": (n, elapsed) | None, "startup_s": ...}``.
    Always joins or terminates every process it started.
    """
    msgs = ctx.Queue()
    start_evt = ctx.Event()
    procs = []
    roles = [("actor", i, f) for i, f in enumerate(actor_ops)]
    if learner_ops is not None:
        roles.append(("learner", 0, learner_ops))
    t_launch = time.perf_counter()
    try:
        for role, wid, factory in roles:
            warm = 200 if role == "actor" else 20
            p = ctx.Process(target=_worker_main, name=f"bench-{role}-{wid}",
                            args=(role, wid, factory, seconds, msgs, start_evt, warm))
            p.start()
            procs.append(p)
        ready, done, startup = set(), {}, {}

        def pump(until_count, key, timeout):
            deadline = time.monotonic() + timeout
            while len(key) < until_count:
                try:
                    m = msgs.get(timeout=0.5)
                except queue_mod.Empty:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"workers not finished after {timeout:.0f}s")
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(
                            f"worker {dead[0].name} died with exit code {dead[0].exitcode}")
                    continue
                if m[0] == "error":
                    raise RuntimeError(f"{m[1]} {m[2]} failed:\n{m[3]}")
                if m[0] == "ready":
                    ready.add((m[1], m[2]))
                    startup[(m[1], m[2])] = m[3]
                elif m[0] == "done":
                    done[(m[1], m[2])] = (m[3], m[4])

        pump(len(roles), ready, STARTUP_TIMEOUT)
        startup_s = time.perf_counter() - t_launch
        start_evt.set()
        pump(len(roles), done, seconds + 60)
        return {"actors": [done[("actor", i)] for i in range(len(actor_ops))],
                "learner": done.get(("learner", 0)),
                "startup_s": startup_s,
                "warmup_s": {f"{r}{i}": round(v, 3) for (r, i), v in startup.items()}}
    finally:
        start_evt.set()  # release anyone still waiting, then reap
        C.reap(procs)


def summarize(lib, kind, n_actors, learner, raw):
    actor_rates = [n / t for n, t in raw["actors"]]
    lr = raw["learner"]
    return {
        "lib": lib, "kind": kind, "capacity": CAPACITY[kind], "actors": n_actors,
        "learner": learner,
        "insert_per_actor": actor_rates,
        "insert_per_actor_mean": (sum(actor_rates) / len(actor_rates)) if actor_rates else None,
        "insert_total": sum(actor_rates) if actor_rates else None,
        "learner_items_s": (lr[0] / lr[1]) if lr else None,
        "learner_calls_s": (lr[0] / BATCH / lr[1]) if lr else None,
        "startup_s": round(raw["startup_s"], 2),
        "warmup_s": raw["warmup_s"],
    }


def shm_case(shm, kind, n_actors, learner, seconds, seed):
    from shmreplay import rate_limiters, selectors
    name = f"bench-mp-{kind[0]}-{os.getpid()}"
    table = shm.Table(TABLE, sampler=selectors.Prioritized(ALPHA), remover=selectors.Fifo(),
                      max_size=CAPACITY[kind], rate_limiter=rate_limiters.MinSize(1))
    server = shm.Server(tables=[table], name=name)
    try:
        client = shm.Client(server.name)
        rng = np.random.default_rng(seed)
        fill_chunks(kind, CAPACITY[kind], rng,
                    lambda b: client.insert_batch(b, {TABLE: rng.random(len(b["rew"])) + 0.05}))
        client.close()
        ctx = mp.get_context("spawn")
        raw = run_workers(ctx, [ShmActorOps(server.name, kind, seed + 1 + i)
                                for i in range(n_actors)],
                          ShmLearnerOps(server.name, seed + 100) if learner else None, seconds)
        return summarize("shmreplay", kind, n_actors, learner, raw)
    finally:
        server.stop()


def _cpprb_driver(kind, n_actors, learner, seconds, seed, out):
    try:
        import cpprb
        ctx = mp.get_context("fork")
        rb = cpprb.MPPrioritizedReplayBuffer(CAPACITY[kind], env_dict(kind), alpha=ALPHA, ctx=ctx)
        rng = np.random.default_rng(seed)
        fill_chunks(kind, CAPACITY[kind], rng, lambda b: rb.add(**b))
        raw = run_workers(ctx, [CpprbActorOps(rb, kind, seed + 1 + i) for i in range(n_actors)],
                          CpprbLearnerOps(rb, seed + 100) if learner else None, seconds)
        out.put(("ok", summarize("cpprb", kind, n_actors, learner, raw)))
    except BaseException:  # noqa: BLE001
        out.put(("error", traceback.format_exc()))


def cpprb_case(kind, n_actors, learner, seconds, seed):
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    driver = ctx.Process(target=_cpprb_driver, name="bench-cpprb-driver",
                         args=(kind, n_actors, learner, seconds, seed, out))
    driver.start()
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT + seconds + 120
        while True:
            try:
                status, value = out.get(timeout=0.5)
                break
            except queue_mod.Empty:
                if driver.exitcode is not None:
                    raise RuntimeError(f"cpprb driver exited with {driver.exitcode}")
                if time.monotonic() > deadline:
                    raise TimeoutError("cpprb driver did not finish")
        if status != "ok":
            raise RuntimeError("cpprb case failed:\n" + value)
        return value
    finally:
        driver.join(timeout=30)
        if driver.is_alive():
            driver.terminate()
            driver.join()


# --------------------------------------------------------------------------- main

def plan(kinds, libs, reference):
    """(lib, kind, actors, learner) in run order; cpprb first (before any Server exists)."""
    out = []
    for lib in ("cpprb", "shmreplay"):
        if lib not in libs:
            continue
        for kind in kinds:
            if lib == "cpprb":
                configs = [(1, True)]
                if reference and kind == "small":
                    configs += [(0, True), (1, False)]
            else:
                configs = [(1, True), (2, True)]
                if reference and kind == "small":
                    configs += [(0, True), (1, False)]
            out += [(lib, kind, a, l) for a, l in configs]
    return out


def run(args):
    seconds = args.seconds if args.seconds is not None else (1.0 if args.quick else 5.0)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    libs = [s.strip() for s in args.libs.split(",") if s.strip()]
    errors = []
    shm = None
    if "shmreplay" in libs:
        shm, why = C.load_shmreplay()
        if shm is None:
            print("shmreplay unavailable:", why)
            errors.append({"lib": "shmreplay", "where": "import", "error": why})
            libs.remove("shmreplay")
    if "cpprb" in libs:
        cpprb, why = C.load_cpprb()
        if cpprb is None:
            print("cpprb unavailable:", why)
            errors.append({"lib": "cpprb", "where": "import", "error": why})
            libs.remove("cpprb")
    info = C.machine_info()
    for ln in C.machine_lines(info):
        print(ln)
    print(f"mode: {'quick' if args.quick else 'full'}; {seconds:g} s per case; "
          f"learner batch {BATCH}, alpha {ALPHA}, beta {BETA}\n")

    results = []
    for lib, kind, n_actors, learner in plan(kinds, libs, not args.no_reference):
        label = f"{lib:9s} {kind:6s} actors={n_actors} learner={'yes' if learner else 'no '}"
        print("  " + label, end=" ... ", flush=True)
        try:
            if lib == "cpprb":
                r = cpprb_case(kind, n_actors, learner, seconds, args.seed)
            else:
                r = shm_case(shm, kind, n_actors, learner, seconds, args.seed)
            results.append(r)
            print(f"insert/actor {C.fmt_num(r['insert_per_actor_mean'])}/s, "
                  f"learner {C.fmt_num(r['learner_items_s'])} items/s "
                  f"(startup {r['startup_s']:.1f}s)", flush=True)
        except Exception as exc:  # noqa: BLE001 - report, never work around
            tb = traceback.format_exc()
            print("FAILED\n" + tb, flush=True)
            errors.append({"lib": lib, "where": f"{kind} actors={n_actors} learner={learner}",
                           "error": repr(exc), "traceback": tb})

    headers = ["lib", "transition", "actors", "learner", "inserts/s per actor", "µs per insert",
               "inserts/s total", "learner items/s", "learner calls/s"]
    rows = []
    for r in results:
        per = r["insert_per_actor_mean"]
        rows.append([r["lib"], f"{r['kind']} (cap {r['capacity']})", r["actors"],
                     "yes" if r["learner"] else "no", C.fmt_num(per),
                     C.fmt_num(1e6 / per if per else None, 1), C.fmt_num(r["insert_total"]),
                     C.fmt_num(r["learner_items_s"]), C.fmt_num(r["learner_calls_s"])])

    def find(lib, kind, actors, learner):
        for r in results:
            if (r["lib"], r["kind"], r["actors"], r["learner"]) == (lib, kind, actors, learner):
                return r
        return None

    comp_headers = ["comparison", "shmreplay", "cpprb", "ratio", "target", "met"]
    comp = []
    for kind in kinds:
        s, c = find("shmreplay", kind, 1, True), find("cpprb", kind, 1, True)
        si = s and s["insert_per_actor_mean"]
        ci = c and c["insert_per_actor_mean"]
        ratio = si / ci if si and ci else None
        tgt = TARGET_INSERT_RATIO if kind == "small" else None
        comp.append([f"{kind}: inserts/s, 1 actor + learner", C.fmt_num(si), C.fmt_num(ci),
                     C.fmt_ratio(ratio), f">= {tgt:g}x" if tgt else "-",
                     ("yes" if ratio >= tgt else "NO") if (tgt and ratio) else "-"])
        if kind == "small" and si:
            q = si / ISSUE_CPPRB["insert"]
            comp.append(["small: inserts/s vs the issue's quoted cpprb 5.3k/s", C.fmt_num(si),
                         C.fmt_num(ISSUE_CPPRB["insert"]), C.fmt_ratio(q), f">= {tgt:g}x",
                         "yes" if q >= tgt else "NO"])
        sl, cl = s and s["learner_items_s"], c and c["learner_items_s"]
        lratio = sl / cl if sl and cl else None
        comp.append([f"{kind}: learner items/s, 1 actor running", C.fmt_num(sl), C.fmt_num(cl),
                     C.fmt_ratio(lratio), "> 1M/s" if kind == "small" else "-",
                     ("yes" if sl > TARGET_LEARNER else "NO") if (sl and kind == "small")
                     else "-"])
        s2 = find("shmreplay", kind, 2, True)
        if s2:
            comp.append([f"{kind}: 2 actors + learner (per actor / learner)",
                         f"{C.fmt_num(s2['insert_per_actor_mean'])} / "
                         f"{C.fmt_num(s2['learner_items_s'])}", "-", "-", "-", "-"])

    print()
    print(C.render_table(headers, rows))
    print()
    print(C.render_table(comp_headers, comp))
    notes = [f"mode: {'quick' if args.quick else 'full'}; {seconds:g} s wall time per case, "
             "all workers started together after warm-up",
             f"prioritized table, alpha {ALPHA}; learner: sample {BATCH} + importance weights "
             f"(beta {BETA}) + update_priorities",
             "shmreplay: Server in the parent, spawned workers attach with Client(name); "
             "cpprb: MPPrioritizedReplayBuffer, fork context",
             f"{info['cores_usable']} usable cores: runs with more than "
             f"{info['cores_usable']} busy processes are oversubscribed"]
    md = C.markdown_header("Multi-process: actors insert one transition per call, "
                           "learner samples 256 + updates", info, notes)
    md += "\n" + C.render_table(headers, rows, markdown=True) + "\n\n"
    md += C.render_table(comp_headers, comp, markdown=True) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- {e['lib']} {e['where']}: `{e['error']}`"
                                          for e in errors) + "\n"
    payload = {"benchmark": "multiprocess", "quick": args.quick, "machine": info,
               "config": {"seconds": seconds, "batch": BATCH, "alpha": ALPHA, "beta": BETA,
                          "capacity": CAPACITY, "kinds": kinds, "seed": args.seed},
               "results": results, "comparison": [dict(zip(comp_headers, r)) for r in comp],
               "errors": errors}
    paths = C.write_results("multiprocess" + ("-quick" if args.quick else ""), payload, md)
    print("\nwrote", ", ".join(os.path.relpath(p, C.REPO_ROOT) for p in paths))
    left = C.check_clean()
    return 1 if (errors or left) else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 s per case instead of 5")
    p.add_argument("--seconds", type=float, default=None, help="wall time per case")
    p.add_argument("--kinds", default="small,frames", help="small,frames")
    p.add_argument("--libs", default="cpprb,shmreplay", help="cpprb,shmreplay")
    p.add_argument("--no-reference", action="store_true",
                   help="skip the learner-only and actor-only reference runs")
    p.add_argument("--seed", type=int, default=0)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

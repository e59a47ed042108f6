"""The cases of ``bench_multiprocess.py``: one (library, transition, actors, learner)
configuration run as worker processes started together, and its rates.

Not a public module. A shmreplay case spawns its workers against a Server made here; a
cpprb case runs whole inside a forked driver process, so that its shared memory is
released afterwards.
"""

import multiprocessing as mp
import os
import queue as queue_mod
import time
import traceback

import numpy as np

import _common as C
from _multiprocess_ops import (ALPHA, BATCH, CAPACITY, STARTUP_TIMEOUT, TABLE, CpprbActorOps,
                               CpprbLearnerOps, ShmActorOps, ShmLearnerOps, env_dict,
                               fill_chunks, worker_main)


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
            p = ctx.Process(target=worker_main, name=f"bench-{role}-{wid}",
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

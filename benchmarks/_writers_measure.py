"""The in-process part of ``bench_writers.py``: one step shape's cases timed against one
Server (first pass, then interleaved steady-state timing), and the memory check.

Not a public module.
"""

import itertools
import os
import time

import _common as C
from _writers_cases import (CASES, DATASETS, NUM_KEEP, TABLES, cpprb_case, cycler,
                            make_pool, raw_case, rss_bytes, shm_case, step_nbytes,
                            trajectory_calls_case)


def _table_info(info):
    return {"current_size": int(info.current_size),
            "num_stored_steps": int(info.num_stored_steps),
            "storage_bytes": int(info.storage_bytes)}


def run_dataset(dname, args, libs, shm, cpprb, rng, timing, errors):
    """Times step shape ``dname``'s cases of ``libs``: each case's first pass (``max_size``
    steps; fewer in quick mode), then all of them interleaved; then the tables' sizes and
    the memory check. Returns the shape's results; failures go to ``errors``."""
    ds = DATASETS[dname]
    cap = ds["capacity"]
    fill = min(cap, 1000 if dname == "small" else 200) if args.quick else cap
    steps, next_obs = make_pool(rng, ds)
    res = {"capacity": cap, "fill_steps": fill, "step_bytes": step_nbytes(steps[0]),
           "cases": {}, "first_pass_us": {}, "rss_growth_bytes": {}, "tables": {},
           "memory": None, "loadavg_before": C.load_average()}
    print(f"\n== {dname}: obs {ds['obs_dtype'].__name__}{list(ds['obs_shape'])}, "
          f"max_size {cap}, first pass {fill} steps per case", flush=True)

    keys = []
    if "numpy" in libs:
        keys += ["raw", "calls_traj3"]
    if shm is not None:
        keys += ["shm_legacy1", "shm_legacy3", "shm_traj3", "shm_traj_squeezed",
                 "shm_traj_nstep", "shm_insert", "shm_floor", "shm_traj_floor"]
    if cpprb is not None:
        keys += ["cpprb_add", "cpprb_next_of"] + (["cpprb_stack"] if dname == "frames" else [])
        keys.append("cpprb_nstep")

    server = client = None
    closers = []
    fns = {}
    try:
        if shm is not None:
            from shmreplay import rate_limiters, selectors
            tables = [shm.Table(name, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                                max_size=cap, rate_limiter=rate_limiters.MinSize(1))
                      for name in TABLES.values()]
            try:
                server = shm.Server(tables=tables, name=f"{args.prefix}-{dname}-{os.getpid()}")
                client = shm.Client(server.name)
            except Exception as exc:  # noqa: BLE001
                C.record_error(errors, "shmreplay", f"{dname} setup", exc)
                keys = [k for k in keys if not k.startswith("shm_")]
        with (server if server is not None else _null()):
            for key in keys:
                lib = CASES[key][0]
                try:
                    rss0 = rss_bytes()
                    if key == "raw":
                        fn, close = raw_case(ds, steps)
                    elif key == "calls_traj3":
                        fn, close = trajectory_calls_case(steps, cycler(steps))
                    elif lib == "shmreplay":
                        fn, close = shm_case(key, client, steps)
                    else:
                        fn, close = cpprb_case(key, cpprb, ds, steps, next_obs)
                    if close is not None:
                        closers.append(close)
                    t0 = time.perf_counter()
                    for _ in itertools.repeat(None, fill):
                        fn()
                    res["first_pass_us"][key] = (time.perf_counter() - t0) / fill * 1e6
                    rss1 = rss_bytes()
                    if rss0 is not None and rss1 is not None:
                        res["rss_growth_bytes"][key] = rss1 - rss0
                    fns[key] = fn
                except Exception as exc:  # noqa: BLE001 - report, never work around
                    C.record_error(errors, lib, f"{dname} {key}", exc)
            print("first pass (µs/step): " + ", ".join(
                f"{k} {v:.1f}" for k, v in res["first_pass_us"].items()), flush=True)
            if fns:
                try:
                    timed = C.time_interleaved(fns, **timing)
                except Exception as exc:  # noqa: BLE001
                    C.record_error(errors, "/".join(fns), f"{dname} timing", exc)
                    timed = {}
                for key, t in timed.items():
                    res["cases"][key] = {"median_us": t["median"] * 1e6,
                                         "best_us": t["best"] * 1e6,
                                         "number": t["number"], "repeat": t["repeat"]}
                    print(f"  {CASES[key][1]:48s} {t['median'] * 1e6:9.2f} µs/step "
                          f"(best {t['best'] * 1e6:.2f})", flush=True)
            if client is not None:
                try:
                    info = client.server_info()
                    res["tables"] = {name: _table_info(i) for name, i in info.items()}
                    res["memory"] = memory_check(shm, dname, ds, steps, args)
                except Exception as exc:  # noqa: BLE001
                    C.record_error(errors, "shmreplay", f"{dname} info/memory", exc)
            for close in closers:
                try:
                    close()
                except Exception as exc:  # noqa: BLE001
                    C.record_error(errors, "shmreplay", f"{dname} writer close", exc)
            closers = []
            if client is not None:
                client.close()
                client = None
    finally:
        if client is not None:
            client.close()
        if server is not None:
            server.stop()  # idempotent; the with block has stopped it already
    res["loadavg_after"] = C.load_average()
    return res


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def memory_check(shm, dname, ds, steps, args):
    """A fresh writer of each kind writes N steps of 3-step overlapping items into an
    empty table; what the table then stores."""
    from shmreplay import rate_limiters, selectors
    cap = ds["capacity"]
    n = min(cap // 2, 300) if args.quick else cap // 2
    names = ("mem-legacy3", "mem-traj3")
    tables = [shm.Table(name, sampler=selectors.Uniform(), remover=selectors.Fifo(),
                        max_size=cap, rate_limiter=rate_limiters.MinSize(1)) for name in names]
    out = {"steps": n, "step_bytes": step_nbytes(steps[0])}
    with shm.Server(tables=tables, name=f"{args.prefix}-mem-{dname}-{os.getpid()}") as server:
        with shm.Client(server.name) as client:
            nxt = cycler(steps)
            with client.writer(NUM_KEEP) as w:
                for i in range(n):
                    w.append(nxt())
                    if i >= NUM_KEEP - 1:
                        w.create_item(names[0], 3, 1.0)
            nxt = cycler(steps)
            tw = client.trajectory_writer(NUM_KEEP)
            for i in range(n):
                step = nxt()
                tw.append(step)
                if i >= NUM_KEEP - 1:
                    tw.create_item(names[1], 1.0, {k: tw.history[k][-3:] for k in step})
            tw.flush()
            tw.close()
            info = client.server_info()
            for name in names:
                out[name] = _table_info(info[name])
    out["n_times_step_bytes"] = n * out["step_bytes"]
    out["whole_items_bytes"] = (n - NUM_KEEP + 1) * NUM_KEEP * out["step_bytes"]
    return out

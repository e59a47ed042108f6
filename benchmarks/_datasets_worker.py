"""The worker processes of ``bench_datasets.py``: ``worker`` runs one library's cases
(``bench_datasets.py --worker tf|jax``) and prints one JSON line; ``run_worker`` starts it
from the parent and reads that line back.

Not a public module. Each worker attaches to the parent's tables by name, times
``sample_batch`` alone first (the baseline), then each (shape, B) group's cases
interleaved.
"""

import json
import os
import subprocess
import sys
import tempfile

import _common as C
from _datasets_cases import (CASES, TABLE, Cases, build_jax_cases, build_tf_cases,
                             loop_steps, timing_settings)


def _row(n, t):
    return {"items_per_call": n, "median_us_per_call": t["median"] * 1e6,
            "best_us_per_call": t["best"] * 1e6, "items_per_s": n / t["median"],
            "best_items_per_s": n / t["best"], "number": t["number"], "repeat": t["repeat"]}


def worker(args):
    """Runs one library's cases against existing tables (``--servers shape=name,...``);
    prints one JSON line."""
    lib = args.worker
    timing = timing_settings(args.quick)
    K = loop_steps(args.quick)
    servers = dict(kv.split("=", 1) for kv in args.servers.split(","))
    out = {"lib": lib, "versions": {}, "shapes": {d: {} for d in servers}, "errors": []}
    errors = out["errors"]
    import shmreplay
    try:
        if lib == "tf":
            import tensorflow as tf
            from shmreplay import tf as _stf  # noqa: F401 - fail here, not per group
            out["versions"]["tensorflow"] = tf.__version__
        else:
            import jax
            from shmreplay import jax as _sj  # noqa: F401
            out["versions"]["jax"] = jax.__version__
            out["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception as exc:  # noqa: BLE001
        C.record_error(errors, f"shmreplay.{lib}", "import", exc)
        print(json.dumps(out, default=str), flush=True)
        return 1
    clients = {}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    try:
        for dname, name in servers.items():
            clients[dname] = shmreplay.Client(name)
        # the baseline: sample_batch in this process before any dataset exists
        for dname, client in clients.items():
            for B in sizes:
                sb = client.sample_batch
                t = C.time_per_call((lambda f, b: lambda: f(TABLE, b))(sb, B), **timing)
                out["shapes"][dname][str(B)] = {"batch_size": B, "loop_steps": K,
                                                "cases": {"baseline": _row(B, t)},
                                                "first_batch_ms": {}}
                print(f"  [{lib}] {dname} B={B}: {CASES['baseline'][1]} "
                      f"{C.fmt_num(B / t['median'])} items/s", flush=True)
        for dname, client in clients.items():
            for B in sizes:
                g = out["shapes"][dname][str(B)]
                where = f"{dname} B={B}"
                g["loadavg_before"] = C.load_average()
                cases = Cases()
                try:
                    sample = client.sample_batch(TABLE, B)
                    sb = client.sample_batch
                    cases.fns["sample_batch"] = (lambda f, b: lambda: f(TABLE, b))(sb, B)
                    cases.items["sample_batch"] = B
                    try:
                        if lib == "tf":
                            build_tf_cases(cases, servers[dname], B, K, sample)
                        else:
                            build_jax_cases(cases, client, B)
                    except Exception as exc:  # noqa: BLE001 - report, never work around
                        C.record_error(errors, f"shmreplay.{lib}", f"{where} setup", exc)
                    g["first_batch_ms"] = dict(cases.first_batch_ms)
                    fns = {k: cases.fns[k] for k in CASES if k in cases.fns}
                    try:
                        timed = C.time_interleaved(fns, skips=cases.skips, **timing)
                    except Exception as exc:  # noqa: BLE001
                        C.record_error(errors, f"shmreplay.{lib}", f"{where} timing", exc)
                        timed = {}
                    for key, t in timed.items():
                        g["cases"][key] = _row(cases.items[key], t)
                        print(f"  [{lib}] {where}: {CASES[key][1]} "
                              f"{C.fmt_num(g['cases'][key]['items_per_s'])} items/s",
                              flush=True)
                finally:
                    cases.close(errors)
                g["loadavg_after"] = C.load_average()
    except Exception as exc:  # noqa: BLE001
        C.record_error(errors, f"shmreplay.{lib}", "run", exc)
    finally:
        for client in clients.values():
            client.close()
    print(json.dumps(out, default=str), flush=True)
    return 1 if errors else 0


def run_worker(script, lib, servers, args, errors):
    """Starts ``script --worker lib`` on the tables ``{shape: buffer name}``; echoes its
    progress; returns its JSON."""
    cmd = [sys.executable, os.path.abspath(script), "--worker", lib,
           "--servers", ",".join(f"{d}={n}" for d, n in servers.items()),
           "--batch-sizes", args.batch_sizes] + (["--quick"] if args.quick else [])
    with tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        except OSError as exc:
            errors.append({"lib": lib, "where": "worker", "error": repr(exc)})
            return None
        result = None
        for line in proc.stdout:
            if line.startswith("{"):
                result = json.loads(line)
            else:
                print(line, end="", flush=True)
        rc = proc.wait()
        err.seek(0)
        tail = err.read()[-3000:]
    if result is None:
        errors.append({"lib": lib, "where": "worker", "error": f"exit {rc}",
                       "stderr_tail": tail})
        print(f"{lib} worker exited {rc}:\n{tail}")
        return None
    errors.extend(result.get("errors", []))
    return result

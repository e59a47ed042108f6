"""The report of ``bench_writers.py``: its tables (markdown and plain text) and the
verdicts against the issue's targets.

Not a public module.
"""

import _common as C
from _writers_cases import CASES, DATASETS
from _writers_reverb import ISSUE_REVERB_US

SMALL_TARGET_US = 20.0
FRAMES_TARGET_RATIO = 2.0
SHM_WRITERS = ("shm_legacy1", "shm_legacy3", "shm_traj3")
SHM_ITEMS = ("shm_traj_squeezed", "shm_traj_nstep")  # judged against shm_traj3
ITEM_TARGET = 1.2


def _us(res, key):
    c = res["cases"].get(key)
    return c["median_us"] if c else None


def _div(a, b):
    return a / b if a is not None and b else None


def build_report(info, args, timing, results, reverb, errors):
    """(markdown, printable text, summary dict)."""
    md = []
    text = []
    targets = {}
    for dname, res in results.items():
        if reverb and dname in reverb.get("datasets", {}):
            rv = reverb["datasets"][dname]
            for key, c in rv["cases"].items():
                res["cases"][key] = dict(c, separate_process=True)
            for key, v in rv["first_pass_us"].items():
                res["first_pass_us"][key] = v
        raw = _us(res, "raw")
        cp = _us(res, "cpprb_add")
        headers = ["case", "µs/step (median)", "best", "first pass µs/step", "÷ raw copy",
                   "cpprb add ÷ case"]
        rows = []
        for key, (lib, label) in CASES.items():
            if key not in res["cases"] and key not in res["first_pass_us"]:
                if lib == "reverb" and key == "reverb_legacy1" and not reverb:
                    rows.append([label, f"not measured here (issue: ~{ISSUE_REVERB_US:g})",
                                 "", "", "", ""])
                continue
            c = res["cases"].get(key)
            m = c["median_us"] if c else None
            rows.append([label, C.fmt_num(m, 2), C.fmt_num(c and c["best_us"], 2),
                         C.fmt_num(res["first_pass_us"].get(key), 1),
                         C.fmt_ratio(_div(m, raw)), C.fmt_ratio(_div(cp, m))])
        ds = DATASETS[dname]
        title = (f"{dname}: obs {ds['obs_dtype'].__name__}{list(ds['obs_shape'])}, action "
                 f"int64, reward/discount float32 ({res['step_bytes']} bytes/step); "
                 f"max_size {res['capacity']}")
        md += [f"#### {title}", "", C.render_table(headers, rows, markdown=True), ""]
        text += [title, C.render_table(headers, rows), ""]

        # shmreplay against each cpprb mode
        cp_keys = [k for k in ("cpprb_add", "cpprb_next_of", "cpprb_stack", "cpprb_nstep")
                   if k in res["cases"]]
        shm_keys = [k for k in SHM_WRITERS + ("shm_insert",) if k in res["cases"]]
        if cp_keys and shm_keys:
            h2 = ["cpprb µs ÷ shmreplay µs"] + [CASES[k][1].replace("cpprb ", "")
                                                 for k in cp_keys]
            r2 = [[CASES[s][1]] + [C.fmt_ratio(_div(_us(res, c), _us(res, s)))
                                   for c in cp_keys] for s in shm_keys]
            md += [C.render_table(h2, r2, markdown=True), ""]
            text += [C.render_table(h2, r2), ""]

        t = {}
        for key in SHM_WRITERS:
            m = _us(res, key)
            if m is None:
                continue
            if dname == "small":
                t[key] = {"us": m, "target": f"< {SMALL_TARGET_US:g} µs",
                          "met": m < SMALL_TARGET_US}
            else:
                r = _div(m, raw)
                t[key] = {"us": m, "ratio_to_raw": r, "target": f"<= {FRAMES_TARGET_RATIO:g}x raw",
                          "met": None if r is None else r <= FRAMES_TARGET_RATIO}
        window = _us(res, "shm_traj3")
        for key in SHM_ITEMS:
            m = _us(res, key)
            if m is not None and window is not None:
                t[key] = {"us": m, "ratio_to_window": m / window,
                          "target": f"<= {ITEM_TARGET:g}x the [-3:] TrajectoryWriter case",
                          "met": m / window <= ITEM_TARGET}
        bound = _us(res, "shm_traj_floor")
        if dname == "frames" and bound is not None:
            # Not a writer: what any Python TrajectoryWriter over these kernels exceeds.
            t["shm_traj_floor"] = {"us": bound, "ratio_to_raw": _div(bound, raw),
                                   "target": "lower bound, not judged", "met": None}
        if args.quick:  # first touches of unfilled tables and rings dominate: no verdict
            for v in t.values():
                v["met"] = None
                v["target"] += " (not judged in quick mode)"
        targets[dname] = t

        mem = res.get("memory")
        if mem:
            h3 = ["table (3-step overlapping items)", "steps written", "items",
                  "num_stored_steps", "storage_bytes", "N × step bytes", "÷ N × step bytes",
                  "whole 3-step items would take"]
            r3 = []
            for name, label in (("mem-legacy3", "Writer(3), create_item(t, 3)"),
                                ("mem-traj3", "TrajectoryWriter(3), history[-3:]")):
                i = mem[name]
                r3.append([label, mem["steps"], i["current_size"], i["num_stored_steps"],
                           _mib(i["storage_bytes"]), _mib(mem["n_times_step_bytes"]),
                           C.fmt_ratio(_div(i["storage_bytes"], mem["n_times_step_bytes"])),
                           _mib(mem["whole_items_bytes"])])
            md += [f"Memory ({dname}), fresh table, {mem['steps']} steps, "
                   f"{mem['step_bytes']} bytes per step:", "",
                   C.render_table(h3, r3, markdown=True), ""]
            text += [f"memory ({dname}):", C.render_table(h3, r3), ""]
        if res.get("tables"):
            h4 = ["timed table, after the run" + ("" if args.quick else " (full)"), "items",
                  "num_stored_steps", "storage_bytes", "÷ items × step bytes"]
            r4 = []
            for name, i in res["tables"].items():
                r4.append([name, i["current_size"], i["num_stored_steps"],
                           _mib(i["storage_bytes"]),
                           C.fmt_ratio(_div(i["storage_bytes"],
                                            i["current_size"] * res["step_bytes"]))])
            if dname == "frames" and res["rss_growth_bytes"]:
                for key in ("raw", "cpprb_add", "cpprb_next_of", "cpprb_stack", "cpprb_nstep"):
                    if key in res["rss_growth_bytes"]:
                        r4.append([f"{CASES[key][1]} (process RSS growth over the first pass)",
                                   res["fill_steps"], "", _mib(res["rss_growth_bytes"][key]),
                                   C.fmt_ratio(_div(res["rss_growth_bytes"][key],
                                                    res["fill_steps"] * res["step_bytes"]))])
            md += [C.render_table(h4, r4, markdown=True), ""]
            text += [C.render_table(h4, r4), ""]
        md += [f"Load average before/after this part: {res['loadavg_before']} / "
               f"{res['loadavg_after']}", ""]

    lines = []
    for dname, t in targets.items():
        for key, v in t.items():
            if "ratio_to_window" in v:
                val = f"{v['us']:.1f} µs, {v['ratio_to_window']:.2f}x the [-3:] case"
            elif dname == "small":
                val = f"{v['us']:.1f} µs"
            else:
                val = f"{C.fmt_ratio(v.get('ratio_to_raw'))} of raw ({v['us']:.1f} µs)"
            ok = "n/a" if v["met"] is None else ("yes" if v["met"] else "NO")
            lines.append(f"{dname}, {CASES[key][1]}: {val}; target {v['target']}: {ok}")
    return md, text, targets, lines


def _mib(n):
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"

"""The summary of ``bench_soak.py``: wake-up percentiles, throughput and memory trends,
the tables (printed and markdown) and the JSON payload.

Not a public module.
"""

import math
import statistics

import numpy as np

import _common as C
from _soak_workers import (ALPHA, BATCH, BETA, ERROR_BUFFER, MAX_SIZE, MIN_SIZE, OBS,
                           PROBE_PRIORITY, SPI)


def _percentiles(values_ns):
    if not values_ns:
        return None
    v = np.sort(np.asarray(values_ns, np.float64)) / 1e3  # µs
    return {"n": int(v.size), "p50_us": float(np.percentile(v, 50)),
            "p90_us": float(np.percentile(v, 90)), "p99_us": float(np.percentile(v, 99)),
            "max_us": float(v[-1]), "mean_us": float(v.mean())}


def _slope_per_min(ts, ys):
    """Least-squares slope of ``ys`` against ``ts`` (seconds), per minute."""
    if len(ts) < 2:
        return None
    return float(np.polyfit(np.asarray(ts, float), np.asarray(ys, float), 1)[0] * 60)


def _fmt_us(x):
    return "n/a" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.1f}")


def _rss(windows, key, field="VmRSS"):
    """``field`` of process ``key`` in each window, MiB (0 where it was not read)."""
    return [((w["memory_kib"].get(key) or {}).get(field) or 0) / 1024 for w in windows]


def _first_last(values):
    return [values[0], values[-1]]


def _latency(args, soak, results, warm_ids, reference):
    """The wake-up percentiles past the warm-up, and the sample probes whose items were
    missed: ``(latency, missed)``."""
    learner = results.get(("learner", 0), {})
    sample_wake = [ns for probe, ns in learner.get("wakeups", []) if probe > warm_ids["sample"]]
    missed = [m for m in learner.get("missed", []) if m[0] > warm_ids["sample"]]
    by_probe = {}
    for i in range(args.actors):
        for probe, ns in results.get(("actor", i), {}).get("wakeups", []):
            if probe > warm_ids["insert"]:
                by_probe.setdefault(probe, []).append(ns)
    insert_wake = [ns for values in by_probe.values() for ns in values]
    insert_first = [min(values) for values in by_probe.values()]
    insert_last = [max(values) for values in by_probe.values() if len(values) == args.actors]
    latency = {
        "sample_wakeup": _percentiles(sample_wake),
        "sample_wakeup_missed_items": len(missed),
        "insert_wakeup_all": _percentiles(insert_wake),
        "insert_wakeup_first_per_probe": _percentiles(insert_first),
        "insert_wakeup_last_per_probe": _percentiles(insert_last),
        "probe_call_insert_batch": _percentiles(soak.probe_calls["sample"] if soak else []),
        "probe_call_sample": _percentiles(soak.probe_calls["insert"] if soak else []),
        "reference_insert_batch": _percentiles(reference["insert"]),
        "reference_sample": _percentiles(reference["sample"]),
        "probes": ({k: v - warm_ids[k] for k, v in soak.probe_ids.items()} if soak else {}),
    }
    return latency, missed


def _trend(windows, pids):
    """First and last window, extremes and least-squares slopes ({} if no window)."""
    ts = [w["t_end_s"] for w in windows]
    ins = [w["inserts_s"] for w in windows]
    smp = [w["samples_s"] for w in windows]
    shm_b = [w["shm_bytes"] for w in windows]

    trend = {}
    if windows:
        trend = {
            "inserts_s_first_last": [ins[0], ins[-1]],
            "inserts_s_min_max": [min(ins), max(ins)],
            "inserts_s_slope_pct_per_min": (100 * _slope_per_min(ts, ins) / statistics.mean(ins)
                                            if len(ins) > 1 else None),
            "samples_s_first_last": [smp[0], smp[-1]],
            "samples_s_min_max": [min(smp), max(smp)],
            "samples_s_slope_pct_per_min": (100 * _slope_per_min(ts, smp) / statistics.mean(smp)
                                            if len(smp) > 1 else None),
            "shm_mib_first_last": [shm_b[0] / 2**20, shm_b[-1] / 2**20],
            "rss_mib_first_last": {k: _first_last(_rss(windows, k)) for k in pids},
            "rss_anon_mib_first_last": {k: _first_last(_rss(windows, k, "RssAnon"))
                                        for k in pids},
        }
    return trend


def _window_table(windows, pids):
    """(headers, rows): one row per window."""
    win_headers = ["t (s)", "inserts/s", "samples/s", "learner calls/s", "size", "shm MiB",
                   "CPU % ours/others/steal"] + [f"{k} RSS MiB" for k in pids]
    win_rows = []
    for w in windows:
        win_rows.append([f"{w['t_end_s']:.0f}", C.fmt_num(w["inserts_s"]),
                         C.fmt_num(w["samples_s"]), C.fmt_num(w["learner_calls_s"]),
                         w["table_size"], f"{w['shm_bytes'] / 2**20:.1f}",
                         f"{w['cpu_ours_pct']:.0f} / {w['cpu_others_pct']:.0f} / "
                         f"{w['cpu_steal_pct']:.0f}"] +
                        [f"{((w['memory_kib'].get(k) or {}).get('VmRSS') or 0) / 1024:.1f}"
                         for k in pids])
    return win_headers, win_rows


def _latency_table(latency, actors):
    """(headers, rows): one row per kind of wake-up and probe call."""
    lat_headers = ["wake-up", "n", "p50 µs", "p90 µs", "p99 µs", "max µs"]
    lat_rows = []
    for label, key in (("sample: probe insert -> learner's sample_batch returns",
                        "sample_wakeup"),
                       ("insert: probe sample -> each waiting actor's insert returns",
                        "insert_wakeup_all"),
                       ("insert: first actor back, per probe", "insert_wakeup_first_per_probe"),
                       ("insert: last actor back, per probe", "insert_wakeup_last_per_probe"),
                       (f"probe call: insert_batch of {math.ceil(BATCH / SPI)} (start to return)",
                        "probe_call_insert_batch"),
                       (f"probe call: sample_batch of {int(SPI) * actors} (start to return)",
                        "probe_call_sample"),
                       ("same insert_batch, nobody waiting (reference table)",
                        "reference_insert_batch"),
                       ("same sample_batch, nobody waiting (reference table)",
                        "reference_sample")):
        p = latency[key]
        lat_rows.append([label] + (["0", "n/a", "n/a", "n/a", "n/a"] if p is None else
                                   [p["n"], _fmt_us(p["p50_us"]), _fmt_us(p["p90_us"]),
                                    _fmt_us(p["p99_us"]), _fmt_us(p["max_us"])]))
    return lat_headers, lat_rows


def _trend_rows(trend, pids):
    """The trend table's rows, from ``_trend``'s figures (none if no window)."""
    if not trend:
        return []

    def slope(key):
        return f"{trend[key]:+.2f} %/min" if trend[key] is not None else "n/a"
    ins0, ins1 = trend["inserts_s_first_last"]
    ins_min, ins_max = trend["inserts_s_min_max"]
    smp0, smp1 = trend["samples_s_first_last"]
    shm0, shm1 = trend["shm_mib_first_last"]
    rows = [
        ["inserts/s first / last window", f"{C.fmt_num(ins0)} / {C.fmt_num(ins1)}"],
        ["inserts/s min / max", f"{C.fmt_num(ins_min)} / {C.fmt_num(ins_max)}"],
        ["inserts/s trend (least squares)", slope("inserts_s_slope_pct_per_min")],
        ["samples/s first / last window", f"{C.fmt_num(smp0)} / {C.fmt_num(smp1)}"],
        ["samples/s trend (least squares)", slope("samples_s_slope_pct_per_min")],
        ["shared memory first / last window (MiB)", f"{shm0:.1f} / {shm1:.1f}"],
    ]
    for k in pids:
        (vm0, vm1), (anon0, anon1) = (trend["rss_mib_first_last"][k],
                                      trend["rss_anon_mib_first_last"][k])
        rows.append([f"{k} VmRSS (RssAnon) first / last (MiB)",
                     f"{vm0:.1f} ({anon0:.1f}) / {vm1:.1f} ({anon1:.1f})"])
    return rows


def summarize(args, info, soak, *, seconds, window, warmup, windows, pids, results,
              warm_ids, reference, errors):
    """Prints the tables; returns ``(markdown, payload)``. ``soak`` is the run's
    ``_soak_parent.Soak`` (None if it failed to start), ``results`` its workers' results,
    ``warm_ids`` the last probe ids of the warm-up (not reported)."""
    latency, missed = _latency(args, soak, results, warm_ids, reference)
    trend = _trend(windows, pids)
    win_headers, win_rows = _window_table(windows, pids)
    lat_headers, lat_rows = _latency_table(latency, args.actors)
    trend_rows = _trend_rows(trend, pids)

    print()
    print(C.render_table(win_headers, win_rows))
    print()
    print(C.render_table(["trend", "value"], trend_rows))
    print()
    print(C.render_table(lat_headers, lat_rows))
    if missed:
        print(f"\n{len(missed)} sample probe(s) returned without the probe's items in the "
              "batch (timed from the published t0 instead; not in the percentiles)")
    notes = [
        f"mode: {'quick' if args.quick else 'full'}; {seconds:g} s measured after "
        f"{warmup:g} s warm-up, windows of {window:g} s",
        f"{args.actors} actor processes insert one transition per call (obs f32[{OBS}] x2, "
        "action, reward, discount, actor, probe, t_ns); 1 learner: sample_batch(256) + "
        f"importance weights + update_priorities; Prioritized({ALPHA}), Fifo, max_size "
        f"{MAX_SIZE}, SampleToInsertRatio({SPI:g}, {MIN_SIZE}, {ERROR_BUFFER}); spawn",
        "inserts/s and samples/s from TableInfo counters (sampled items, incl. probes); "
        "shm = st_blocks of the buffer's /dev/shm segments; RSS = VmRSS of each process "
        "(it counts the shared pages a process touched; RssAnon in the JSON); CPU % = "
        "shares of all cores' time (/proc/stat): this benchmark's processes, all other "
        "processes, and steal (time the hypervisor gave to other guests)",
        f"wake-ups: probes every {args.probe_every:g} s, alternating; the paused side sleeps. "
        "Sample: the parent inserts 32 items stamped with monotonic_ns() (t_ns) while the "
        "actors are paused and the learner's sample_batch is registered waiting; latency = "
        "the learner's return - t_ns of those items in its batch. Insert: the parent samples "
        "8 x actors items while the learner is paused and every actor's insert is registered "
        "waiting; latency = each actor's return - monotonic_ns() before that sample call. "
        "Both include the unblocking call's own time up to its commit: at most what the same "
        "call costs on a table nobody waits on (the 'reference table' rows)",
        f"{info['cores_usable']} usable cores for {args.actors + 2} processes "
        "(parent mostly sleeps): oversubscribed",
    ]
    md = C.markdown_header("Soak: actors + learner on a rate-limited prioritized table", info,
                           notes)
    md += "\n" + C.render_table(win_headers, win_rows, markdown=True) + "\n\n"
    md += C.render_table(["trend", "value"], trend_rows, markdown=True) + "\n\n"
    md += C.render_table(lat_headers, lat_rows, markdown=True) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- `{e['error']}`" for e in errors) + "\n"
    payload = {"benchmark": "soak", "quick": args.quick, "machine": info,
               "config": {"seconds": seconds, "warmup": warmup, "window": window,
                          "actors": args.actors, "probe_every": args.probe_every,
                          "batch": BATCH, "alpha": ALPHA, "beta": BETA,
                          "samples_per_insert": SPI, "min_size_to_sample": MIN_SIZE,
                          "error_buffer": ERROR_BUFFER, "max_size": MAX_SIZE,
                          "probe_priority": PROBE_PRIORITY, "seed": args.seed},
               "pids": pids, "windows": windows, "trend": trend, "latency": latency,
               "per_process": {f"{r}{i}": {k: v for k, v in res.items()
                                           if k not in ("wakeups", "missed")}
                               for (r, i), res in results.items()},
               "errors": errors}
    return md, payload

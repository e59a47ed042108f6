"""The performance page's tables, generated from the JSON results.

A table on ``docs/performance.md`` is a block::

    <!-- table: NAME FILE [FILE ...] -->
    ...generated lines...
    <!-- /table -->

``fill(page)`` rewrites every block's lines with ``TABLES[NAME](files)``: a line naming
each run (machine, date, commit, load), then the Markdown table. To show a newer run,
change FILE on the marker line and run ``python benchmarks/plots.py --tables``. A FILE
written ``@ALIAS`` is the one a ``<!-- source: @ALIAS FILE -->`` line of the page names,
so that a section's tables and the figures its text cites move to a new run together.
"""

import re
import statistics

import _perf_sources as sources
from _perf_format import md as _md, num as _num, pick as _pick, rate as _rate, writer_cases
from _perf_tables_ab import AB_TABLES
from _perf_tables_acme import ACME_TABLES

BLOCK = re.compile(r"(<!-- table: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
SOURCE = re.compile(r"<!-- source: @(?P<alias>[\w.-]+) (?P<file>\S+) -->")


class TableError(Exception):
    """A table block names an unknown table, or its files do not fit the table."""


def vs_cpprb(files):
    """cpprb and shmreplay per case; Reverb's columns too when the run measured it."""
    (name, data), = files
    with_reverb = bool((data.get("reverb") or {}).get("measured"))
    rows = []
    for r in data["results"]:
        ours, theirs = r.get("shmreplay") or {}, r.get("cpprb") or {}
        line = [r["op"], r["sampler"], r["n"], _num(theirs.get("median_us")),
                _num(ours.get("median_us")),
                "-" if r.get("ratio") is None else f"**{r['ratio']:.2f}x**"]
        if with_reverb:
            reverb = r.get("reverb") or {}
            line += [_num(reverb.get("median_us"), 0),
                     "-" if r.get("ratio_reverb") is None else f"{r['ratio_reverb']:,.0f}x"]
        rows.append(line)
    headers = ["case", "sampler", "n", "cpprb µs", "shmreplay µs", "ratio"]
    aligns = ["---", "---", "---:", "---:", "---:", "---:"]
    if with_reverb:
        headers += ["Reverb µs", "Reverb / shmreplay"]
        aligns += ["---:", "---:"]
    return _md(headers, rows, aligns)


def multiprocess(files):
    (name, data), = files
    res = data["results"]

    def get(lib, kind, actors, learner, field):
        row = _pick(res, lib=lib, kind=kind, actors=actors, learner=learner)
        return None if row is None else row.get(field)

    def line(label, kind, actors, learner, field):
        ours, theirs = (get(lib, kind, actors, learner, field) for lib in ("shmreplay", "cpprb"))
        ratio = f"{ours / theirs:.1f}x" if ours and theirs else "-"
        return [label, f"**{_rate(ours)}**", _rate(theirs), ratio]

    rows = [line("inserts/s, 1 actor, learner running", "small", 1, True, "insert_per_actor_mean"),
            line("learner items/s sampled + updated, 1 actor running", "small", 1, True,
                 "learner_items_s"),
            line("learner items/s, no actor", "small", 0, True, "learner_items_s"),
            line("inserts/s, 1 actor, no learner", "small", 1, False, "insert_per_actor_mean")]
    for kind in ("small", "frames"):
        two = _pick(res, lib="shmreplay", kind=kind, actors=2, learner=True)
        if two:
            rows.append([f"{kind}, 2 actors + learner: inserts/s per actor / learner items/s",
                         f"{_rate(two['insert_per_actor_mean'])} / "
                         f"{_rate(two['learner_items_s'])}", "-", "-"])
    rows.append(line("frames (uint8 84x84x4 obs, next_obs): inserts/s, 1 actor + learner",
                     "frames", 1, True, "insert_per_actor_mean"))
    rows.append(line("frames: learner items/s with that actor", "frames", 1, True,
                     "learner_items_s"))
    return _md(["", "shmreplay", "cpprb `MPPrioritizedReplayBuffer`", "ratio"], rows)


def startup(files):
    (name, data), = files
    r = data["results"]

    def cold(key, field):
        return ", ".join(f"{run[field]:.1f} s" for run in r[key])

    warm_owner = [run["all_first_calls"] for run in r["owner + 3 workers, warm"]]
    cli = r["CLI, warm"]

    def med(*keys):
        return " / ".join(f"{cli[k]['median']:.3f}" for k in keys) + " s"

    rows = [
        ["first `Server` (cold: it compiles every kernel, `shmreplay.warm_up`)",
         cold("first Server, cold", "server"), "-"],
        ["docs/index.md's quickstart, as a script", cold("quickstart, cold", "wall"),
         f"{r['quickstart, warm']['median']:.2f} s"],
        ["an owner creates a buffer and spawns 2 actors and a learner: all three have "
         "done their first insert / sample", cold("owner + 3 workers, cold", "all_first_calls"),
         f"{min(warm_owner):.2f}-{max(warm_owner):.2f} s"],
        ["a spawned actor: `Process.start()` to its first insert returning", "-",
         f"{r['spawned actor, warm']['start_to_insert']:.2f} s"],
        ["of which attaching (`Client(name)`) and the first insert", "-",
         f"{r['spawned actor, warm']['attach'] + r['spawned actor, warm']['first_insert']:.2f} s"],
        [f"`python -c \"import shmreplay\"` (`python -c pass`: "
         f"{r['import shmreplay']['python -c pass']:.3f} s)", "-",
         f"{r['import shmreplay']['median']:.3f} s"],
        ["`shmreplay --help` / `ls` / `gc`", "-", med("--help", "ls", "gc")],
        ["`shmreplay info` / `verify` / `top` (one frame, 0.1 s interval)", "-",
         med("info", "verify", "top (1 frame, 0.1 s interval)")],
    ]
    return _md(["case", "cold", "warm"], rows)


def large(files):
    (name, data), = files
    caps = sorted({r["capacity"] for r in data["capacity"]})
    lo, hi = caps[0], caps[-1]
    rows = []
    for s in data["capacity_summary"]:
        a = _pick(data["capacity"], variant=s["variant"], capacity=lo)
        b = _pick(data["capacity"], variant=s["variant"], capacity=hi)
        rows.append([f"{s['lib']} `{s['variant']}`",
                     f"{a['us']:.1f} ({_rate(a['items_s'])} items/s)",
                     f"{b['us']:.1f} ({_rate(b['items_s'])} items/s)",
                     f"**{s['slowdown']:.2f}x**"])
    return _md(["", f"µs @ 2^{lo.bit_length() - 1}", f"µs @ 2^{hi.bit_length() - 1}",
                "slowdown"], rows)


def large_curve(files):
    """The learner call's µs at every capacity the run measured (the capacity plot's
    points), one row per library and variant."""
    (name, data), = files
    caps = sorted({r["capacity"] for r in data["capacity"]})
    rows = []
    for s in data["capacity_summary"]:
        line = [f"{s['lib']} `{s['variant']}`"]
        for cap in caps:
            r = _pick(data["capacity"], variant=s["variant"], capacity=cap)
            line.append("-" if r is None else f"{r['us']:,.1f}")
        rows.append(line)
    return _md(["µs per learner call"] + [f"2^{c.bit_length() - 1}" for c in caps], rows)


def copy_floor(files):
    (name, data), = files
    rows = [[f["item"], f"{f['shmreplay_us']:.1f}", f"{f['numpy_floor_us']:.1f}",
             f"**{f['ratio']:.2f}x**", f"{f['numpy_take_out_raise_us']:.0f}"]
            for f in data["floor"]]
    return _md(["`sample_batch(256)` of frames", "shmreplay µs", "numpy floor µs",
                "ratio", "`np.take(out=)`, default mode, µs"], rows)


def writers(files):
    """One column pair (small, frames) per file."""
    runs = [(name, data) for name, data in files]
    labels = {}
    for _, data in runs:
        for key, case in data["cases"].items():
            labels.setdefault(key, case["label"])
    headers = ["per step (µs)"]
    for name, data in runs:
        headers += [f"{sources.provenance(data)['date'][5:16]}: small", "frames"]
    rows = []
    for key, label in labels.items():
        cells = []
        for _, data in runs:
            for kind in ("small", "frames"):
                case = writer_cases(data, kind).get(key)
                cells.append(_num(case["median_us"]) if case else "")
        if any(cells):
            rows.append([label] + cells)
    return _md(headers, rows)


DATASET_ROWS = [
    ("baseline", "tf", "`sample_batch` (the baseline, TF worker)", False),
    ("md_eager", "tf", "`make_dataset` npc=1, eager `next()`", True),
    ("md2_eager", "tf", "`make_dataset` npc=2, eager `next()`", True),
    ("md2_loop", "tf", "`make_dataset` npc=2, TF loop", True),
    ("floor_eager", "tf", "TF itself: eager `next()` over `from_tensors(batch).repeat()`", True),
    ("traj_loop", "tf", "`TrajectoryDataset(...).batch(B)`, TF loop", True),
    ("jax", "jax", "`BatchIterator`, 1 worker", True),
    ("jax2", "jax", "`BatchIterator`, 2 workers", True),
]


def datasets(files):
    (name, data), = files
    cols = [(kind, b) for kind in ("small", "frames")
            for b in sorted(data["results"][kind]["groups"], key=int)]
    rows = []
    for case, worker, label, ratio in DATASET_ROWS:
        cells = []
        for kind, b in cols:
            r = data["results"][kind]["groups"][b].get(worker, {}).get("cases", {}).get(case)
            if r is None:
                cells.append("-")
            elif case.startswith("floor"):
                cells.append(f"({r['ratio']:.2f})")
            else:
                cells.append(_rate(r["items_per_s"])
                             + (f" ({r['ratio']:.2f})" if ratio else ""))
        rows.append([label] + cells)
    return _md(["items/s (÷ sample_batch)"] + [f"{kind} B={b}" for kind, b in cols], rows)


FEED_LEARNERS = {"jax": "JAX, `BatchIterator`", "tf": "TF, `make_dataset` + `tf.function`",
                 "tf_packed": "TF, `PackedBatches` + `tf.function`",
                 "reverb": "TF, Reverb's `TrajectoryDataset` + `tf.function`"}


def learner_feed(files):
    rows = []
    for name, data in files:
        run = data.get("args", {}).get("suffix") or name
        for r in data["rows"]:
            what = [FEED_LEARNERS[r["framework"]],
                    "transitions, MLP, B=256, PER" if r["workload"] == "transitions" else
                    "Atari, Nature-DQN, B=32", "on" if r["actor"] else "off", run]
            if r.get("error"):
                rows.append(what + ["error (see the JSON)", "", "", "", ""])
                continue
            med, ratio = r["median_steps_per_s"], r["ratio"]
            # (Reverb's rows have no floor: it is shmreplay's tf.data path without a table)
            cpu = " / ".join(f"{1e3 * statistics.median(r['cpu_s_per_step'][k]):.2f}"
                             if k in r["cpu_s_per_step"] else "-"
                             for k in ("constant", "floor", "fed"))
            # (host: the framework's own floor for fresh data, in runs from 2026-11-27 night)
            host, floor = (f"{ratio[k]:.2f}" if k in ratio else "-" for k in ("host", "floor"))
            rows.append(what + [f"{med['constant']:.1f}", f"{med['fed']:.1f}",
                                f"**{ratio['fed']:.2f}**", host, floor, cpu])
            if "fed_packed" in ratio:  # (runs from 2026-11-28, session 34)
                cpu = " / ".join(f"{1e3 * statistics.median(r['cpu_s_per_step'][k]):.2f}"
                                 for k in ("constant", "floor", "fed_packed"))
                rows.append([FEED_LEARNERS["tf_packed"]] + what[1:] + [
                    f"{med['constant']:.1f}", f"{med['fed_packed']:.1f}",
                    f"**{ratio['fed_packed']:.2f}**", host, floor, cpu])
    return _md(["learner", "workload", "actor", "run", "constant (steps/s)", "fed", "ratio",
                "host ratio", "floor ratio", "CPU/step constant / floor / fed (ms)"], rows,
               ["---"] * 4 + ["---:"] * 6)


def soak_windows(files):
    (name, data), = files
    rows = [[f"{w['t_end_s']:.0f}", _rate(w["inserts_s"]), _rate(w["samples_s"]),
             f"{w['learner_calls_s']:.0f}", f"{w['cpu_others_pct']:.1f}"
             if w.get("cpu_others_pct") is not None else "-"]
            for w in data["windows"]]
    return _md(["t (s)", "inserts/s", "sampled items/s", "learner calls/s",
                "others' CPU %"], rows)


def soak_memory(files):
    (name, data), = files
    t = data["trend"]
    rows = [["buffer, shared memory"] + [f"{x:.1f} MiB" for x in t["shm_mib_first_last"]]]
    for proc, (a, b) in t["rss_mib_first_last"].items():
        anon = t["rss_anon_mib_first_last"][proc]
        rows.append([f"{proc}: VmRSS (RssAnon)", f"{a:.1f} ({anon[0]:.2f}) MiB",
                     f"{b:.1f} ({anon[1]:.2f}) MiB"])
    return _md(["", "first window", "last window"], rows)


SOAK_LATENCY = [
    ("sample_wakeup", "sample: probe insert to the learner's return"),
    ("insert_wakeup_all", "insert: probe sample to each waiting actor's return"),
    ("insert_wakeup_first_per_probe", "insert: first of the 3 actors back"),
    ("insert_wakeup_last_per_probe", "insert: last of the 3 actors back"),
    ("probe_call_insert_batch", "the probe's `insert_batch(32)`, which wakes the learner"),
    ("reference_insert_batch", "the same call on a table nobody waits on"),
    ("probe_call_sample", "the probe's `sample_batch(24)`, which wakes 3 actors"),
    ("reference_sample", "the same call on a table nobody waits on"),
]


def soak_latency(files):
    (name, data), = files
    lat = data["latency"]
    rows = [[label, lat[key]["n"]] + [f"{lat[key][p]:.3g}" for p in
                                      ("p50_us", "p90_us", "p99_us", "max_us")]
            for key, label in SOAK_LATENCY]
    return _md(["", "n", "p50 µs", "p90 µs", "p99 µs", "max µs"], rows)


def checkpoint(files):
    (name, data), = files
    rows = []
    names = {"shmreplay": "shmreplay `Client.checkpoint` / `Server(checkpoint=)`",
             "cpprb": "cpprb `save_transitions` / `load_transitions`",
             "floor": "`np.save` + `fsync` / `np.load` (the floor)"}
    for case, res in data["results"].items():
        for lib in ("shmreplay", "cpprb", "floor"):
            r = res[lib]
            hold = f"**{r['max_hold_s']:.3f}**" if "max_hold_s" in r else "-"
            rows.append([case, names[lib], f"{r['save_s']:.3f}", hold, f"{r['restore_s']:.3f}",
                         f"{r['file_bytes'] / 2 ** 20:.1f}"])
    return _md(["case", "library", "save (s)", "pause (s)", "restore (s)", "file (MiB)"], rows,
               ["---", "---", "---:", "---:", "---:", "---:"])


def checkpoint_ab(files):
    (name, data), = files
    m, c = data["medians"], data["commits"]
    rows = []
    for case in m["other"]:
        a, b = m["other"][case], m["this"][case]
        rows.append([case, f"{a['save_s']:.3f} / {b['save_s']:.3f}",
                     f"{a['restore_s']:.3f} / {b['restore_s']:.3f} "
                     f"({b['restore_s'] / a['restore_s']:.2f}x)",
                     f"{a['max_hold_s']:.3f} / {b['max_hold_s']:.3f}"])
    return _md([f"case (`{c['other']}` / `{c['this']}`)", "save before / after (s)",
                "restore before / after (s)", "longest pause before / after (s)"], rows)


def tf_client(files):
    (name, data), = files
    floors = data.get("floors_us") or {}
    groups = {}
    for r in data["results"]:
        groups.setdefault((r["op"], r["mode"], r["n"]), {})[r["table"]] = r
    rows = []
    for (op, mode, n), by_table in groups.items():
        u, p = by_table.get("uniform"), by_table.get("prioritized")

        def both(fn):
            return " / ".join("-" if r is None else fn(r) for r in (u, p))

        floor = floors.get(f"{op} {mode}", floors.get(op))
        # a dataset's figure is the whole call (made, or made and read for N items)
        key = (lambda r, lib: r[lib]["median_ms"] * 1e3) if op.startswith("dataset") else \
            (lambda r, lib: r[lib]["per_unit_us"])
        rows.append([f"{op}, {mode}", n if n is not None else "",
                     both(lambda r: f"{key(r, 'reverb'):,.0f}"),
                     both(lambda r: f"{key(r, 'shmreplay'):,.0f}"),
                     both(lambda r: f"{r['ratio']:.1f}x"),
                     "" if floor is None else f"{floor:.0f}"])
    return _md(["case (uniform / prioritized)", "N", "Reverb µs", "shmreplay µs",
                "Reverb / shmreplay", "floor µs"],
               rows, ["---", "---:", "---:", "---:", "---:", "---:"])


def ab_hot_paths(files):
    (name, data), = files
    m = data["medians"]
    rows = [[case, f"{m['before'][case]:.2f}", f"{m['after'][case]:.2f}",
             f"{m['after'][case] / m['before'][case]:.3f}"] for case in m["before"]]
    return _md(["case (µs per call)", "before", "after", "after / before"], rows)


def any_length(files):
    (name, data), = files
    s = data["sample_batch_256"]
    fixed = s["fixed"]["us_per_call"]
    rows = [[label, f"{s[key]['us_per_call']:.0f}", s[key]["padded_steps"],
             f"{s[key]['us_per_call'] / fixed:.2f}"]
            for key, label in (("fixed", "fixed"), ("any", "any, lengths 1 .. 39"),
                               ("any_20", "any, all 20"))]
    return _md(["table", "µs per `sample_batch(256)`", "padded steps", "÷ fixed"], rows)


TABLES = {

    "vs_cpprb": vs_cpprb, "multiprocess": multiprocess, "startup": startup, "large": large,
    "large_curve": large_curve,
    "copy_floor": copy_floor, "writers": writers, "learner_feed": learner_feed,
    "datasets": datasets, "soak_windows": soak_windows, "soak_memory": soak_memory, "soak_latency": soak_latency,
    "checkpoint": checkpoint, "checkpoint_ab": checkpoint_ab, "tf_client": tf_client,
    "ab_hot_paths": ab_hot_paths, "any_length": any_length,
    **AB_TABLES, **ACME_TABLES,
}


def aliases(page):
    """``{alias: file}`` from the page's ``<!-- source: @ALIAS FILE -->`` lines: a section
    names its run once, and its tables and citations say ``@ALIAS``."""
    found = {}
    for m in SOURCE.finditer(page):
        if m.group("alias") in found:
            raise TableError(f"@{m.group('alias')} is defined twice")
        found[m.group("alias")] = m.group("file")
    return found


def resolve(name, known):
    """A results file's name, ``@ALIAS`` looked up in ``known``."""
    if not name.startswith("@"):
        return name
    if name[1:] not in known:
        raise TableError(f"{name}: no <!-- source: {name} FILE --> on the page")
    return known[name[1:]]


def render(spec, known=None):
    """The lines of the block whose marker reads ``<!-- table: SPEC -->``."""
    name, *names = spec.split()
    names = [resolve(n, known or {}) for n in names]
    if name not in TABLES:
        raise TableError(f"unknown table {name!r}; known: {', '.join(sorted(TABLES))}")
    if not names:
        raise TableError(f"table {name!r} names no results file")
    files = [(n, sources.load(n)) for n in names]
    try:
        body = TABLES[name](files)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise TableError(f"table {name!r} cannot be made from {', '.join(names)}: "
                         f"{type(e).__name__}: {e}") from None
    if len(files) > 2:  # a series: the machine and day once, then each run's commit
        first = sources.provenance(files[0][1])
        runs = f"`benchmarks/results/`, {first['machine']}, {first['date'][:10]}: " + "; ".join(
            f"`{n}` `{p['commit']}` at {p['date'][11:16]} (load {p['load']})"
            for n, p in ((n, sources.provenance(d)) for n, d in files))
    else:
        runs = "; ".join(sources.provenance_line(n, d) for n, d in files)
    return ["", f"*Generated from {runs}.*", ""] + body + [""]


def blocks(page):
    """``[(spec, body)]`` of every table block on the page, in order."""
    return [(m.group("spec"), m.group("body")) for m in BLOCK.finditer(page)]


def fill(page):
    """The page with every table block regenerated."""
    known = aliases(page)
    return BLOCK.sub(lambda m: m.group(1) + "\n".join(render(m.group("spec"), known)) + "\n"
                     + m.group(4), page)

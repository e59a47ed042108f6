"""The performance page's before/after tables: A/B runs and series of runs.

Registered in ``_perf_tables.TABLES``; the blocks and their markers are as there.
"""

import re
import statistics

from _perf_format import md as _md, num as _num, pick as _pick, rate as _rate, writer_cases


def _group(name, data):
    """A run's group in a before/after series: ``before`` or ``after`` when its tag or
    file name says so, else the tag (or the file name)."""
    tag = data.get("tag") or re.sub(r"\.json$", "", name)
    for side in ("before", "after"):
        if side in tag:
            return side
    return tag


def _span(xs, fmt="{:.2f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else \
        f"{fmt.format(lo)}-{fmt.format(hi)}"


def _groups(files):
    out = {}
    for name, data in files:
        out.setdefault(_group(name, data), []).append(data)
    return out


def nests_forms(files):
    """Each form's µs per call ÷ the flat dict's in the same run: the range over runs."""
    groups = _groups(files)
    first = files[0][1]
    forms = [f for f in first["config"]["forms"] if f != "dict"]
    cases = [c for c, figures in first["results_us"].items() if "dict" in figures]
    rows = []
    for case in cases:
        for group, runs in groups.items():
            rows.append([f"{case}, {group}"] + [
                _span(r["results_us"][case][form] / r["results_us"][case]["dict"] for r in runs)
                for form in forms])
    return _md(["row (÷ flat dict, range over runs)"] + [f.replace("_", " ") for f in forms],
               rows, ["---"] * (len(forms) + 1))


def nests_items(files):
    """TrajectoryWriter items: µs per step ÷ the ``[-3:]`` window item's, range over runs."""
    groups = _groups(files)
    kinds = [k for k in files[0][1]["results_us"]["TrajectoryWriter items"] if k != "window"]
    rows = [[kind] + [_span(r["results_us"]["TrajectoryWriter items"][kind]
                            / r["results_us"]["TrajectoryWriter items"]["window"] for r in runs)
                      for runs in groups.values()] for kind in kinds]
    return _md(["item (÷ window)"] + [f"{g} ({len(r)} runs)" for g, r in groups.items()], rows,
               ["---"] * (len(groups) + 1))


def nests_partial(files):
    """TrajectoryWriter steps appended in parts: µs per step ÷ the whole step's, per run."""
    rows = []
    for name, data in files:
        parts = data["results_us"]["TrajectoryWriter partial steps"]
        rows.append([name] + [f"{parts[kind]:.2f} ({parts[kind] / parts['whole']:.2f}x)"
                              for kind in parts])
    kinds = list(files[0][1]["results_us"]["TrajectoryWriter partial steps"])
    return _md(["run", *(f"{kind} µs/step (÷ whole)" for kind in kinds)], rows,
               ["---"] + ["---:"] * len(kinds))


def vs_cpprb_forms(files):
    """Each nest form's ratio to cpprb: range over the runs of each group, add and sample."""
    groups = _groups(files)
    forms = files[0][1]["config"]["forms"].split(",")
    rows = []
    for group, runs in groups.items():
        for form in forms:
            key = "ratio" if form == "dict" else f"ratio[{form}]"

            def ratios(ops):
                return [r[key] for run in runs for r in run["results"] if r["op"] in ops]

            cases = [(x["op"], x["sampler"], x["n"]) for x in runs[0]["results"]]
            best = [max(next(x[key] for x in run["results"]
                             if (x["op"], x["sampler"], x["n"]) == case) for run in runs)
                    for case in cases]
            met = [sum(r[key] >= run["config"]["target_ratio"] for r in run["results"])
                   for run in runs]
            rows.append([group, form, _span(ratios({"add"}), "{:.2f}x"),
                         _span(ratios({"sample", "sample+update"}), "{:.2f}x"),
                         " / ".join(str(m) for m in met), f"{min(best):.2f}x"])
    return _md(["runs", "form", "add ÷ cpprb", "sample (+update) ÷ cpprb",
                "cases >= 2x, per run", "min over cases of the best run"], rows,
               ["---", "---", "---:", "---:", "---:", "---:"])


def vs_cpprb_ab(files):
    """shmreplay µs per call in alternating before/after runs of bench_vs_cpprb.py."""
    (name, data), = files
    runs = data["runs"]
    order = data.get("order") or list(runs)
    rows = []
    for i, r0 in enumerate(runs[order[0]]["results"]):
        per = [runs[o]["results"][i]["shmreplay"]["median_us"] for o in order]
        before = [p for o, p in zip(order, per) if o.startswith("before")]
        after = [p for o, p in zip(order, per) if o.startswith("after")]
        rows.append([f"{r0['op']} {r0['sampler']} {r0['n']}"] + [f"{p:.2f}" for p in per]
                    + [f"{statistics.mean(after) / statistics.mean(before):.2f}",
                       f"{runs[order[-1]]['results'][i]['ratio']:.2f}x"])
    return _md(["case (µs per call)"] + order + ["after / before", f"{order[-1]} ÷ cpprb"], rows)


MP_AB_ROWS = [("small: inserts/s, 1 actor + learner", "small", 1, True, "insert_per_actor_mean"),
              ("small: learner items/s, 1 actor", "small", 1, True, "learner_items_s"),
              ("small: learner items/s, no actor", "small", 0, True, "learner_items_s"),
              ("frames: inserts/s, 1 actor + learner", "frames", 1, True,
               "insert_per_actor_mean"),
              ("frames: learner items/s, 1 actor", "frames", 1, True, "learner_items_s")]


def multiprocess_ab(files):
    (name, data), = files
    rows = []
    for label, kind, actors, learner, field in MP_AB_ROWS:
        b, a = (_pick(data[side]["results"], lib="shmreplay", kind=kind, actors=actors,
                      learner=learner) for side in ("before", "after"))
        if a and b and a.get(field) and b.get(field):
            rows.append([label, _rate(b[field]), _rate(a[field]), f"{a[field] / b[field]:.2f}"])
    return _md(["shmreplay", "before", "after", "after / before"], rows)


def writers_ab(files):
    """µs per step of two writers runs (before, after) and their ratio, small and frames."""
    (nb, before), (na, after) = files
    rows = []
    for key, case in after["cases"].items():
        if case["lib"] != "shmreplay":
            continue
        for kind in ("small", "frames"):
            b, a = (writer_cases(d, kind).get(key) for d in (before, after))
            if a and b:
                rows.append([f"{case['label']}, {kind}", _num(b["median_us"]),
                             _num(a["median_us"]), f"{a['median_us'] / b['median_us']:.2f}"])
    return _md(["per step (µs)", "before", "after", "after / before"], rows)


AB_TABLES = {
    "nests_forms": nests_forms, "nests_items": nests_items, "nests_partial": nests_partial,
    "vs_cpprb_forms": vs_cpprb_forms,
    "vs_cpprb_ab": vs_cpprb_ab, "multiprocess_ab": multiprocess_ab, "writers_ab": writers_ab,
}

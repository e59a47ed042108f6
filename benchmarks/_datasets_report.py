"""The report of ``bench_datasets.py``: one table per (shape, B), each case's ratio to the
baseline, and the verdicts against the target.

Not a public module.
"""

import _common as C
from _datasets_cases import CASES, TARGET, spec_text


def build_report(results, args):
    """(markdown lines, printable lines, targets dict, target summary lines)."""
    md, text, targets, lines = [], [], {}, []
    headers = ["case", "items/s", "µs/batch", "÷ baseline", f"≥ {TARGET:g}",
               "first batch ms"]
    for dname, res in results.items():
        for B, per_lib in res["groups"].items():
            rows = []
            loads = []
            for lib, g in per_lib.items():
                base = g["cases"].get("baseline")
                base_rate = base["items_per_s"] if base else None
                for key, (wlib, label, judged) in CASES.items():
                    c = g["cases"].get(key)
                    if c is None or (wlib is not None and wlib != lib):
                        continue
                    ratio = c["items_per_s"] / base_rate if base_rate else None
                    c["ratio"] = ratio
                    ok = ""
                    if judged and ratio is not None:
                        ok = "(quick)" if args.quick else ("yes" if ratio >= TARGET else "NO")
                        targets.setdefault(dname, {}).setdefault(B, {})[key] = {
                            "items_per_s": c["items_per_s"], "ratio": ratio,
                            "met": None if args.quick else ratio >= TARGET}
                    fb = g["first_batch_ms"].get(key)
                    us_batch = c["median_us_per_call"] * int(B) / c["items_per_call"]
                    rows.append([f"[{lib}] {label}", C.fmt_num(c["items_per_s"]),
                                 C.fmt_num(us_batch, 1), C.fmt_ratio(ratio), ok,
                                 "" if fb is None else f"{fb:.1f}"])
                loads.append(f"{lib} worker {g.get('loadavg_before')} / "
                             f"{g.get('loadavg_after')}")
            title = (f"{dname} ({spec_text(dname)}; {res['item_bytes']} bytes/item; "
                     f"table {res.get('current_size')} items), B = {B}")
            md += [f"#### {title}", "", C.render_table(headers, rows, markdown=True), "",
                   "Load average before/after: " + "; ".join(loads), ""]
            text += [title, C.render_table(headers, rows), ""]
    for dname, per_b in targets.items():
        for B, t in per_b.items():
            met = [k for k, v in t.items() if v["met"]]
            ratios = ", ".join(f"{k} {C.fmt_ratio(v['ratio'])}" for k, v in t.items())
            verdict = ("not judged in quick mode" if args.quick else
                       f"{len(met)}/{len(t)} meet ≥ {TARGET:g}"
                       + (f" ({', '.join(met)})" if met else ""))
            lines.append(f"{dname}, B={B}: {verdict}; ratios {ratios}")
    return md, text, targets, lines

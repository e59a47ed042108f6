"""Draws the performance page's figures from the JSON results, and writes its tables.

    python benchmarks/plots.py            # the page's table blocks, and the SVGs in docs/img/perf/
    python benchmarks/plots.py --tables   # the table blocks only (no matplotlib needed)
    python benchmarks/plots.py --check    # change nothing; exit 1 if anything is stale

Each figure names the run it shows (machine, date, commit, load) under its title, read
from the file ``_perf_sources.FIGURES`` assigns it. The SVGs are deterministic: the same
JSON gives the same bytes (fixed ids, no date in the metadata, text kept as text).
"""

import argparse
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _perf_sources as sources  # noqa: E402
import _perf_tables as tables  # noqa: E402
from _perf_format import writer_cases  # noqa: E402

COLORS = {"shmreplay": "#1f6fb4", "cpprb": "#d9730d", "reverb": "#3a9a3a", "numpy": "#777777"}


def _pyplot():
    import matplotlib
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({
        "svg.hashsalt": "shmreplay-perf",   # stable ids
        "svg.fonttype": "none",             # text stays text: small, diff-able
        "font.size": 9,
        "axes.grid": True,
        "grid.alpha": 0.3,
    })
    return plt


def _title(fig, text, name, data):
    p = sources.provenance(data)
    fig.suptitle(text, fontsize=11, y=0.985)
    fig.text(0.5, 0.915, f"{name}: {p['machine']}, {p['date']}, commit {p['commit']}, "
             f"load {p['load']}", ha="center", fontsize=7.5, color="#444444")
    fig.subplots_adjust(top=0.78, bottom=0.14, wspace=0.3)


def _plain(x):
    """Tick labels as the page writes numbers: 3, 30, 300, 3k, 1.5M."""
    if x >= 1e6:
        return f"{x / 1e6:g}M"
    if x >= 1e3:
        return f"{x / 1e3:g}k"
    return f"{x:g}"


def _log_axis(axis, subs=(1.0, 2.0, 5.0)):
    from matplotlib import ticker
    axis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    axis.set_major_formatter(ticker.FuncFormatter(lambda x, _: _plain(x)))
    axis.set_minor_formatter(ticker.NullFormatter())


def _pick(rows, **want):
    found = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    return found[0] if found else None


def _series(rows, key, op, sampler, xs):
    """``[(n, median µs)]`` of one library's (``key``'s) case across ``xs``."""
    pts = [(n, _pick(rows, op=op, sampler=sampler, n=n)) for n in xs]
    return [(n, r[key]["median_us"]) for n, r in pts
            if r and isinstance(r.get(key), dict) and r[key].get("median_us")]


def fig_per_call(plt, name, data):
    """Median µs per call against steps added and against batch size, log-log; Reverb on
    the same axes when the run measured it (its ``reverb`` section)."""
    rows = data.get("results") or []
    adds, batches = data["config"]["add_steps"], data["config"]["batch_sizes"]
    fig, (ax_add, ax_sample) = plt.subplots(1, 2, figsize=(8.4, 4.6))
    series = []  # (axis, key, op, sampler, style, label)
    for lib in ("shmreplay", "cpprb", "reverb"):
        for sampler, style in (("uniform", "-o"), ("prioritized", "--s")):
            series.append((ax_add, lib, "add", sampler, style, f"{lib}, {sampler}"))
            series.append((ax_sample, lib, "sample", sampler, style, None))
        series.append((ax_sample, lib, "sample+update", "prioritized", ":^",
                       f"{lib}, prioritized sample+update"))
    for sampler, style in (("uniform", "-.x"), ("prioritized", "-.+")):
        series.append((ax_add, "reverb[insert]", "add", sampler, style,
                       f"reverb Client.insert per step, {sampler}"))
    for ax, key, op, sampler, style, label in series:
        pts = _series(rows, key, op, sampler, adds if op == "add" else batches)
        if pts:
            ax.plot(*zip(*pts), style, color=COLORS[key.split("[")[0]], label=label,
                    markersize=4, linewidth=1.2)
    for ax, xlabel, xs in ((ax_add, "steps added per call", adds),
                           (ax_sample, "batch size", batches)):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("µs per call (median)")
        low, high = ax.get_ylim()
        _log_axis(ax.yaxis, (1.0, 2.0, 5.0) if high / low < 1e3 else (1.0, 3.0))
        ax.set_xticks(xs)
        ax.set_xticklabels([str(n) for n in xs])
    ax_add.set_title("add (insert / insert_batch; Reverb: writer)")
    ax_sample.set_title("sample (+ update priorities)")
    handles, labels = [], []
    for ax in (ax_add, ax_sample):
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, fontsize=6.5, loc="lower center", ncol=3, frameon=False)
    reverb = data.get("reverb") or {}
    if reverb.get("measured"):
        v = reverb.get("versions") or {}
        what = (f"shmreplay, cpprb and Reverb {v.get('dm-reverb', '?')} "
                "(Reverb in its own venv, same run)")
    else:
        what = "shmreplay and cpprb (Reverb: not in this JSON)"
    _title(fig, f"Per call, one process: {what}", name, data)
    fig.subplots_adjust(top=0.82, bottom=0.31)
    return fig


def fig_multiprocess(plt, name, data):
    """Inserts/s per actor and learner items/s against the number of actors."""
    rows = [r for r in data.get("results") or [] if r.get("learner")]
    with_actors = sorted({r["actors"] for r in rows if r["actors"]})
    fig, (ax_ins, ax_learn) = plt.subplots(1, 2, figsize=(8.4, 3.6))
    for lib in ("shmreplay", "cpprb"):
        for kind, style in (("small", "-o"), ("frames", "--s")):
            mine = sorted((r for r in rows if r["lib"] == lib and r["kind"] == kind),
                          key=lambda r: r["actors"])
            ins = [(r["actors"], r["insert_per_actor_mean"]) for r in mine
                   if r.get("insert_per_actor_mean")]
            learn = [(r["actors"], r["learner_items_s"]) for r in mine
                     if r.get("learner_items_s")]
            label = f"{lib}, {kind}"
            if ins:
                ax_ins.plot(*zip(*ins), style, color=COLORS[lib], label=label)
            if learn:
                ax_learn.plot(*zip(*learn), style, color=COLORS[lib], label=label)
    ax_ins.set_xticks(with_actors)
    ax_ins.set_xlim(min(with_actors) - 0.3, max(with_actors) + 0.3)
    ax_ins.set_ylabel("inserts/s per actor")
    ax_ins.set_title("actors, one insert per call, learner running")
    ax_learn.set_ylabel("learner items/s (sample 256 + update)")
    ax_learn.set_title("the learner, with that many actors")
    actors = sorted({r["actors"] for r in rows})
    for ax in (ax_ins, ax_learn):
        ax.set_yscale("log")
        ax.set_xlabel("actor processes")
    ax_learn.set_xticks(actors)
    for ax in (ax_ins, ax_learn):
        _log_axis(ax.yaxis)
    ax_learn.legend(fontsize=7)
    _title(fig, "Actors and a learner in separate processes", name, data)
    return fig


def fig_capacity(plt, name, data):
    """The learner call's µs against the table's capacity, log-log."""
    rows = data.get("capacity") or []
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    styles = ["-o", "--s", ":^"]
    for i, variant in enumerate(dict.fromkeys(r["variant"] for r in rows)):
        pts = sorted((r["capacity"], r["us"]) for r in rows if r["variant"] == variant)
        lib = next(r["lib"] for r in rows if r["variant"] == variant)
        ax.plot(*zip(*pts), styles[i % 3], color=COLORS.get(lib, "k"),
                label=f"{lib}: {variant}")
    caps = sorted({r["capacity"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(caps)
    ax.set_xticklabels([f"$2^{{{c.bit_length() - 1}}}$" for c in caps])
    ax.set_xlabel("table capacity (items)")
    ax.set_ylabel("µs per learner call (median)")
    _log_axis(ax.yaxis)
    ax.legend(fontsize=6.5)
    _title(fig, "Learner call (sample 256 + weights + update 256) against capacity",
           name, data)
    return fig


WRITER_CASES = ["raw", "shm_floor", "shm_insert", "shm_legacy1", "shm_legacy3",
                "shm_traj3", "cpprb_add", "cpprb_nstep", "reverb_legacy1",
                "reverb_legacy3", "reverb_traj3", "reverb_insert"]


def fig_writers(plt, name, data):
    """µs per environment step for each writer pattern, small steps and frames."""
    labels = data.get("cases") or {}
    kinds = [k for k in ("small", "frames") if k in (data.get("results") or {})]
    per_kind = {k: writer_cases(data, k) for k in kinds}
    fig, axes = plt.subplots(1, len(kinds), figsize=(8.4, 4.2), sharey=True)
    axes = axes if len(kinds) > 1 else [axes]
    shown = [c for c in WRITER_CASES
             if any(c in per_kind[k] for k in kinds)]
    for ax, kind in zip(axes, kinds):
        cases = per_kind[kind]
        ys = list(range(len(shown)))
        vals = [cases.get(c, {}).get("median_us") or 0 for c in shown]
        ax.barh(ys, vals, color=[COLORS.get(labels.get(c, {}).get("lib"), "k")
                                 for c in shown])
        for y, v in zip(ys, vals):
            if v:
                ax.text(v * 1.05, y, f"{v:.3g}", va="center", fontsize=6.5)
        ax.set_xscale("log")
        ax.set_xlabel("µs per step (median)")
        _log_axis(ax.xaxis)
        ax.set_title(f"{kind} steps")
        ax.set_yticks(ys)
        ax.set_yticklabels([labels.get(c, {}).get("label", c) for c in shown], fontsize=6.5)
        ax.invert_yaxis()
    reverb = (data.get("reverb") or {}).get("datasets")
    _title(fig, "Writers: cost of one environment step (append + create_item)"
           + ("" if reverb else " (Reverb: not in this run)"), name, data)
    fig.subplots_adjust(left=0.36, wspace=0.1)
    return fig


DRAW = {"per-call": fig_per_call, "multiprocess": fig_multiprocess,
        "capacity": fig_capacity, "writers": fig_writers}


def render(name):
    """The SVG text of one figure."""
    plt = _pyplot()
    source = sources.FIGURES[name]
    fig = DRAW[name](plt, source, sources.load(source))
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": "benchmarks/plots.py"})
    plt.close(fig)
    return out.getvalue()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", action="store_true",
                        help="only the <!-- table: --> blocks of docs/performance.md")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a table block (or an SVG) is stale")
    args = parser.parse_args(argv)
    stale = []
    page = open(sources.PAGE, encoding="utf-8").read()
    new_page = tables.fill(page)
    if new_page != page:
        if not args.check:
            with open(sources.PAGE, "w", encoding="utf-8") as f:
                f.write(new_page)
            print(f"wrote the table blocks of {sources.PAGE}")
        else:
            stale.append(sources.PAGE)
    if not args.tables:
        os.makedirs(sources.IMG_DIR, exist_ok=True)
        for name in sources.FIGURES:
            path = os.path.join(sources.IMG_DIR, f"{name}.svg")
            svg = render(name)
            old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
            if svg == old:
                continue
            if args.check:
                stale.append(path)
            else:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(svg)
                print(f"wrote {path}")
    for path in stale:
        print(f"stale: {path} (run python benchmarks/plots.py"
              f"{' --tables' if path == sources.PAGE else ''})")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())

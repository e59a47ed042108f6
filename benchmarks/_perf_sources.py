"""Which result file each figure and table of the performance page comes from, and how
to read a result file's provenance (machine, date, commit, load).

Not a public module: ``plots.py`` and ``tests/test_performance_page.py`` import it.
Re-pointing a figure at a newer run is one line in ``FIGURES`` below; re-pointing a
table is its ``<!-- table: NAME FILE -->`` line on the page (then ``plots.py --tables``).
"""

import datetime
import json
import os

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")
PAGE = os.path.join(REPO_ROOT, "docs", "performance.md")
IMG_DIR = os.path.join(REPO_ROOT, "docs", "img", "perf")

# Figure name (the SVG's file name) -> the results file it draws.
FIGURES = {
    "per-call": "vs_cpprb-evening.json",
    "multiprocess": "multiprocess.json",
    "capacity": "large-evening.json",
    "writers": "writers-2026-11-27.json",
}


class ResultsError(Exception):
    """A results file is missing, unreadable, or lacks a field a figure or table needs."""


def load(name):
    """The parsed JSON of ``benchmarks/results/<name>``."""
    path = os.path.join(RESULTS_DIR, name)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ResultsError(f"no results file {name!r} in {RESULTS_DIR}") from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"{name}: not valid JSON ({e})") from None


def provenance(data):
    """``{'machine', 'date', 'commit', 'load'}`` of a results file, as strings.

    The scripts record these in ``machine`` (``date``, ``git_commit``,
    ``loadavg_at_start``, ``cpu``, ``cores``); a few record ``date``/``commit`` at the
    top level instead. A field the file lacks reads ``"?"``.
    """
    machine = data.get("machine")
    machine = machine if isinstance(machine, dict) else {}
    date = machine.get("date") or data.get("date") or "?"
    commit = machine.get("git_commit") or data.get("commit") or "?"
    load = machine.get("loadavg_at_start") or data.get("load")
    if isinstance(load, (list, tuple)):
        load = load[0] if load else None
    cpu = machine.get("cpu")
    cores = machine.get("cores")
    if cpu and cores:
        where = f"{cpu}, {cores} cores"
    else:
        where = str(data.get("machine") or "?") if not machine else (cpu or "?")
    return {"machine": where, "date": _utc(date), "commit": str(commit),
            "load": "?" if load is None else f"{float(load):.2f}"}


def _utc(date):
    try:
        when = datetime.datetime.fromisoformat(str(date))
    except ValueError:
        return str(date)
    if when.tzinfo is not None:
        when = when.astimezone(datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def sub_runs(data):
    """``[(label, run)]`` of a file that holds several runs (an A/B: ``runs`` or
    ``before``/``after``, each with its own ``machine``); empty for a single run."""
    if isinstance(data.get("machine"), dict) or data.get("date"):
        return []
    runs = data.get("runs") if isinstance(data.get("runs"), dict) else \
        {k: data[k] for k in ("before", "after") if isinstance(data.get(k), dict)}
    return [(k, v) for k, v in runs.items() if isinstance(v, dict) and "machine" in v]


def provenance_line(name, data):
    """One line naming a result file's run(s): file, machine, date, commit, load."""
    subs = sub_runs(data)
    if subs:
        first = provenance(subs[0][1])
        each = ", ".join(f"{label} `{provenance(run)['commit']}` at "
                         f"{provenance(run)['date'][11:16]} (load {provenance(run)['load']})"
                         for label, run in subs)
        return f"`benchmarks/results/{name}`: {first['machine']}, {first['date'][:10]}: {each}"
    p = provenance(data)
    return (f"`benchmarks/results/{name}`: {p['machine']}, {p['date']}, "
            f"commit `{p['commit']}`, load average {p['load']} at the start")

"""Shared helpers of the benchmark scripts: machine info, timing, tables, result files.

Not a public module; the scripts import it from their own directory.
"""

import datetime
import gc
import importlib
import importlib.metadata
import itertools
import json
import traceback
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")

# Benchmark the working copy, not whatever may be installed elsewhere; or, for an A/B
# of two checkouts with the same scripts, the one $SHMREPLAY_BENCH_CODE names.
CODE_ROOT = os.path.abspath(os.environ.get("SHMREPLAY_BENCH_CODE") or REPO_ROOT)
if CODE_ROOT not in sys.path:
    sys.path.insert(0, CODE_ROOT)


# --------------------------------------------------------------------------- imports

def load_shmreplay():
    """Returns ``(module, None)`` when shmreplay's client API is usable, else ``(None, why)``.

    Usable means: ``Server``, ``Table``, ``Client.sample_batch`` exist. The scripts then run
    the cpprb half alone and print ``n/a`` for shmreplay.
    """
    try:
        mod = importlib.import_module("shmreplay")
    except Exception as exc:  # noqa: BLE001 - any import failure means "not ready"
        return None, f"import shmreplay failed: {type(exc).__name__}: {exc}"
    missing = [a for a in ("Server", "Table", "Client") if not hasattr(mod, a)]
    if not missing and not hasattr(mod.Client, "sample_batch"):
        missing.append("Client.sample_batch")
    if missing:
        return None, "shmreplay lacks " + ", ".join(missing)
    return mod, None


def load_cpprb():
    try:
        return importlib.import_module("cpprb"), None
    except Exception as exc:  # noqa: BLE001
        return None, f"import cpprb failed: {type(exc).__name__}: {exc}"


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        mod = sys.modules.get(dist)
        return getattr(mod, "__version__", None) if mod else None


# --------------------------------------------------------------------------- machine

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git_commit():
    try:
        out = subprocess.run(["git", "-C", CODE_ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def dirty_files():
    """Uncommitted changes under shmreplay/ (the working copy is what is measured)."""
    try:
        out = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--",
                              "shmreplay"], capture_output=True, text=True, timeout=5)
        return [ln[3:] for ln in out.stdout.splitlines() if ln.strip()]
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info():
    """The facts a reader needs to compare numbers across machines."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    versions = {"python": platform.python_version()}
    for dist in ("numpy", "numba", "cpprb", "posix_ipc", "shmreplay"):
        versions[dist] = _version(dist)
    if versions["shmreplay"] is None and "shmreplay" in sys.modules:
        versions["shmreplay"] = getattr(sys.modules["shmreplay"], "__version__", "working copy")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "mem_gib": _mem_total_gib(),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "loadavg_at_start": load_average(),
        "versions": versions,
    }


def machine_lines(info):
    v = info["versions"]
    vs = ", ".join(f"{k} {v[k]}" for k in v if v[k] is not None)
    return [
        f"date: {info['date']}",
        f"machine: {info['cpu']}, {info['cores']} cores ({info['cores_usable']} usable), "
        f"{info['mem_gib']} GiB, {info['platform']}",
        f"versions: {vs}",
        f"commit: {info['git_commit'] or 'uncommitted working copy'}; "
        f"load average at start {info.get('loadavg_at_start')}",
    ]


# --------------------------------------------------------------------------- timing

def _warm_and_calibrate(fn, min_time, warmup, max_number):
    perf = time.perf_counter
    t_end = perf() + warmup
    calls = 0
    while True:
        fn()
        calls += 1
        if perf() >= t_end and calls >= 3:
            break
    number = 1
    while True:
        t0 = perf()
        for _ in itertools.repeat(None, number):
            fn()
        dt = perf() - t0
        if dt >= min_time or number >= max_number:
            return number
        number = min(max_number, max(number * 2, int(number * min_time / max(dt, 1e-9) * 1.2)))


def time_interleaved(fns, *, repeat=7, min_time=0.02, warmup=0.05, max_number=1_000_000,
                     skips=None):
    """Timeit-style timing of several zero-argument callables: seconds per call.

    Each callable is warmed up for ``warmup`` seconds and gets its own loop count
    ``number`` so that one repeat takes ``>= min_time``. Then ``repeat`` rounds run with the
    garbage collector off; each round times one repeat of every callable, alternating
    the order, so background load and drift hit all of them alike.

    Args:
      fns: ``{label: callable}``.
      skips: ``{label: count}``: untimed calls of that callable just before each of its
        timed repeats (a prefetching pipeline's head start is not timed).

    Returns:
      ``{label: {"median", "best", "number", "repeat"}}`` (seconds per call).
    """
    perf = time.perf_counter
    numbers = {k: _warm_and_calibrate(f, min_time, warmup, max_number) for k, f in fns.items()}
    per_call = {k: [] for k in fns}
    order = list(fns)
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for r in range(repeat):
            for k in (order if r % 2 == 0 else order[::-1]):
                fn, number = fns[k], numbers[k]
                for _ in range(skips.get(k, 0) if skips else 0):
                    fn()
                t0 = perf()
                for _ in itertools.repeat(None, number):
                    fn()
                per_call[k].append((perf() - t0) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {k: {"median": statistics.median(v), "best": min(v), "number": numbers[k],
                "repeat": repeat} for k, v in per_call.items()}


def time_per_call(fn, **kwargs):
    """``time_interleaved`` for one callable."""
    return time_interleaved({"fn": fn}, **kwargs)["fn"]


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# --------------------------------------------------------------------------- output

def fmt_num(x, digits=1):
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.{digits}f}"


def fmt_ratio(x):
    return "n/a" if x is None else f"{x:.2f}x"


def render_table(headers, rows, markdown=False):
    """Plain-text (aligned) or markdown table from string cells."""
    rows = [[str(c) for c in r] for r in rows]
    if markdown:
        out = ["| " + " | ".join(headers) + " |",
               "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def write_results(stem, payload, markdown):
    """Writes ``results/<stem>.json`` and ``results/<stem>.md`` (via ``.tmp`` + rename)."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    paths = []
    for ext, text in (("json", json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n"),
                      ("md", markdown.rstrip() + "\n")):
        path = os.path.join(RESULTS_DIR, f"{stem}.{ext}")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def record_error(errors, lib, where, exc):
    """Prints the traceback being handled and records it in ``errors`` as ``lib``'s at
    ``where``."""
    tb = traceback.format_exc()
    print(f"{lib} {where} failed:\n{tb}", flush=True)
    errors.append({"lib": lib, "where": where, "error": repr(exc), "traceback": tb})


def prepared_case(lib, where, make, errors):
    """``make()``'s function, called once here so that an error names its case; None
    (the error recorded in ``errors`` and printed) if making or calling it failed."""
    try:
        fn = make()
        fn()  # surface errors with the case named (and trace tf.functions)
        return fn
    except Exception as exc:  # noqa: BLE001
        record_error(errors, lib, where, exc)
        return None


def markdown_report(title, info, notes, headers, rows, errors=()):
    """A results page: the header, the table, then the errors (``lib``, ``where``,
    ``error`` each) if any."""
    md = markdown_header(title, info, notes)
    md += "\n" + render_table(headers, rows, markdown=True) + "\n"
    if errors:
        md += "\nErrors:\n\n" + "\n".join(f"- {e['lib']} {e['where']}: `{e['error']}`"
                                          for e in errors) + "\n"
    return md


def markdown_header(title, info, notes=()):
    lines = [f"### {title}", ""]
    lines += [f"- {ln}" for ln in machine_lines(info)]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def reap(procs, grace=10.0):
    """Joins worker processes; terminates, then kills, the ones still alive after ``grace`` s."""
    for p in procs:
        p.join(timeout=grace)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def leftover_segments(marker="shmreplay.bench-"):
    """Segments (``shmreplay.bench-*``) and semaphores (``sem.shmreplay.bench-*``) in
    /dev/shm that a benchmark left behind (should be empty)."""
    try:
        return sorted(n for n in os.listdir("/dev/shm")
                      if n.startswith(marker) or n.startswith("sem." + marker))
    except OSError:
        return []


def check_clean(marker="shmreplay.bench-"):
    """Warns about (and returns) the segments named ``marker*`` left in /dev/shm."""
    left = leftover_segments(marker)
    if left:
        print(f"WARNING: left in /dev/shm: {left}", file=sys.stderr)
    return left


def run_json_worker(cmd, errors, who, timeout=1800, own_packages=True):
    """Runs a worker command (often a peer's Python in its own virtualenv) and returns
    the JSON of the last stdout line that starts with ``{``, with its ``errors`` added to
    ``errors``; or None, with the failure (and stderr's tail) recorded in ``errors`` as
    ``who``'s. ``own_packages=False`` drops ``PYTHONPATH``, so that the other virtualenv
    does not import this one's packages."""
    print(f"{who}: running", " ".join(cmd), flush=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if not own_packages:
        env.pop("PYTHONPATH", None)
    with tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                  timeout=timeout, env=env)
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append({"lib": who, "where": "worker", "error": repr(exc)})
            print(f"{who} worker failed:", exc)
            return None
        err.seek(0)
        tail = err.read()[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        errors.append({"lib": who, "where": "worker",
                       "error": f"exit {proc.returncode}", "stderr_tail": tail})
        print(f"{who} worker exited {proc.returncode}:\n{tail}")
        return None
    out = json.loads(lines[-1])
    errors.extend(out.get("errors", []))
    return out

"""Start-up costs, cold and warm: what a user waits for before the first insert.

numba compiles shmreplay's kernels on first use and caches them on disk. "Cold" runs
point ``NUMBA_CACHE_DIR`` at a fresh empty directory, as on a fresh clone or after an
upgrade; "warm" runs reuse a cache that a previous run filled. Every case runs in new
processes (``subprocess``, and ``multiprocessing`` spawn for actors), as a user's do.

Cases:
  import                 ``python -c "import shmreplay"`` (against ``python -c pass``)
  first Server, cold     creating a Server on an empty cache: it compiles every kernel
  quickstart             docs/index.md's first example, as a script, cold and warm
  owner + 3 workers      an owner creates a buffer and spawns 2 actors and a learner;
                         time until all three have done their first insert / sample
  spawned actor, warm    ``Process.start()`` to the actor's first insert returning
  numba floor            a process that loads one trivial kernel from numba's cache: what
                         any numba library pays before its first call
  CLI                    ``shmreplay --help / ls / info / verify / top / gc`` against one
                         live buffer

Usage: ``python benchmarks/bench_startup.py [--quick] [--cold-runs N] [--warm-runs N]``.
Writes ``results/startup.json`` and ``.md`` (``startup-quick.*`` with ``--quick``).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import _common

ROOT = _common.REPO_ROOT
NAME = f"bench-startup-{os.getpid()}"


def _env(cache):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=ROOT)
    env.pop("SHMREPLAY_TEST_RUN", None)
    return env


def _run(args, cache, timeout=900):
    """Runs a command; returns (wall seconds, stdout). Fails loudly on a non-zero exit."""
    start = time.perf_counter()
    proc = subprocess.run(args, env=_env(cache), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return wall, proc.stdout


def _python(code, cache, timeout=900):
    """Runs ``code`` as a script file (spawned children import their target from it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="bench_startup_",
                                     delete=False) as script:
        script.write(code)
    try:
        return _run([sys.executable, script.name], cache, timeout)
    finally:
        os.unlink(script.name)


def _quickstart_code(name):
    """docs/index.md's first example, with a buffer name of this run."""
    with open(os.path.join(ROOT, "docs", "index.md")) as f:
        code = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
    return code.replace('"quickstart"', repr(name))


FIRST_SERVER = """
import time, json
t0 = time.perf_counter()
import shmreplay
t1 = time.perf_counter()
server = shmreplay.Server([shmreplay.Table.queue("q", 10)], name={name!r})
t2 = time.perf_counter()
server.stop()
print(json.dumps({{"import": t1 - t0, "server": t2 - t1}}))
"""

OWNER_AND_WORKERS = """
import json, multiprocessing, time
import numpy as np

def actor(name, q):
    import shmreplay
    with shmreplay.Client(name) as client:
        client.insert({{"obs": np.zeros(4, np.float32), "reward": np.float32(1)}},
                      priorities={{"replay": 1.0}}, timeout=600)
    q.put(("actor", time.time()))

def learner(name, q):
    import shmreplay
    with shmreplay.Client(name) as client:
        client.sample_batch("replay", 2, timeout=600)
    q.put(("learner", time.time()))

if __name__ == "__main__":
    t0 = time.time()
    import shmreplay
    from shmreplay import rate_limiters, selectors
    server = shmreplay.Server([shmreplay.Table(
        "replay", selectors.Prioritized(0.6), selectors.Fifo(), 1000,
        rate_limiters.MinSize(2))], name={name!r})
    t1 = time.time()
    spawn = multiprocessing.get_context("spawn")
    q = spawn.Queue()
    procs = [spawn.Process(target=actor, args=(server.name, q)) for _ in range(2)]
    procs.append(spawn.Process(target=learner, args=(server.name, q)))
    for p in procs:
        p.start()
    done = [q.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(60)
    server.stop()
    print(json.dumps({{"server": t1 - t0, "all_first_calls": max(t for _, t in done) - t0}}))
"""

SPAWNED_ACTOR = """
import json, multiprocessing, time
import numpy as np

def actor(name, q):
    t_enter = time.time()
    import shmreplay
    t_import = time.time()
    client = shmreplay.Client(name)
    t_attach = time.time()
    client.insert({{"obs": np.zeros(4, np.float32), "reward": np.float32(1)}},
                  priorities={{"replay": 1.0}}, timeout=60)
    t_insert = time.time()
    client.close()
    q.put((t_enter, t_import, t_attach, t_insert))

if __name__ == "__main__":
    import shmreplay
    from shmreplay import rate_limiters, selectors
    server = shmreplay.Server([shmreplay.Table(
        "replay", selectors.Prioritized(0.6), selectors.Fifo(), 1000,
        rate_limiters.MinSize(1))], name={name!r})
    spawn = multiprocessing.get_context("spawn")
    rows = []
    for _ in range({runs}):
        q = spawn.Queue()
        p = spawn.Process(target=actor, args=(server.name, q))
        t_start = time.time()
        p.start()
        t_enter, t_import, t_attach, t_insert = q.get(timeout=120)
        p.join(60)
        rows.append({{"start_to_insert": t_insert - t_start, "spawn": t_enter - t_start,
                      "import": t_import - t_enter, "attach": t_attach - t_import,
                      "first_insert": t_insert - t_attach}})
    server.stop()
    print(json.dumps(rows))
"""

# The floor under any numba library: a fresh process that imports numpy and numba and
# calls one trivial kernel loaded from numba's cache (its first call initializes numba's
# code generator, which imports scipy.linalg when scipy is installed, to find a BLAS).
NUMBA_FLOOR = """
import json, time
t0 = time.perf_counter()
import numba, numpy as np
t1 = time.perf_counter()

@numba.njit(cache=True, nogil=True)
def one(x):
    return x + 1

one(np.int64(1))
t2 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "first_call": t2 - t1}}))
"""

HOLD_BUFFER = """
import sys, time
import numpy as np
import shmreplay
from shmreplay import rate_limiters, selectors
server = shmreplay.Server([shmreplay.Table(
    "replay", selectors.Prioritized(0.6), selectors.Fifo(), 10_000,
    rate_limiters.MinSize(1))], name={name!r})
client = server.localhost_client()
client.insert_batch({{"obs": np.zeros((100, 4), np.float32)}}, priorities={{"replay": 1.0}})
print("ready", flush=True)
sys.stdin.read()
server.stop()
"""


def _numba_floor(cache, runs):
    """Wall time of a process that only loads one cached numba kernel (median)."""
    directory = tempfile.mkdtemp(prefix="bench-startup-floor-")
    script = os.path.join(directory, "floor.py")  # cache=True needs a file
    with open(script, "w") as f:
        f.write(NUMBA_FLOOR.format())
    try:
        _run([sys.executable, script], cache)
        rows = []
        for _ in range(runs):
            wall, out = _run([sys.executable, script], cache)
            rows.append(dict(json.loads(out.strip().splitlines()[-1]), wall=wall))
        return {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _shmreplay_command():
    script = os.path.join(os.path.dirname(sys.executable), "shmreplay")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "shmreplay.cli"]


def bench_cli(cache, runs):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_BUFFER.format(name=NAME + "-cli")],
                              env=_env(cache), cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        cli = _shmreplay_command()
        name = NAME + "-cli"
        commands = {"--help": ["--help"], "ls": ["ls"], "info": ["info", name],
                    "verify": ["verify", name], "gc": ["gc"],
                    "top (1 frame, 0.1 s interval)": ["top", name, "--iterations", "1",
                                                      "--interval", "0.1"]}
        results = {}
        for label, args in commands.items():
            _run(cli + args, cache)  # first run: loads what the command needs
            walls = [_run(cli + args, cache)[0] for _ in range(runs)]
            results[label] = {"median": statistics.median(walls), "best": min(walls),
                              "runs": runs}
        return results
    finally:
        holder.stdin.close()
        holder.wait(60)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cold-runs", type=int, default=None)
    parser.add_argument("--warm-runs", type=int, default=None)
    args = parser.parse_args(argv)
    cold_runs = args.cold_runs or (1 if args.quick else 2)
    warm_runs = args.warm_runs or (3 if args.quick else 7)
    info = _common.machine_info()
    print("\n".join(_common.machine_lines(info)), flush=True)
    results, errors = {}, []
    warm_cache = tempfile.mkdtemp(prefix="bench-startup-warm-")
    try:
        def cold(label, fn):
            values = []
            for _ in range(cold_runs):
                cache = tempfile.mkdtemp(prefix="bench-startup-cold-")
                try:
                    values.append(fn(cache))
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
            results[label] = values
            print(f"{label}: {values}", flush=True)

        cold("first Server, cold", lambda cache: json.loads(
            _python(FIRST_SERVER.format(name=NAME + "-first"), cache)[1]))
        cold("quickstart, cold", lambda cache: {"wall": _python(
            _quickstart_code(NAME + "-quick"), cache)[0]})
        cold("owner + 3 workers, cold", lambda cache: json.loads(_python(
            OWNER_AND_WORKERS.format(name=NAME + "-workers"), cache)[1]))
        # Fill the warm cache, then the warm cases.
        _python(FIRST_SERVER.format(name=NAME + "-fill"), warm_cache)
        floor = _numba_floor(warm_cache, warm_runs)
        results["numba floor, warm"] = floor
        walls = [_python("import shmreplay", warm_cache)[0] for _ in range(warm_runs)]
        bare = [_python("pass", warm_cache)[0] for _ in range(warm_runs)]
        results["import shmreplay"] = {"median": statistics.median(walls),
                                       "python -c pass": statistics.median(bare)}
        walls = [_python(_quickstart_code(NAME + "-quick"), warm_cache)[0]
                 for _ in range(warm_runs)]
        results["quickstart, warm"] = {"median": statistics.median(walls), "best": min(walls)}
        results["owner + 3 workers, warm"] = [json.loads(_python(
            OWNER_AND_WORKERS.format(name=NAME + "-workers"), warm_cache)[1])
            for _ in range(max(1, warm_runs // 2))]
        rows = json.loads(_python(SPAWNED_ACTOR.format(name=NAME + "-actor", runs=warm_runs),
                                  warm_cache)[1])
        results["spawned actor, warm"] = {
            key: statistics.median(r[key] for r in rows) for key in rows[0]}
        results["CLI, warm"] = bench_cli(warm_cache, warm_runs)
    except Exception as exc:  # noqa: BLE001 - recorded and reported, never worked around
        import traceback
        traceback.print_exc()
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(warm_cache, ignore_errors=True)
    markdown = _markdown(info, results)
    print(markdown)
    stem = "startup-quick" if args.quick else "startup"
    _common.write_results(stem, {"machine": info, "results": results, "errors": errors},
                          markdown)
    return 1 if errors else 0


def _markdown(info, results):
    lines = ["# Start-up, cold and warm numba cache", ""]
    lines += [f"- {line}" for line in _common.machine_lines(info)]
    lines += ["", "| case | seconds |", "|---|---:|"]

    def row(label, value):
        lines.append(f"| {label} | {value:.3f} |")

    for entry in results.get("first Server, cold", []):
        row("first Server on an empty cache (compiles every kernel)", entry["server"])
    for entry in results.get("quickstart, cold", []):
        row("quickstart script, cold cache", entry["wall"])
    if "quickstart, warm" in results:
        row("quickstart script, warm cache (median)", results["quickstart, warm"]["median"])
    for entry in results.get("owner + 3 workers, cold", []):
        row("owner + 2 actors + learner, cold: all first calls done", entry["all_first_calls"])
    for entry in results.get("owner + 3 workers, warm", []):
        row("owner + 2 actors + learner, warm: all first calls done", entry["all_first_calls"])
    if "numba floor, warm" in results:
        floor = results["numba floor, warm"]
        row("numba floor: python + numpy + numba + one cached kernel (median)", floor["wall"])
        row("numba floor: its first call (median)", floor["first_call"])
    if "import shmreplay" in results:
        row("python -c 'import shmreplay' (median)", results["import shmreplay"]["median"])
        row("python -c pass (median)", results["import shmreplay"]["python -c pass"])
    for key, value in results.get("spawned actor, warm", {}).items():
        row(f"spawned actor, warm: {key} (median)", value)
    for label, value in results.get("CLI, warm", {}).items():
        row(f"shmreplay {label} (median)", value["median"])
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""Item-exact comparison of Acme's adders and TF-Agents' observers on Reverb and on
shmreplay (issue 19, point 5).

    /work/reverb-venv/bin/python benchmarks/compat/item_exact.py --backend reverb
    /work/compat-venv/bin/python benchmarks/compat/item_exact.py --backend shmreplay
    python benchmarks/compat/item_exact.py --compare A.json B.json [--md OUT.md]

Each case (item_exact_cases.py) starts a server with the tables a learner makes, runs the
actor code in spawned processes (one per actor, two actors, deterministic fake
environments), then reads every item of every table and writes them to a JSON file:
keys dropped, each item as its structure and its leaves (dtype, shape, values), sorted
canonically. A TF-Agents case also reads batches through ``ReverbReplayBuffer.as_dataset``
(their shapes and dtypes; their values are random draws, so only whether each drawn
window is one of the stored items' windows is recorded). ``--compare`` prints, per case,
identical / differs (first difference) / failed (the error).

``--backend shmreplay`` puts benchmarks/compat/shim first on sys.path, so ``import
reverb`` is shmreplay, here and in the spawned actors (spawn copies sys.path).
"""

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SHIM = os.path.join(HERE, "shim")
STUBS = os.path.join(HERE, "stubs")  # launchpad, which Acme imports at start-up only
RESULTS = os.path.join(REPO, "benchmarks", "results")
ACTOR_TIMEOUT_S = 300
NUM_ACTORS = 2


def use_backend(backend):
    """Makes ``import reverb`` the chosen backend (before anything imports it)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    if backend == "shmreplay":
        sys.path.insert(0, SHIM)
    sys.path.append(STUBS)  # after site-packages: a real dm-launchpad wins
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # TF-Agents needs Keras 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# --- canonical items --------------------------------------------------------------------

def structure_of(data):
    """The nest's shape, independent of how a backend orders dict keys."""
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return {type(data).__name__: {f: structure_of(getattr(data, f)) for f in data._fields}}
    if isinstance(data, dict):
        return {"dict": {str(k): structure_of(v) for k, v in sorted(data.items())}}
    if isinstance(data, (list, tuple)):
        return {type(data).__name__: [structure_of(v) for v in data]}
    return "leaf"


def leaf_of(value):
    import numpy as np
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    return {"dtype": str(array.dtype), "shape": list(array.shape), "values": array.tolist()}


def canonical(sample):
    import tree
    return {"structure": structure_of(sample.data),
            "leaves": [leaf_of(leaf) for leaf in tree.flatten(sample.data)],
            "priority": float(sample.info.priority)}


def _sort(items):
    return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))


# --- one case ---------------------------------------------------------------------------

def _actor_main(case_name, address, actor_id, errors):
    """A spawned actor: connects by address and runs the case's actor code; reports
    its error (or None) and the Acme adder modules it ran."""
    try:
        import reverb
        import item_exact_cases
        case = item_exact_cases.CASES[case_name]()
        if case.uses_acme:  # the adders the parent uses, before connecting imports any
            item_exact_cases.acme_adders()
        client = reverb.Client(address)
        case.act(reverb, client, actor_id)
        errors.put((actor_id, None, item_exact_cases.adder_modules()))
    except BaseException:  # reported to the parent, which records the case as failed
        errors.put((actor_id, traceback.format_exc(), {}))


def _other_adders(actor_modules):
    """The actor's Acme adder modules that are not the parent's (name: both files)."""
    import item_exact_cases
    mine = item_exact_cases.adder_modules()
    return {name: f"actor {path}, parent {mine.get(name)}"
            for name, path in sorted(actor_modules.items()) if mine.get(name) != path}


def _read_table(client, table, size):
    """Every item of ``table``: one queue read, or Uniform draws until every key is seen."""
    seen = {}
    for _ in range(200):
        if len(seen) >= size:
            break
        for sample in client.sample(table, num_samples=max(1, min(64, size)),
                                    emit_timesteps=False):
            seen[int(sample.info.key)] = sample
    return [canonical(sample) for sample in seen.values()]


def _windows(items, leaf_index, length):
    """Every ``length``-step window of one leaf over the stored items (as tuples)."""
    found = set()
    for item in items:
        values = item["leaves"][leaf_index]["values"]
        for start in range(len(values) - length + 1):
            found.add(json.dumps(values[start:start + length]))
    return found


def _read_dataset(case, reverb, address, items):
    import numpy as np
    import tree
    batches = case.read_dataset(reverb, address)
    flat_spec = None
    out = []
    for batch in batches:
        leaves = tree.flatten(batch)
        flat_spec = [{"dtype": str(np.asarray(l).dtype), "shape": list(np.asarray(l).shape)}
                     for l in leaves]
        observation = np.asarray(batch.observation)  # [batch, num_steps, 2]
        stored = _windows(items, _observation_index(batch), observation.shape[1])
        valid = sum(json.dumps(row.tolist()) in stored for row in observation)
        out.append({"leaves": flat_spec, "windows_from_stored_items": valid,
                    "batch_size": int(observation.shape[0])})
    return out


def _observation_index(batch):
    import tree
    paths = [path for path, _ in tree.flatten_with_path(batch)]
    return paths.index(("observation",))


def run_case(name, reverb, work):
    import item_exact_cases
    case = item_exact_cases.CASES[name]()
    result = {"note": case.note}
    stage = "tables"
    server = None
    try:
        tables = case.tables(reverb)
        stage = "server"
        server = reverb.Server(tables, port=None)
        address = f"localhost:{server.port}"
        stage = "actors"
        context = multiprocessing.get_context("spawn")
        errors = context.Queue()
        actors = [context.Process(target=_actor_main, args=(name, address, i, errors))
                  for i in range(NUM_ACTORS)]
        for actor in actors:
            actor.start()
        reports, modules = {}, {}
        deadline = time.monotonic() + ACTOR_TIMEOUT_S
        while len(reports) < NUM_ACTORS and time.monotonic() < deadline:
            try:
                actor_id, error, modules[actor_id] = errors.get(
                    timeout=max(0.1, deadline - time.monotonic()))
                reports[actor_id] = error
            except Exception:  # queue.Empty: the deadline passed
                break
        for actor in actors:
            actor.join(timeout=30)
            if actor.is_alive():
                actor.kill()
        failed = {i: e for i, e in reports.items() if e}
        for i, actor_modules in sorted(modules.items()):
            other = _other_adders(actor_modules)
            if other and i not in failed:
                failed[i] = f"RuntimeError: the actor ran other adder code: {other}"
        if any(modules.values()):  # where the actors' adders came from (the same files)
            result["actor_adders"] = sorted({os.path.dirname(path) for m in modules.values()
                                             for path in m.values() if path})
        if len(reports) < NUM_ACTORS:
            failed.update({i: "actor did not report (hang or crash, exit code "
                              f"{actors[i].exitcode})" for i in range(NUM_ACTORS)
                           if i not in reports})
        if failed:
            result["actor_tracebacks"] = {str(i): e[-4000:] for i, e in failed.items()}
            raise RuntimeError("; ".join(f"actor {i}: {_final_line(e)}"
                                         for i, e in sorted(failed.items())))
        stage = "read"
        client = reverb.Client(address)
        info = client.server_info()
        result["tables"] = {}
        for table in sorted(info):
            size = int(info[table].current_size)
            items = _read_table(client, table, size)
            result["tables"][table] = {"current_size": size,
                                       "num_episodes": int(info[table].num_episodes),
                                       "items": _sort(items)}
        if case.read_dataset is not None:
            stage = "dataset"
            items = result["tables"][item_exact_cases.TABLE]["items"]
            result["dataset"] = _read_dataset(case, reverb, address, items)
        result["status"] = "ok"
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        result.update(status="failed", stage=stage,
                      error=f"{type(error).__name__}: {error}"[:3000],
                      traceback=traceback.format_exc()[-4000:])
    finally:
        if server is not None:
            try:
                server.stop()
            except Exception:
                pass
    return result


def _final_line(text):
    """The exception line of a traceback (its last non-empty line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def versions(backend):
    import importlib.metadata as md
    found = {}
    for dist in ("dm-reverb", "dm-acme", "tf-agents", "tensorflow", "numpy", "dm-tree",
                 "dm-env", "tensorflow-probability", "shmreplay"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if backend == "shmreplay":
        import shmreplay
        found["shmreplay_path"] = os.path.dirname(os.path.dirname(shmreplay.__file__))
    return found


def run(args):
    use_backend(args.backend)
    work = tempfile.mkdtemp(prefix="item-exact-")
    os.environ["ITEM_EXACT_WORK"] = work  # where Acme's current adders are written
    os.environ["ITEM_EXACT_ACME_ADDERS"] = args.acme_adders  # spawned actors inherit it
    os.environ["ITEM_EXACT_WITHOUT_SIGNATURES"] = "1" if args.without_signatures else "0"
    import reverb  # noqa: F401  (the backend, first on sys.path)
    import item_exact_cases
    names = args.case or list(item_exact_cases.CASES)
    out = {"backend": args.backend, "reverb_module": os.path.abspath(reverb.__file__),
           "versions": versions(args.backend), "acme_source_commit": _acme_commit(),
           "acme_adders": args.acme_adders, "without_signatures": args.without_signatures,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cases": {}}
    if os.path.exists(args.out) and args.case:
        with open(args.out) as f:
            out["cases"] = json.load(f).get("cases", {})
    for name in names:
        started = time.monotonic()
        out["cases"][name] = run_case(name, reverb, work)
        result = out["cases"][name]
        summary = (f"{sum(len(t['items']) for t in result['tables'].values())} items"
                   if result["status"] == "ok" else result["error"].splitlines()[0][:200])
        print(f"{name}: {result['status']} ({summary}) {time.monotonic() - started:.0f}s",
              flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}")


def _acme_commit():
    import subprocess
    import item_exact_cases
    done = subprocess.run(["git", "-C", item_exact_cases.ACME_SOURCE, "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip()


# --- comparing --------------------------------------------------------------------------

def first_difference(a, b, path="$"):
    """Where two JSON values first differ, or None."""
    if type(a) is not type(b):
        return f"{path}: {_short(a)} != {_short(b)}"
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}: only in {'B' if key not in a else 'A'}"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {_short(a)} != {_short(b)}"


def _short(value):
    text = json.dumps(value)
    return text if len(text) < 120 else text[:117] + "..."


def _comparable(result, with_structure=True):
    """What must match: the items, table counts and the dataset's shapes/validity (and
    the items' nest structure, unless a run was without signatures: a table without one
    returns its items' leaves as a flat list)."""
    tables = result.get("tables")
    if not with_structure:
        tables = {name: dict(table, items=_sort([dict(item, structure=None)
                                                 for item in table["items"]]))
                  for name, table in tables.items()}
    return {"tables": tables, "dataset": result.get("dataset")}


def compare(path_a, path_b):
    with open(path_a) as f:
        a = json.load(f)
    with open(path_b) as f:
        b = json.load(f)
    rows = []
    for name in list(a["cases"]) + [n for n in b["cases"] if n not in a["cases"]]:
        ra, rb = a["cases"].get(name), b["cases"].get(name)
        failed = [(side, r) for side, r in (("A", ra), ("B", rb))
                  if r is None or r["status"] != "ok"]
        if failed:
            verdict = "failed (" + ", ".join(sorted({failure_class(r) for _, r in failed})) + ")"
            detail = "; ".join(
                f"{side} ({dict(a=a, b=b)[side.lower()]['backend']}): " +
                ("not run" if r is None else f"[{r['stage']}] {_last_line(r['error'])}")
                for side, r in failed)
        else:
            structure = not (a.get("without_signatures") or b.get("without_signatures"))
            difference = first_difference(_comparable(ra, structure), _comparable(rb, structure))
            verdict = "identical" if difference is None else "differs"
            detail = difference or (f"{sum(len(t['items']) for t in ra['tables'].values())}"
                                    " items")
        rows.append((name, verdict, detail))
    return a, b, rows


# What a failure is, from its error: the classes the lead's issue 19 work addresses.
FAILURE_CLASSES = [
    ("None dims", r"unknown dimension|None dimension"),
    ("variable-length", r"the table's items have|variable-length|different length"),
]


def failure_class(result):
    import re
    if result is None:
        return "not run"
    if result.get("status") == "ok":
        return ""
    for name, pattern in FAILURE_CLASSES:
        if re.search(pattern, result.get("error", "")):
            return name
    return "other"


def _last_line(error):
    lines = [line for line in error.splitlines() if line.strip()]
    return (lines[0] if lines else "")[:400]


def report_md(a, b, rows):
    lines = ["# Acme and TF-Agents on Reverb and on shmreplay, item by item", "",
             f"A: `{a['backend']}`{_mode(a)} ({_versions_line(a)}), {a['date']}.  ",
             f"B: `{b['backend']}`{_mode(b)} ({_versions_line(b)}), {b['date']}.", "",
             "Repeat: see benchmarks/compat/README.md, *Item-exact*.", "",
             "| case | what | verdict | detail |", "| --- | --- | --- | --- |"]
    for name, verdict, detail in rows:
        note = (a["cases"].get(name) or b["cases"].get(name) or {}).get("note", "")
        lines.append(f"| {name} | {note.replace('|', '/')} | **{verdict}** | "
                     f"{detail.replace('|', '/')} |")
    counts = {}
    for _, verdict, _ in rows:
        counts[verdict.split(" ")[0]] = counts.get(verdict.split(" ")[0], 0) + 1
    lines += ["", "Totals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    return "\n".join(lines)


def _mode(run_result):
    return " **without signatures**" if run_result.get("without_signatures") else ""


def _versions_line(run_result):
    v = run_result["versions"]
    keys = ("dm-reverb", "shmreplay", "dm-acme", "tf-agents", "tensorflow", "numpy")
    adders = run_result.get("acme_adders", "head")
    source = (f"Acme's adders at {run_result['acme_source_commit'][:12]}" if adders == "head"
              else "acme 0.4.0's adders")
    return ", ".join([f"{k} {v[k]}" for k in keys if k in v] + [source])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["reverb", "shmreplay"])
    parser.add_argument("--case", action="append", default=[], help="repeatable")
    parser.add_argument("--out", help="default benchmarks/results/item-exact-BACKEND.json")
    parser.add_argument("--acme-adders", choices=["head", "package"], default="head",
                        help="Acme's current acme/adders/reverb (default; acme 0.4.0's "
                             "do not run on dm-reverb 0.14.0) or the installed package's")
    parser.add_argument("--without-signatures", action="store_true",
                        help="diagnostic: tables without signatures (items compared "
                             "leaf by leaf, structure ignored)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    parser.add_argument("--md", help="with --compare: also write this Markdown file")
    parser.add_argument("--append", metavar="HEADING",
                        help="with --md: append this comparison under HEADING")
    args = parser.parse_args()
    if args.compare:
        a, b, rows = compare(*args.compare)
        for name, verdict, detail in rows:
            print(f"{name}: {verdict}: {detail}")
        if args.md:
            text = report_md(a, b, rows)
            if args.append:  # a second comparison under its own heading
                text = "\n## " + args.append + "\n" + text.split("\n", 1)[1]
            with open(args.md, "a" if args.append else "w") as f:
                f.write(text)
            print(f"wrote {args.md}")
        return
    if not args.backend:
        parser.error("--backend or --compare")
    args.out = args.out or os.path.join(RESULTS, f"item-exact-{args.backend}.json")
    run(args)


if __name__ == "__main__":
    main()

"""Runs Reverb users' scripts, unchanged but for the import, on shmreplay (and on Reverb).

Two scripts, both taken from their source when this runs (nothing of theirs is kept in
this repository):

* ``readme``: every Python block of Reverb 0.14.0's README, in order (the tutorial:
  a server, ``insert([0, 1])``, a 3-step ``trajectory_writer`` item into the same table,
  ``sample``, the table kinds, a checkpoint and a server restored from it). Read from
  Reverb's git tag, as ``run.py`` reads its tests.
* ``seed002``: the code of the project's seed 002 (a survey of Reverb's ``Client`` and
  ``TFClient``): its set-up, every client call of its sections 3 to 5, then its whole
  ``benchmark.py`` (perfplot timings of ``Client.insert``, ``Client.writer``,
  ``TFClient.insert``, ``Client.sample``, ``TFClient.sample``, ``TFClient.dataset`` and
  cpprb, uniform and prioritized). Read from ``../shared/seeds``.

``import reverb`` becomes ``import shmreplay as reverb``; run with ``--backend reverb``
(in a venv with dm-reverb) the same text runs on Reverb itself, so the only edits are
those both need. They are listed in ``EDITS``, each with its reason: the README's
``tables=[...]`` placeholder, and the seed's typos and ``[...]`` placeholders in its prose
(code that fails on Reverb too). After each script an epilogue checks what it left
(e.g. that the restored server holds the tutorial's two items).

    python benchmarks/compat/user_scripts.py                      # both, on shmreplay
    /work/reverb-venv/bin/python benchmarks/compat/user_scripts.py --backend reverb

Writes ``benchmarks/results/user_scripts-<backend>.json``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REVERB_TAG = "v0.14.0"
SEED = os.path.join(REPO, "..", "shared", "seeds", "002_98562171603c7fbc.txt")

# (script, text to find, replacement, why). Each must match exactly once, unless its
# find text is in COUNTS.
EDITS = [
    ("readme", "reverb.Server(tables=[...], checkpointer=checkpointer)",
     "reverb.Server(tables=TUTORIAL_TABLES(), checkpointer=checkpointer)",
     "the README writes `tables=[...]` for 'the tables of the server that wrote the "
     "checkpoint'; the epilogue's prologue defines them as the README's first server's"),
    ("seed002", "tf_client.inser(", "tf_client.insert(", "typo in the article's prose"),
    ("seed002", "tablea=", "tables=", "typo in the article's prose"),
    ("seed002", "updates={key:new_priority},deletes=[...]",
     "updates={key:new_priority},deletes=[]",
     "`[...]` placeholder in the article's prose (no key to delete is named)"),
    ("seed002", "keys=tf.constant([...]),", "keys=tf.constant([key],dtype=tf.uint64),",
     "`[...]` placeholder in the article's prose"),
    ("seed002", "priorities=tf.constant([...],dtype=tf.float64))",
     "priorities=tf.constant([new_priority],dtype=tf.float64))",
     "`[...]` placeholder in the article's prose"),
    ("seed002", '.png "', '.png"',
     "the benchmark's file names end in a space ('ReplayBuffer_add2.png '): matplotlib "
     "refuses the format 'png ' on either backend"),
    ("seed002", "d = np.random.randint(2) # [0,2) == 0 or 1",
     "d = np.float64(np.random.randint(2)) # [0,2) == 0 or 1",
     "the benchmark fills the tables with `done` as a Python int (int64), then asks "
     "TFClient.sample for float64: Reverb 0.14 fails there too ('Type mismatch: actual "
     "int64 vs. expect double'), as shmreplay does"),
]
COUNTS = {'.png "': 4, "d = np.random.randint(2) # [0,2) == 0 or 1": 2}

# Code the article's prose leaves to the reader: the key of section 5 ("ReplaySample.
# info.key ... I will omit some of the sample code"). Run before section 5.
SEED_KEY = ("key = next(iter(client.sample(table_name, num_samples=1)))[0].info.key\n"
            "new_priority = 0.5\n")

README_EPILOGUE = """
# (The first server stopped when `server` was rebound, as Reverb's does on deletion.)
restored = reverb.Client(f'localhost:{server.port}').server_info()['my_table']
assert restored.current_size == 2, restored
print('USER-SCRIPT-OK readme: restored', restored.current_size, 'items')
"""

SEED_EPILOGUE = """
import glob
pictures = sorted(glob.glob('*.png'))
assert len(pictures) == 4, pictures
print('USER-SCRIPT-OK seed002:', len(pictures), 'plots')
"""


def readme_source(git_dir: str) -> str:
    """The README's Python blocks, in order, with the tables helper the edit names."""
    text = subprocess.run(["git", "-C", git_dir, "show", f"{REVERB_TAG}:README.md"],
                          check=True, capture_output=True, text=True).stdout
    blocks, inside, current = [], False, []
    for line in text.splitlines():
        if line.startswith("```python"):
            inside, current = True, []
        elif line.startswith("```") and inside:
            inside = False
            blocks.append("\n".join(current))
        elif inside:
            current.append(line)
    source = "\n\n".join(blocks) + "\n"
    first = source.index("reverb.Server(tables=[") + len("reverb.Server(tables=")
    tables = source[first:source.index("],\n)", first) + 1]
    helper = f"def TUTORIAL_TABLES():\n    return {tables.strip()}\n\n"
    body = source.split("\n", 1)[1]  # after the README's own `import reverb`
    return source.split("\n", 1)[0] + "\n" + helper + body


def _between(lines, start: str, end: str, last_end: bool = False):
    """The lines from the first that starts with ``start`` to the one (first or last)
    that starts with ``end``, inclusive."""
    i = next(n for n, line in enumerate(lines) if line.startswith(start))
    ends = [n for n, line in enumerate(lines) if n >= i and line.startswith(end)]
    return lines[i:(ends[-1] if last_end else ends[0]) + 1]


def seed_source(path: str) -> str:
    """Seed 002's code: its set-up, the calls of its sections 3 to 5 in order, and its
    whole benchmark script."""
    lines = open(path, encoding="utf-8").read().splitlines()
    setup = _between(lines, "import numpy as np", "shapes = ")
    sections = [
        _between(lines, "client.insert([obs", "client.insert([obs"),
        _between(lines, "with client.writer(", "    writer.create_item(table_name,num_timesteps=3"),
        _between(lines, "tf_client.inser(", "                 priorities=tf.constant([priority]"),
        _between(lines, "client.sample(table_name,num_samples", "client.sample(table_name"),
        _between(lines, "tf_client.sample(tf.constant", "tf_client.sample(tf.constant"),
        _between(lines, "tf_client.dataset(tf.constant", "tf_client.dataset(tf.constant"),
        [SEED_KEY],
        _between(lines, "client.mutate_priorities(", "client.mutate_priorities("),
        _between(lines, "tf_client.update_priorities(", "                            priorities="),
    ]
    # The article writes each call bare, as a notebook shows its value; consume the
    # generators and datasets so that the calls really run.
    calls = "\n".join("\n".join(s) for s in sections)
    calls = calls.replace("client.sample(table_name,num_samples=batch_size)",
                          "list(client.sample(table_name,num_samples=batch_size))")
    benchmark = _between(lines, "import gc", "              equality_check=None)", True)
    return "\n".join(setup) + "\n\n" + calls + "\n\n" + "\n".join(benchmark) + "\n"


def edited(name: str, source: str, backend: str) -> str:
    for script, find, replace, _why in EDITS:
        if script != name:
            continue
        if source.count(find) != COUNTS.get(find, 1):
            raise SystemExit(f"{name}: edit {find!r} matches {source.count(find)} times: "
                             "the source changed; review EDITS")
        source = source.replace(find, replace)
    if backend == "shmreplay":
        if source.count("\nimport reverb\n") + source.startswith("import reverb\n") < 1:
            raise SystemExit(f"{name}: no `import reverb` line")
        source = source.replace("import reverb\n", "import shmreplay as reverb\n")
    return source


def run(name: str, source: str, python: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"shmreplay-user-{name}-") as work:
        path = os.path.join(work, f"{name}.py")
        with open(path, "w") as f:
            f.write(source)
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   MPLBACKEND="Agg")
        start = time.monotonic()
        try:
            done = subprocess.run([python, path], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=timeout)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = "timeout", exc.stdout or "", exc.stderr or ""
            out, err = (o.decode() if isinstance(o, bytes) else o for o in (out, err))
        seconds = round(time.monotonic() - start, 1)
    ok = code == 0 and f"USER-SCRIPT-OK {name}" in out
    tail = (err.strip().splitlines() or [""])[-1] if not ok else ""
    return {"script": name, "ok": ok, "exit": code, "seconds": seconds,
            "last_output": (out.strip().splitlines() or [""])[-1][:300], "error": tail[:500]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["shmreplay", "reverb"], default="shmreplay")
    parser.add_argument("--reverb-git", default="/work/.mirror/google-deepmind+reverb/repo")
    parser.add_argument("--seed", default=SEED)
    parser.add_argument("--only", action="append", choices=["readme", "seed002"])
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--print-source", action="store_true",
                        help="print the edited scripts and exit")
    args = parser.parse_args()
    scripts = {"readme": lambda: readme_source(args.reverb_git) + README_EPILOGUE,
               "seed002": lambda: seed_source(args.seed) + SEED_EPILOGUE}
    results = []
    for name, make in scripts.items():
        if args.only and name not in args.only:
            continue
        source = edited(name, make(), args.backend)
        if args.print_source:
            print(f"# ---- {name} ----\n{source}")
            continue
        result = run(name, source, sys.executable, args.timeout)
        print(json.dumps(result))
        results.append(result)
    if args.print_source:
        return
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    out = os.path.join(REPO, "benchmarks", "results", f"user_scripts-{args.backend}.json")
    with open(out, "w") as f:
        json.dump({"backend": args.backend, "commit": commit,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "edits": [{"script": s, "find": a, "replace": b, "why": w}
                             for s, a, b, w in EDITS],
                   "results": results}, f, indent=1)
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()

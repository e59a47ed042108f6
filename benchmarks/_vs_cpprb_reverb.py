"""Reverb's side of ``bench_vs_cpprb.py``: the same cases through Reverb's Python ``Client``.

Not a public module. Reverb needs TensorFlow and numpy < 2, so it runs in its own
virtualenv: ``bench_vs_cpprb.py --reverb-python PATH`` (or ``$REVERB_PYTHON``) starts
``PATH bench_vs_cpprb.py --reverb-worker``, which calls ``worker`` here; the worker prints
one JSON line on stdout, which ``run_worker`` reads back.

How Reverb is driven (cpprb's published "cpprb vs Reverb" benchmark compared
``Client.insert``, ``Client.writer(max_sequence_length=1)`` and ``Client.sample``; the
TF client it also used is gone from Reverb 0.14):

- one in-process ``reverb.Server`` with a ``uniform`` table (``Uniform()``) and a
  ``prioritized`` table (``Prioritized(0.4)``), each ``Fifo()``, 4096 items,
  ``MinSize(1)``; a ``reverb.Client`` on its port. Sampler and server share the process,
  so Reverb reads the table directly, without gRPC (its best case);
- add N, ``writer`` (the figure the page plots as Reverb): a ``client.writer(1)`` kept
  open; a call appends N steps, ``create_item`` after each (priority 1.0, or a random
  priority on the prioritized table) and ends with ``flush()``, so the N items are in the
  table when the call returns;
- add N, ``insert``: N calls of ``client.insert(step, {table: priority})`` (one item each);
- sample B: ``list(client.sample(table, num_samples=B))``; on the prioritized table the
  importance weights ``(table_size * probability) ** -0.4``, normalized by their maximum,
  are computed from the returned infos, as shmreplay and cpprb return them;
- sample+update B: that sample, then ``client.mutate_priorities(table, {key: p})`` for
  the B keys.
"""

import json
import traceback

import numpy as np

import _common as C

DISTS = ("dm-reverb", "tensorflow", "tensorflow-cpu", "numpy")


def _steps(rng, n):
    batch = {
        "obs": rng.standard_normal((n, 15)).astype(np.float32),
        "act": rng.standard_normal((n, 3)).astype(np.float32),
        "rew": rng.standard_normal(n).astype(np.float32),
        "next_obs": rng.standard_normal((n, 15)).astype(np.float32),
        "done": np.zeros(n, np.float32),
    }
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


class ReverbSide:
    """The Reverb cases of one run (a server, a client, one open writer per table)."""

    def __init__(self, reverb, rng, capacity, alpha, beta):
        self.rng = rng
        self.capacity = capacity
        self.beta = beta
        sel = reverb.selectors
        tables = [reverb.Table("uniform", sel.Uniform(), sel.Fifo(), capacity,
                               reverb.rate_limiters.MinSize(1)),
                  reverb.Table("prioritized", sel.Prioritized(alpha), sel.Fifo(), capacity,
                               reverb.rate_limiters.MinSize(1))]
        self.server = reverb.Server(tables=tables)
        self.client = reverb.Client(f"localhost:{self.server.port}")
        self.writers = {}

    def _writer(self, table):
        if table not in self.writers:
            self.writers[table] = self.client.writer(1)
        return self.writers[table]

    def _prios(self, table, n):
        return ([1.0] * n if table == "uniform"
                else [float(p) for p in self.rng.random(n) + 0.05])

    def fill(self):
        """Fills both tables to capacity through a writer."""
        steps = _steps(self.rng, 256)
        for table in ("uniform", "prioritized"):
            w = self._writer(table)
            prios = self._prios(table, self.capacity)
            for i in range(self.capacity):
                w.append(steps[i % len(steps)])
                w.create_item(table, 1, prios[i])
            w.flush()
        sizes = {name: int(i.current_size) for name, i in self.client.server_info().items()}
        if sizes != {"uniform": self.capacity, "prioritized": self.capacity}:
            raise AssertionError(f"Reverb tables hold {sizes} after filling {self.capacity}")

    def case_fn(self, op, sampler, n, api):
        """The timed callable of one case; ``api`` is ``writer`` or ``insert`` for adds."""
        client, table = self.client, sampler
        if op == "add":
            steps = _steps(self.rng, n)
            prios = self._prios(table, n)
            if api == "insert":
                insert = client.insert
                pairs = [(s, {table: p}) for s, p in zip(steps, prios)]

                def insert_each():
                    for step, prio in pairs:
                        insert(step, prio)
                return insert_each
            w = self._writer(table)
            append, create_item, flush = w.append, w.create_item, w.flush

            def write():
                for step, prio in zip(steps, prios):
                    append(step)
                    create_item(table, 1, prio)
                flush()
            return write
        sample, beta = client.sample, self.beta

        def draw():
            got = list(sample(table, num_samples=n))
            if len(got) != n:
                raise AssertionError(f"Reverb sampled {len(got)} items, want {n}")
            return got
        if op == "sample" and sampler == "uniform":
            return draw

        def weights(got):
            infos = [item[0].info for item in got]
            p = np.array([i.probability for i in infos])
            w = (infos[0].table_size * p) ** -beta
            return infos, w / w.max()
        if op == "sample":
            return lambda: weights(draw())
        prios = [float(p) for p in self.rng.random(n) + 0.05]
        mutate = client.mutate_priorities

        def sample_update():
            infos, _ = weights(draw())
            mutate(table, updates={int(i.key): p for i, p in zip(infos, prios)})
        return sample_update

    def close(self):
        for w in self.writers.values():
            w.close()
        self.writers.clear()
        self.server.stop()


def worker(cases, capacity, alpha, beta, timing, seed):
    """Runs inside Reverb's virtualenv: times every case, prints one JSON line."""
    import importlib.metadata as md
    out = {"versions": {}, "results": [], "errors": [], "timing": timing,
           "loadavg_at_start": C.load_average()}
    for dist in DISTS:
        try:
            out["versions"][dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    import reverb
    side = ReverbSide(reverb, np.random.default_rng(seed), capacity, alpha, beta)
    try:
        filled = False
        for op, sampler, n in cases:
            row = {"op": op, "sampler": sampler, "n": n}
            fns = {}
            for api in (("writer", "insert") if op == "add" else ("client",)):
                try:
                    if op != "add" and not filled:
                        side.fill()
                        filled = True
                    fn = side.case_fn(op, sampler, n, api)
                    fn()
                    fns[api] = fn
                except Exception as exc:  # noqa: BLE001 - report, never work around
                    out["errors"].append({"lib": "reverb", "where": f"{op} {sampler} {n} {api}",
                                          "error": repr(exc),
                                          "traceback": traceback.format_exc()})
            if fns:
                for api, t in C.time_interleaved(fns, **timing).items():
                    row[api] = {"median_us": t["median"] * 1e6, "best_us": t["best"] * 1e6,
                                "number": t["number"], "repeat": t["repeat"]}
            out["results"].append(row)
    finally:
        side.close()
    print(json.dumps(out), flush=True)
    return 0


def run_worker(python, script, args, errors):
    """Runs ``script --reverb-worker`` in ``python``; returns its JSON, or None."""
    cmd = [python, script, "--reverb-worker", "--seed", str(args.seed)] + \
        (["--quick"] if args.quick else [])
    return C.run_json_worker(cmd, errors, "reverb", own_packages=False)

"""Acme's adders per environment step: shmreplay (through the compat shim) against Reverb.

Part of ``bench_writers.py`` (``--libs acme``; not a script of its own). The same adder
code, Acme's current ``acme/adders/reverb`` (read from Acme's git repository by
``compat/item_exact_cases.acme_adders``, over the installed dm-acme 0.4.0, whose own
adders pass ``get_signature_timeout_ms``, which dm-reverb 0.14 refuses), runs in three
worker processes:

* shmreplay: ``--acme-python`` (default ``$ACME_PYTHON``, else ``/work/compat-venv``'s
  python), with ``benchmarks/compat/shim`` first on ``sys.path`` so that the adders'
  ``import reverb`` is shmreplay (this checkout);
* Reverb: ``--reverb-python`` (dm-reverb 0.14, TensorFlow 2.15), in-process
  ``reverb.Server``, client over localhost gRPC;
* a reference, *Acme alone* (in ``--acme-python``): the same adders over a client whose
  ``trajectory_writer`` does nothing (``_NullWriter``: ``append`` keeps each field's
  value in a list, ``history[k][i]`` / ``[a:b]`` and ``.numpy()`` read them back,
  ``create_item``, ``flush`` and ``end_episode`` only count or reset). What Acme's
  own code costs per step, which no backend can take away.

Each worker makes one table per adder, as Acme's agents do (``Uniform``, ``Fifo``,
``MinSize(1)``, the adder's ``signature(env_spec)``, items validated against it, Acme's
default), and drives each adder from a dm_env episode loop: ``add_first(restart)``, then
``add(action, timestep)`` for each of ``EPISODE_STEPS`` steps, the last a termination
(the adder then writes its end-of-episode items and ends the episode; on Reverb that
waits for the server to confirm them). The timesteps are built before timing (the
environment costs nothing), obs cycling through bench_writers' pool of 64 steps. One
timed call is one whole episode; the figure is its time / ``EPISODE_STEPS`` (µs per
environment step, ``add_first`` included). Before timing, each adder runs episodes
until its table is full (``first pass``), so every item then evicts one: steady state.
The two adders' timings are interleaved within a worker (``_common.time_interleaved``:
median of repeats); the backends' workers alternate, ``--acme-rounds`` (3) workers
each, and a figure is the median of a backend's round medians (each round's figures and
load averages are kept in the JSON).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
COMPAT = os.path.join(HERE, "compat")
SHIM = os.path.join(COMPAT, "shim")
STUBS = os.path.join(COMPAT, "stubs")  # launchpad: Acme imports it at start-up only
DEFAULT_ACME_PYTHON = "/work/compat-venv/bin/python"

EPISODE_STEPS = 100
N_STEP, DISCOUNT = 5, 0.99
SEQUENCE_LENGTH, PERIOD = 20, 10
BACKENDS = ("shmreplay", "reverb", "null")
# case key -> label; table max_size per dataset (items). Tables are sized so that the
# first pass (the fill) is about 20k small or 5k frame steps per adder.
ADDERS = {
    "acme_nstep": f"NStepTransitionAdder(n_step={N_STEP}, discount={DISCOUNT})",
    "acme_sequence": f"SequenceAdder(sequence_length={SEQUENCE_LENGTH}, period={PERIOD})",
}
CAPACITY = {"small": {"acme_nstep": 20_000, "acme_sequence": 2_000},
            "frames": {"acme_nstep": 5_000, "acme_sequence": 500}}


# --------------------------------------------------------------------------- worker

def _use_backend(backend):
    """Makes ``import reverb`` the backend's (before anything imports it)."""
    if COMPAT not in sys.path:
        sys.path.insert(0, COMPAT)
    if backend != "reverb":  # the null writer's adders import the shim's reverb
        sys.path.insert(0, SHIM)
    sys.path.append(STUBS)  # after site-packages: a real dm-launchpad wins
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Acme HEAD's adder files, copied out of the git mirror once (shared by both venvs).
    os.environ.setdefault("ITEM_EXACT_WORK", os.path.join(tempfile.gettempdir(),
                                                          "bench-acme-adders"))


def _env_spec(ds):
    from acme import specs
    return specs.EnvironmentSpec(
        observations=specs.Array(ds["obs_shape"], ds["obs_dtype"], name="observation"),
        actions=specs.BoundedArray((), np.int64, 0, 17, name="action"),
        rewards=specs.Array((), np.float32, name="reward"),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, name="discount"))


def _episode(steps):
    """``(first timestep, [(action, timestep)] * EPISODE_STEPS)``; the last terminates."""
    import dm_env
    obs = [s["obs"] for s in steps]
    first = dm_env.restart(obs[0])
    moves = []
    for t in range(1, EPISODE_STEPS + 1):
        s = steps[t % len(steps)]
        last = t == EPISODE_STEPS
        moves.append((s["action"], dm_env.TimeStep(
            dm_env.StepType.LAST if last else dm_env.StepType.MID, s["reward"],
            np.float32(0.0) if last else s["discount"], obs[t % len(obs)])))
    return first, moves


class _NullRef:
    """``history[k][i]`` or ``history[k][a:b]`` of ``_NullWriter``."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def numpy(self):
        value = self.value
        return np.stack(value) if type(value) is list else value


class _NullColumn:
    """``history[k]`` of ``_NullWriter``: the field's value at each step of the episode
    (``None`` where a step has none)."""

    __slots__ = ("writer", "values")

    def __init__(self, writer):
        self.writer, self.values = writer, []

    def __getitem__(self, index):
        values, n = self.values, self.writer.steps_begun
        if len(values) < n:
            values.extend([None] * (n - len(values)))
        return _NullRef(values[index])


class _NullWriter:
    """A ``TrajectoryWriter`` that does nothing but what Acme's adders read back."""

    def __init__(self):
        self.history, self.episode_steps, self.items, self._open = {}, 0, 0, False

    @property
    def steps_begun(self):
        return self.episode_steps + self._open

    def append(self, data, partial_step=False):
        index = self.episode_steps
        for key, value in data.items():
            if isinstance(value, (dict, list, tuple)):
                raise TypeError(f"null writer: field {key} is a nest, not a leaf")
            column = self.history.get(key)
            if column is None:
                column = self.history[key] = _NullColumn(self)
            values = column.values
            if len(values) < index:
                values.extend([None] * (index - len(values)))
            if len(values) == index:
                values.append(value)
            else:
                values[index] = value
        self._open = partial_step
        if not partial_step:
            self.episode_steps += 1

    def create_item(self, table, priority, trajectory):
        self.items += 1

    def flush(self, block_until_num_items=0, timeout_ms=None):
        pass

    def end_episode(self, clear_buffers=True, timeout_ms=None):
        self.history, self.episode_steps, self._open = {}, 0, False

    def close(self):
        pass


class _NullClient:
    def __init__(self):
        self.writers = []

    def trajectory_writer(self, num_keep_alive_refs, **kwargs):
        self.writers.append(_NullWriter())
        return self.writers[-1]


def _make_adder(adders, key, client):
    table = {key: None}  # priority 1.0 into the table named after the case
    if key == "acme_nstep":
        return adders.NStepTransitionAdder(client, n_step=N_STEP, discount=DISCOUNT,
                                           priority_fns=table)
    return adders.SequenceAdder(client, sequence_length=SEQUENCE_LENGTH, period=PERIOD,
                                priority_fns=table)


def _signature(adders, key, spec):
    if key == "acme_nstep":
        return adders.NStepTransitionAdder.signature(spec)
    return adders.SequenceAdder.signature(spec, sequence_length=SEQUENCE_LENGTH)


def worker(backend, datasets, dataset_names, make_pool, timing, quick, seed, prefix):
    """Runs in the backend's virtualenv; prints one JSON line on stdout."""
    import importlib.metadata as md
    _use_backend(backend)
    import _common as C
    import item_exact_cases
    adders = item_exact_cases.acme_adders()
    import reverb
    out = {"backend": backend, "versions": {}, "datasets": {}, "errors": [],
           "acme_adders_file": adders.__file__,
           "acme_source_commit": _acme_commit(item_exact_cases.ACME_SOURCE)}
    for dist in ("dm-reverb", "dm-acme", "tensorflow", "tensorflow-cpu", "numpy", "dm-env"):
        try:
            out["versions"][dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    if backend == "shmreplay":
        import shmreplay
        out["shmreplay_file"] = shmreplay.__file__
        out["versions"]["shmreplay"] = getattr(shmreplay, "__version__", "working copy")
    rng = np.random.default_rng(seed)
    for dname in dataset_names:
        ds = datasets[dname]
        steps, _ = make_pool(rng, ds)
        first, moves = _episode(steps)
        spec = _env_spec(ds)
        res = {"episode_steps": EPISODE_STEPS, "cases": {}, "first_pass_us": {},
               "fill_steps": {}, "items_per_episode": {}, "tables": {},
               "loadavg_before": C.load_average()}
        tables = [] if backend == "null" else [
                  reverb.Table(key, reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                               CAPACITY[dname][key], reverb.rate_limiters.MinSize(1),
                               signature=_signature(adders, key, spec)) for key in ADDERS]
        if backend == "null":
            server, client = None, {key: _NullClient() for key in ADDERS}
        elif backend == "shmreplay":
            server = reverb.Server(tables=tables, name=f"{prefix}-acme-{dname}-{os.getpid()}")
            client = reverb.Client(server.name)
        else:
            server = reverb.Server(tables=tables)
            client = reverb.Client(f"localhost:{server.port}")
        try:
            fns, live = {}, []
            for key in ADDERS:
                try:
                    adder = _make_adder(adders, key,
                                        client[key] if backend == "null" else client)
                    live.append(adder)

                    def episode(adder=adder):
                        adder.add_first(first)
                        for action, timestep in moves:
                            adder.add(action, timestep)
                    episode()
                    res["items_per_episode"][key] = _num_items(client, key)
                    cap = CAPACITY[dname][key]
                    per_item = 1 if key == "acme_nstep" else PERIOD
                    n_episodes = 3 if quick else -(-cap * per_item // EPISODE_STEPS)
                    t0 = time.perf_counter()
                    for _ in range(n_episodes):
                        episode()
                    res["first_pass_us"][key] = ((time.perf_counter() - t0)
                                                 / (n_episodes * EPISODE_STEPS) * 1e6)
                    res["fill_steps"][key] = n_episodes * EPISODE_STEPS
                    fns[key] = episode
                except Exception as exc:  # noqa: BLE001 - report, never work around
                    out["errors"].append({"lib": f"acme on {backend}", "where": f"{dname} {key}",
                                          "error": repr(exc),
                                          "traceback": traceback.format_exc()})
            timed = C.time_interleaved(fns, **timing) if fns else {}
            for key, t in timed.items():
                res["cases"][key] = {"median_us": t["median"] / EPISODE_STEPS * 1e6,
                                     "best_us": t["best"] / EPISODE_STEPS * 1e6,
                                     "number": t["number"], "repeat": t["repeat"],
                                     "steps_per_call": EPISODE_STEPS}
            res["tables"] = {key: {"max_size": CAPACITY[dname][key],
                                   "current_size": _num_items(client, key)} for key in ADDERS}
            for adder in live:  # flushes and closes the writer, as Acme's tests do
                adder.__del__()
        finally:
            res["loadavg_after"] = C.load_average()
            if backend == "shmreplay":
                client.close()
            if server is not None:
                server.stop()
        out["datasets"][dname] = res
    print(json.dumps(out), flush=True)
    return 0


def _num_items(client, key):
    """The table's size; for the null writer (``client``: a ``_NullClient`` per case),
    the items written so far."""
    if isinstance(client, dict):
        return sum(writer.items for writer in client[key].writers)
    return int(client.server_info()[key].current_size)


def _acme_commit(git_dir):
    try:
        return subprocess.run(["git", "-C", git_dir, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# --------------------------------------------------------------------------- parent

def run(script, pythons, args, errors, rounds=3):
    """Runs the worker of each backend whose python is given, the backends alternating,
    ``rounds`` times each: ``{backend: merged worker JSON}`` (``_merge``); a failed
    worker is recorded in ``errors``."""
    runs = {}
    for r in range(rounds):
        for backend in BACKENDS:
            python = pythons.get(backend)
            if python:
                out = _run_worker(script, python, backend, args, errors)
                if out is not None:
                    runs.setdefault(backend, []).append(out)
                    _print(backend, out, f"round {r + 1}/{rounds}")
    merged = {backend: _merge(outs) for backend, outs in runs.items()}
    # The backends (and the null writer) must see the same items: one episode's count.
    for dname in args.datasets.split(","):
        for key in ADDERS:
            counts = {b: r["datasets"].get(dname, {}).get("items_per_episode", {}).get(key)
                      for b, r in merged.items()}
            if len({c for c in counts.values() if c is not None}) > 1:
                errors.append({"lib": "acme", "where": f"{dname} {key}",
                               "error": f"items per episode differ: {counts}"})
    return merged


def _run_worker(script, python, backend, args, errors):
    cmd = [python, script, "--acme-worker", backend, "--seed", str(args.seed),
           "--datasets", args.datasets, "--prefix", args.prefix] + (
               ["--quick"] if args.quick else [])
    import _common as C
    return C.run_json_worker(cmd, errors, f"acme on {backend}")


def _print(backend, out, when):
    for dname, res in out["datasets"].items():
        for key, c in res["cases"].items():
            print(f"  {backend} {dname} {ADDERS[key]:44s} {c['median_us']:9.2f} µs/step "
                  f"(best {c['best_us']:.2f}; {when}; load {res['loadavg_after']})",
                  flush=True)


def _merge(outs):
    """One result from a backend's rounds: per case, the median of the rounds' medians
    and the best of their bests (each round's figures kept under ``rounds``)."""
    import statistics
    merged = dict(outs[0], rounds=[{d: {"cases": r["cases"], "first_pass_us": r["first_pass_us"],
                                        "loadavg_before": r["loadavg_before"],
                                        "loadavg_after": r["loadavg_after"]}
                                    for d, r in o["datasets"].items()} for o in outs])
    merged["datasets"] = {}
    for dname, first in outs[0]["datasets"].items():
        res = dict(first, cases={}, first_pass_us={})
        res["loadavg_before"] = [o["datasets"][dname]["loadavg_before"] for o in outs]
        res["loadavg_after"] = [o["datasets"][dname]["loadavg_after"] for o in outs]
        for key in ADDERS:
            cs = [o["datasets"][dname]["cases"][key] for o in outs
                  if key in o["datasets"][dname]["cases"]]
            if cs:
                res["cases"][key] = {"median_us": statistics.median(c["median_us"] for c in cs),
                                     "best_us": min(c["best_us"] for c in cs),
                                     "rounds": len(cs), "steps_per_call": EPISODE_STEPS}
            fs = [o["datasets"][dname]["first_pass_us"][key] for o in outs
                  if key in o["datasets"][dname]["first_pass_us"]]
            if fs:
                res["first_pass_us"][key] = statistics.median(fs)
        merged["datasets"][dname] = res
    return merged


LABELS = {"shmreplay": "shmreplay", "reverb": "Reverb", "null": "Acme alone"}


def report(results, C):
    """(markdown lines, text lines, summary lines) of the workers' results."""
    md, text, summary = [], [], []
    got = {b: results[b] for b in BACKENDS if results.get(b)}
    if not got:
        return md, text, summary
    shm, rv, null = (got.get(b, {}).get("datasets", {}) for b in BACKENDS)

    def us(res, dname, key, field="cases"):
        value = res.get(dname, {}).get(field, {}).get(key)
        return value.get("median_us") if isinstance(value, dict) else value

    headers = ["adder", "dataset", "shmreplay µs/step", "Reverb µs/step", "Reverb ÷ shmreplay",
               "Acme alone µs/step (null writer)", "shmreplay − Acme alone",
               "Reverb − Acme alone", "first pass shmreplay / Reverb",
               "items per episode shmreplay / Reverb / Acme alone"]
    rows = []
    for dname in next(iter(got.values()))["datasets"]:
        for key, label in ADDERS.items():
            ma, mb, mn = us(shm, dname, key), us(rv, dname, key), us(null, dname, key)
            ratio = mb / ma if ma and mb else None
            items = " / ".join(str(r.get(dname, {}).get("items_per_episode", {}).get(key))
                               for r in (shm, rv, null))
            rows.append([label, dname, C.fmt_num(ma, 1), C.fmt_num(mb, 1), C.fmt_ratio(ratio),
                         C.fmt_num(mn, 1), C.fmt_num(ma - mn if ma and mn else None, 1),
                         C.fmt_num(mb - mn if mb and mn else None, 1),
                         f"{C.fmt_num(us(shm, dname, key, 'first_pass_us'), 1)} / "
                         f"{C.fmt_num(us(rv, dname, key, 'first_pass_us'), 1)}", items])
            if ma is not None or mb is not None:
                summary.append(f"{dname}, Acme {label}: shmreplay {C.fmt_num(ma, 1)} µs/step, "
                               f"Reverb {C.fmt_num(mb, 1)} µs/step"
                               + (f" (Reverb {ratio:.2f}x shmreplay)" if ratio else "")
                               + (f"; Acme alone {mn:.1f}" if mn else ""))
    loads, versions = [], []
    for backend, r in got.items():
        loads += [f"{LABELS[backend]} {d}: " + ", ".join(
            f"{b} / {a}" for b, a in zip(x["loadavg_before"], x["loadavg_after"]))
            for d, x in r["datasets"].items()]
        v = r["versions"]
        versions.append(f"{LABELS[backend]}: " + ", ".join(f"{k} {v[k]}" for k in v))
    first = next(iter(got.values()))
    commit = first.get("acme_source_commit") or "?"
    md += ["#### Acme's adders, per environment step", "",
           f"Acme's adders at Acme {commit[:12]} (over dm-acme 0.4.0), the same code on "
           f"both backends; episodes of {EPISODE_STEPS} steps (add_first + {EPISODE_STEPS} "
           "add, the last a termination), one episode per timed call, µs per step, "
           f"median of {len(first['rounds'])} alternating worker rounds per backend; tables "
           "with the adder's signature, Uniform/Fifo/MinSize(1), full before timing "
           "(max_size " + "; ".join(f"{d}: " + ", ".join(f"{k[5:]} {v}" for k, v in c.items())
                                    for d, c in CAPACITY.items()) + " items). "
           "'Reverb ÷ shmreplay' > 1: shmreplay is faster. 'Acme alone': the same adders "
           "over a writer that does nothing (Acme's own cost per step, in the shmreplay "
           "virtualenv).", "",
           C.render_table(headers, rows, markdown=True), "",
           "Versions: " + "; ".join(versions), "",
           "Load average before / after each worker's part, per round: " + "; ".join(loads), ""]
    text += ["Acme's adders (µs per environment step):", C.render_table(headers, rows), ""]
    return md, text, summary

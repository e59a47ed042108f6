"""Reverb's side of ``bench_learner_feed.py``: the TF rows fed by Reverb's own dataset.

Not a public module. Reverb needs TensorFlow and numpy < 2, so it runs in its own
virtualenv: ``bench_learner_feed.py --reverb-python PATH`` (or ``$REVERB_PYTHON``) runs
``PATH _learner_feed_reverb.py WORKLOAD ACTOR ...`` once per row (``run_rows``); the worker
prints one JSON line, read back by ``_common.run_json_worker``.

How Reverb feeds the learner (the way a Reverb user does it):

- one in-process ``reverb.Server`` with the row's table: the same selectors as the
  shmreplay table (``Prioritized(0.6)`` for transitions, ``Uniform()`` for atari, each
  with ``Fifo()``), the same size, ``MinSize(1)``, and a signature; prefilled to that
  size through a ``trajectory_writer``, one step per item (the items are single steps:
  no time dimension). The server is in the learner's process, so the dataset reads the
  table directly, without gRPC (Reverb's best case); the actor goes through gRPC;
- ``fed``: ``reverb.TrajectoryDataset.from_table_signature(address, table,
  max_in_flight_samples_per_worker=2 * batch)``, ``.batch(batch, drop_remainder=True)``,
  ``.prefetch(2)``; the same ``tf.function`` step as the shmreplay row takes the iterator,
  calls ``next`` and runs ``_learner_models``' train step, returning keys and TD errors;
  on the prioritized table ``client.mutate_priorities`` runs beside it after each call
  (``|td| + 1e-6``);
- ``fed_in_graph`` (prioritized only): the same with ``reverb.TFClient.update_priorities``
  inside the function;
- ``constant``: the same step over ``from_tensors(batch).repeat()`` of one batch sampled
  from that dataset, as the shmreplay row's constant case;
- with an actor: a spawned process inserting single items at ``--actor-rate`` per second
  through its own ``trajectory_writer`` (one ``create_item`` and ``flush`` per item), running
  while constant and fed are measured (from its first insert on: its imports take
  seconds); the row's ``actor_inserts_per_s`` is the rate it reached.
"""

import argparse
import json
import multiprocessing
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _learner_models import WORKLOADS, make_items  # noqa: E402
from _learner_timing import alternate  # noqa: E402

TABLE = "replay"
DISTS = ("dm-reverb", "tensorflow", "tensorflow-cpu", "numpy")


def _write(writer, steps, priorities):
    """Appends ``steps`` (a list of dicts), one item of one step each."""
    for step, priority in zip(steps, priorities):
        writer.append(step)
        writer.create_item(TABLE, float(priority),
                           {k: col[-1] for k, col in writer.history.items()})


def _split(pool):
    n = len(next(iter(pool.values())))
    return [{k: v[i] for k, v in pool.items()} for i in range(n)]


def make_server(reverb, tf, workload):
    spec = WORKLOADS[workload]
    sel = reverb.selectors
    sample = _split(make_items(workload, 1, np.random.default_rng(0)))[0]
    signature = {k: tf.TensorSpec(v.shape, tf.as_dtype(v.dtype)) for k, v in sample.items()}
    table = reverb.Table(TABLE, sel.Prioritized(0.6) if spec["per"] else sel.Uniform(),
                         sel.Fifo(), spec["size"], reverb.rate_limiters.MinSize(1),
                         signature=signature)
    server = reverb.Server(tables=[table])
    client = reverb.Client(f"localhost:{server.port}")
    rng = np.random.default_rng(0)
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for start in range(0, spec["size"], 50):  # (Reverb warns above ~50 pending)
            n = min(50, spec["size"] - start)
            _write(writer, _split(make_items(workload, n, rng)), rng.random(n) + 0.1)
            writer.flush()
    return server, client


def actor(port, workload, rate, stop, count):
    """Inserts single items at ``rate`` per second until ``stop`` is set; ``count``
    (a shared integer) counts them."""
    import reverb
    client = reverb.Client(f"localhost:{port}")
    steps = _split(make_items(workload, 64, np.random.default_rng(1)))
    t0, n = time.monotonic(), 0
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        while not stop.is_set():
            _write(writer, [steps[n % 64]], [1.0])
            writer.flush()
            n += 1
            count.value = n
            ahead = t0 + n / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)


def cases(reverb, tf, server, client, workload, refs):
    import _learner_models
    spec = WORKLOADS[workload]
    per, batch = spec["per"], spec["batch"]
    address = f"localhost:{server.port}"
    train, variables = _learner_models.tf_train(workload)
    tf_client = reverb.TFClient(address)

    def dataset():
        return reverb.TrajectoryDataset.from_table_signature(
            address, TABLE, max_in_flight_samples_per_worker=2 * batch
        ).batch(batch, drop_remainder=True).prefetch(2)

    @tf.function
    def iterator_step(iterator):
        sample = next(iterator)
        td = train(sample)
        return (sample.info.key, td) if per else td

    @tf.function
    def in_graph_step(iterator):
        sample = next(iterator)
        td = train(sample)
        tf_client.update_priorities(TABLE, sample.info.key,
                                    tf.cast(tf.abs(td), tf.float64) + 1e-6)

    iterator = iter(dataset())
    const = next(iterator)
    const_iterator = iter(tf.data.Dataset.from_tensors(const).repeat())
    refs += [iterator, const_iterator, variables]

    def fed():
        if not per:
            iterator_step(iterator)
            return
        keys, td = iterator_step(iterator)
        prios = np.abs(td.numpy().astype(np.float64)) + 1e-6
        client.mutate_priorities(TABLE, updates=dict(zip(keys.numpy().tolist(),
                                                         prios.tolist())))

    def nothing():
        pass

    out = {"constant": (lambda: iterator_step(const_iterator), nothing),
           "fed": (fed, nothing)}
    if per:
        in_graph_iterator = iter(dataset())
        refs.append(in_graph_iterator)
        out["fed_in_graph"] = (lambda: in_graph_step(in_graph_iterator), nothing)
    return out


def worker(argv):
    """One Reverb row in this process; prints its JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workload")
    parser.add_argument("actor", choices=("off", "on"))
    for flag in ("--actor-rate", "--seconds", "--warmup"):
        parser.add_argument(flag, type=float, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    args = parser.parse_args(argv)
    row = {"framework": "reverb", "workload": args.workload, "actor": args.actor == "on",
           "versions": {d: _common._version(d) for d in DISTS}}
    try:
        import reverb
        import tensorflow as tf
        server, client = make_server(reverb, tf, args.workload)
        refs, procs, stop = [], [], None
        try:
            if row["actor"]:
                ctx = multiprocessing.get_context("spawn")
                stop, count = ctx.Event(), ctx.Value("q", 0, lock=False)
                procs.append(ctx.Process(target=actor, args=(server.port, args.workload,
                                                             args.actor_rate, stop, count)))
                procs[0].start()
                deadline = time.monotonic() + 300  # (its imports take seconds: wait for it)
                while count.value == 0 and procs[0].is_alive() and time.monotonic() < deadline:
                    time.sleep(0.05)
                if count.value == 0:
                    raise RuntimeError("the Reverb actor did not insert within 300 s")
                t_actor, n_actor = time.monotonic(), count.value
            scale = WORKLOADS[args.workload]["time"]
            row["steps_per_s"], row["cpu_s_per_step"] = alternate(
                cases(reverb, tf, server, client, args.workload, refs), args.rounds,
                args.seconds * scale, args.warmup * scale)
            if stop is not None:  # what the actor reached (it may fall behind its rate)
                row["actor_inserts_per_s"] = (count.value - n_actor) / (time.monotonic() - t_actor)
        finally:
            if stop is not None:
                stop.set()
            _common.reap(procs)
            refs.clear()
            client = None
            server.stop()
    except Exception:  # noqa: BLE001 - the error goes into the JSON, the run goes on
        row["error"] = traceback.format_exc()[-2000:]
    print(json.dumps(row), flush=True)


def run_rows(args):
    """The Reverb rows of a run (TF workloads x actors), each in a worker in Reverb's
    virtualenv; ``[]`` (and a printed reason) when Reverb is not to be measured."""
    python = args.reverb_python or os.environ.get("REVERB_PYTHON")
    if "tf" not in args.frameworks.split(",") or not python:
        print("Reverb: not measured (" + ("no tf in --frameworks" if python else
              "no --reverb-python given and $REVERB_PYTHON unset") + ")")
        return []
    rows = []
    for workload in args.workloads.split(","):
        for actor_flag in args.actors.split(","):
            cmd = [python, os.path.abspath(__file__), workload, actor_flag,
                   "--actor-rate", str(args.actor_rate), "--seconds", str(args.seconds),
                   "--warmup", str(args.warmup), "--rounds", str(args.rounds)]
            errors = []
            out = _common.run_json_worker(cmd, errors, "reverb", own_packages=False,
                                          timeout=900 + 16 * args.rounds * args.seconds)
            rows.append(out if out is not None else
                        {"framework": "reverb", "workload": workload,
                         "actor": actor_flag == "on", "error": json.dumps(errors)[-2000:]})
    return rows


if __name__ == "__main__":
    worker(sys.argv[1:])

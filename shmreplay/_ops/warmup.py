"""Compiling every kernel before actors and learners need it: once per machine.

numba compiles a kernel the first time a process calls it and keeps the machine code
in its disk cache, so only the first run after an install (or an upgrade) compiles.
Left to itself that first run compiles in every process at once (the owner, each
actor, the learner) while they are already meant to be working, and a learner that
waits a fixed time for data gives up before the actors' first insert.

``warm_up`` moves that cost to one place and one time. The owner calls it when it
creates a ``Server``, before any actor is started: if numba's cache lacks a kernel, it
says so on the ``shmreplay`` logger ("compiling kernels, first run only: ~N s") and
runs every kernel once on a small private scratch buffer, holding the machine's
compile lock (``shmreplay._shm.kernels._jit``) so that other processes starting meanwhile
wait and then load the result. With a warm cache it only reads the cache's index files
(a few milliseconds) and loads nothing.

The scratch run calls the public API, so that each kernel is compiled with exactly the
argument types that real calls use; ``tests/test_warmup.py`` checks that afterwards no
kernel is missing from the cache and that a fresh process doing every kind of call
compiles nothing.
"""

import contextlib
import dataclasses
import logging
import os
import tempfile
import time
import uuid

import numpy as np

_log = logging.getLogger("shmreplay")

# Compiling every kernel in one process on an idle 2-core VM took 25.6 and 26.4 s
# (benchmarks/results/startup.json). The estimate scales it by the share of kernels
# missing and by the compiling process's share of the CPUs: it is single-threaded, and
# competes with the load average's runnable processes.
_FULL_COMPILE_SECONDS = 25.0


@dataclasses.dataclass(frozen=True)
class WarmUp:
    """What ``warm_up`` did.

    Attributes:
      compiled: How many of the ``kernels`` entry points this call compiled (0: the
        cache held them all, or another process compiled them meanwhile).
      kernels: How many entry points the cache must hold.
      seconds: How long the call took.
      cache_directory: Where numba keeps them.
    """
    compiled: int
    kernels: int
    seconds: float
    cache_directory: str


def warm_up(log: bool = True) -> WarmUp:
    """Makes sure numba's cache holds every kernel, compiling the missing ones now.

    Called by ``Server`` before it creates its buffer; call it yourself to pay the
    first-run cost at a time of your choosing (``shmreplay compile`` does, for an image
    build or an install script). Safe to call from several processes at once: one of
    them compiles, the others wait for it and then load.

    Args:
      log: Say on the ``shmreplay`` logger (WARNING, so it shows without any logging
        set up) that kernels are being compiled and about how long that takes.

    Returns:
      A ``WarmUp`` record.
    """
    global _complete
    from shmreplay._shm.kernels import _jit, table
    start = time.monotonic()
    if _running or _complete:  # the scratch run's own Servers; a later Server
        return WarmUp(0, len(_jit.entry_points(table)), 0.0, _jit.cache_directory())
    total = len(_jit.entry_points(table))
    missing = []
    if _jit.uncached(table):
        with _jit.machine_lock():
            # Another process may have compiled them while this one waited for the lock.
            missing = _jit.uncached(table)
            if missing:
                if log:
                    _log.warning("shmreplay: compiling kernels, first run only: ~%d s "
                                 "(cached in %s)", _estimate(len(missing), total),
                                 _jit.cache_directory())
                try:
                    _exercise_every_kernel()
                except Exception as exc:  # an optimization: never the caller's failure
                    _log.warning("shmreplay: compiling the kernels ahead of use failed "
                                 "(%s: %s); each compiles at its first use instead",
                                 type(exc).__name__, exc)
                    return WarmUp(len(missing), total, time.monotonic() - start,
                                  _jit.cache_directory())
                if log:
                    _log.warning("shmreplay: kernels compiled in %.1f s",
                                 time.monotonic() - start)
    _complete = True
    return WarmUp(len(missing), total, time.monotonic() - start, _jit.cache_directory())


_complete = False  # this process found (or made) the cache complete


def _estimate(missing: int, total: int) -> int:
    try:
        slowdown = (os.getloadavg()[0] + 1) / (os.cpu_count() or 1)
    except OSError:
        slowdown = 1.0
    return max(1, round(_FULL_COMPILE_SECONDS * missing / total * max(1.0, slowdown)))


_running = False


def _exercise_every_kernel():
    """Runs every kernel once on private scratch buffers (removed afterwards)."""
    global _running
    _running = True
    try:
        _call_every_kernel()
    finally:
        _running = False


def _call_every_kernel():
    import shmreplay
    from shmreplay import errors, rate_limiters, selectors

    name = f"warmup-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    one, batch = {"w": np.zeros(2, np.float32)}, {"w": np.zeros((3, 2), np.float32)}
    batch2 = {"w": batch["w"][:2]}
    step = {"obs": np.zeros(2, np.float32), "action": np.int64(0)}
    tables = [
        shmreplay.Table.queue("queue", 2),
        shmreplay.Table("prioritized", selectors.Prioritized(0.6), selectors.Fifo(), 8,
                        rate_limiters.MinSize(1)),
        shmreplay.Table("heap", selectors.MaxHeap(), selectors.MinHeap(), 8,
                        rate_limiters.MinSize(1), max_times_sampled=1),
        shmreplay.Table("steps", selectors.Prioritized(0.6), selectors.Fifo(), 8,
                        rate_limiters.MinSize(1)),
        shmreplay.Table("sequences", selectors.Uniform(), selectors.Fifo(), 8,
                        rate_limiters.MinSize(1)),
        shmreplay.Table.queue("empty", 1),
    ]
    quick = contextlib.suppress(errors.DeadlineExceededError)  # the blocked paths
    with tempfile.TemporaryDirectory(prefix="shmreplay-warmup-") as directory, \
            shmreplay.Server(tables, name=name) as server, \
            shmreplay.Client(server.name) as client:
        for _ in range(2):  # waits for an item, then gives up: wait, unwait (the first
            with quick:     # call may spend its timeout compiling the others)
                client.sample_batch("empty", 1, timeout=0.05)
        # Whole items: single and batched inserts, blocked ones, several tables at once.
        client.insert(one, priorities={"queue": 1.0}, timeout=5)
        client.insert({"w": np.zeros(2, np.float32)}, priorities={"queue": 1.0}, timeout=5)
        for call in (lambda: client.insert(one, priorities={"queue": 1.0}, timeout=0),
                     lambda: client.insert_batch(batch2, priorities={"queue": 1.0},
                                                 timeout=0)):
            with quick:
                call()
        client.sample_batch("queue", 2, timeout=5)
        client.insert_batch({"w": np.zeros((2, 2), np.float32)}, priorities={"queue": 1.0},
                            timeout=5)
        next(client.sample("queue", 1, timeout=5))
        with quick:
            client.sample_batch("queue", 2, timeout=0)
        # An item of another shape: the general store (arena) of a table without a signature.
        client.insert(b"another shape", priorities={"queue": 1.0}, timeout=5)
        next(client.sample("queue", 1, timeout=5))
        client.insert(one, priorities={"prioritized": 1.0, "heap": 2.0}, timeout=5)
        client.insert_batch(batch, priorities={"prioritized": 2.0, "heap": 1.0}, timeout=5)
        for table in ("prioritized", "heap"):
            sample = client.sample_batch(table, 4, timeout=5)
            sample.info.importance_weights(0.4)
            keys = sample.info.key
            client.update_priorities(table, keys, np.ones(len(keys)))
        keys = client.sample_batch("prioritized", 40, timeout=5).info.key  # weighed update
        client.update_priorities("prioritized", keys, np.linspace(1, 2, len(keys)))
        client.mutate_priorities("prioritized", updates={int(keys[0]): 3.0},
                                 deletes=[int(keys[-1])])
        list(client.sample("prioritized", 2, timeout=5))
        # Items over stored steps: both writers, then sampling them.
        writer = client.trajectory_writer(num_keep_alive_refs=2)
        for _ in range(3):
            writer.append(step)
            if writer.episode_steps >= 2:
                history = writer.history
                writer.create_item("steps", 1.0, {"obs": history["obs"][-2],
                                                  "next_obs": history["obs"][-1],
                                                  "action": history["action"][-2]})
        writer.end_episode(timeout_ms=5_000)
        writer.close()
        with client.writer(3) as legacy:
            for index in range(3):
                legacy.append(step)
                if index:
                    legacy.create_item("sequences", 2, 1.0)
            legacy.create_item("sequences", 3, 1.0)  # items of any length: padded batches
        from shmreplay._shm.kernels import refpool
        for word in (np.uint32, np.uint16, np.uint8):  # (padded copies of other row sizes)
            refpool.copy_padded(np.zeros((1, 1), word), np.zeros((1, 1), np.int64),
                                np.zeros((1, 1, 1), word))
        for table in ("steps", "sequences"):
            client.sample_batch(table, 2 if table == "steps" else 8, timeout=5)
            next(client.sample(table, 1, emit_timesteps=False, timeout=5))
        client.mutate_priorities("steps", deletes=[int(client.sample_batch(
            "steps", 1, timeout=5).info.key[0])])
        # Operators' calls: info, checks, dead writers, growth, checkpoints, reset.
        from shmreplay._shm.kernels import table as kernels
        client.server_info()
        for engine in client._buffer.engines:
            engine.reclaim_dead_writers()
            engine.cancel(np.empty(0, np.int64))
            engine.can_insert(1), engine.can_sample(1)
            client.verify(engine.name)
            if engine.has_columns():  # (raises nothing: watermarks only ever go up)
                kernels.grow(*engine.arrays, np.int64(engine.layout_gen), 0, 0)
        kernels.wake_all(client._engine("empty").ctrl)  # (stop()'s, when a lock stays held)
        path = client.checkpoint(os.path.join(directory, "warmup.ckpt"))
        client.reset("prioritized")
        with shmreplay.Server(name=name + "-restored", checkpoint=path):
            pass
        # stop()'s own kernel, last: a process that never loaded it stops without it
        # (see TableEngine.close), so the Server's stop would not compile it.
        kernels.close(*client._engine("empty").arrays)

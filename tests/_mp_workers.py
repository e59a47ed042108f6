"""Worker functions and process helpers for the multi-process tests.

Workers live in an importable module so that ``multiprocessing``'s ``spawn`` start
method can find them. Each worker reports through a ``multiprocessing`` queue as
``(tag, payload)`` tuples; an exception in a worker is reported as ``("error", text)``
so the test fails with the child's traceback instead of a bare timeout.
"""

import contextlib
import ctypes
import functools
import os
import signal
import sys
import time
import traceback

import numpy as np
import _names

SHM_DIR = "/dev/shm"


# --------------------------------------------------------------------------------------
# helpers used by the tests (parent side)
# --------------------------------------------------------------------------------------

def shm_objects(name):
    """The /dev/shm entries of buffer ``name``: its segments (and semaphores, if any)."""
    from shmreplay._shm import peek as _peek
    semaphore = f"sem.shmreplay.{name}"
    return sorted(_peek.segments_of(name)
                  + [e for e in os.listdir(SHM_DIR) if e == semaphore])


def segment_kinds(entries):
    """``entries`` with each data segment's random token dropped (``shmreplay.x:t0``),
    to compare with the segments a buffer should have."""
    from shmreplay._shm import layout as _layout
    return [entry.rpartition(_layout.DATA_SEPARATOR)[0]
            if (_layout.parse_segment(entry) or (None, None))[1] is not None else entry
            for entry in entries]


def wait_until(predicate, timeout, interval=0.01):
    """Polls ``predicate`` until it is true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def get(queue, timeout, expect_tag=None):
    """One ``(tag, payload)`` message from a worker; raises if it reports an error."""
    tag, payload = queue.get(timeout=timeout)
    if tag == "error":
        raise AssertionError(f"worker failed:\n{payload}")
    if expect_tag is not None and tag != expect_tag:
        raise AssertionError(f"expected message {expect_tag!r}, got {tag!r}: {payload!r}")
    return payload


@contextlib.contextmanager
def processes(*procs, join_timeout=10.0):
    """Starts ``procs``; on exit joins each with a timeout and kills any still alive
    (at once if the body raised)."""
    started = []
    failed = True
    try:
        for proc in procs:
            proc.start()
            started.append(proc)
        yield procs
        failed = False
    finally:
        # On success the children are finishing: give them time. On failure, do not wait.
        deadline = time.monotonic() + (0.0 if failed else join_timeout)
        for proc in started:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in started:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def kill_and_reap(proc, timeout=5.0):
    """SIGKILLs ``proc`` and waits for it; returns its exit code."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout)
    return proc.exitcode


def _guard(fn):
    """Runs worker ``fn(..., queue)``; reports its exception on ``queue`` (the last arg)."""
    @functools.wraps(fn)
    def run(*args):
        queue = args[-1]
        try:
            fn(*args)
        except SystemExit:
            raise
        except BaseException:
            queue.put(("error", traceback.format_exc()))
            raise
    return run


def warm_kernels():
    """Runs every kernel once on a private scratch buffer, so that numba compiles them
    (or loads them from its cache) now: the timings of a test then measure the library,
    not the JIT. Called by the test modules and by children that time things."""
    import shmreplay
    from shmreplay import errors, rate_limiters, selectors

    name = _names.unique("warm")
    tables = [shmreplay.Table.queue("q", 1),
              shmreplay.Table("p", selectors.Prioritized(0.5), selectors.Fifo(), 4,
                              rate_limiters.MinSize(1)),
              shmreplay.Table.queue("empty", 1)]
    one, batch = {"w": np.zeros(2)}, {"w": np.zeros((1, 2))}
    with shmreplay.Server(tables, name=name) as server:
        with shmreplay.Client(server.name) as client:
            with contextlib.suppress(errors.DeadlineExceededError):  # wait_for_items
                client.sample_batch("empty", 1, timeout=0.01)
            client.insert(one, priorities={"q": 1.0}, timeout=5)
            for call in (lambda: client.insert(one, priorities={"q": 1.0}, timeout=0.01),
                         lambda: client.insert_batch(batch, priorities={"q": 1.0}, timeout=0.01)):
                with contextlib.suppress(errors.DeadlineExceededError):  # blocked paths
                    call()
            client.sample_batch("q", 1, timeout=5)
            client.insert_batch(batch, priorities={"q": 1.0}, timeout=5)
            next(client.sample("q", 1, timeout=5))
            with contextlib.suppress(errors.DeadlineExceededError):
                client.sample_batch("q", 1, timeout=0.01)
            client.insert(one, priorities={"p": 1.0}, timeout=5)
            client.insert_batch({"w": np.zeros((3, 2))}, priorities={"p": 2.0}, timeout=5)
            keys = client.sample_batch("p", 4, timeout=5).info.key
            client.update_priorities("p", keys, np.ones(len(keys)))
            client.mutate_priorities("p", updates={int(keys[0]): 3.0}, deletes=[int(keys[-1])])
            engine = client._buffer.by_name["p"]
            engine.reclaim_dead_writers()
            engine.cancel(np.empty(0, np.int64))
            engine.can_insert(1), engine.can_sample(1)
            client.verify("p"), client.verify("q")
            client.server_info()
            client.reset("p")


def item(value, width):
    """An item whose every element encodes ``value`` (for torn-item checks)."""
    return {"x": np.full(width, value, np.float64), "v": np.float64(value)}


def torn_rows(data):
    """Indices of rows whose payload is not exactly the value its checksum leaf names."""
    x, v = data["x"], data["v"]
    bad = ~np.all(x == v[:, None], axis=1)
    return np.flatnonzero(bad)


# --------------------------------------------------------------------------------------
# multiprocess workers
# --------------------------------------------------------------------------------------

@_guard
def attach_and_insert(name, table, values, queue):
    import shmreplay
    assert isinstance(name, str)
    with shmreplay.Client(name) as client:
        keys = [client.insert({"x": np.full(8, v, np.float64), "v": np.int64(v)},
                              priorities={table: 1.0}, timeout=5)[table] for v in values]
    queue.put(("keys", keys))


@_guard
def insert_into_tables(name, tables, values, queue):
    """Inserts each value into every table of ``tables``, in that (dict) order."""
    import shmreplay
    with shmreplay.Client(name) as client:
        queue.put(("ready", None))
        for v in values:
            client.insert(np.int64(v), priorities={t: 1.0 for t in tables}, timeout=10)
    queue.put(("done", len(values)))


@_guard
def insert_with_client(client, table, values, queue):
    import shmreplay
    assert isinstance(client, shmreplay.Client)
    keys = [client.insert({"x": np.full(8, v, np.float64), "v": np.int64(v)},
                          priorities={table: 1.0}, timeout=5)[table] for v in values]
    client.close()
    queue.put(("keys", keys))


@_guard
def torn_writer(name, table, width, seed, ready, go, stop, queue):
    """Inserts items ``item(random value)`` as fast as possible until ``stop`` is set."""
    import shmreplay
    rng = np.random.default_rng(seed)
    with shmreplay.Client(name) as client:
        # Warm up (maps the data segment) before the timed run.
        client.insert(item(rng.random(), width), priorities={table: 1.0}, timeout=5)
        ready.set()
        if not go.wait(20):
            raise RuntimeError("never told to go")
        count = 1
        values = rng.random(1024) + seed  # distinct per writer
        while not stop.is_set():
            for _ in range(16):
                client.insert(item(values[count % 1024] + count, width),
                              priorities={table: 1.0}, timeout=5)
                count += 1
    queue.put(("count", count))


@_guard
def blocked_sampler(name, table, timeout, ready, queue):
    """Signals ``ready``, then blocks in ``sample_batch``; reports the time it woke."""
    import shmreplay
    from shmreplay import errors
    warm_kernels()
    with shmreplay.Client(name) as client:
        client.server_info()  # everything mapped before we block
        ready.set()
        start = time.monotonic()
        try:
            sample = client.sample_batch(table, 4, timeout=timeout)
        except errors.ShmReplayError as exc:
            queue.put(("raised", (type(exc).__name__, start, time.monotonic())))
            return
        queue.put(("sampled", (start, time.monotonic(),
                               np.asarray(sample.data["v"]).tolist())))


@_guard
def blocked_inserter(name, table, value, timeout, ready, queue):
    """Signals ``ready``, then inserts (blocking on the rate limiter); reports when done."""
    import shmreplay
    from shmreplay import errors
    warm_kernels()
    with shmreplay.Client(name) as client:
        client.server_info()
        ready.set()
        start = time.monotonic()
        try:
            client.insert({"x": np.full(8, value, np.float64), "v": np.int64(value)},
                          priorities={table: 1.0}, timeout=timeout)
        except errors.ShmReplayError as exc:
            queue.put(("raised", (type(exc).__name__, start, time.monotonic())))
            return
        queue.put(("inserted", (start, time.monotonic())))


@_guard
def priority_inserter(name, table, count, seed, ready, go, queue):
    """Inserts ``count`` items with random priorities (singly and in batches of 8)."""
    import shmreplay
    rng = np.random.default_rng(seed)
    with shmreplay.Client(name) as client:
        ready.set()
        if not go.wait(20):
            raise RuntimeError("never told to go")
        done = 0
        while done < count:
            if done % 3 == 0 and count - done >= 8:
                client.insert_batch({"x": np.full((8, 8), seed, np.float64),
                                     "v": np.full(8, seed, np.int64)},
                                    priorities={table: rng.random(8) * 10}, timeout=5)
                done += 8
            else:
                client.insert({"x": np.full(8, seed, np.float64), "v": np.int64(seed)},
                              priorities={table: float(rng.random() * 10)}, timeout=5)
                done += 1
    queue.put(("inserted", done))


@_guard
def priority_updater(name, table, seed, ready, go, stop, queue):
    """Samples batches and rewrites their priorities until ``stop`` is set."""
    import shmreplay
    rng = np.random.default_rng(seed)
    updates = 0
    with shmreplay.Client(name) as client:
        ready.set()
        if not go.wait(20):
            raise RuntimeError("never told to go")
        while not stop.is_set():
            sample = client.sample_batch(table, 16, timeout=5)
            keys = sample.info.key
            if updates % 2:
                client.update_priorities(table, keys, rng.random(len(keys)) * 10)
            else:
                client.mutate_priorities(
                    table, updates={int(k): float(p) for k, p in zip(keys, rng.random(len(keys)))})
            updates += 1
    queue.put(("updates", updates))


# --------------------------------------------------------------------------------------
# crash workers
# --------------------------------------------------------------------------------------

@_guard
def hold_lock_forever(name, table, may_lock, locked, queue):
    """After ``may_lock``, takes the table's robust mutex directly, signals ``locked``,
    and sleeps (until the test SIGKILLs it)."""
    import shmreplay
    client = shmreplay.Client(name)
    engine = client._buffer.by_name[table]
    if not may_lock.wait(20):
        raise RuntimeError("never told to lock")
    libc = ctypes.CDLL(None)
    result = libc.pthread_mutex_lock(ctypes.c_void_p(engine.ctrl.ctypes.data))
    if result != 0:
        raise OSError(result, "pthread_mutex_lock failed")
    locked.set()
    time.sleep(60)


@_guard
def insert_when_told(name, table, value, ready, go, queue):
    """Attaches, signals ``ready``, waits for ``go``, inserts once; reports when done."""
    import shmreplay
    warm_kernels()
    with shmreplay.Client(name) as client:
        client.server_info()
        engine = client._buffer.by_name[table]
        engine.has_columns()
        ready.set()
        if not go.wait(20):
            raise RuntimeError("never told to go")
        start = time.monotonic()
        client.insert({"x": np.full(8, value, np.float64), "v": np.int64(value)},
                      priorities={table: 1.0}, timeout=5)
        queue.put(("inserted", (start, time.monotonic())))


@_guard
def reserve_and_die(name, table, queue):
    """Reserves one slot (state WRITING) and SIGKILLs itself before committing it."""
    import shmreplay
    client = shmreplay.Client(name)
    engine = client._buffer.by_name[table]
    engine.has_columns()  # (maps the stores the parent's first item made, as inserts do)
    slots = engine.reserve(1, 5)
    # Half of a write: the slot holds garbage that must never be seen.
    if engine.has_columns():
        engine.columns[0][slots[0]] = -12345.0
    queue.put(("reserved", int(slots[0])))
    queue.close()
    queue.join_thread()  # the message is in the pipe before we die
    os.kill(os.getpid(), signal.SIGKILL)


@_guard
def insert_loop(name, table, width, seed, ready, queue):
    """Inserts checksummed items in a tight loop until killed."""
    import shmreplay
    rng = np.random.default_rng(seed)
    client = shmreplay.Client(name)
    client.insert(item(seed, width), priorities={table: 1.0}, timeout=5)
    ready.set()
    i = 0
    values = rng.random(4096) * 1000
    while True:
        client.insert(item(values[i % 4096], width), priorities={table: float(values[i % 4096])},
                      timeout=5)
        if i % 4 == 0:
            value = values[(i + 1) % 4096]
            client.insert_batch({"x": np.full((4, width), value, np.float64),
                                 "v": np.full(4, value, np.float64)},
                                priorities={table: 1.0}, timeout=5)
        i += 1


# --------------------------------------------------------------------------------------
# lifecycle workers
# --------------------------------------------------------------------------------------

_KEEP = []  # keeps a Server reachable until interpreter exit


def make_server(name):
    """A Server with a signed table and an unsigned one; inserts one item into each, so
    every segment exists (a table's data segment is made by its first item)."""
    import shmreplay
    from shmreplay import rate_limiters, selectors
    from shmreplay.specs import TensorSpec
    signed = shmreplay.Table("signed", selectors.Uniform(), selectors.Fifo(), 16,
                             rate_limiters.MinSize(1),
                             signature={"x": TensorSpec((8,), np.float64)})
    unsigned = shmreplay.Table.queue("unsigned", 16)
    server = shmreplay.Server([signed, unsigned], name=name)
    client = server.localhost_client()
    client.insert({"x": np.zeros(8)}, priorities={"signed": 1.0}, timeout=5)
    client.insert({"y": np.ones(3, np.int32)}, priorities={"unsigned": 1.0}, timeout=5)
    client.close()
    return server


@_guard
def owner_returns(name, keep, ready, queue):
    """Creates a Server and returns without stopping it."""
    server = make_server(name)
    if keep:
        _KEEP.append(server)
    ready.set()


def owner_raises(name, ready, queue):
    """Creates a Server and dies of an uncaught exception (not reported on ``queue``)."""
    server = make_server(name)
    _KEEP.append(server)
    ready.set()
    raise RuntimeError("owner died of an uncaught exception (expected by the test)")


def owner_waits(name, ready, queue):
    """Creates a Server, signals ``ready``, and sleeps until a signal ends the process
    (reports ``("timeout", None)`` if none came)."""
    server = make_server(name)
    _KEEP.append(server)
    ready.set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.05)
    queue.put(("timeout", None))


@_guard
def client_after_stop(name, table, ready, go, queue):
    """Attaches, inserts and samples, then after ``go`` reports what insert/sample raise."""
    import shmreplay
    client = shmreplay.Client(name)
    client.insert({"x": np.zeros(8)}, priorities={table: 1.0}, timeout=5)
    client.sample_batch(table, 1, timeout=5)
    ready.set()
    if not go.wait(20):
        raise RuntimeError("never told to go")
    outcomes = []
    for call in (lambda: client.insert({"x": np.zeros(8)}, priorities={table: 1.0}, timeout=1),
                 lambda: client.sample_batch(table, 1, timeout=1),
                 lambda: next(client.sample(table, 1, timeout=1))):
        try:
            call()
            outcomes.append("no error")
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    client.close()
    queue.put(("outcomes", outcomes))


@_guard
def forked_child(server, client, table, queue):
    """In a forked child of the owner: uses the inherited objects, then tries every
    way an exiting process could clean up (all must leave the owner's buffer alone)."""
    import gc
    from shmreplay import server as server_module
    client.insert({"x": np.full(8, 7.0)}, priorities={table: 1.0}, timeout=5)
    server.stop()                  # not the owner: must be a no-op
    server_module._stop_all()      # what the atexit / signal hooks run at exit
    server.__del__()               # what garbage collection runs
    del server
    gc.collect()
    queue.put(("done", os.getpid()))


@_guard
def owner_forks(name, queue):
    """Creates a Server, then ``os.fork()``s a child that exits through a full interpreter
    shutdown (SystemExit -> atexit hooks, garbage collection); reports what is left."""
    import shmreplay
    server = make_server(name)
    _KEEP.append(server)
    before = shm_objects(name)
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            with shmreplay.Client(name) as client:
                client.insert({"x": np.full(8, 5.0)}, priorities={"signed": 1.0}, timeout=5)
            code = 0
        finally:
            sys.exit(code)  # unwinds into multiprocessing's bootstrap, then interpreter exit
    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise RuntimeError("the forked child did not exit")
    after = shm_objects(name)
    with shmreplay.Client(name) as client:
        size = client.server_info()["signed"].current_size
        client.insert({"x": np.zeros(8)}, priorities={"signed": 1.0}, timeout=5)
    queue.put(("forked", (os.waitstatus_to_exitcode(status), before, after, size)))


def forked_child_sigterm(ready, queue):
    """In a forked child of the owner: waits to be SIGTERMed (inherited handlers run)."""
    ready.set()
    time.sleep(30)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("helper module for the tests")

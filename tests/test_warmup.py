"""Kernels compile once per machine, before actors need them (``shmreplay._ops.warmup``).

The cold-cache test compiles every kernel into an empty numba cache (about 20 s of CPU
on 2 cores); it is the one test here that pays that, and it checks several things at
once: three processes that create a Server at the same moment compile once between
them, the others wait and load; afterwards, a fresh process making every kind of call
compiles nothing. The other tests use the session's warm cache.
"""

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import _names
import shmreplay

ROOT = Path(__file__).resolve().parents[1]

# Counts the kernels numba compiles (cache misses; loading from the cache is no event).
_COUNT_COMPILES = """
import json, sys
from numba.core import event
compiled = []
class _Listener(event.Listener):
    def on_start(self, e):
        compiled.append(e.data["dispatcher"].py_func.__name__)
    def on_end(self, e):
        pass
event.register("numba:compile", _Listener())
"""

_CREATE_SERVER = _COUNT_COMPILES + """
import shmreplay
server = shmreplay.Server([shmreplay.Table.queue("q", 4)], name=sys.argv[1])
server.stop()
print(json.dumps(compiled))
"""

# Every kind of call, with data unlike the warm-up's (other dtypes, nests, sizes).
_EVERY_CALL = _COUNT_COMPILES + """
import collections, os, tempfile
import numpy as np
import shmreplay
from shmreplay import rate_limiters, selectors
Step = collections.namedtuple("Step", "obs reward")
tables = [shmreplay.Table("p", selectors.Prioritized(1.0), selectors.Fifo(), 100,
                          rate_limiters.SampleToInsertRatio(2.0, 1, 50.0)),
          shmreplay.Table("u", selectors.Lifo(), selectors.MaxHeap(), 100,
                          rate_limiters.MinSize(1), max_times_sampled=2),
          shmreplay.Table("s", selectors.MinHeap(), selectors.Fifo(), 100,
                          rate_limiters.MinSize(1)),
          shmreplay.Table("frames", selectors.Uniform(), selectors.Fifo(), 100,
                          rate_limiters.MinSize(1))]
with shmreplay.Server(tables, name=sys.argv[1]) as server:
    client = shmreplay.Client(server.name)
    item = {"o": {"x": np.ones((3, 5), np.float64)}, "r": np.int32(2)}
    client.insert(item, priorities={"p": 0.5, "u": 1.0})
    client.insert_batch({"o": {"x": np.ones((7, 3, 5))}, "r": np.arange(7, dtype=np.int32)},
                        priorities={"p": np.linspace(1, 2, 7), "u": 1.0}, timeout=5)
    batch = client.sample_batch("p", 5, timeout=5)
    client.update_priorities("p", batch.info.key, np.full(5, 3.0))
    client.mutate_priorities("u", deletes=[int(client.sample_batch("u", 1).info.key[0])])
    list(client.sample("u", 3, timeout=5))
    with client.trajectory_writer(4) as writer:
        for t in range(6):
            writer.append(Step(np.full(2, t, np.float32), float(t)))
            if t >= 3:
                writer.create_item("s", 1.0, Step(writer.history.obs[-3:],
                                                  writer.history.reward[-2]))
        writer.end_episode(timeout_ms=5000)
    client.sample_batch("s", 2, timeout=5)
    client.insert_batch(np.zeros((50, 64, 64), np.uint8), priorities={"frames": 1.0})
    client.sample_batch("frames", 100, timeout=5)  # 400 KiB: a batch in fresh arrays
    client.server_info()
    client.verify("p")
    client.checkpoint(os.path.join(tempfile.mkdtemp(), "c.ckpt"))
    client.reset("s")
    client.close()
print(json.dumps(compiled))
"""


def _python(code, cache, *args, timeout=900):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=900):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out + err
    return json.loads(out.strip().splitlines()[-1]), err


@pytest.mark.slow
def test_a_cold_machine_compiles_once_and_then_no_process_compiles():
    with tempfile.TemporaryDirectory(prefix="shmreplay-test-numba-") as cache:
        # Two owners and `shmreplay compile` start at once on an empty cache.
        procs = [_python(_CREATE_SERVER, cache, _names.unique("cold")) for _ in range(2)]
        cli = subprocess.Popen([sys.executable, "-m", "shmreplay.cli", "compile"],
                               env=dict(os.environ, NUMBA_CACHE_DIR=cache), cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = [_finish(proc) for proc in procs]
        out, err = cli.communicate(timeout=900)
        assert cli.returncode == 0, out + err
        results.append((re.match(r"compiled (\d+) of \1 kernels", out) is not None, err))
        compiling = [(compiled, err) for compiled, err in results if compiled]
        # Exactly one process compiled; it said so, with an estimate.
        assert len(compiling) == 1, results
        assert "compiling kernels, first run only: ~" in compiling[0][1]
        assert "failed" not in compiling[0][1], compiling[0][1]
        for compiled, err in results:
            if not compiled:  # it waited for the compiling one (and may have said so)
                assert "first run only: ~" not in err, err
        if not results[-1][0]:
            assert re.match(r"all \d+ kernels were already compiled", out), out
        # The warm-up reached every kernel that Python calls.
        probe = ("import json; from shmreplay._shm.kernels import _jit, table; "
                 "print(json.dumps([d.py_func.__name__ for d in _jit.uncached(table)]))")
        assert _finish(_python(probe, cache))[0] == []
        # A fresh process making every kind of call compiles nothing.
        compiled, err = _finish(_python(_EVERY_CALL, cache, _names.unique("every")))
        assert compiled == [], compiled
        assert "compiling" not in err, err


def test_a_warm_cache_is_reported_complete_and_nothing_is_compiled():
    # The session fixture warmed the cache; a new process only reads the index files.
    code = _COUNT_COMPILES + textwrap.dedent("""
        import shmreplay
        report = shmreplay.warm_up()
        print(json.dumps([report.compiled, report.kernels, compiled]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    compiled_here, kernels, compiled = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (compiled_here, compiled) == (0, [])
    assert kernels > 20
    assert "compiling" not in proc.stderr


def test_python_calls_only_entry_points():
    """The cache probe checks only ``_jit.entry_points(table)``: a kernel that Python calls
    outside that set would be invisible to it (and compile lazily in every process)."""
    import ast
    from shmreplay._shm.kernels import _jit, table
    entry = {d.py_func.__name__ for d in _jit.entry_points(table)}
    called = set()
    for path in (ROOT / "shmreplay").rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = {a.asname or a.name for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) and node.module == "shmreplay._shm.kernels"
                   for a in node.names if a.name == "table"}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.islower()
                    and not node.attr.startswith(("OUT_", "GATHER", "LAYOUT"))):
                called.add(node.attr)
    assert called, "found no kernel calls: the scan is broken"
    assert called <= entry | {"BROKEN"}, sorted(called - entry)


def test_a_stopped_lock_holder_delays_a_compile_by_the_bound_only(monkeypatch):
    """A process stopped while holding the compile lock (Ctrl-Z, a debugger) holds the
    others back until it has made no progress for ``STALL`` seconds, not forever; they
    then go on without it. A warm process does not wait at all."""
    from shmreplay._shm.kernels import _jit
    lock_path = os.path.join(_jit.cache_directory(), _jit.LOCK_NAME)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, signal
            fd = os.open({lock_path!r}, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            print("locked", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        # Loading a cached kernel takes no lock (this process has none loaded yet).
        probe = subprocess.run(
            [sys.executable, "-c", "import shmreplay._shm.kernels.table as k; k.seed(1)"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert probe.returncode == 0 and "waiting" not in probe.stderr, probe.stderr
        monkeypatch.setattr(_jit, "STALL", 0.5)
        start = time.monotonic()
        with _jit.machine_lock():
            waited = time.monotonic() - start
        assert 0.5 <= waited < 30, waited
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    # Its death released the lock: the next process takes it at once.
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_the_lock_is_reentrant_and_a_symlinked_lock_file_is_not_followed(tmp_path,
                                                                           monkeypatch):
    from shmreplay._shm.kernels import _jit
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    directory = tmp_path / "cache"
    directory.mkdir()
    (directory / _jit.LOCK_NAME).symlink_to(target)
    monkeypatch.setattr(_jit, "_directory", str(directory))
    with _jit.machine_lock():           # no lock to have: goes on at once
        with _jit.machine_lock():
            pass
    assert target.read_text() == "keep"
    (directory / _jit.LOCK_NAME).unlink()
    with _jit.machine_lock():
        with _jit.machine_lock():       # the same process again: no self-deadlock
            assert _jit._state["depth"] == 2
        fd = os.open(directory / _jit.LOCK_NAME, os.O_RDWR)
        try:                            # still held by the outer level
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert _jit._state["depth"] == 0 and _jit._state["fd"] is None


def test_a_failing_warm_up_does_not_fail_the_server(monkeypatch, buffer_name, caplog):
    """Compiling ahead is an optimization: if the scratch run fails (say /dev/shm is
    full), the Server is still created and its kernels compile at first use."""
    from shmreplay._ops import warmup as _warmup
    from shmreplay._shm.kernels import _jit

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_warmup, "_complete", False)
    monkeypatch.setattr(_jit, "uncached", lambda module: ["a kernel"])
    monkeypatch.setattr(_warmup, "_call_every_kernel", full)
    with caplog.at_level("WARNING", logger="shmreplay"):
        with shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name) as server:
            client = server.localhost_client()
            client.insert(np.zeros(2), {"q": 1.0}, timeout=5)
            assert client.sample_batch("q", 1, timeout=5).data.shape == (1, 2)
            client.close()
    assert "compiling the kernels ahead of use failed (OSError" in caplog.text


def test_importing_shmreplay_loads_no_numba():
    code = ("import sys, shmreplay, shmreplay.table, shmreplay.specs; "
            "print('numba' in sys.modules, 'shmreplay.client' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.split() == ["False", "False"], proc.stdout + proc.stderr

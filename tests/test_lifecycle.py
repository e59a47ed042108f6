"""No leaks (DESIGN invariant 7): the owner removes every segment it created when it
stops, leaves a ``with`` block, or exits (normally, by an uncaught exception, by SIGTERM
or SIGINT); other processes then see ``BufferBrokenError`` / ``BufferNotFoundError``.
A forked child of the owner never removes the owner's buffer; a SIGKILLed owner
cannot clean up, and its segments stay until removed by name.

Segments are checked in /dev/shm itself, not through the library.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import posix_ipc
import pytest

import _mp_workers as W
import shmreplay
from shmreplay._shm import layout as L
from shmreplay import errors
from shmreplay.specs import TensorSpec

pytestmark = pytest.mark.slow

SPAWN = multiprocessing.get_context("spawn")
X8 = {"x": TensorSpec((8,), np.float64)}



def _segments(name):
    return W.shm_objects(name)


def _all_removed(name, timeout=30.0):
    """True once no /dev/shm entry of ``name`` is left (polls up to ``timeout``: returns as
    soon as they are gone, and a busy machine may run an exiting owner late)."""
    return W.wait_until(lambda: not _segments(name), timeout)


def _expected_segments(name):
    # The header segment and one data segment per table (made by each table's first item).
    # (Compared with ``W.segment_kinds``: each data segment's name ends with a random token.)
    return [f"shmreplay.{name}", f"shmreplay.{name}:t0", f"shmreplay.{name}:t1"]


def _table(name="t", signature=X8):
    return shmreplay.Table.queue(name, 16, signature=signature)


# --------------------------------------------------------------------------------------
# the owner stops the buffer in-process
# --------------------------------------------------------------------------------------

def test_stop_removes_every_segment(buffer_name):
    server = shmreplay.Server([_table("signed"), _table("unsigned", None)], name=buffer_name)
    try:
        client = server.localhost_client()
        client.insert({"y": np.arange(3)}, priorities={"unsigned": 1.0}, timeout=5)
        client.insert({"x": np.zeros(8)}, priorities={"signed": 1.0}, timeout=5)
        client.close()
        assert W.segment_kinds(_segments(buffer_name)) == _expected_segments(buffer_name)
    finally:
        server.stop()
    assert _all_removed(buffer_name), _segments(buffer_name)
    assert server.stopped


def test_with_block_removes_every_segment(buffer_name):
    with shmreplay.Server([_table("signed"), _table("unsigned", None)],
                          name=buffer_name) as server:
        with server.localhost_client() as client:
            client.insert({"y": np.arange(3)}, priorities={"unsigned": 1.0}, timeout=5)
            client.insert({"x": np.zeros(8)}, priorities={"signed": 1.0}, timeout=5)
        assert W.segment_kinds(_segments(buffer_name)) == _expected_segments(buffer_name)
    assert _all_removed(buffer_name), _segments(buffer_name)


def test_with_block_left_by_an_exception_removes_every_segment(buffer_name):
    with pytest.raises(KeyError):
        with shmreplay.Server([_table()], name=buffer_name):
            assert _segments(buffer_name)
            raise KeyError("boom")
    assert _all_removed(buffer_name), _segments(buffer_name)


def test_stop_twice_is_fine(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        server.stop()
        server.stop()
        assert server.stopped
    server.stop()
    assert _all_removed(buffer_name)


def test_attach_after_stop_raises_buffer_not_found(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        shmreplay.Client(server.name).close()
    with pytest.raises(errors.BufferNotFoundError):
        shmreplay.Client(buffer_name).server_info(timeout=0)
    # Also from a process that never saw the buffer.
    script = ("import shmreplay, sys\n"
              "try:\n    shmreplay.Client(sys.argv[1]).server_info(timeout=0)\n"
              "except shmreplay.errors.BufferNotFoundError:\n    print('not found')\n")
    result = subprocess.run([sys.executable, "-c", script, buffer_name],
                            capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "not found", result.stderr


def test_a_client_of_a_stopped_buffer_is_not_fooled_by_a_new_one_of_that_name(buffer_name):
    old_server = shmreplay.Server([_table("unsigned", None)], name=buffer_name)
    old = shmreplay.Client(buffer_name)
    try:
        old.insert({"y": np.arange(3)}, priorities={"unsigned": 1.0}, timeout=5)
        old_server.stop()
        with shmreplay.Server([_table("unsigned", None)], name=buffer_name):
            # The old client still maps the stopped buffer: it must say so, not report
            # the dead buffer's contents as if they were the new one's.
            with pytest.raises(errors.BufferBrokenError, match="stopped"):
                old.server_info()
            with pytest.raises(errors.BufferBrokenError):
                old.insert({"y": np.arange(3)}, priorities={"unsigned": 1.0}, timeout=1)
            with shmreplay.Client(buffer_name) as new:
                assert new.server_info()["unsigned"].current_size == 0
    finally:
        old.close()
        old_server.stop()


# --------------------------------------------------------------------------------------
# the owner is another process that exits
# --------------------------------------------------------------------------------------

def _run_owner(target, name, *extra):
    """Starts an owner process; returns it once its buffer exists (all its segments)."""
    queue, ready = SPAWN.Queue(), SPAWN.Event()
    proc = SPAWN.Process(target=target, args=(name, *extra, ready, queue))
    proc.start()
    try:
        assert ready.wait(20), "the owner did not start"
        assert W.wait_until(
            lambda: W.segment_kinds(_segments(name)) == _expected_segments(name), 30), \
            _segments(name)
    except BaseException:
        proc.kill()
        proc.join(5)
        raise
    return proc, queue


@pytest.mark.parametrize("keep", [False, True], ids=["server-collected", "server-kept-global"])
def test_owner_returning_without_stop_removes_every_segment(buffer_name, keep):
    proc, queue = _run_owner(W.owner_returns, buffer_name, keep)
    try:
        proc.join(10)
        assert proc.exitcode == 0, None if queue.empty() else queue.get(timeout=1)
        assert _all_removed(buffer_name), _segments(buffer_name)
    finally:
        proc.kill()
        proc.join(5)


def test_owner_dying_of_uncaught_exception_removes_every_segment(buffer_name):
    proc, _ = _run_owner(W.owner_raises, buffer_name)
    try:
        proc.join(10)
        assert proc.exitcode == 1  # the exception killed it
        assert _all_removed(buffer_name), _segments(buffer_name)
    finally:
        proc.kill()
        proc.join(5)


def test_owner_script_exit_and_uncaught_exception_remove_every_segment(buffer_name):
    # An owner that is a plain interpreter (no multiprocessing machinery around it).
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[3])
        import _mp_workers
        server = _mp_workers.make_server(sys.argv[1])
        print(len(_mp_workers.shm_objects(sys.argv[1])), flush=True)
        if sys.argv[2] == "raise":
            raise RuntimeError("uncaught (expected by the test)")
    """)
    tests_dir = os.path.dirname(os.path.abspath(W.__file__))
    for mode, code in (("return", 0), ("raise", 1)):
        name = f"{buffer_name}-{mode}"
        result = subprocess.run([sys.executable, "-c", script, name, mode, tests_dir],
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == code, result.stderr
        assert result.stdout.strip() == "3", (mode, result.stdout, result.stderr)
        assert _all_removed(name), (mode, _segments(name))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_owner_killed_by_signal_removes_every_segment(buffer_name, signum):
    proc, queue = _run_owner(W.owner_waits, buffer_name)
    client = None
    try:
        client = shmreplay.Client(buffer_name)
        assert client.server_info()["signed"].current_size == 1
        os.kill(proc.pid, signum)
        proc.join(10)
        assert proc.exitcode is not None, "the owner ignored the signal"
        if signum == signal.SIGTERM:
            assert proc.exitcode == -signal.SIGTERM  # it still dies by the signal
        else:
            assert proc.exitcode != 0  # KeyboardInterrupt
        assert queue.empty(), queue.get(timeout=1)  # it did not just time out
        assert _all_removed(buffer_name), _segments(buffer_name)
        # A client attached in this process learns that the owner is gone.
        with pytest.raises(errors.BufferBrokenError):
            client.insert({"x": np.ones(8)}, priorities={"signed": 1.0}, timeout=1)
        with pytest.raises(errors.BufferBrokenError):
            client.sample_batch("signed", 1, timeout=1)
    finally:
        if client is not None:
            client.close()
        proc.kill()
        proc.join(5)


def test_a_caught_ctrl_c_or_a_handled_sigterm_leaves_the_buffer_alone(buffer_name):
    # A notebook's "interrupt" is a SIGINT the kernel catches; a trainer may handle
    # SIGTERM to save its work. Neither may cost the owner its buffer; exiting still
    # removes it.
    script = textwrap.dedent("""
        import os, signal, sys, time
        sys.path.insert(0, sys.argv[2])
        import numpy as np
        import _mp_workers
        handled = []
        signal.signal(signal.SIGTERM, lambda signum, frame: handled.append(signum))
        server = _mp_workers.make_server(sys.argv[1])
        client = server.localhost_client()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("handled", handled == [signal.SIGTERM], flush=True)
        client.insert({"x": np.ones(8)}, priorities={"signed": 1.0}, timeout=1)
        print("size", client.server_info()["signed"].current_size, flush=True)
        print("stopped", server.stopped, flush=True)
    """)
    tests_dir = os.path.dirname(os.path.abspath(W.__file__))
    result = subprocess.run([sys.executable, "-c", script, buffer_name, tests_dir],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:4] == ["interrupted", "handled True", "size 2",
                                             "stopped False"], result.stdout
    assert _all_removed(buffer_name), _segments(buffer_name)  # removed at exit


def test_sigkilled_owner_leaves_its_segments_behind(buffer_name):
    proc, _ = _run_owner(W.owner_waits, buffer_name)
    try:
        assert W.kill_and_reap(proc) == -signal.SIGKILL
        time.sleep(0.3)
        leftovers = _segments(buffer_name)
        assert W.segment_kinds(leftovers) == _expected_segments(buffer_name)
    finally:
        proc.kill()
        proc.join(5)
        for entry in _segments(buffer_name):
            posix_ipc.unlink_shared_memory("/" + entry)
    assert not _segments(buffer_name)


# --------------------------------------------------------------------------------------
# other processes when the owner stops
# --------------------------------------------------------------------------------------

def test_client_in_other_process_gets_buffer_broken_after_stop(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        queue, ready, go = SPAWN.Queue(), SPAWN.Event(), SPAWN.Event()
        child = SPAWN.Process(target=W.client_after_stop,
                              args=(server.name, "t", ready, go, queue))
        with W.processes(child):
            assert ready.wait(20)
            server.stop()
            assert _all_removed(buffer_name)
            go.set()
            outcomes = W.get(queue, 10, "outcomes")
            child.join(10)
    assert outcomes == ["BufferBrokenError"] * 3
    assert child.exitcode == 0


def test_blocked_sampler_in_other_process_is_woken_by_stop(buffer_name):
    server = shmreplay.Server([_table()], name=buffer_name)
    try:
        engine = server._tables[0]._engine
        queue, ready = SPAWN.Queue(), SPAWN.Event()
        child = SPAWN.Process(target=W.blocked_sampler, args=(server.name, "t", 10, ready, queue))
        with W.processes(child):
            assert ready.wait(20)
            assert W.wait_until(lambda: engine.ctrl[L.C_ITEMS_WAITERS] >= 1, 60)
            time.sleep(0.1)
            stopped_at = time.monotonic()
            server.stop()
            kind, start, woke_at = W.get(queue, 10, "raised")
            child.join(10)
        assert kind == "BufferBrokenError"
        assert woke_at - stopped_at < 1.0, f"woke {woke_at - stopped_at:.3f} s after stop"
        assert child.exitcode == 0
    finally:
        server.stop()
    assert _all_removed(buffer_name)


def test_blocked_inserter_in_other_process_is_woken_by_stop(buffer_name):
    table = shmreplay.Table.queue("t", 1, signature={"x": TensorSpec((8,), np.float64),
                                                     "v": TensorSpec((), np.int64)})
    server = shmreplay.Server([table], name=buffer_name)
    try:
        engine = table._engine
        with server.localhost_client() as client:
            client.insert({"x": np.zeros(8), "v": np.int64(0)}, priorities={"t": 1.0}, timeout=5)
        queue, ready = SPAWN.Queue(), SPAWN.Event()
        child = SPAWN.Process(target=W.blocked_inserter,
                              args=(server.name, "t", 1, 10, ready, queue))
        with W.processes(child):
            assert ready.wait(20)
            assert W.wait_until(lambda: engine.ctrl[L.C_SPACE_WAITERS] >= 1, 60)
            stopped_at = time.monotonic()
            server.stop()
            kind, start, woke_at = W.get(queue, 10, "raised")
            child.join(10)
        assert kind == "BufferBrokenError"
        assert woke_at - stopped_at < 1.0
    finally:
        server.stop()
    assert _all_removed(buffer_name)


# --------------------------------------------------------------------------------------
# forked children of the owner
# --------------------------------------------------------------------------------------

FORK = multiprocessing.get_context("fork")


def test_forked_child_exiting_does_not_remove_the_owners_buffer(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = server.localhost_client()
        try:
            # The table's first item makes its data segment; the queue gives it back.
            client.insert({"x": np.zeros(8)}, priorities={"t": 1.0}, timeout=5)
            client.sample_batch("t", 1, timeout=2)
            before = _segments(buffer_name)
            assert W.segment_kinds(before) == [f"shmreplay.{buffer_name}",
                                               f"shmreplay.{buffer_name}:t0"]
            queue = FORK.Queue()
            child = FORK.Process(target=W.forked_child, args=(server, client, "t", queue))
            with W.processes(child):
                pid = W.get(queue, 10, "done")
                child.join(10)
            assert pid != os.getpid() and child.exitcode == 0
            time.sleep(0.2)
            assert _segments(buffer_name) == before
            assert not server.stopped
            # The buffer still works, and holds what the child inserted.
            sample = client.sample_batch("t", 1, timeout=2)
            assert np.all(sample.data["x"] == 7.0)
            client.insert({"x": np.ones(8)}, priorities={"t": 1.0}, timeout=2)
            with shmreplay.Client(buffer_name) as other:
                assert other.server_info()["t"].current_size == 1
        finally:
            client.close()
    assert _all_removed(buffer_name)


def test_forked_child_killed_by_sigterm_does_not_remove_the_owners_buffer(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        before = _segments(buffer_name)
        queue, ready = FORK.Queue(), FORK.Event()
        child = FORK.Process(target=W.forked_child_sigterm, args=(ready, queue))
        with W.processes(child):
            assert ready.wait(10)
            os.kill(child.pid, signal.SIGTERM)  # runs the inherited cleanup handler
            child.join(10)
        assert child.exitcode == -signal.SIGTERM
        time.sleep(0.2)
        assert _segments(buffer_name) == before
        with server.localhost_client() as client:
            client.insert({"x": np.ones(8)}, priorities={"t": 1.0}, timeout=2)
            assert client.sample_batch("t", 1, timeout=2).data["x"].tolist() == [[1.0] * 8]
    assert _all_removed(buffer_name)


def test_forked_child_exiting_through_interpreter_shutdown_keeps_the_buffer(buffer_name):
    # The owner is a spawned process that os.fork()s; the child exits like any Python
    # program (atexit hooks, garbage collection). Only the owner's own exit removes it.
    queue = SPAWN.Queue()
    owner = SPAWN.Process(target=W.owner_forks, args=(buffer_name, queue))
    with W.processes(owner):
        status, before, after, size = W.get(queue, 20, "forked")
        owner.join(10)
    assert status == 0
    assert W.segment_kinds(before) == _expected_segments(buffer_name)
    assert after == before, "the forked child removed its parent's buffer"
    assert size == 2  # make_server's item and the child's insert
    assert owner.exitcode == 0
    assert _all_removed(buffer_name), _segments(buffer_name)


def test_close_from_another_thread_gives_concurrent_calls_closed_error(buffer_name):
    """A Client closed by one thread while others use it: their calls end with
    ClosedError (never a TypeError from a dropped view), and a call blocked on the rate
    limiter ends too, within a wait slice."""
    import threading
    table = shmreplay.Table.queue("q", 100, signature=X8)
    with shmreplay.Server([table, shmreplay.Table.queue("empty", 10, signature=X8)],
                          name=buffer_name):
        client = shmreplay.Client(buffer_name)
        outcomes = {"busy": [], "blocked": []}
        started = threading.Barrier(3)

        def busy():
            started.wait(10)
            try:
                while True:
                    client.insert({"x": np.zeros(8)}, {"q": 1.0}, timeout=1)
                    client.sample_batch("q", 1, timeout=1)
                    client.update_priorities("q", np.zeros(0, np.uint64), np.zeros(0))
            except Exception as exc:  # noqa: BLE001 (the type is the point)
                outcomes["busy"].append(exc)

        def blocked():
            started.wait(10)
            try:
                client.sample_batch("empty", 1)  # waits for an item without limit
            except Exception as exc:  # noqa: BLE001
                outcomes["blocked"].append(exc)

        threads = [threading.Thread(target=busy), threading.Thread(target=blocked)]
        for thread in threads:
            thread.start()
        started.wait(10)
        time.sleep(0.3)
        client.close()
        for thread in threads:
            thread.join(5)
            assert not thread.is_alive(), "a call did not end after close()"
        for kind, errors_seen in outcomes.items():
            assert len(errors_seen) == 1 and isinstance(errors_seen[0], errors.ClosedError), \
                (kind, errors_seen)


def test_sigterm_while_the_owner_compiles_its_kernels_removes_the_buffer(buffer_name, tmp_path):
    """A Server's first process on a machine compiles the kernels (an empty numba cache)
    on a scratch buffer of its own, its main thread inside LLVM holding numba's and
    LLVM's locks. SIGTERM's thread then stops that Server without loading a kernel (it
    waited for those locks: a deadlock, and the process ignored SIGTERM), and the
    process dies by the signal, leaving nothing behind."""
    code = textwrap.dedent(f"""
        import time, shmreplay
        server = shmreplay.Server([shmreplay.Table.queue("q", 4)], name={buffer_name!r})
        time.sleep(600)
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    scratch = f"{L.SEGMENT_PREFIX}warmup-{proc.pid}-"

    def scratch_segments():
        return [n for n in os.listdir("/dev/shm") if n.startswith(scratch)]
    try:
        deadline = time.monotonic() + 120
        while not scratch_segments() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        assert scratch_segments(), "the owner did not start compiling on its scratch buffer"
        time.sleep(1.0)  # (inside the first compilations, which take tens of seconds)
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail("the owner did not end within 20 s of SIGTERM while compiling")
        assert proc.returncode == -signal.SIGTERM, proc.communicate()
        assert scratch_segments() == []
        assert _all_removed(buffer_name), _segments(buffer_name)
    finally:
        proc.kill()
        proc.wait(5)

"""What an operator (or a damaged buffer) can do to a buffer, and what shmreplay does about
it (issue 18): odd files under /dev/shm, buffers removed by ``gc``/``rm`` while processes
use them, ``gc`` while servers start, ``verify`` on corrupt control words, and numbers
out of range.
"""

import io
import json
import os
import select
import subprocess
import sys

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors


def _table(name="t", max_size=10):
    return shmreplay.Table(name, selectors.Prioritized(0.5), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1))


def _snapshot(client, table="t"):
    """Everything a refused call must leave as it was: keys, priorities, counters."""
    info = client.server_info()[table]
    items = client._engine(table).ctrl.copy()
    return info.current_size, info.num_inserted, info.num_deleted, items.tobytes()


# --- point 13: numbers out of range ----------------------------------------------------

@pytest.mark.parametrize("key, error", [(-1, ValueError), (2**64, ValueError),
                                        ("1", TypeError), (1.5, TypeError), (True, TypeError)])
def test_mutate_priorities_refuses_keys_out_of_range(buffer_name, key, error):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"x": np.zeros(2)}, {"t": 1.0})
        before = _snapshot(client)
        with pytest.raises(error, match="(?s)'t'.*updates"):
            client.mutate_priorities("t", updates={key: 2.0})
        with pytest.raises(error, match="(?s)'t'.*deletes"):
            client.mutate_priorities("t", deletes=[key])
        with pytest.raises(error, match="(?s)'t'.*keys"):
            client.update_priorities("t", [key], [2.0])
        assert _snapshot(client) == before
        client.close()


def test_priorities_must_be_numbers_not_text(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        key = int(client.insert({"x": np.zeros(2)}, {"t": 1.0})["t"])
        before = _snapshot(client)
        for call in (lambda: client.mutate_priorities("t", updates={key: "1.5"}),
                     lambda: client.update_priorities("t", [key], ["1.5"]),
                     lambda: client.update_priorities("t", np.array([key], np.uint64),
                                                      np.array(["1.5"])),
                     lambda: client.insert({"x": np.zeros(2)}, {"t": "1.5"})):
            with pytest.raises(errors.InvalidPriorityError, match="(?s)'t'.*number.*1.5"):
                call()
        assert _snapshot(client) == before
        # Keys as numpy integers, and floats that are whole, are still keys.
        client.mutate_priorities("t", updates={np.uint64(key): 3.0})
        assert client.update_priorities("t", [float(key)], [4.0]) == 1
        client.close()


@pytest.mark.parametrize("argument, value, error", [
    ("max_size", 2**62, ValueError), ("max_size", 2**40, ValueError),
    ("max_size", 0, ValueError), ("max_size", 1.5, TypeError), ("max_size", "10", TypeError),
    ("max_size", True, TypeError), ("max_times_sampled", 2**64, ValueError),
    ("max_times_sampled", float("inf"), TypeError)])
def test_table_refuses_sizes_out_of_range(argument, value, error):
    kwargs = {"max_size": 10, argument: value}
    with pytest.raises(error, match=f"(?s)'t'.*{argument}"):
        shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(),
                        rate_limiter=rate_limiters.MinSize(1), **kwargs)


# --- point 11: verify on the corruption it exists to find --------------------------------

WORKERS = os.path.join(os.path.dirname(__file__), "_operator_workers.py")


def test_verify_reports_corrupt_words_and_never_crashes(buffer_name):
    """Control words and slot fields set to 2**40 or negative: ``verify()`` and
    ``shmreplay verify`` report a problem for each; the process survives (before: SIGSEGV
    on C_HEAD or C_FRESH = 2**40)."""
    worker = subprocess.Popen([sys.executable, WORKERS, "corrupt_and_verify", buffer_name],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = worker.stdout.readline()
        assert line, f"the worker died (exit {worker.wait(timeout=30)})"
        unreported = [r[:4] for r in json.loads(line) if not r[4]]
        assert not unreported
        assert worker.stdout.readline().strip() == "corrupt"
        cli = subprocess.run([sys.executable, "-m", "shmreplay.cli", "verify", buffer_name],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 1, (cli.returncode, cli.stderr)
        assert "p: " in cli.stdout and "insertion-order list" in cli.stdout
        assert "h: ok" in cli.stdout and "s: ok" in cli.stdout
    finally:
        worker.communicate("\n", timeout=60)
    assert worker.returncode == 0


# --- point 7: no ghost buffers after gc or rm ----------------------------------------------

class _Worker:
    """A ``_operator_workers`` process driven line by line; every answer has a deadline."""

    def __init__(self, *args):
        self.process = subprocess.Popen([sys.executable, WORKERS, *args], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.answer(60) == "ready"

    def answer(self, timeout=10.0) -> str:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"no answer within {timeout} s"
        return self.process.stdout.readline().strip()

    def call(self, command, timeout=10.0) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.answer(timeout)

    def end(self):
        if self.process.poll() is None:
            try:
                self.process.communicate("quit\n", timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _cli(*args, only=None):
    """``shmreplay ARGS`` in a new process; with ``only``, gc is limited to the buffers
    whose names start so (the others on the machine are other programs')."""
    code = ("import sys\n"
            "from shmreplay import cli\n"
            "from shmreplay._shm import peek as _peek\n"
            "every = _peek.segments\n"
            "if sys.argv[1]:\n"
            "    _peek.segments = lambda: {n: e for n, e in every().items()\n"
            "                              if n.startswith(sys.argv[1])}\n"
            "sys.exit(cli.main(sys.argv[2:]))\n")
    result = subprocess.run([sys.executable, "-c", code, only or "", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout


def test_gc_of_a_killed_owner_fails_the_processes_still_attached(buffer_name):
    """Owner SIGKILLed; an actor and a learner stay attached; ``shmreplay gc`` removes
    the buffer and a new Server takes the name: the actor's next insert and the
    learner's next sample raise BufferBrokenError (before: the insert was acknowledged
    into the removed buffer and lost; the learner sampled the old items)."""
    owner = _Worker("own", buffer_name)
    actor = learner = None
    try:
        actor, learner = _Worker("attached", buffer_name), _Worker("attached", buffer_name)
        owner.process.kill()
        owner.process.wait(timeout=10)
        assert actor.call("insert") == "ok"  # a dead owner's buffer still works
        assert "owner" in _cli("gc", only=buffer_name)
        with shmreplay.Server([shmreplay.Table.queue("t", 100)], name=buffer_name) as new:
            assert actor.call("insert") == "BufferBrokenError"
            assert learner.call("sample") == "BufferBrokenError"
            assert shmreplay.Client(new.name).server_info()["t"].current_size == 0
    finally:
        for worker in (owner, actor, learner):
            if worker is not None:
                worker.end()


def test_rm_force_of_a_live_buffer_fails_its_owner_and_clients(buffer_name):
    """``shmreplay rm --force`` on a live buffer: its owner's calls and its clients'
    (a blocked sample too) raise BufferBrokenError; the owner's later stop() leaves alone
    the new buffer that took the name."""
    server = shmreplay.Server([shmreplay.Table.queue("t", 100)], name=buffer_name)
    actor = learner = None
    try:
        own_client = shmreplay.Client(buffer_name)
        actor, learner = _Worker("attached", buffer_name), _Worker("attached", buffer_name)
        learner.process.stdin.write("wait\n")  # blocks: the queue is empty
        learner.process.stdin.flush()
        assert actor.call("insert") == "ok" and actor.call("insert") == "ok"
        assert learner.answer() == "ok"  # (it took one of them)
        learner.process.stdin.write("wait\n")
        learner.process.stdin.flush()
        assert learner.call("sample") == "ok"
        learner.process.stdin.write("wait\n")  # blocks again: empty
        learner.process.stdin.flush()
        assert "removed" in _cli("rm", "--force", buffer_name)
        assert learner.answer(5.0) == "BufferBrokenError"
        assert actor.call("insert") == "BufferBrokenError"
        with pytest.raises(errors.BufferBrokenError, match="rm"):
            own_client.insert({"x": np.zeros(2, np.float32)}, {"t": 1.0})
        with pytest.raises(errors.BufferBrokenError):
            own_client.sample_batch("t", 1, timeout=0.1)
        own_client.close()
        with shmreplay.Server([shmreplay.Table.queue("t", 100)], name=buffer_name) as new:
            server.stop()
            assert os.path.exists(f"/dev/shm/shmreplay.{buffer_name}")
            assert shmreplay.Client(new.name).server_info()["t"].current_size == 0
    finally:
        server.stop()
        for worker in (actor, learner):
            if worker is not None:
                worker.end()


# --- point 3: FIFOs, directories and symlinks named like a buffer ------------------------

def _odd_files(name, tmp_path):
    """A directory, a FIFO and a symlink under /dev/shm named like ``name``'s data
    segments (``shmreplay.NAME.t5`` ...) and like buffers of their own."""
    shm = "/dev/shm/shmreplay." + name
    os.mkdir(shm + ".t5")
    os.mkfifo(shm + ".t6", 0o600)
    (tmp_path / "outside").write_bytes(b"\0" * 4096)
    os.symlink(tmp_path / "outside", shm + ".t7")
    return [shm + tail for tail in (".t5", ".t6", ".t7")]


def _remove_odd(paths):
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)


def test_gc_and_rm_skip_odd_files_named_like_segments(buffer_name, tmp_path):
    """A dead owner's buffer next to a directory, FIFO and symlink named like its data
    segments: gc removes the buffer's segments, lists the others as left alone, and
    goes on (before: root's gc died with an IsADirectoryError traceback)."""
    owner = _Worker("own", buffer_name)
    odd = []
    try:
        owner.process.kill()
        owner.process.wait(timeout=10)
        odd = _odd_files(buffer_name, tmp_path)
        listed = _cli("ls", only=buffer_name)
        for tail in (".t5", ".t6", ".t7"):
            line = next(l for l in listed.splitlines() if l.startswith(buffer_name + tail))
            assert line.split()[1:3] == ["?", "?"]
        collected = _cli("gc", only=buffer_name)
        assert f"{buffer_name}: owner" in collected and "removed 2 segment(s)" in collected
        for tail in (".t5", ".t6", ".t7"):
            assert f"{buffer_name}{tail}: left alone" in collected
        assert not os.path.exists(f"/dev/shm/shmreplay.{buffer_name}")
        assert all(os.path.lexists(path) for path in odd)
        assert (tmp_path / "outside").exists()
        forced = subprocess.run([sys.executable, "-m", "shmreplay.cli", "rm", "--force",
                                 buffer_name + ".t5"], capture_output=True, text=True,
                                timeout=60)
        assert "Traceback" not in forced.stderr and "cannot remove" in forced.stderr
    finally:
        owner.end()
        _remove_odd(odd)


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_client_refuses_odd_files_with_a_shmreplay_error(buffer_name, tmp_path, kind):
    """Before: a symlink gave a raw OSError(ELOOP), a directory a bare ValueError."""
    path = f"/dev/shm/shmreplay.{buffer_name}"
    (tmp_path / "outside").write_bytes(b"\0" * 4096)
    make, said = {"symlink": (lambda: os.symlink(tmp_path / "outside", path), "symbolic link"),
                  "directory": (lambda: os.mkdir(path), "directory"),
                  "fifo": (lambda: os.mkfifo(path, 0o600), "FIFO")}[kind]
    make()
    try:
        with pytest.raises(errors.LayoutMismatchError, match=f"(?s){buffer_name}.*{said}"):
            shmreplay.Client(buffer_name)
    finally:
        _remove_odd([path])


# --- point 8: gc while servers start ------------------------------------------------------

def test_gc_never_removes_a_buffer_being_created(buffer_name):
    """Servers created and stopped in a loop in one process while gc runs over and over
    in this one: no live buffer is removed. A header still zero, or naming no owner
    yet, cannot be judged and is left alone; an owner is dead only if its pid (with its
    start time) no longer runs."""
    from shmreplay import cli
    from shmreplay._shm import peek as _peek
    prefix = buffer_name + "-"
    creator = _Worker("storm", prefix, "3")
    every = _peek.segments
    removed, runs = [], 0
    try:
        _peek.segments = lambda: {n: e for n, e in every().items() if n.startswith(prefix)}
        while creator.process.poll() is None and runs < 100000:
            out = io.StringIO()
            cli.main(["gc"], out=out)
            removed += [line for line in out.getvalue().splitlines() if "removed" in line]
            runs += 1
            if select.select([creator.process.stdout], [], [], 0)[0]:
                break
    finally:
        _peek.segments = every
    created, lost = map(int, creator.answer(30).split())
    creator.end()
    assert created > 20 and runs > 20, (created, runs)
    assert removed == [] and lost == 0

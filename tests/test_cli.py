"""The operator's CLI, driven as a user would: a subprocess against real buffers."""

import os
import signal
import subprocess
import sys
import time

import numpy as np

import shmreplay
from shmreplay import rate_limiters, selectors


def _cli(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "shmreplay.cli", *args],
                            capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _server(name):
    return shmreplay.Server([shmreplay.Table(
        "replay", selectors.Prioritized(0.5), selectors.Fifo(), 100, rate_limiters.MinSize(2))],
        name=name)


def test_ls_info_and_verify_describe_a_live_buffer(buffer_name):
    with _server(buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"x": np.zeros(4)}, {"replay": 1.0})
        line = next(l for l in _cli("ls").stdout.splitlines() if l.startswith(buffer_name))
        assert line.split()[1:5] == [str(os.getpid()), "alive", "1", "1"]
        info = _cli("info", buffer_name).stdout
        assert "table replay: 1/100 items" in info
        assert "priority_exponent" in info
        assert "can sample now: False" in info  # MinSize(2) with one item
        assert "next sample waits for inserts: 1 items < min_size_to_sample 2" in info
        assert "next insert" not in info
        assert _cli("verify", buffer_name).stdout.strip() == "replay: ok"
        client.close()


def test_info_shows_how_a_table_stores_its_items(buffer_name):
    tables = [shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), 100,
                              rate_limiters.MinSize(1)) for name in ("whole", "steps")]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"x": np.zeros(4)}, {"whole": 1.0})
        with client.writer(3) as writer:
            for t in range(5):
                writer.append({"x": np.full(4, t)})
                if t >= 2:
                    writer.create_item("steps", 3, 1.0)  # 3 items over 5 distinct steps
        info = _cli("info", buffer_name).stdout
        assert "storage: whole items; 1 stored" in info
        assert "storage: steps shared by items; 5 stored" in info
        assert _cli("verify", buffer_name).stdout.split() == ["whole:", "ok", "steps:", "ok"]
        client.close()


def test_rm_refuses_a_live_owner_unless_forced(buffer_name):
    with _server(buffer_name):
        refused = _cli("rm", buffer_name, check=False)
        assert refused.returncode == 1 and "is alive" in refused.stdout
        assert os.path.exists(f"/dev/shm/shmreplay.{buffer_name}")
        _cli("rm", "--force", buffer_name)
        assert not os.path.exists(f"/dev/shm/shmreplay.{buffer_name}")


def _gc_only(prefix):
    """``shmreplay gc`` as a user runs it, but limited to the buffers whose names start
    with ``prefix``: gc removes every buffer on the machine it finds dead, and the others
    are other programs' (another test run's SIGKILLed owner, which that test is about to
    look at; a buffer another program is creating right now)."""
    code = ("import sys\n"
            "from shmreplay import cli\n"
            "from shmreplay._shm import peek as _peek\n"
            "every = _peek.segments\n"
            "_peek.segments = lambda: {n: e for n, e in every().items()\n"
            "                          if n.startswith(sys.argv[1])}\n"
            "sys.exit(cli.main(['gc']))\n")
    result = subprocess.run([sys.executable, "-c", code, prefix], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


def test_gc_removes_buffers_of_a_sigkilled_owner(buffer_name):
    code = ("import shmreplay, numpy as np, sys, time\n"
            "from shmreplay import selectors as S, rate_limiters as R\n"
            f"s = shmreplay.Server([shmreplay.Table('t', S.Uniform(), S.Fifo(), 10, R.MinSize(1))], name='{buffer_name}')\n"
            "shmreplay.Client(s.name).insert({'x': np.zeros(2)}, {'t': 1.0})\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "ready"
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        segments = [f for f in os.listdir("/dev/shm") if f.startswith(f"shmreplay.{buffer_name}")]
        assert len(segments) == 2  # header and data: a SIGKILLed owner cannot clean up
        line = next(l for l in _cli("ls").stdout.splitlines() if l.startswith(buffer_name))
        assert line.split()[2] == "dead"
        assert buffer_name in _gc_only(buffer_name).stdout
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                f.startswith(f"shmreplay.{buffer_name}") for f in os.listdir("/dev/shm")):
            time.sleep(0.05)
        assert not any(f.startswith(f"shmreplay.{buffer_name}") for f in os.listdir("/dev/shm"))
    finally:
        owner.kill()
        owner.wait(timeout=10)


def test_info_on_a_missing_buffer_is_a_clear_error():
    result = _cli("info", "test-does-not-exist", check=False)
    assert result.returncode == 2
    assert "No shmreplay buffer" in result.stderr


# --- shmreplay top --------------------------------------------------------------------------

import io  # noqa: E402
import select  # noqa: E402

import _names  # noqa: E402
from shmreplay import cli  # noqa: E402

_RATE = 200.0  # items/s the feeding process inserts (and samples) into table "replay"


def _top_tables():
    return [shmreplay.Table("replay", selectors.Prioritized(0.5), selectors.Fifo(), 1000,
                            rate_limiters.MinSize(1)),
            shmreplay.Table("idle", selectors.Uniform(), selectors.Fifo(), 10,
                            rate_limiters.MinSize(5)),
            # band [-1, 3]: a fourth insert without a sample is not allowed
            shmreplay.Table("ratio", selectors.Uniform(), selectors.Fifo(), 10,
                            rate_limiters.SampleToInsertRatio(1.0, 1, 2.0))]


def _feeder(name):
    """A process that inserts and samples ``_RATE`` items/s into "replay", kept on schedule."""
    code = ("import sys, time, numpy as np, shmreplay\n"
            f"client = shmreplay.Client({name!r})\n"
            "item, prio = {'x': np.zeros(4, np.float32)}, {'replay': 1.0}\n"
            "client.insert(item, prio, timeout=10)\n"
            "client.sample_batch('replay', 1, timeout=10)\n"
            "print('ready', flush=True)\n"
            "start, n = time.monotonic(), 0\n"
            "while time.monotonic() - start < 60:\n"
            f"    while n < (time.monotonic() - start) * {_RATE}:\n"
            "        client.insert(item, prio, timeout=10)\n"
            "        client.sample_batch('replay', 1, timeout=10)\n"
            "        n += 1\n"
            "    time.sleep(0.002)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _read_until(proc, text, timeout=60):
    """What ``proc`` wrote to stdout until ``text`` appeared (bounded by ``timeout``)."""
    out = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in out:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {text!r} within {timeout} s; got {out!r}"
        if select.select([proc.stdout], [], [], remaining)[0]:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"stdout closed before {text!r}: {out!r} {proc.stderr.read()!r}"
            out += chunk
    return out.decode()


def _stop(proc):
    if proc.poll() is None:
        proc.kill()
    return proc.communicate(timeout=10)


def _frames(stdout):
    """``[{table: fields}]``, one dict per refresh of non-TTY ``top`` output."""
    frames = []
    for block in stdout.strip().split("\n\n"):
        lines = block.splitlines()
        assert lines[0].startswith("shmreplay top: ") and lines[1].startswith("TABLE"), block
        frames.append({line.split()[0]: line for line in lines[2:]})
    return frames


def test_top_shows_live_rates_sizes_and_blocked_calls(buffer_name):
    with shmreplay.Server(_top_tables(), name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for _ in range(3):
            client.insert({"x": np.zeros(2)}, {"ratio": 1.0}, timeout=5)
        feeder = _feeder(server.name)
        try:
            _read_until(feeder, "ready")
            result = _cli("top", buffer_name, "--interval", "0.2", "--iterations", "3")
        finally:
            _stop(feeder)
        assert "Traceback" not in result.stderr
        frames = _frames(result.stdout)
        assert len(frames) == 3
        inserted_before = None
        for frame in frames:
            assert sorted(frame) == ["idle", "ratio", "replay"]
            _, items, insert_rate, sample_rate, inserted, sampled, _ = \
                frame["replay"].split()[:7]
            insert_rate, sample_rate = float(insert_rate), float(sample_rate)
            inserted = int(inserted)
            # The feeder keeps to 200/s on average; one 0.2 s window may run behind or catch up.
            assert 0 < insert_rate < 10 * _RATE and 0 < sample_rate < 10 * _RATE, frame
            assert items.endswith("/1000") and int(sampled) > 0
            if inserted_before is not None:  # the rate is the counter's growth per second
                assert 0.1 < (inserted - inserted_before) / insert_rate < 0.6, frames
            inserted_before = inserted
            assert frame["replay"].endswith("ok | ok")
            assert frame["idle"].split()[1:7] == ["0/10", "0.0", "0.0", "0", "0", "0"]
            assert frame["idle"].endswith("ok | BLOCKED (size < 5)")
            assert frame["ratio"].split()[1] == "3/10"
            assert "BLOCKED (needs samples) | ok" in frame["ratio"]
        mean = sum(float(f["replay"].split()[2]) for f in frames) / len(frames)
        assert _RATE / 3 < mean < 3 * _RATE, result.stdout
        client.close()


def test_top_on_a_missing_buffer_exits_1_with_a_clear_message():
    result = _cli("top", _names.unique("missing"), "--iterations", "1", check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert "no buffer named" in result.stderr and "Traceback" not in result.stderr
    bad = _cli("top", _names.unique("missing"), "--interval", "0", check=False)
    assert bad.returncode == 2 and "--interval: must be a number > 0" in bad.stderr


def test_top_exits_1_when_the_watched_buffer_is_stopped(buffer_name):
    server = _server(buffer_name)
    top = subprocess.Popen([sys.executable, "-m", "shmreplay.cli", "top", buffer_name,
                            "--interval", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _read_until(top, "TABLE")
        server.stop()
        top.wait(timeout=30)
    finally:
        server.stop()
        _, stderr = _stop(top)
    assert top.returncode == 1
    assert stderr.decode().strip() == (
        f"shmreplay top: buffer '{buffer_name}' was stopped by its owner")


def test_top_ctrl_c_exits_cleanly(buffer_name):
    with _server(buffer_name):
        top = subprocess.Popen([sys.executable, "-m", "shmreplay.cli", "top", buffer_name,
                                "--interval", "0.1"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
        try:
            _read_until(top, "TABLE")
            top.send_signal(signal.SIGINT)
            top.wait(timeout=30)
        finally:
            _, stderr = _stop(top)
    assert top.returncode == 0 and stderr == b""


def test_top_redraws_in_place_on_a_terminal(buffer_name):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    with _server(buffer_name):
        screen = Terminal()
        assert cli.main(["top", buffer_name, "--interval", "0.05", "--iterations", "2"],
                        out=screen) == 0
    frames = screen.getvalue().split("\x1b[H\x1b[2J")
    assert frames[0] == "" and len(frames) == 3
    assert all(frame.startswith(f"shmreplay top: {buffer_name}") for frame in frames[1:])


def test_info_says_why_a_full_queue_blocks_inserts(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert_batch({"x": np.zeros((2, 4))}, {"q": 1.0})
        info = _cli("info", buffer_name).stdout
        assert "next insert waits for samples: (inserts 2 + in flight 0 + 1) x 1 samples " \
               "per insert - samples 0 = 3 > max_diff 2" in info
        assert "next sample" not in info
        client.close()


def test_info_into_a_pipe_closed_early_exits_quietly(buffer_name):
    tables = [shmreplay.Table.queue(f"q{i}", 2) for i in range(50)]  # output > a pipe's read
    with shmreplay.Server(tables, name=buffer_name):
        result = subprocess.run(
            f"{sys.executable} -m shmreplay.cli info {buffer_name} | head -2",
            shell=True, capture_output=True, text=True, timeout=60)
        assert result.stdout.splitlines()[1].startswith("table q0:")
        assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


# --- first contact: ls, rm, gc and --help read headers only; info says a dead owner -------

import multiprocessing  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import _mp_workers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Runs the CLI with the ``shmreplay`` package's __init__ skipped (it imports the client
# today) and the modules that map tables or hold kernels made unimportable: the command
# must not need them. ``SHMREPLAY_TEST_SHM`` points it at another directory than /dev/shm.
_NO_ENGINE = f"""
import importlib.abc, os, sys, types
package = types.ModuleType("shmreplay")
package.__path__ = [{str(ROOT / "shmreplay")!r}]
sys.modules["shmreplay"] = package
BLOCKED = ("shmreplay._engine.buffer", "shmreplay._engine.table_engine", "shmreplay.client",
           "shmreplay._shm.kernels.table", "shmreplay._shm.kernels.sumtree", "cloudpickle")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in BLOCKED:
            raise ImportError(name + " was imported")
sys.meta_path.insert(0, Block())
from shmreplay import cli
from shmreplay._shm import peek as _peek
_peek.SHM_DIR = os.environ.get("SHMREPLAY_TEST_SHM", _peek.SHM_DIR)
status = cli.main(sys.argv[1:])
assert not [m for m in BLOCKED if m in sys.modules]
sys.exit(status)
"""


def _cli_without_engines(*args, shm=None):
    env = dict(os.environ, **({"SHMREPLAY_TEST_SHM": str(shm)} if shm else {}))
    return subprocess.run([sys.executable, "-c", _NO_ENGINE, *args], capture_output=True,
                          text=True, timeout=60, env=env)


def _ls_line(stdout, name):
    return next(line for line in stdout.splitlines() if line.startswith(name + " ")).split()


def test_ls_rm_and_help_read_headers_without_attaching(buffer_name):
    tables = [shmreplay.Table("p", selectors.Prioritized(0.6), selectors.Fifo(), 100,
                              rate_limiters.MinSize(1)),
              shmreplay.Table("u", selectors.Uniform(), selectors.MaxHeap(), 1000,
                              rate_limiters.MinSize(1)),
              shmreplay.Table.queue("q", 5)]
    with shmreplay.Server(tables, name=buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            client.insert_batch({"x": np.zeros((3, 2))}, {"p": 1.0})
            client.insert({"x": np.zeros(2)}, {"u": 1.0, "q": 1.0})
            listed = _cli_without_engines("ls")
            assert listed.returncode == 0, listed.stderr
            assert _ls_line(listed.stdout, buffer_name)[1:5] == [
                str(os.getpid()), "alive", "3", "5"]
            # the same figure as the full client's view
            assert _ls_line(listed.stdout, buffer_name)[1:5] == \
                _ls_line(_cli("ls").stdout, buffer_name)[1:5]
        helped = _cli_without_engines("--help")
        assert helped.returncode == 0 and "gc" in helped.stdout, helped.stderr
        refused = _cli_without_engines("rm", buffer_name)
        assert refused.returncode == 1 and "is alive" in refused.stdout, refused.stderr
        assert os.path.exists(f"/dev/shm/shmreplay.{buffer_name}")


def _fake_shm(tmp_path, source_name):
    """A directory standing in for /dev/shm: a copy of a live buffer's header segment whose
    recorded owner is dead, a segment being created (zeros), a FIFO, and a symlink."""
    shm = tmp_path / "shm"
    shm.mkdir()
    dead = shm / "shmreplay.dead-owner"
    shutil.copyfile(f"/dev/shm/shmreplay.{source_name}", dead)
    dead.chmod(0o600)
    from shmreplay._shm import layout as _layout
    header = np.memmap(dead, _layout.HEADER, mode="r+", shape=(1,))
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, timeout=60)
    header["owner_pid"] = int(child.stdout)   # a process that has exited
    header.flush()
    del header
    (shm / "shmreplay.being-created").write_bytes(b"\0" * 4096)
    os.chmod(shm / "shmreplay.being-created", 0o600)
    os.mkfifo(shm / "shmreplay.a-fifo", 0o600)
    outside = tmp_path / "outside"
    outside.write_bytes(b"\0" * 4096)
    os.symlink(outside, shm / "shmreplay.a-link")
    return shm


def test_gc_removes_only_what_it_knows_is_dead(tmp_path, buffer_name):
    with _server(buffer_name):
        shm = _fake_shm(tmp_path, buffer_name)
    listed = _cli_without_engines("ls", shm=shm)
    assert listed.returncode == 0, listed.stderr
    assert _ls_line(listed.stdout, "dead-owner")[2:4] == ["dead", "1"]
    for name in ("being-created", "a-fifo", "a-link"):
        assert _ls_line(listed.stdout, name)[1:5] == ["?"] * 4
    collected = _cli_without_engines("gc", shm=shm)
    assert collected.returncode == 0, collected.stderr
    assert "dead-owner: owner" in collected.stdout and "is gone; removed 1" in collected.stdout
    assert "being-created: left alone" in collected.stdout
    assert "a-fifo: left alone: it is not a regular file" in collected.stdout
    assert "a-link: left alone: it cannot be opened" in collected.stdout
    assert sorted(os.listdir(shm)) == [
        "shmreplay.a-fifo", "shmreplay.a-link", "shmreplay.being-created"]
    assert (tmp_path / "outside").exists()
    refused = _cli_without_engines("rm", "being-created", shm=shm)
    assert refused.returncode == 1 and "--force removes it anyway" in refused.stdout
    forced = _cli_without_engines("rm", "--force", "being-created", "a-link", shm=shm)
    assert forced.returncode == 0 and sorted(os.listdir(shm)) == ["shmreplay.a-fifo"]
    assert (tmp_path / "outside").exists()


def test_info_says_when_the_owner_is_dead(buffer_name):
    spawn = multiprocessing.get_context("spawn")
    ready, queue = spawn.Event(), spawn.Queue()
    owner = spawn.Process(target=_mp_workers.owner_waits, args=(buffer_name, ready, queue))
    with _mp_workers.processes(owner, join_timeout=0):
        assert ready.wait(60), "the owner did not create its buffer"
        alive = _cli("info", buffer_name).stdout.splitlines()[0]
        assert alive.startswith(f"buffer {buffer_name}: owner {owner.pid} alive;")
        _mp_workers.kill_and_reap(owner)
    try:
        info = _cli("info", buffer_name).stdout
        first = info.splitlines()[0]
        assert first.startswith(f"buffer {buffer_name}: owner {owner.pid} is DEAD")
        assert "`shmreplay gc` removes" in first and "table signed: 1/16 items" in info
        assert _ls_line(_cli("ls").stdout, buffer_name)[2] == "dead"
    finally:
        _cli("rm", buffer_name)


def test_ls_top_and_info_show_the_same_memory(buffer_name):
    with _server(buffer_name) as server:
        with shmreplay.Client(server.name) as client:
            client.insert_batch({"x": np.zeros((50, 1000))}, {"replay": 1.0})
            listed = " ".join(_ls_line(_cli("ls").stdout, buffer_name)[5:])
            top = _cli("top", buffer_name, "--interval", "0.05", "--iterations", "1").stdout
            info = _cli("info", buffer_name).stdout.splitlines()[0]
    assert listed.endswith("KiB") or listed.endswith("MiB")
    assert f"  memory {listed}  " in top.splitlines()[0]
    assert f"; {listed} in memory (all its segments, as ls and top count it)" in info


def test_gc_removes_ray_ledgers_only_of_buffers_gone_or_dead(tmp_path, buffer_name):
    """shmreplay.ray's ledger directories (no Ray needed: the ledger is plain files):
    ``ls`` shows them with their buffer's state; ``gc`` removes those of a buffer that is
    gone or dead, never one whose buffer is alive or cannot be judged."""
    from shmreplay._ray import ledger
    with _server(buffer_name):
        shm = _fake_shm(tmp_path, buffer_name)
        shutil.copyfile(f"/dev/shm/shmreplay.{buffer_name}", shm / "shmreplay.live-one")
    os.chmod(shm / "shmreplay.live-one", 0o600)   # its owner: this process, alive
    for name in ("live-one", "dead-owner", "being-created", "never-was"):
        ledger.Ledger(name, directory=str(shm)).record("ab12", 3, [7])
    (shm / "shmreplay-ray-ledger.not-a-dir").write_bytes(b"")
    listed = _cli_without_engines("ls", shm=shm)
    assert listed.returncode == 0, listed.stderr
    ledgers = listed.stdout.split("RAY LEDGER OF BUFFER", 1)[1]
    states = {name: _ls_line(ledgers, name)[1:3]
              for name in ("live-one", "dead-owner", "being-created", "never-was")}
    assert states == {"live-one": ["alive", "1"], "dead-owner": ["dead", "1"],
                      "being-created": ["?", "1"], "never-was": ["gone", "1"]}, listed.stdout
    assert "not-a-dir" not in ledgers
    collected = _cli_without_engines("gc", shm=shm)
    assert collected.returncode == 0, collected.stderr
    assert "buffer never-was is gone; removed (1 file(s))" in collected.stdout
    # (the dead buffer went first, in the same gc)
    assert "dead-owner: owner" in collected.stdout
    assert "buffer dead-owner is gone; removed" in collected.stdout
    assert "shmreplay-ray-ledger.being-created: left alone" in collected.stdout
    left = sorted(entry for entry in os.listdir(shm) if entry.startswith("shmreplay-ray"))
    assert left == ["shmreplay-ray-ledger.being-created", "shmreplay-ray-ledger.live-one",
                    "shmreplay-ray-ledger.not-a-dir"]
    # A service's ledger whose directory gc removed (its buffer did not exist yet) is
    # made again by the next record, so the exactly-once record is not lost.
    kept = ledger.Ledger("never-was", directory=str(shm))
    kept.remove_all()
    kept.record("cd34", 1, "applied")
    assert ledger.Ledger("never-was", directory=str(shm)).last("cd34") == (1, "applied")

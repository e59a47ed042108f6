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
        assert buffer_name in _cli("gc").stdout
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

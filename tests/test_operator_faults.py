"""What an operator (or a damaged buffer) can do to a buffer, and what shmreplay does about
it (issue 18): odd files under /dev/shm, buffers removed by ``gc``/``rm`` while processes
use them, ``gc`` while servers start, ``verify`` on corrupt control words, and numbers
out of range.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import shmreplay
from shmreplay import _layout as L, errors, rate_limiters, selectors
import _names


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

"""The examples run against the current API and clean up.

* ``examples/demo.py`` runs for a few seconds, reports nonzero insert and sample rates,
  exits 0 and leaves nothing in /dev/shm; on Ctrl-C it stops its workers, exits 130 and
  leaves nothing either.

The documentation's code blocks run in ``test_doc_snippets.py``.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import _names
import _waiting
from shmreplay._shm import layout as _layout

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.py"
SHM = Path("/dev/shm")

# Generous: on a fresh checkout every process compiles the numba kernels first.
DEMO_TIMEOUT = 240

# A progress line: "  2.0s       41,476      346,387      43,357".
PROGRESS = re.compile(r"^\s*(\d+\.\d)s\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s*$", re.M)


def _segments(prefix="shmreplay"):
    if not SHM.is_dir():
        return set()
    return {name for name in os.listdir(SHM) if name.startswith(prefix)}


def _objects_of(names=(), pids=()):
    """The /dev/shm entries of buffers ``names`` and of the port buffers (``port-P``)
    that processes ``pids`` made: what the program under test may have left. Anything
    else in /dev/shm is another program's, created or removed at any time (another
    test run, a user's job), and not ours to judge."""
    exact = {f"{sem}shmreplay.{name}" for name in names for sem in ("", "sem.")}
    entries = _segments("")
    unnamed = _names.port_buffers_of(set(pids), entries)

    def buffer_of(entry):  # "shmreplay.x:t3:TOKEN" (a data segment) -> "shmreplay.x"
        parsed = _layout.parse_segment(entry)
        return entry if parsed is None else _layout.SEGMENT_PREFIX + parsed[0]

    return {entry for entry in entries if buffer_of(entry) in exact or entry in unnamed}


def _rates(output):
    """(inserts/s, samples/s, table size) of every progress line."""
    return [tuple(int(v.replace(",", "")) for v in match.groups()[1:])
            for match in PROGRESS.finditer(output)]


def _demo_command(name, *args):
    return [sys.executable, str(DEMO), "--name", name, *args]


@pytest.mark.slow
def test_demo_runs_reports_rates_and_cleans_up():
    name = _names.unique("demo")
    before = _segments()
    proc = subprocess.run(_demo_command(name, "--seconds", "3", "--actors", "1"), cwd=ROOT,
                          capture_output=True, text=True, timeout=DEMO_TIMEOUT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    rates = _rates(proc.stdout)
    assert len(rates) == 3, output  # one line per second
    assert any(inserts > 0 and samples > 0 for inserts, samples, _ in rates), output
    summary = re.search(r"([\d,]+) inserted \(([\d,]+)/s\), ([\d,]+) sampled \(([\d,]+)/s\)",
                        proc.stdout)
    assert summary, output
    assert all(int(v.replace(",", "")) > 0 for v in summary.groups()), output
    assert "nothing left in /dev/shm" in proc.stdout, output
    assert not _segments(f"shmreplay.{name}"), output
    assert not _objects_of([name]) - before, output


@pytest.mark.slow
def test_demo_stops_cleanly_on_ctrl_c():
    """Ctrl-C reaches every process of the foreground group, as a terminal sends it."""
    name = _names.unique("demo")
    before = _segments()
    proc = subprocess.Popen(_demo_command(name, "--seconds", "120", "--actors", "2"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    with _waiting.OutputWatch(proc, lambda line: bool(PROGRESS.match(line))) as watch:
        assert watch.seen.wait(DEMO_TIMEOUT), watch.output
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    output = watch.output
    assert proc.returncode == 128 + signal.SIGINT, output
    assert "Traceback" not in output, output
    assert "stopped early by Ctrl-C" in output, output
    assert not _waiting.wait_until_gone(proc.pid), f"workers outlived the demo:\n{output}"
    assert not _segments(f"shmreplay.{name}"), output
    assert not _objects_of([name], [proc.pid]) - before, output


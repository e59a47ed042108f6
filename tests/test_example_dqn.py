"""``examples/jax_dqn.py`` (the README's demo) and ``tf_dqn.py``: actor processes and a JAX
or a TensorFlow learner learn CartPole.

Runs each example as a user would (a subprocess with its default settings, real
processes attaching by name) and checks that it learned: it stops once the average
return of the last 20 episodes reaches its target (475 for JAX, 400 for TensorFlow;
random play gets about 22), exits 0, data flowed both ways (items inserted, batches
sampled, learner steps), and the buffer is gone afterwards.

* The JAX demo runs from a cold numba cache (a fresh ``NUMBA_CACHE_DIR``), as on a fresh
  clone: the first run compiles the kernels and must still learn within its time cap.
  It is the suite's slowest test (typically 1-2 minutes on 2 cores).
* The TensorFlow demo runs on the suite's warm cache.
* A run that cannot reach its target exits 1, says why, and still prints its result
  line; Ctrl-C (to the whole process group, as a terminal sends it) and SIGTERM stop
  the workers and remove the buffer.
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

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TARGETS = {"jax_dqn.py": 475, "tf_dqn.py": 400}  # the scripts' default --target
# The examples stop once solved, at most 300 s after their workers start; a first run
# compiles the kernels before that. Measured on a busy 2-core machine (load average
# 5-10): compiling 55-77 s, solving 30-49 s (JAX) and 37-61 s (TensorFlow); with two
# more CPU hogs, 189 s and 55 s. The bound only has to stop a hung run.
RUN_TIMEOUT = 600

# time, env steps, episodes, return, items/s, samples/s, learner steps
ROW = re.compile(r"^\s*(\d+)s\s+([\d,]+)\s+(\d+)\s+([\d.]+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s*$",
                 re.M)
RESULT = re.compile(r"^best average return \(last 20 episodes\): ([\d.]+)$", re.M)


def _number(text):
    return float(text.replace(",", ""))


def _rows(stdout):
    return [[_number(v) for v in row] for row in ROW.findall(stdout)]


def _env(**extra):
    """This checkout's shmreplay, whatever the virtualenv has installed."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def _leftovers(name):
    return sorted(Path("/dev/shm").glob(f"shmreplay.{name}*"))


def _check_learned(proc, example, name):
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    rows = _rows(proc.stdout)
    assert rows, output
    assert rows[-1][1] > 10_000 and rows[-1][6] > 1_000, output  # env steps, learner steps
    assert any(r[4] > 0 and r[5] > 0 for r in rows), output     # items/s and samples/s
    assert re.search(r"^solved in \d+ s: ", proc.stdout, re.M), output
    results = RESULT.findall(proc.stdout)
    assert len(results) == 1 and proc.stdout.rstrip().endswith(
        f"(last 20 episodes): {results[0]}"), output              # the last line
    assert float(results[0]) >= TARGETS[example], output
    assert not _leftovers(name), output


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_jax_demo_learns_on_a_first_run_from_a_cold_kernel_cache(tmp_path):
    """README command 1 on a fresh clone: no compiled kernels anywhere yet."""
    name = _names.unique("dqn")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "jax_dqn.py"), "--name", name],
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=_env(NUMBA_CACHE_DIR=str(tmp_path / "numba-cache")))
    _check_learned(proc, "jax_dqn.py", name)
    # The Server compiled the kernels, once, and said so while it did.
    assert re.search(r"compiling kernels, first run only: ~\d+ s", proc.stderr), proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT + 60)
def test_tf_demo_learns():
    name = _names.unique("dqn")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "tf_dqn.py"), "--name", name],
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=_env())
    _check_learned(proc, "tf_dqn.py", name)


@pytest.mark.slow
def test_a_run_that_misses_its_target_exits_1_and_says_why():
    name = _names.unique("dqn")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "jax_dqn.py"), "--name", name,
                           "--seconds", "3", "--target", "501"],  # CartPole's cap is 500
                          cwd=ROOT, capture_output=True, text=True, timeout=180, env=_env())
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert re.search(r"^error: not solved: \S", proc.stderr, re.M), output
    assert "Traceback" not in output, output
    assert RESULT.search(proc.stdout.rstrip().splitlines()[-1]), output
    assert not _leftovers(name), output


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stopped_run_stops_its_workers_and_removes_the_buffer(how):
    """Ctrl-C reaches every process of the foreground group, as a terminal sends it;
    SIGTERM reaches the owner only. Either way the learner is training when it comes."""
    name = _names.unique("dqn")
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / "jax_dqn.py"), "--name", name],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=_env())

    def training(line):
        row = ROW.match(line)
        return bool(row) and _number(row.group(7)) > 0

    with _waiting.OutputWatch(proc, training) as watch:
        assert watch.seen.wait(180), watch.output
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    output = watch.output
    signum = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
    assert proc.returncode == 128 + signum, output
    assert "Traceback" not in output, output
    assert RESULT.search(watch.lines[-1]), output
    assert not _waiting.wait_until_gone(proc.pid), f"workers outlived the demo:\n{output}"
    assert not _leftovers(name), output

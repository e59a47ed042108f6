"""``examples/jax_dqn.py`` and ``tf_dqn.py``, shortened: actor processes and a JAX or a
TensorFlow learner learn CartPole.

Runs the example as a user would (a subprocess, real processes attaching by name) and
checks that it trains: the average return of the last 20 episodes rises well above a
random policy's (about 22), data flows both ways (items inserted, batches sampled,
learner steps), and the buffer is gone afterwards.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import _names

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RANDOM_POLICY_RETURN = 22

# time, env steps, episodes, return, items/s, samples/s, learner steps
ROW = re.compile(r"^\s*(\d+)s\s+([\d,]+)\s+(\d+)\s+([\d.]+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s*$",
                 re.M)


def _number(text):
    return float(text.replace(",", ""))


@pytest.mark.slow
@pytest.mark.parametrize("example", ["jax_dqn.py", "tf_dqn.py"])
def test_dqn_example_learns_cartpole_and_cleans_up(example):
    name = _names.unique("dqn")
    proc = subprocess.run([sys.executable, str(EXAMPLES / example), "--seconds", "45",
                           "--name", name],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    rows = [[_number(v) for v in row] for row in ROW.findall(proc.stdout)]
    assert len(rows) >= 30, output
    assert rows[-1][1] > 10_000 and rows[-1][6] > 1_000, output  # env steps, learner steps
    assert any(r[4] > 0 and r[5] > 0 for r in rows), output     # items/s and samples/s
    best = float(re.search(r"best average return \(last 20 episodes\): ([\d.]+)",
                           proc.stdout).group(1))
    assert best > 5 * RANDOM_POLICY_RETURN, output
    assert not list(Path("/dev/shm").glob(f"shmreplay.{name}*")), output

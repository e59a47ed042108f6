"""``examples/ray_actors.py`` as a user runs it: it starts its own 3-node Ray cluster on
this machine, remote CartPole actors on the two worker nodes feed the learner's buffer
through ``shmreplay.ray``, and the JAX learner on the buffer's node learns.

A brief run: the target is an average return of 60 over the last 20 episodes (random
play gets about 22; the example's default is 475), reached here after 7 s of training
(load average 9, 2 cores); starting the cluster takes most of the run's 60 s. The run
must end solved, with data having flowed (env steps, learner steps), and leave neither
the buffer nor its ledger behind.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install "
                                  "'shmreplay[ray]')")
pytest.importorskip("jax", reason="the example's learner needs jax")
pytest.importorskip("gymnasium", reason="the example's actors need gymnasium")

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\s*(\d+) s\s+env steps\s+([\d,]+)\s+learner steps\s+([\d,]+)\s+"
                 r"average return\s+([\d.]+)$", re.M)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_remote_actors_feed_a_learner_that_learns():
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ray_actors.py"), "--seconds", "90",
         "--target", "60"], cwd=ROOT / "examples", capture_output=True, text=True,
        timeout=240, env={**os.environ, "PYTHONPATH": path})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    name = re.search(r"^buffer '([^']+)' on node", proc.stdout, re.M)
    assert name, output
    rows = [[float(v.replace(",", "")) for v in row] for row in ROW.findall(proc.stdout)]
    assert rows and rows[-1][1] > rows[0][1] and rows[-1][2] > 0, output
    solved = re.search(r"^solved: average return ([\d.]+) over 20 episodes$", proc.stdout,
                       re.M)
    assert solved and float(solved[1]) >= 60, output
    assert not list(Path("/dev/shm").glob(f"shmreplay.{name[1]}*")), output
    assert not Path(f"/dev/shm/shmreplay-ray-ledger.{name[1]}").exists(), output

"""Reverb on the learner-feed benchmark: bench_learner_feed.py runs one Reverb worker per
TF row (workload x actor) when given a Reverb python, none otherwise; the report and the
performance page's table show the Reverb rows (which have no floor).

Fast: no Reverb, no TensorFlow (the workers' output is given). With $REVERB_PYTHON set,
one more test runs a real worker for a second.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _learner_feed_reverb as RV  # noqa: E402
import _perf_tables as tables  # noqa: E402
import bench_learner_feed as feed  # noqa: E402


def _args(**kw):
    return argparse.Namespace(**{"reverb_python": "/some/python", "frameworks": "jax,tf",
                                 "workloads": "transitions,atari", "actors": "off,on",
                                 "actor_rate": 1000.0, "seconds": 1.0, "warmup": 1.0,
                                 "rounds": 2, "quick": True, "suffix": "", "no_write": True,
                                 **kw})


def _row(framework, workload, actor, floor=True):
    rates = {"constant": [100.0, 120.0], "fed": [50.0, 60.0]}
    if floor:
        rates["floor"] = [90.0, 108.0]
    return {"framework": framework, "workload": workload, "actor": actor,
            "steps_per_s": rates,
            "cpu_s_per_step": {k: [0.004, 0.005] for k in rates}}


def test_one_worker_per_tf_row_in_reverbs_python(monkeypatch):
    calls = []

    def fake(cmd, errors, who, **kw):
        calls.append((cmd, kw))
        return _row("reverb", cmd[2], cmd[3] == "on", floor=False)
    monkeypatch.setattr(RV._common, "run_json_worker", fake)
    rows = RV.run_rows(_args())
    assert [(r["workload"], r["actor"]) for r in rows] == [
        ("transitions", False), ("transitions", True), ("atari", False), ("atari", True)]
    assert all(cmd[0] == "/some/python" and kw["own_packages"] is False
               for cmd, kw in calls)


def test_no_reverb_rows_without_a_python_or_without_tf(monkeypatch):
    monkeypatch.delenv("REVERB_PYTHON", raising=False)
    monkeypatch.setattr(RV._common, "run_json_worker",
                        lambda *a, **k: pytest.fail("no worker expected"))
    assert RV.run_rows(_args(reverb_python=None)) == []
    assert RV.run_rows(_args(frameworks="jax")) == []


def test_a_failed_worker_is_an_error_row(monkeypatch):
    monkeypatch.setattr(RV._common, "run_json_worker", lambda *a, **k: None)
    rows = RV.run_rows(_args(workloads="atari", actors="off"))
    assert rows[0]["framework"] == "reverb" and "error" in rows[0]


def test_the_report_and_the_page_table_show_reverb_rows(capsys):
    rows = [_row("tf", "transitions", False), _row("reverb", "transitions", False, False)]
    feed.report(rows, feed._common.machine_info(), _args())
    md = capsys.readouterr().out
    assert "| TF, Reverb `TrajectoryDataset` + `tf.function` |" in md
    assert rows[1]["ratio"]["fed"] == pytest.approx(0.5, abs=0.01)
    table = tables.learner_feed([("x.json", {"args": {"suffix": "x"}, "rows": rows})])
    reverb_line = [ln for ln in table if "Reverb" in ln]
    assert len(reverb_line) == 1
    assert "**0.50**" in reverb_line[0] and "| - |" in reverb_line[0]


@pytest.mark.skipif(not os.environ.get("REVERB_PYTHON"), reason="$REVERB_PYTHON unset")
def test_a_real_reverb_worker_prints_its_row():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [os.environ["REVERB_PYTHON"], str(ROOT / "benchmarks" / "_learner_feed_reverb.py"),
         "atari", "off", "--actor-rate", "100", "--seconds", "0.3", "--warmup", "0.1",
         "--rounds", "1"], capture_output=True, text=True, timeout=600, env=env)
    row = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    assert "error" not in row, row.get("error")
    assert row["framework"] == "reverb" and row["steps_per_s"]["fed"][0] > 0

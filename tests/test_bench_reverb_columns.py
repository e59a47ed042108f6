"""Reverb on the per-call benchmark: bench_vs_cpprb.py merges the Reverb worker's cases
into its rows (with the Reverb / shmreplay ratio), the page's table grows Reverb's
columns, and the per-call plot draws Reverb's series, only when the run measured Reverb.

Fast: no Reverb, no TensorFlow (the worker's output is given); the plot test needs
matplotlib.
"""

import argparse
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _perf_tables as tables  # noqa: E402
import bench_vs_cpprb as vs  # noqa: E402


def _timed(us):
    return {"median_us": us, "best_us": us, "number": 1, "repeat": 1}


def _rows():
    return [{"op": op, "sampler": sampler, "n": n, "cpprb": _timed(20.0),
             "shmreplay": _timed(4.0), "ratio": 5.0} for op, sampler, n in vs.cases()]


def _worker_output():
    results = []
    for op, sampler, n in vs.cases():
        row = {"op": op, "sampler": sampler, "n": n}
        if op == "add":
            row["writer"], row["insert"] = _timed(400.0), _timed(800.0)
        else:
            row["client"] = _timed(2000.0)
        results.append(row)
    return {"versions": {"dm-reverb": "0.14.0", "tensorflow": "2.15.1", "numpy": "1.26.4"},
            "timing": {"repeat": 1}, "loadavg_at_start": [0.5, 0.5, 0.5],
            "results": results, "errors": []}


def _args(**kw):
    return argparse.Namespace(**{"reverb_python": "/some/python", "quick": True, "seed": 0,
                                 **kw})


def test_reverb_cases_are_merged_into_the_rows(monkeypatch):
    monkeypatch.setattr(vs.RV, "run_worker", lambda *a: _worker_output())
    rows = _rows()
    section = vs.run_reverb(_args(), ["cpprb", "shmreplay", "reverb"], rows, [])
    assert section["measured"] and section["versions"]["dm-reverb"] == "0.14.0"
    for row in rows:
        if row["op"] == "add":
            assert row["reverb"]["median_us"] == 400.0          # the writer
            assert row["reverb[insert]"]["median_us"] == 800.0  # Client.insert per step
            assert row["ratio_reverb"] == pytest.approx(100.0)
        else:
            assert row["reverb"]["median_us"] == 2000.0
            assert "reverb[insert]" not in row
            assert row["ratio_reverb"] == pytest.approx(500.0)
        assert row["ratio"] == 5.0  # cpprb / shmreplay unchanged


def test_a_worker_case_out_of_order_is_an_error(monkeypatch):
    out = _worker_output()
    out["results"][0], out["results"][1] = out["results"][1], out["results"][0]
    monkeypatch.setattr(vs.RV, "run_worker", lambda *a: out)
    with pytest.raises(AssertionError, match="is not"):
        vs.run_reverb(_args(), ["reverb"], _rows(), [])


def test_without_a_reverb_python_reverb_is_not_measured(monkeypatch):
    monkeypatch.delenv("REVERB_PYTHON", raising=False)
    monkeypatch.setattr(vs.RV, "run_worker", lambda *a: pytest.fail("worker started"))
    rows = _rows()
    section = vs.run_reverb(_args(reverb_python=None), ["cpprb", "shmreplay", "reverb"],
                            rows, [])
    assert section == {"measured": False, "note": section["note"]}
    assert "REVERB_PYTHON" in section["note"]
    assert all("reverb" not in row for row in rows)


def _table(data):
    return "\n".join(tables.vs_cpprb([("x.json", data)]))


def test_the_page_table_has_reverb_columns_only_when_measured(monkeypatch):
    monkeypatch.setattr(vs.RV, "run_worker", lambda *a: _worker_output())
    rows = _rows()
    section = vs.run_reverb(_args(), ["reverb"], rows, [])
    with_reverb = _table({"results": rows, "reverb": section})
    assert "| Reverb µs | Reverb / shmreplay |" in with_reverb.splitlines()[0]
    assert "| add | uniform | 1 | 20.00 | 4.00 | **5.00x** | 400 | 100x |" in with_reverb
    without = _table({"results": _rows(), "reverb": {"measured": False, "note": "n/a"}})
    assert "Reverb" not in without
    assert _table({"results": _rows()}) == without  # older files have no section


def test_the_per_call_plot_draws_reverb_when_measured(monkeypatch):
    pytest.importorskip("matplotlib")
    import plots
    monkeypatch.setattr(vs.RV, "run_worker", lambda *a: _worker_output())
    rows = _rows()
    section = vs.run_reverb(_args(), ["reverb"], rows, [])
    config = {"add_steps": list(vs.ADD_STEPS), "batch_sizes": list(vs.BATCH_SIZES)}
    plt = plots._pyplot()

    def reverb_lines(data):
        fig = plots.fig_per_call(plt, "x.json", data)
        try:
            return ([ln.get_label() for ax in fig.axes for ln in ax.get_lines()
                     if ln.get_color() == plots.COLORS["reverb"]], fig._suptitle.get_text())
        finally:
            plt.close(fig)

    lines, title = reverb_lines({"results": rows, "reverb": section, "config": config})
    # add: writer and Client.insert, uniform and prioritized; sample: uniform,
    # prioritized, sample+update.
    assert len(lines) == 7, lines
    assert "reverb Client.insert per step, uniform" in lines
    assert "Reverb 0.14.0" in title
    lines, title = reverb_lines({"results": _rows(), "config": config})
    assert lines == [] and "Reverb: not in this JSON" in title


@pytest.mark.skipif(not __import__("os").environ.get("REVERB_PYTHON"),
                    reason="needs $REVERB_PYTHON, a Python with dm-reverb")
def test_the_reverb_worker_times_every_case_through_reverb():
    """The real worker, in Reverb's virtualenv (about half a minute)."""
    import json
    import os
    import subprocess
    proc = subprocess.run(
        [os.environ["REVERB_PYTHON"], str(ROOT / "benchmarks" / "bench_vs_cpprb.py"),
         "--reverb-worker", "--quick"],
        capture_output=True, text=True, timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert out["errors"] == [] and out["versions"]["dm-reverb"]
    assert [(r["op"], r["sampler"], r["n"]) for r in out["results"]] == vs.cases()
    for row in out["results"]:
        apis = ("writer", "insert") if row["op"] == "add" else ("client",)
        assert all(row[api]["median_us"] > 0 for api in apis), row

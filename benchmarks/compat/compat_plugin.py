"""pytest plugin for run.py: records each case's outcome as it ends, and sets up what
the test files' ``__main__`` blocks would have (they are run by pytest, not as scripts).

Environment (set by run.py):
  COMPAT_RESULTS: a JSON-lines file; one line per finished case, appended at once, so
    that a file whose run is killed (a hang past its timeout) keeps what it finished.
  COMPAT_GRAPH_MODE=1: the file's ``__main__`` calls ``tf.disable_eager_execution()``.
"""

import json
import os


def pytest_configure(config):
    if os.environ.get("COMPAT_GRAPH_MODE") == "1":
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
    try:  # absltest.main() parses flags; tests read FLAGS.test_tmpdir and the like
        from absl import flags
        flags.FLAGS.mark_as_parsed()
    except ImportError:
        pass


def _first_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.strip().splitlines()[0][:400]
    text = str(report.longrepr or "")
    for line in text.splitlines():
        if line.startswith("E "):
            return line[1:].strip()[:400]
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:400] if lines else ""


def _record(nodeid, outcome, message=""):
    path = os.environ.get("COMPAT_RESULTS")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"id": nodeid, "outcome": outcome, "message": message}) + "\n")


def pytest_runtest_logstart(nodeid, location):
    path = os.environ.get("COMPAT_RESULTS")
    if path:  # the case now running: a kill leaves this as the last line
        with open(path + ".running", "w") as out:
            out.write(nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call":
        if report.passed:
            _record(report.nodeid, "passed")
        elif report.skipped:
            _record(report.nodeid, "skipped", _first_line(report))
        else:
            _record(report.nodeid, "failed", _first_line(report))
    elif report.failed:  # setup or teardown
        _record(report.nodeid, "error", f"[{report.when}] " + _first_line(report))
    elif report.skipped and report.when == "setup":
        _record(report.nodeid, "skipped", _first_line(report))


def pytest_collectreport(report):
    if report.failed:
        _record(report.nodeid, "error", "[collect] " + _first_line(report))

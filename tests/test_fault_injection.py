"""A short run of ``benchmarks/fault_injection.py``: busy actors and learners, spawned and
attached by name, stopped (SIGSTOP), resumed and SIGKILLed at random.

Nothing acknowledged is lost, nothing torn, the table verifies, and no call with a
timeout hangs. How closely timeouts are kept (the benchmark's 100 ms) is a figure of the
benchmark on a quiet machine; here, on a shared CI machine, a call only has to end
within its timeout plus two seconds.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
import fault_injection  # noqa: E402

pytestmark = pytest.mark.slow


def test_random_stops_and_kills_lose_nothing_and_hang_nothing(buffer_name):
    figures = fault_injection.run(seconds=8.0, actors=2, learners=1, seed=7,
                                  name=buffer_name, allowance=2.0, at_least=(21, 101),
                                  longest=60.0)
    assert figures["stops"] > 20 and figures["calls_with_timeout"] > 100, figures
    assert figures["acknowledged"] > 0, figures
    assert figures["missing"] == 0 and figures["torn"] == 0, figures
    assert figures["verify"] == [], figures
    assert figures["overruns"] == 0, figures

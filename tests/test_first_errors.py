"""The first errors a user meets (issue 16): each says what happened in words, names
the table, column, expected and actual value, says what to do, and leaves the buffer
exactly as it was.
"""

import multiprocessing
import os

import numpy as np
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay.specs import TensorSpec
import _mp_workers
import _names

SPAWN = multiprocessing.get_context("spawn")


def all_of(*parts):
    """A regex matching a message that contains every one of ``parts`` (regexes)."""
    return "(?s)" + "".join(f"(?=.*{part})" for part in parts)


def uniform(name, **kwargs):
    return shmreplay.Table(name, selectors.Uniform(), selectors.Fifo(), 100,
                           rate_limiters.MinSize(1), **kwargs)


def contents(client, table):
    """Everything a rejected call must leave as it was: size, counters, items."""
    info = client.server_info()[table]
    items = []
    if info.current_size:
        engine = client._engine(table)
        items = [np.asarray(column).copy() for column in engine.columns]
    return (info.current_size, info.num_inserted, info.num_sampled, info.num_deleted,
            [item.tobytes() for item in items])


# --- timeouts ------------------------------------------------------------------------------


def test_timeout_messages_print_the_callers_seconds(buffer_name):
    tables = [shmreplay.Table.queue(name, 1) for name in ("q", "w", "t")]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        timeout = 0.1 * 3  # 0.30000000000000004
        # never inserted into: waits for the first item
        with pytest.raises(errors.DeadlineExceededError,
                           match=r"'q'.* sample within the timeout of 0\.3 s\.$"):
            client.sample_batch("q", 1, timeout=timeout)
        client.insert({"x": np.zeros(2)}, {"q": 1.0})
        before = contents(client, "q")
        # full: an insert waits; the message is the caller's timeout, not what was left
        with pytest.raises(errors.DeadlineExceededError,
                           match=r"'q'.* insert within the timeout of 0\.3 s\.$"):
            client.insert({"x": np.zeros(2)}, {"q": 1.0}, timeout=timeout)
        assert contents(client, "q") == before
        client.sample_batch("q", 1, timeout=1)
        # empty again: the sample waits through the general path with a deadline
        for call in (lambda: client.sample_batch("q", 1, timeout=timeout),
                     lambda: next(client.sample("q", 1, timeout=timeout))):
            with pytest.raises(errors.DeadlineExceededError,
                               match=r"'q'.* sample within the timeout of 0\.3 s\.$"):
                call()
        with client.writer(1) as writer:
            writer.append({"x": np.zeros(2)})
            writer.create_item("w", 1, 1.0)
            writer.append({"x": np.zeros(2)})
            writer.create_item("w", 1, 1.0)  # waits: the queue is full
            with pytest.raises(errors.DeadlineExceededError,
                               match=r"1 item\(s\) still wait .* after 0\.3 s\.$"):
                writer.flush(timeout=timeout)
            client.sample_batch("w", 1, timeout=1)
        trajectory = client.trajectory_writer(1)
        for _ in range(2):
            trajectory.append({"x": np.zeros(2)})
            trajectory.create_item("t", 1.0, {"x": trajectory.history["x"][-1:]})
        with pytest.raises(errors.DeadlineExceededError, match=r"after 300 ms\.$"):
            trajectory.flush(timeout_ms=100 * 3.0000000000000004)
        client.sample_batch("t", 1, timeout=1)
        trajectory.flush(timeout_ms=1000)
        trajectory.close()
        client.close()


def test_seconds_are_readable_and_keep_what_was_asked():
    assert errors.seconds(0.1 * 3) == "0.3 s"
    assert errors.seconds(0.25) == "0.25 s"
    assert errors.seconds(1e-4) == "0.0001 s"
    assert errors.seconds(3600) == "3600 s"
    assert errors.seconds(2.5, "ms") == "2.5 ms"

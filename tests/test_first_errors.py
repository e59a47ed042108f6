"""The first errors a user meets (issue 16): each says what happened in words, names
the table, column, expected and actual value, says what to do, and leaves the buffer
exactly as it was.
"""

import multiprocessing
import os
import re

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


# --- a second Server with a taken name ------------------------------------------------------


def test_a_taken_name_says_whose_it_is_and_whether_its_owner_lives(buffer_name):
    ready, queue = SPAWN.Event(), SPAWN.Queue()
    owner = SPAWN.Process(target=_mp_workers.owner_waits, args=(buffer_name, ready, queue))
    with _mp_workers.processes(owner, join_timeout=0):
        assert ready.wait(60), "the owner did not create its buffer"
        before = _mp_workers.shm_objects(buffer_name)
        with pytest.raises(errors.BufferExistsError,
                           match=all_of(f"'{buffer_name}'", "already exists",
                                        f"pid {owner.pid}, is alive", "another name",
                                        "shmreplay ls")) as info:
            shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name)
        assert isinstance(info.value, FileExistsError)
        with shmreplay.Client(buffer_name) as client:  # the owner's buffer is untouched
            assert client.server_info()["signed"].current_size == 1
        assert _mp_workers.shm_objects(buffer_name) == before

        assert _mp_workers.kill_and_reap(owner) == -9
        with pytest.raises(errors.BufferExistsError,
                           match=all_of(f"'{buffer_name}'", f"pid {owner.pid}, is dead",
                                        "shmreplay gc", f"shmreplay rm {buffer_name}")):
            shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name)
        assert _mp_workers.shm_objects(buffer_name) == before
    from shmreplay import cli
    import io
    assert cli.main(["rm", buffer_name], out=io.StringIO()) == 0   # what the message says
    with shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name) as server:
        assert server.name == buffer_name


def test_a_taken_name_in_this_process_says_so(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name):
        with pytest.raises(errors.BufferExistsError,
                           match=all_of(f"this process \\(pid {os.getpid()}\\)",
                                        "already running here")):
            shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name)


def test_a_name_taken_by_something_else_is_left_alone(buffer_name):
    path = f"/dev/shm/shmreplay.{buffer_name}"
    os.mkfifo(path, 0o600)  # opening it for reading would block: never done
    try:
        with pytest.raises(errors.SegmentSquattedError,  # (a BufferExistsError)
                           match=all_of(path, "not a regular file", "owner uid",
                                        f"rm --force {buffer_name}")):
            shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name)
        assert os.path.exists(path)
    finally:
        os.unlink(path)


# --- addresses: Reverb's "localhost:8000" and shmreplay's names -----------------------------


@pytest.mark.parametrize("address", ["replay-host:8000", "dns:///replay-host:80",
                                     "10.1.2.3:8000", "[2001:db8::1]:8000"])
def test_a_remote_address_is_refused_with_the_reason(address):
    with pytest.raises(errors.InvalidNameError,
                       match=all_of(re.escape(repr(address)), "not this machine",
                                    "no network server", "localhost:")) as info:
        shmreplay.Client(address)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("address", ["localhost:x", "localhost:0", "localhost:70000", ":80"])
def test_a_malformed_address_is_refused(address):
    with pytest.raises(errors.InvalidNameError, match=re.escape(repr(address))):
        shmreplay.Client(address)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_name_that_looks_like_a_host_is_a_name(host):
    # A valid name is never refused: it is waited for, and its absence explained.
    client = shmreplay.Client(host)
    with pytest.raises(errors.BufferNotFoundError,
                       match=all_of(f"'{host}' looks like a host", "PORT",
                                    "(shmreplay ls|No buffer exists)")):
        client.server_info(timeout=0)


# (".t1": once refused, as the old name of a buffer's table 1 data segment; names cannot
# collide since: tests/test_segments.py.)
@pytest.mark.parametrize("tail", ["", "_under.dot-dash", ".127.0.0.1", ".t", ".tt1", ".t1x", ".t1",
                                  "-" + "x" * 40])
def test_every_valid_name_attaches(tail):
    name = _names.unique("name") + tail
    with shmreplay.Server([shmreplay.Table.queue("q", 2)], name=name) as server:
        with shmreplay.Client(name) as client:
            client.insert({"x": np.zeros(1)}, {"q": 1.0})
        with server.localhost_client() as client:
            assert server.name == name == client.server_address


def test_a_named_server_has_no_port_and_a_port_excludes_a_name(buffer_name):
    with pytest.raises(ValueError, match=all_of("give one", "port-P")):
        shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name, port=8000)
    with shmreplay.Server([shmreplay.Table.queue("q", 2)], name=buffer_name) as server:
        with pytest.raises(AttributeError,
                           match=all_of("no port", "created by name",
                                        re.escape(f"Client({buffer_name!r})"))):
            server.port
        with server.localhost_client() as client:
            assert client.server_address == buffer_name


# --- data that does not fit: structure in words, dtype before shape, None ------------------

SIGNED = {"obs": TensorSpec((2,), np.float32), "reward": TensorSpec((), np.float64),
          "nest": {"a": TensorSpec((3,), np.int64)}}


def _item(**change):
    item = {"obs": np.zeros(2, np.float32), "reward": 1.0, "nest": {"a": np.zeros(3, np.int64)}}
    item.update(change)
    return {key: value for key, value in item.items() if value is not _DROP}


_DROP = object()


@pytest.mark.parametrize("table", ["signed", "first-item"])
def test_a_structure_mismatch_names_the_key_paths_in_words(buffer_name, table):
    # (arena_bytes=0: a table without a signature would otherwise store these items
    # whole in its general store, as Reverb does: see test_general_items)
    tables = [uniform("signed", signature=SIGNED), uniform("first-item", arena_bytes=0)]
    with shmreplay.Server(tables, name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        other = "first-item" if table == "signed" else "signed"
        client.insert(_item(), {table: 1.0, other: 1.0})
        before = contents(client, table), contents(client, other)
        cases = [
            (_item(reward=_DROP), ["\\['reward'\\] is missing",
                                   "a float64 column of shape \\(\\)"]),
            (_item(extra=np.zeros(1)), ["\\['extra'\\] is an extra key"]),
            (_item(reward=_DROP, rew=1.0), ["\\['reward'\\] is missing",
                                            "\\['rew'\\] is an extra key"]),
            (_item(nest={"a": np.zeros(3, np.int64), "b": 1}),
             ["\\['nest'\\]\\['b'\\] is an extra key"]),
            (_item(obs=[0.0, 1.0]), ["\\['obs'\\] is a list of 2",
                                     "a float32 column of shape \\(2,\\)", "np.asarray"]),
            (_item(nest=(np.zeros(3, np.int64),)),
             ["\\['nest'\\] is a tuple of 1", "a dict with keys 'a'"]),
            ((np.zeros(2, np.float32), 1.0), ["the data is a tuple of 2",
                                              "a dict with keys 'nest', 'obs', 'reward'"]),
        ]
        for data, parts in cases:
            # one table: the fast path first; two: the general path at once
            for priorities in ({table: 1.0}, {table: 1.0, other: 1.0}):
                with pytest.raises(errors.SchemaError,
                                   match=all_of(f"'{table}'", "structure", *parts)):
                    client.insert(data, priorities)
        with pytest.raises(errors.SchemaError, match=all_of("\\['reward'\\] is missing")):
            client.insert_batch({"obs": np.zeros((2, 2), np.float32),
                                 "nest": {"a": np.zeros((2, 3), np.int64)}}, {table: 1.0})
        assert (contents(client, table), contents(client, other)) == before


def test_a_string_into_a_numeric_column_says_dtype_not_shape(buffer_name):
    with shmreplay.Server([uniform("t", signature=SIGNED), uniform("raw", arena_bytes=0)],
                          name=buffer_name) as server, shmreplay.Client(server.name) as client:
        client.insert(_item(), {"t": 1.0})
        before = contents(client, "t")
        for value, got in (("ab", "the str 'ab'"), (b"ab", "the bytes b'ab'"),
                           (np.array(["a", "b"]), "an array of dtype <U1 \\(strings\\)"),
                           (np.array([object(), object()]), "dtype object")):
            with pytest.raises(errors.SchemaError,
                               match=all_of("'t'", "\\['obs'\\]", "expected dtype float32",
                                            got, "never strings")) as info:
                client.insert(_item(obs=value), {"t": 1.0})
            assert "shape" not in str(info.value)
        assert contents(client, "t") == before
        # the first item of an unsigned table: no column of strings is made
        with pytest.raises(errors.SchemaError,
                           match=all_of("'raw'", "\\['obs'\\]", "<U2 \\(strings\\)", "numeric")):
            client.insert({"obs": "ab"}, {"raw": 1.0})
        assert client.server_info()["raw"].signature is None


def test_a_none_in_a_tables_first_item_is_refused(buffer_name):
    with shmreplay.Server([uniform("t")], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        for data, where in (({"obs": np.zeros(2), "reward": None}, "\\['reward'\\] is None"),
                            ((np.zeros(2), None, {"x": None}),
                             "\\[1\\], \\[2\\]\\['x'\\] are None")):
            with pytest.raises(errors.MissingValueError,
                               match=all_of("'t'", "first item fixes the table's columns",
                                            where, "needs a value", "signature")) as info:
                client.insert(data, {"t": 1.0})
            # Reverb refuses a None leaf with a TypeError; a SchemaError is a ValueError
            assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
        assert client.server_info()["t"].signature is None  # nothing was fixed
        client.insert({"obs": np.zeros(2), "reward": np.float32(0)}, {"t": 1.0})
        before = contents(client, "t")
        with pytest.raises(errors.MissingValueError,
                           match=all_of("'t'", "\\['reward'\\] is None",
                                        "a float32 column of shape \\(\\)")):
            client.insert({"obs": np.zeros(2), "reward": None}, {"t": 1.0})
        assert contents(client, "t") == before


def test_a_float32_into_a_column_a_python_float_made_says_so(buffer_name):
    # The README's trap: a Python float in the first item makes a float64 column, and a
    # learner's np.float32 reward is then refused. The message says how it came to be.
    # (arena_bytes=0: refused, not stored whole in the general store; see test_general_items)
    with shmreplay.Server([uniform("replay", arena_bytes=0), uniform("signed", signature=SIGNED)],
                          name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"obs": np.zeros(2, np.float32), "reward": 1.0}, {"replay": 1.0})
        before = contents(client, "replay")
        for reward, got in ((np.float32(1.0), "a numpy float32 scalar"),
                            (np.ones(1, np.float32)[0], "a numpy float32 scalar")):
            with pytest.raises(errors.SchemaError,
                               match=all_of("'replay'", "\\['reward'\\]",
                                            "expected dtype float64, got float32", got,
                                            "never cast", "first item fixed",
                                            "a Python float makes float64",
                                            "np\\.float32\\(\\.\\.\\.\\)")):
                client.insert({"obs": np.zeros(2, np.float32), "reward": reward},
                              {"replay": 1.0})
        with pytest.raises(errors.SchemaError,
                           match=all_of("'replay'", "\\['reward'\\]", "float64", "float32",
                                        "an array of float32")):
            client.insert_batch({"obs": np.zeros((2, 2), np.float32),
                                 "reward": np.ones(2, np.float32)}, {"replay": 1.0})
        assert contents(client, "replay") == before
        # a table with a signature chose its dtypes: no word about a first item
        client.insert(_item(), {"signed": 1.0})
        with pytest.raises(errors.SchemaError, match="float32") as info:
            client.insert(_item(reward=np.float32(1)), {"signed": 1.0})
        assert "first item" not in str(info.value)


def test_the_readme_example_takes_a_learners_float32_reward(buffer_name):
    # With np.float32(1.0) in the first item, float32 rewards and Python floats both fit.
    with shmreplay.Server([uniform("replay")], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"obs": np.zeros(8, np.float32), "reward": np.float32(1.0)},
                      priorities={"replay": 1.0})
        client.insert({"obs": np.zeros(8, np.float32), "reward": np.float32(0.5)},
                      priorities={"replay": 1.0})
        client.insert({"obs": np.zeros(8, np.float32), "reward": 0.25}, {"replay": 1.0})
        batch = client.sample_batch("replay", 3, timeout=5)
        assert batch.data["reward"].dtype == np.float32


def test_the_writers_name_structure_mismatches_in_words(buffer_name):
    # (no general store, which would take the trajectory's item of another structure)
    table = shmreplay.Table.queue("q", 10, arena_bytes=0)
    with shmreplay.Server([table], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        with client.writer(2) as writer:
            writer.append({"a": np.zeros(2), "b": np.int64(1)})
            with pytest.raises(errors.SchemaError,
                               match=all_of("Writer", "\\['b'\\] is missing",
                                            "the first step has an int64 column")):
                writer.append({"a": np.zeros(2)})
            writer.create_item("q", 1, 1.0)
        trajectory = client.trajectory_writer(2)
        trajectory.append({"a": np.zeros(2), "c": np.int64(1)})
        with pytest.raises(errors.SchemaError,
                           match=all_of("'q'", "\\['b'\\] is missing",
                                        "\\['c'\\] is an extra key")):
            trajectory.create_item("q", 1.0, {"a": trajectory.history["a"][-1:],
                                              "c": trajectory.history["c"][-1:]})
        trajectory.close()

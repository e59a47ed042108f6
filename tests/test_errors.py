"""Bad input (issue 2): every rejected call raises a typed error whose message names what
was wrong and what was expected, and leaves the buffer exactly as it was.
"""

import contextlib
import math
import mmap
import threading

import numpy as np
import posix_ipc
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay._shm import layout as L
from shmreplay.specs import TensorSpec
import _names
from _nests import sample_nests

SIGNATURE = {"obs": TensorSpec((3,), np.float32), "act": TensorSpec((), np.int64)}


def item(i=0, obs=None):
    return {"obs": np.full(3, i, np.float32) if obs is None else obs, "act": np.int64(i)}


def batch(n, start=0):
    return {"obs": np.repeat(np.arange(start, start + n, dtype=np.float32)[:, None], 3, axis=1),
            "act": np.arange(start, start + n, dtype=np.int64)}


def all_of(*parts):
    """A regex matching a message that contains every one of ``parts`` (regexes), in any order."""
    def scoped(part):  # "(?i)x" -> "(?i:x)": global flags may only start a regex
        return f"(?i:{part[4:]})" if part.startswith("(?i)") else part
    return "(?s)" + "".join(f"(?=.*{scoped(p)})" for p in parts)


def new_name(tag="err"):
    return _names.unique(tag)


def tables():
    return [
        shmreplay.Table("sig", sampler=selectors.Prioritized(1.0), remover=selectors.Fifo(),
                        max_size=100, rate_limiter=rate_limiters.MinSize(1), signature=SIGNATURE),
        # No signature: the first item fixes it. (arena_bytes=0: refused, not stored
        # whole in the general store; see test_general_items)
        shmreplay.Table.queue("q", 3, arena_bytes=0),
        shmreplay.Table("raw", sampler=selectors.Uniform(), remover=selectors.Fifo(),
                        max_size=10, rate_limiter=rate_limiters.MinSize(1),
                        arena_bytes=0),   # stays unsigned
    ]


@contextlib.contextmanager
def serve():
    with shmreplay.Server(tables=tables(), name=new_name()) as server:
        client = shmreplay.Client(server.name)
        try:
            yield server, client
        finally:
            client.close()


@pytest.fixture
def populated():
    """A buffer whose 'sig' table holds acts 0, 1, 2 with priorities 1, 2, 3 and whose
    queue 'q' holds one item; yields (server, client, {act: key} of 'sig')."""
    with serve() as (server, client):
        keys = {}
        for i in range(3):
            keys[i] = client.insert(item(i), priorities={"sig": float(i + 1)}, timeout=1)["sig"]
        client.insert(item(9), priorities={"q": 1.0}, timeout=1)
        yield server, client, keys


def snapshot(client):
    state = {}
    for name, info in client.server_info().items():
        rl = info.rate_limiter_info
        state[name] = dict(
            current_size=info.current_size, num_inserted=info.num_inserted,
            num_sampled=info.num_sampled, num_deleted=info.num_deleted,
            num_unique_samples=info.num_unique_samples,
            inserts=rl.insert_stats.completed, samples=rl.sample_stats.completed,
            deletes=rl.delete_stats.completed,
            signature=None if info.signature is None else repr(info.signature),
            # slots reserved and not yet committed or cancelled: a refused call must not
            # leave one behind (the table would look unchanged, with a slot lost)
            pending=int(client._buffer.by_name[name].ctrl[L.C_PENDING]))
    return state


@contextlib.contextmanager
def unchanged(client):
    """Asserts that nothing the buffer reports changed across the block."""
    before = snapshot(client)
    yield
    after = snapshot(client)
    changed = [f"{table}.{field}: {before[table][field]!r} -> {after[table][field]!r}"
               for table in before for field in before[table]
               if before[table][field] != after[table][field]]
    assert not changed, "a rejected call changed the buffer: " + "; ".join(changed)


def assert_sig_contents(client, priorities=None):
    """'sig' still holds acts 0..2 with the given priorities (checked by sampling last)."""
    priorities = priorities or {0: 1.0, 1: 2.0, 2: 3.0}
    s = client.sample_batch("sig", batch_size=600, timeout=1)
    seen = {}
    for act, obs, prio, prob in zip(s.data["act"].tolist(), s.data["obs"], s.info.priority,
                                    s.info.probability):
        np.testing.assert_array_equal(obs, np.full(3, act, np.float32))
        seen[act] = prio
        assert prob == pytest.approx(priorities[act] / sum(priorities.values()), rel=1e-9)
    assert seen == priorities


# --------------------------------------------------------------------------------------
# shape, dtype, structure
# --------------------------------------------------------------------------------------

def test_wrong_shape(populated):
    server, client, _ = populated
    with unchanged(client):
        with pytest.raises(errors.SchemaError, match=all_of("'sig'", "obs", r"\(3,\)", r"\(4,\)")):
            client.insert(item(obs=np.zeros(4, np.float32)), priorities={"sig": 1.0}, timeout=1)
        with pytest.raises(ValueError, match=all_of("'sig'", "obs", r"\(3,\)", r"\(2, 2\)")):
            client.insert(item(obs=np.zeros((2, 2), np.float32)), priorities={"sig": 1.0})
        bad = batch(2)
        bad["obs"] = np.zeros((2, 5), np.float32)
        with pytest.raises(errors.SchemaError, match=all_of("'sig'", "obs", r"\(3,\)", r"\(5,\)")):
            client.insert_batch(bad, priorities={"sig": 1.0}, timeout=1)
    assert_sig_contents(client)


def test_first_item_fixes_shape_of_unsigned_table(populated):
    server, client, _ = populated
    with unchanged(client):
        with pytest.raises(errors.SchemaError, match=all_of("'q'", "obs", r"\(3,\)", r"\(7,\)")):
            client.insert(item(obs=np.zeros(7, np.float32)), priorities={"q": 1.0}, timeout=1)


def test_wrong_dtype(populated):
    server, client, _ = populated
    with unchanged(client):
        with pytest.raises(errors.SchemaError, match=all_of("'sig'", "obs", "float32", "float64")):
            client.insert(item(obs=np.zeros(3, np.float64)), priorities={"sig": 1.0}, timeout=1)
        with pytest.raises(errors.SchemaError, match=all_of("'sig'", "act", "int64", "int32")):
            client.insert({"obs": np.zeros(3, np.float32), "act": np.int32(1)},
                          priorities={"sig": 1.0}, timeout=1)
        bad = batch(2)
        bad["act"] = bad["act"].astype(np.float32)
        with pytest.raises(errors.SchemaError, match=all_of("'sig'", "act", "int64", "float32")):
            client.insert_batch(bad, priorities={"sig": 1.0}, timeout=1)
        # the unsigned queue's dtypes were fixed by its first item
        with pytest.raises(errors.SchemaError, match=all_of("'q'", "obs", "float32", "int16")):
            client.insert(item(obs=np.zeros(3, np.int16)), priorities={"q": 1.0}, timeout=1)
    assert_sig_contents(client)


def test_wrong_structure(populated):
    server, client, _ = populated
    with unchanged(client):
        for data in ({"obs": np.zeros(3, np.float32)},
                     {"obs": np.zeros(3, np.float32), "act": np.int64(0), "extra": np.int64(1)},
                     (np.zeros(3, np.float32), np.int64(0)),
                     np.zeros(3, np.float32)):
            with pytest.raises(errors.SchemaError, match=all_of("'sig'", "(?i)structure")):
                client.insert(data, priorities={"sig": 1.0}, timeout=1)
    assert_sig_contents(client)


def test_non_numeric_data(populated):
    server, client, _ = populated
    with unchanged(client):
        with pytest.raises(errors.SchemaError, match=all_of("'sig'", "obs", "float32")):
            client.insert(item(obs=np.array(["a", "b", "c"])), priorities={"sig": 1.0}, timeout=1)
        with pytest.raises(errors.SchemaError, match=all_of("'sig'", "act", "int64")):
            client.insert({"obs": np.zeros(3, np.float32), "act": "seven"},
                          priorities={"sig": 1.0}, timeout=1)
        with pytest.raises(errors.SchemaError, match=all_of("'sig'", "act")):
            client.insert({"obs": np.zeros(3, np.float32), "act": object()},
                          priorities={"sig": 1.0}, timeout=1)
        # an unsigned table must not let a non-numeric first item define its columns
        for data in ("hello", np.array([b"bytes"]), {"x": object()}, [np.float32(1), "s"]):
            with pytest.raises(errors.SchemaError, match=all_of("'raw'", "(?i)numeric")):
                client.insert(data, priorities={"raw": 1.0}, timeout=1)
    assert client.server_info()["raw"].signature is None
    client.insert(np.arange(4, dtype=np.int16), priorities={"raw": 1.0}, timeout=1)
    s = client.sample_batch("raw", batch_size=1, timeout=1)
    np.testing.assert_array_equal(s.data[0], np.arange(4, dtype=np.int16))
    assert_sig_contents(client)


def test_batch_leaves_with_different_leading_sizes(populated):
    server, client, _ = populated
    with unchanged(client):
        bad = {"obs": np.zeros((4, 3), np.float32), "act": np.zeros(5, np.int64)}
        with pytest.raises(errors.SchemaError,
                           match=all_of("(?i)leading", r"obs\W+4", r"act\W+5")):
            client.insert_batch(bad, priorities={"sig": 1.0}, timeout=1)
        scalar_leaf = {"obs": np.zeros((4, 3), np.float32), "act": np.int64(1)}
        with pytest.raises(errors.SchemaError, match=all_of("(?i)batch dimension", "act")):
            client.insert_batch(scalar_leaf, priorities={"sig": 1.0}, timeout=1)
        with pytest.raises(errors.SchemaError, match="(?i)empty"):
            client.insert_batch(batch(0), priorities={"sig": 1.0}, timeout=1)
    assert_sig_contents(client)


# --------------------------------------------------------------------------------------
# tables and priorities
# --------------------------------------------------------------------------------------

def test_unknown_table(populated):
    server, client, keys = populated
    message = all_of("nope", "(?i)not found", "sig")      # names the table and the choices
    calls = [
        lambda: client.insert(item(), priorities={"nope": 1.0}, timeout=1),
        lambda: client.insert(item(), priorities={"sig": 1.0, "nope": 1.0}, timeout=1),
        lambda: client.insert_batch(batch(2), priorities={"sig": 1.0, "nope": 1.0}, timeout=1),
        lambda: client.sample_batch("nope", batch_size=1, timeout=1),
        lambda: next(client.sample("nope", timeout=1)),
        lambda: client.mutate_priorities("nope", updates={keys[0]: 5.0}),
        lambda: client.update_priorities("nope", keys=np.array([keys[0]], np.uint64),
                                         priorities=np.array([5.0])),
        lambda: client.reset("nope"),
    ]
    with unchanged(client):
        for call in calls:
            with pytest.raises(errors.TableNotFoundError, match=message) as info:
                call()
            assert isinstance(info.value, RuntimeError)
            assert isinstance(info.value, KeyError)
            assert not str(info.value).startswith("'")      # KeyError must not quote it
    assert_sig_contents(client)


@pytest.mark.parametrize("bad, text", [(-1.0, "-1"), (math.nan, "(?i)nan"),
                                       (math.inf, "(?i)inf"), (-math.inf, "(?i)-inf")])
def test_invalid_priority(populated, bad, text):
    server, client, keys = populated
    message = all_of("'sig'", text)
    with unchanged(client):
        with pytest.raises(errors.InvalidPriorityError, match=message):
            client.insert(item(5), priorities={"sig": bad}, timeout=1)
        # the bad priority is for the second table: the first gets nothing either
        with pytest.raises(errors.InvalidPriorityError, match=message):
            client.insert(item(5), priorities={"q": 1.0, "sig": bad}, timeout=1)
        with pytest.raises(errors.InvalidPriorityError, match=message):
            client.insert_batch(batch(3, start=5), priorities={"sig": np.array([1.0, bad, 1.0])},
                                timeout=1)
        with pytest.raises(errors.InvalidPriorityError, match=message):
            client.insert_batch(batch(3, start=5), priorities={"sig": bad}, timeout=1)
        with pytest.raises(ValueError, match=message):
            client.mutate_priorities("sig", updates={keys[0]: 7.0, keys[1]: bad})
        with pytest.raises(ValueError, match=message):
            client.mutate_priorities("sig", updates={keys[1]: bad}, deletes=[keys[2]])
        with pytest.raises(errors.InvalidPriorityError, match=message):
            client.update_priorities("sig", keys=np.array([keys[0], keys[1]], np.uint64),
                                     priorities=np.array([7.0, bad]))
    # no earlier part of a rejected call was applied
    assert_sig_contents(client)


def test_priority_too_large_for_the_sum_tree(populated):
    # 'sig' is Prioritized(1.0) over 100 slots: the largest priority keeps their sum
    # finite; above it each insert path refuses the item with the same message.
    server, client, keys = populated
    message = all_of("'sig'", "too large")
    with unchanged(client):
        with pytest.raises(errors.InvalidPriorityError, match=message):
            client.insert(item(5), priorities={"sig": 1e307}, timeout=1)
        with pytest.raises(errors.InvalidPriorityError, match=message):
            client.insert_batch(batch(2, start=5), priorities={"sig": 1e307}, timeout=1)
        with pytest.raises(errors.InvalidPriorityError, match=message):
            client.insert_batch(batch(2, start=5), priorities={"sig": np.array([1.0, 1e307])},
                                timeout=1)
    assert_sig_contents(client)


def test_malformed_priorities(populated):
    server, client, keys = populated
    with unchanged(client):
        with pytest.raises(errors.InvalidPriorityError, match="(?i)empty"):
            client.insert(item(), priorities={}, timeout=1)
        with pytest.raises(ValueError, match="(?i)empty"):
            client.insert_batch(batch(2), priorities={}, timeout=1)
        with pytest.raises(errors.InvalidPriorityError,
                           match=all_of("'sig'", "3", r"\(2,\)")):
            client.insert_batch(batch(3), priorities={"sig": np.ones(2)}, timeout=1)
        with pytest.raises(errors.InvalidPriorityError, match=all_of("'sig'", "high")):
            client.insert(item(), priorities={"sig": "high"}, timeout=1)
        with pytest.raises(errors.InvalidPriorityError, match=all_of("'sig'", "3", r"\(2,\)")):
            client.update_priorities("sig", keys=np.array([keys[0], keys[1], keys[2]], np.uint64),
                                     priorities=np.ones(2))
    assert_sig_contents(client)


def test_timeout_and_oversized_batches_leave_the_table_unchanged(populated):
    server, client, _ = populated
    client.insert(item(1), priorities={"q": 1.0}, timeout=1)
    client.insert(item(2), priorities={"q": 1.0}, timeout=1)      # the queue is full (3)
    with unchanged(client):
        with pytest.raises(errors.DeadlineExceededError):
            client.insert(item(3), priorities={"q": 1.0}, timeout=0.1)
        # one full table blocks the whole insert: 'sig' must not get its item either;
        # the message names the full table and the caller's timeout
        with pytest.raises(TimeoutError, match=all_of("'q'", "timeout of 0.1 s")):
            client.insert(item(3), priorities={"sig": 1.0, "q": 1.0}, timeout=0.1)
        # a batch the queue's limiter can never admit is refused at once
        with pytest.raises(ValueError, match=all_of("'q'", "4", "(?i)split")):
            client.insert_batch(batch(4), priorities={"q": 1.0}, timeout=0.1)
        for bad in (0, -3, 1.5, 0.0):
            with pytest.raises(ValueError, match=all_of("batch_size", str(bad))):
                client.sample_batch("sig", batch_size=bad, timeout=1)
    got = [int(step.data["act"]) for [step] in sample_nests(client, "q", num_samples=3, timeout=1)]
    assert got == [9, 1, 2]
    assert_sig_contents(client)


def test_rejected_insert_does_not_fix_the_columns_of_an_unsigned_table(populated):
    # 'raw' has no signature and no item yet: its first *successful* insert fixes its
    # columns. A call that is rejected must leave it free to take any item.
    server, client, _ = populated
    wrong_for_sig = item(obs=np.zeros(4, np.float32))
    rejected = [
        # rejected by the second table's schema
        (errors.SchemaError, all_of("'sig'", "obs"),
         lambda: client.insert(wrong_for_sig, priorities={"raw": 1.0, "sig": 1.0}, timeout=1)),
        # rejected for naming a table that does not exist
        (errors.TableNotFoundError, all_of("nope", "(?i)not found"),
         lambda: client.insert(wrong_for_sig, priorities={"raw": 1.0, "nope": 1.0}, timeout=1)),
        # rejected for its priority
        (errors.InvalidPriorityError, all_of("'raw'", "-2"),
         lambda: client.insert(wrong_for_sig, priorities={"raw": -2.0}, timeout=1)),
        # rejected as a batch larger than one call can write
        (ValueError, all_of("'raw'", "(?i)split"),
         lambda: client.insert_batch(np.zeros((100, 2), np.float64), priorities={"raw": 1.0},
                                     timeout=1)),
    ]
    for error, message, call in rejected:
        with unchanged(client):
            with pytest.raises(error, match=message):
                call()
        assert client.server_info()["raw"].signature is None, "a rejected call fixed the columns"
    assert client.server_info()["raw"].signature is None
    client.insert(np.arange(5, dtype=np.int32), priorities={"raw": 1.0}, timeout=1)
    s = client.sample_batch("raw", batch_size=1, timeout=1)
    np.testing.assert_array_equal(s.data[0], np.arange(5, dtype=np.int32))


def test_timed_out_inserts_leave_no_reservation_behind(populated):
    server, client, _ = populated
    client.insert(item(1), priorities={"q": 1.0}, timeout=1)
    client.insert(item(2), priorities={"q": 1.0}, timeout=1)      # full
    for _ in range(3):
        with pytest.raises(errors.DeadlineExceededError):
            client.insert(item(3), priorities={"q": 1.0}, timeout=0.05)
    client.sample_batch("q", batch_size=1, timeout=1)             # room for exactly one
    client.insert(item(4), priorities={"q": 1.0}, timeout=0.5)
    with pytest.raises(errors.DeadlineExceededError):
        client.insert(item(5), priorities={"q": 1.0}, timeout=0.05)
    got = [int(step.data["act"]) for [step] in sample_nests(client, "q", num_samples=3, timeout=1)]
    assert got == [1, 2, 4]


# --------------------------------------------------------------------------------------
# names and configuration
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text", [
    ("", "(?i)non-empty"),
    ("bad/name", "bad/name"),
    ("bad name", "bad name"),
    (".hidden", r"\.hidden"),
    ("-dash", "-dash"),
    ("test-" + "x" * 96, "101"),                 # 101 characters; the limit is 100
    (12.5, "12.5"),
])
def test_invalid_buffer_name(name, text):
    with pytest.raises(errors.InvalidNameError, match=all_of("(?i)buffer", text)):
        shmreplay.Server(tables=tables(), name=name)
    with pytest.raises(errors.InvalidNameError, match=all_of("(?i)buffer", text)) as info:
        shmreplay.Client(name)
    assert isinstance(info.value, ValueError)


def test_reverb_positional_server_arguments_are_read_as_reverb_reads_them(tmp_path):
    # Reverb's Server(tables, port, checkpointer); shmreplay's own name is keyword-only.
    with pytest.raises(TypeError, match=all_of("port must be an int", "name=")):
        shmreplay.Server(tables(), "my-name")
    with pytest.raises(errors.InvalidNameError, match="12"):
        shmreplay.Client(12)
    checkpointer = shmreplay.checkpointers.DefaultCheckpointer(str(tmp_path))
    with shmreplay.Server(tables(), None, checkpointer) as server:
        assert isinstance(server.port, int) and server.name == f"port-{server.port}"
        with shmreplay.Client(f"localhost:{server.port}") as client:
            path = client.checkpoint()
        assert path.startswith(str(tmp_path))


def test_longest_valid_buffer_name():
    name = new_name("max")
    name += "x" * (100 - len(name))
    with shmreplay.Server(tables=tables(), name=name) as server:
        with shmreplay.Client(name) as client:
            assert client.server_info()["sig"].current_size == 0
        assert server.name == name


@pytest.mark.parametrize("name, text", [
    ("", "(?i)non-empty"), ("bad/name", "bad/name"), ("t" * 65, "65"), (None, "None")])
def test_invalid_table_name(name, text):
    with pytest.raises(errors.InvalidNameError, match=all_of("(?i)table", text)):
        shmreplay.Table.queue(name, 10)
    assert shmreplay.Table.queue("t" * 64, 10).name == "t" * 64


def test_duplicate_table_names():
    dup = [shmreplay.Table.queue("dup", 5), shmreplay.Table.queue("dup", 7)]
    with pytest.raises(ValueError, match=all_of("(?i)same name", "dup")):
        shmreplay.Server(tables=dup, name=new_name())


@pytest.mark.parametrize("value", [[], None, ()])
def test_no_tables(value):
    with pytest.raises(ValueError, match="(?i)at least one table"):
        shmreplay.Server(tables=value, name=new_name())


def test_bad_table_configuration():
    with pytest.raises(ValueError, match=all_of("'t'", "max_size", "0")):
        shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 0, rate_limiters.MinSize(1))
    with pytest.raises(TypeError, match=all_of("'t'", "sampler")):
        shmreplay.Table("t", "uniform", selectors.Fifo(), 10, rate_limiters.MinSize(1))
    with pytest.raises(TypeError, match=all_of("'t'", "rate_limiter")):
        shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 10, 3)
    with pytest.raises(ValueError, match=all_of("'t'", "(?i)unsupported signature spec", "obs")):
        shmreplay.Table.queue("t", 10, signature={"obs": "float32"})
    # (a None after the first dimension is open: the first item settles it)
    assert shmreplay.Table.queue("t", 10, signature={"obs": _spec_with_none()}).shapes_from_data
    # (strings are a string column: test_string_signatures.py)
    assert shmreplay.Table.queue("t", 10, signature=TensorSpec((2,), np.str_)).has_strings
    with pytest.raises(ValueError, match=all_of("'t'", "(?i)numeric")):
        shmreplay.Table.queue("t", 10, signature=TensorSpec((2,), "datetime64[s]"))
    with pytest.raises(ValueError, match=all_of("(?i)priority_exponent", "-1")):
        selectors.Prioritized(-1)


def _spec_with_none():
    class Spec:
        shape = (3, None)  # (a None time dimension, first, takes items of any length)
        dtype = np.float32
    return Spec()


# --------------------------------------------------------------------------------------
# attaching
# --------------------------------------------------------------------------------------

def test_attach_to_missing_buffer():
    # Reverb's lazy connection: the Client is made; its calls wait up to their timeout.
    name = new_name("missing")
    client = shmreplay.Client(name)
    with pytest.raises(errors.BufferNotFoundError, match=name) as info:
        client.server_info(timeout=0)
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, errors.DeadlineExceededError)


@contextlib.contextmanager
def foreign_segment(name, content, size):
    """A segment under a shmreplay buffer's name that shmreplay did not create."""
    segment = posix_ipc.SharedMemory("/shmreplay." + name, posix_ipc.O_CREX, size=size)
    try:
        try:
            with mmap.mmap(segment.fd, size) as view:
                view[:len(content)] = content
        finally:
            segment.close_fd()
        yield
    finally:
        segment.unlink()


def test_attach_to_segment_that_is_not_a_shmreplay_buffer():
    junk = bytes(range(256)) * 16
    name = _names.unique("foreign")
    with foreign_segment(name, junk, 4096):
        with pytest.raises(errors.LayoutMismatchError,
                           match=all_of(name, "(?i)not a shmreplay buffer",
                                        "(?i)magic")) as info:
            shmreplay.Client(name)
        assert isinstance(info.value, ValueError)


def test_attach_to_segment_too_small_for_a_header():
    name = new_name("tiny")
    with foreign_segment(name, b"SHMRPLY1", 16):
        with pytest.raises(errors.LayoutMismatchError, match=all_of(name, "16")):
            shmreplay.Client(name)


def test_attach_to_buffer_of_another_layout_version():
    from shmreplay._shm import layout as _layout
    header = np.zeros(1, _layout.HEADER)
    header["magic"] = _layout.MAGIC
    header["layout_version"] = 999
    name = new_name("version")
    with foreign_segment(name, header.tobytes(), 4096):
        with pytest.raises(errors.LayoutMismatchError,
                           match=all_of(name, "(?i)version", "999", str(_layout.LAYOUT_VERSION))):
            shmreplay.Client(name)


# --------------------------------------------------------------------------------------
# closed clients and stopped servers
# --------------------------------------------------------------------------------------

def test_use_after_close():
    with serve() as (server, client):
        other = shmreplay.Client(server.name)
        other.close()
        calls = [
            lambda: other.insert(item(), priorities={"sig": 1.0}, timeout=1),
            lambda: other.insert_batch(batch(2), priorities={"sig": 1.0}, timeout=1),
            lambda: other.sample_batch("sig", batch_size=1, timeout=1),
            lambda: next(other.sample("sig", timeout=1)),
            lambda: other.mutate_priorities("sig", updates={1: 1.0}),
            lambda: other.update_priorities("sig", keys=np.array([1], np.uint64),
                                            priorities=np.array([1.0])),
            lambda: other.reset("sig"),
            lambda: other.server_info(),
        ]
        with unchanged(client):
            for call in calls:
                with pytest.raises(errors.ClosedError, match=all_of(server.name, "(?i)closed")):
                    call()
        assert issubclass(errors.ClosedError, RuntimeError)


def test_stopped_server_wakes_blocked_callers_and_refuses_new_ones():
    server = shmreplay.Server(tables=tables(), name=new_name())
    try:
        client = shmreplay.Client(server.name)
        outcome = {}

        def blocked():
            try:
                client.sample_batch("sig", batch_size=1, timeout=10)
            except BaseException as e:
                outcome["error"] = e

        thread = threading.Thread(target=blocked, daemon=True)
        thread.start()
        thread.join(0.1)
        assert thread.is_alive()
    finally:
        server.stop()
    thread.join(5)
    assert not thread.is_alive(), "stop() must wake a blocked sample"
    assert isinstance(outcome.get("error"), RuntimeError)
    assert isinstance(outcome["error"], errors.ShmReplayError)
    with pytest.raises(errors.BufferBrokenError, match=server.name):
        client.insert(item(), priorities={"sig": 1.0}, timeout=1)
    client.close()
    with pytest.raises(errors.BufferNotFoundError, match=server.name):
        shmreplay.Client(server.name).server_info(timeout=0)


def test_python_scalars_are_inserted_only_when_their_column_stores_them_unchanged():
    # The writers' rule, on every insert path (one table: the fast path; two: the
    # general one): ints exactly, floats rounded but never overflowing.
    # (arena_bytes=0: refused, not stored whole in the general store; see test_general_items)
    tables = [shmreplay.Table.queue("q", 10, arena_bytes=0),
              shmreplay.Table.queue("r", 10, arena_bytes=0)]
    with shmreplay.Server(tables, name=new_name("scalars")) as server:
        client = shmreplay.Client(server.name)
        first = {"u": np.uint8(1), "f": np.float32(1), "h": np.float16(1)}
        client.insert(first, {"q": 1.0, "r": 1.0})
        bad = [({"u": 300}, "'u'", "int 300"), ({"u": -1}, "'u'", "int -1"),
               ({"u": 1.0}, "'u'", "float 1.0: a Python float is never"),
               ({"f": 1e300}, "'f'", "overflows float32"),
               ({"f": 2**24 + 1}, "'f'", "cannot hold it exactly"),
               ({"h": 70000.0}, "'h'", "overflows float16")]
        for change, column, text in bad:
            item = {"u": 2, "f": 2.0, "h": 2.0}
            item.update(change)
            for priorities in ({"q": 1.0}, {"q": 1.0, "r": 1.0}):
                with pytest.raises(errors.SchemaError, match=all_of("'q'", column, text)):
                    client.insert(item, priorities)
        assert [client.server_info()[t].current_size for t in "qr"] == [1, 1]
        client.insert({"u": 255, "f": 0.1, "h": float("nan")}, {"q": 1.0})
        client.insert({"u": 3, "f": np.float64(0.5), "h": 1}, {"q": 1.0})
        got = client.sample_batch("q", 3, timeout=1).data
        assert got["u"].tolist() == [1, 255, 3] and got["f"][1] == np.float32(0.1)
        assert np.isnan(got["h"][1]) and got["f"][2] == 0.5
        client.close()


def test_python_ints_exact_in_a_float_column_take_the_fast_path():
    with shmreplay.Server([shmreplay.Table.queue("q", 10, arena_bytes=0)],
                          name=new_name("fastint")) as server:
        client = shmreplay.Client(server.name)
        client.insert({"r": np.float32(0.5)}, {"q": 1.0})
        engine = client._engine("q")
        assert engine.fast_leaves({"r": 2**24}) is not None  # exact in float32
        assert engine.fast_leaves({"r": 2**24 + 1}) is None  # the general path refuses it
        with pytest.raises(errors.SchemaError, match="cannot hold it exactly"):
            client.insert({"r": 2**24 + 1}, {"q": 1.0})
        client.insert({"r": 3}, {"q": 1.0})
        assert client.sample_batch("q", 2, timeout=1).data["r"].tolist() == [0.5, 3.0]
        client.close()

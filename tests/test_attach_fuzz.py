"""Attaching to corrupt or foreign segments: a typed error or a working buffer, nothing else.

Hypothesis plants segments under test names: random bytes, truncated copies of a real
buffer, copies with header fields, control words or data-segment header fields
mutated, and copies with bytes of a pickled blob flipped. ``shmreplay.Client(name)``
followed by ``server_info()`` and a sample must then either raise a
``ShmReplayError`` or return the item the copied buffer holds (its bytes: a damaged
schema that still fits the segment may rename the column or change its row's shape). It must never
crash the process, never wait beyond its timeout, and a refused attach must leave the
segments' bytes as they were. Mutating a field that locates or sizes something must
always be refused.

The examples are few and derandomized, so the file takes seconds and every CI run
tries the same cases.
"""

import contextlib
import functools
import mmap
import os
import struct
import time

import numpy as np
import optree
import posix_ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import _names
import shmreplay
from shmreplay import errors
from shmreplay._engine import buffer as _buffer
from shmreplay._shm import layout as L
from shmreplay._shm import peek as _peek

SHM = "/dev/shm"
ITEM = {"obs": np.arange(4, dtype=np.float32)}

FUZZ = settings(max_examples=120, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# Header fields that locate or size something, or identify the format: any change to
# one must be refused.
LOCATING = ("magic", "layout_version", "header_size", "total_bytes", "num_tables",
            "config_offset", "config_len", "tables_offset", "segment_mode")
# Header fields that only describe (who created it, when): a change must not matter.
DESCRIBING = ("owner_pid", "owner_start", "owner_uid", "created_ns", "owner_ns")
DATA_FIELDS = ("magic", "layout_version", "complete", "schema_len", "total_bytes")
# Control words fixed at creation that kernels index with.
STATIC_WORDS = (L.C_CAPACITY, L.C_MAX_SIZE, L.C_SAMPLER_KIND, L.C_REMOVER_KIND,
                L.C_SLOT_BITS, L.C_TREE_LEAVES)


@pytest.fixture(autouse=True)
def short_wait_for_creation(monkeypatch):
    """A header in the ``creating`` state is waited for 2 s; the fuzz need not wait."""
    monkeypatch.setattr(_buffer, "attach", functools.partial(_buffer.attach, wait_active=0.02))


# --------------------------------------------------------------------------------------
# templates: the bytes of real buffers, and planting bytes under a fresh name
# --------------------------------------------------------------------------------------

def _read(entry):
    with open(os.path.join(SHM, entry), "rb") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def template(kind):
    """``(header bytes, data bytes, expected obs)`` of a one-item buffer.

    ``kind`` is ``"items"`` (the item came from ``Client.insert``: whole-item columns)
    or ``"steps"`` (from a trajectory writer: step rows that items reference).
    """
    name = _names.unique("template")
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=name):
        with shmreplay.Client(name) as client:
            if kind == "items":
                client.insert(ITEM, priorities={"q": 1.0}, timeout=5)
                expected = ITEM["obs"]
            else:
                with client.trajectory_writer(num_keep_alive_refs=2) as writer:
                    for t in range(2):
                        writer.append({"obs": ITEM["obs"] + t})
                    writer.create_item("q", 1.0, {"obs": writer.history["obs"][-2:]})
                expected = np.stack([ITEM["obs"], ITEM["obs"] + 1])
        header, data = _peek.segments_of(name)
        return _read(header), _read(data), expected


def _entries(name):
    return _peek.segments_of(name)


def _token(header):
    """The data segment token that table 0's control block in ``header`` names (0 if
    a mutation moved it out of the header: the data segment cannot be found then)."""
    where = int(np.frombuffer(header, L.HEADER, 1)[0]["tables_offset"]) + L.C_DATA_TOKEN * 8
    raw = header[where:where + 8] if 0 <= where <= len(header) - 8 else b""
    return int(np.frombuffer(raw, np.int64)[0]) if raw else 0


def _plant(posix_name, content):
    segment = posix_ipc.SharedMemory(posix_name, posix_ipc.O_CREX, mode=0o600,
                                     size=len(content))
    try:
        if content:
            with mmap.mmap(segment.fd, len(content)) as view:
                view[:] = content
    finally:
        segment.close_fd()


@contextlib.contextmanager
def planted(header, data=None):
    """A buffer name whose header (and table 0's data) segment hold the given bytes."""
    name = _names.unique("fuzz")
    data_name = None  # (planted under the token the header names, whatever it is)
    try:
        _plant(L.header_segment_name(name), header)
        if data is not None:
            data_name = L.data_segment_name(name, 0, _token(header))
            _plant(data_name, data)
        yield name
    finally:
        for entry in set(_entries(name)) | ({data_name[1:]} if data_name else set()):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM, entry))


def _with_fields(raw, dtype, changes):
    out = bytearray(raw)
    record = np.frombuffer(out, dtype, 1, 0)
    for field, value in changes:
        record[field] = value
    return bytes(out)


def attach_and_use(name, expected):
    """Attaches, reads the info and samples; returns None if that worked correctly,
    else the ``ShmReplayError`` raised. Anything else fails the test."""
    before = {entry: _read(entry) for entry in _entries(name)}
    try:
        client = shmreplay.Client(name)
    except errors.ShmReplayError as error:
        after = {entry: _read(entry) for entry in _entries(name)}
        assert after == before, "a refused attach changed the segments"
        return error
    try:
        with client:
            started = None
            try:
                # (bounded: a header whose state reads STOPPED is a buffer that a new
                # one may replace, which a lazy Client waits for)
                info = client.server_info(timeout=5.0)  # maps the data segment
                started = time.monotonic()
                sample = client.sample_batch("q", 1, timeout=0.05)
            except errors.ShmReplayError as error:
                return error
            finally:
                assert started is None or time.monotonic() - started < 5, "a sample hung"
            assert info["q"].current_size == 1
            # A damaged schema that still fits the segment may rename the column, read
            # its bytes as another dtype or shape, or a shorter or longer row; what comes
            # back must still start where the item was stored.
            [leaf] = optree.tree_leaves(sample.data)
            got, stored = leaf[0].tobytes(), expected.tobytes()
            assert got.startswith(stored) or stored.startswith(got), (got, stored)
            return None
    except errors.ShmReplayError as error:  # closing
        return error


# --------------------------------------------------------------------------------------
# header segments
# --------------------------------------------------------------------------------------

def test_the_templates_work():
    for kind in ("items", "steps"):
        header, data, expected = template(kind)
        with planted(header, data) as name:
            assert attach_and_use(name, expected) is None


@FUZZ
@given(st.one_of(
    st.binary(max_size=600),
    st.binary(max_size=5000).map(lambda tail: L.MAGIC + struct.pack("<I", L.LAYOUT_VERSION) + tail),
))
def test_random_bytes_are_refused(content):
    with planted(content) as name:
        error = attach_and_use(name, None)
    assert isinstance(error, (errors.LayoutMismatchError, errors.BufferBrokenError))


@FUZZ
@given(st.data())
def test_truncated_headers_are_refused(data):
    header, _, _ = template("items")
    size = data.draw(st.one_of(st.integers(0, L.HEADER_SIZE + 8),
                               st.integers(0, len(header) - 1)))
    with planted(header[:size]) as name:
        assert isinstance(attach_and_use(name, None), errors.LayoutMismatchError)


def _field_values(field, original):
    if field == "magic":
        return st.one_of(st.just(L.DATA_MAGIC), st.binary(min_size=8, max_size=8))
    kind = L.HEADER.fields[field][0] if field in L.HEADER.names else L.DATA_HEADER.fields[field][0]
    info = np.iinfo(kind)
    near = [original + d for d in (-4096, -64, -8, -1, 1, 8, 64, 4096)]
    special = [0, 1, -1, 2, info.min, info.max, 0o600, 0o660, 0o666, L.HEADER_SIZE]
    return st.one_of(st.sampled_from([v for v in near + special if info.min <= v <= info.max]),
                     st.integers(int(info.min), int(info.max)))


@st.composite
def header_mutations(draw):
    header, _, _ = template("items")
    record = np.frombuffer(header, L.HEADER, 1, 0)[0]
    fields = draw(st.lists(st.sampled_from(LOCATING + DESCRIBING + ("state",)),
                           min_size=1, max_size=3, unique=True))
    changes = []
    for field in fields:
        original = record[field]
        value = draw(_field_values(field, original if field == "magic" else int(original)))
        changes.append((field, value))
    return changes


@FUZZ
@given(header_mutations())
def test_mutated_header_fields(changes):
    header, data, expected = template("items")
    original = np.frombuffer(header, L.HEADER, 1, 0)[0]
    changed = {field for field, value in changes if value != original[field]}
    if dict(changes).get("segment_mode") == 0o660:
        changed.discard("segment_mode")      # group-shared: the 0600 file is narrower, fine
    with planted(_with_fields(header, L.HEADER, changes), data) as name:
        error = attach_and_use(name, expected)
    if "state" in changed:  # (BufferNotReadyError: stopped, and no new one came)
        assert isinstance(error, (errors.LayoutMismatchError, errors.BufferBrokenError,
                                  errors.BufferNotReadyError))
    elif changed & set(LOCATING):
        assert isinstance(error, errors.LayoutMismatchError), changes
    else:
        assert error is None, (changes, error)   # who created it, and when, is not checked


def test_a_header_stuck_creating_is_refused_after_a_bounded_wait(monkeypatch):
    header, data, _ = template("items")
    monkeypatch.undo()                           # the real 2-second wait
    with planted(_with_fields(header, L.HEADER, [("state", L.STATE_CREATING)]), data) as name:
        started = time.monotonic()
        with pytest.raises(errors.LayoutMismatchError, match="still being created after"):
            shmreplay.Client(name)
        assert time.monotonic() - started < 10


def _attach_with_control_word(kind, word, value):
    """Attaches to a copy of a ``kind`` buffer whose table has ``ctrl[word] = value``;
    returns ``(the error or None, the word's original value)``."""
    header, data, expected = template(kind)
    table_offset = int(np.frombuffer(header, L.HEADER, 1, 0)[0]["tables_offset"])
    region = L.plan_table(table_offset, shmreplay.Table.queue("q", 10))
    position = region.ctrl + 8 * word
    original = struct.unpack_from("<q", header, position)[0]
    mutated = bytearray(header)
    struct.pack_into("<q", mutated, position, value)
    with planted(bytes(mutated), data) as name:
        return attach_and_use(name, expected), original


@FUZZ
@given(st.sampled_from(STATIC_WORDS), st.integers(-2**63, 2**63 - 1))
def test_mutated_control_words_are_refused(word, value):
    error, original = _attach_with_control_word("items", word, value)
    if value == original:
        assert error is None
    else:
        assert isinstance(error, errors.LayoutMismatchError)


def _flips(draw, raw, start, length):
    out = bytearray(raw)
    for _ in range(draw(st.integers(1, 4))):
        position = start + draw(st.integers(0, length - 1))
        out[position] = draw(st.integers(0, 255))
    return bytes(out)


@FUZZ
@given(st.data())
def test_corrupt_configuration_blob(data):
    header, segment_data, expected = template("items")
    record = np.frombuffer(header, L.HEADER, 1, 0)[0]
    mutated = _flips(data.draw, header, int(record["config_offset"]), int(record["config_len"]))
    with planted(mutated, segment_data) as name:
        attach_and_use(name, expected)          # a typed error, or the right item


# --------------------------------------------------------------------------------------
# data segments
# --------------------------------------------------------------------------------------

@FUZZ
@given(st.sampled_from(["items", "steps"]), st.data())
def test_mutated_data_headers(kind, data):
    header, segment_data, expected = template(kind)
    record = np.frombuffer(segment_data, L.DATA_HEADER, 1, 0)[0]
    fields = data.draw(st.lists(st.sampled_from(DATA_FIELDS), min_size=1, max_size=3,
                                unique=True))
    changes = [(f, data.draw(_field_values(f, record[f] if f == "magic" else int(record[f]))))
               for f in fields]
    changed = {field for field, value in changes if value != record[field]}
    with planted(header, _with_fields(segment_data, L.DATA_HEADER, changes)) as name:
        error = attach_and_use(name, expected)
    if changed:
        assert isinstance(error, errors.LayoutMismatchError), changes
    else:
        assert error is None


@FUZZ
@given(st.sampled_from(["items", "steps"]), st.data())
def test_truncated_data_segments_are_refused(kind, data):
    header, segment_data, _ = template(kind)
    size = data.draw(st.one_of(st.integers(0, L.DATA_HEADER_SIZE + 8),
                               st.integers(0, len(segment_data) - 1)))
    with planted(header, segment_data[:size]) as name:
        assert isinstance(attach_and_use(name, None), errors.LayoutMismatchError)


@FUZZ
@given(st.sampled_from(["items", "steps"]), st.data())
def test_corrupt_schema_blob(kind, data):
    header, segment_data, expected = template(kind)
    length = int(np.frombuffer(segment_data, L.DATA_HEADER, 1, 0)[0]["schema_len"])
    mutated = _flips(data.draw, segment_data, L.DATA_HEADER_SIZE, length)
    with planted(header, mutated) as name:
        attach_and_use(name, expected)          # a typed error, or the right item


@FUZZ
@given(st.sampled_from([L.C_ROW_CAPACITY, L.C_REFS_WIDTH]), st.integers(-2**63, 2**63 - 1))
def test_step_storage_must_match_the_control_block(word, value):
    error, original = _attach_with_control_word("steps", word, value)
    assert (error is None) if value == original else isinstance(error, errors.LayoutMismatchError)

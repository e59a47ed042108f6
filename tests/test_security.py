"""Who can read, write and attach to a buffer (docs/security.md).

* Every segment of a buffer is 0600 by default and 0660 with
  ``Server(share_with_group=True)``, including the data segments that another
  process creates lazily, whatever the creating process's umask.
* Attaching refuses a segment of another uid unless the buffer is group-shared, the
  caller passed ``trust_group=True`` and belongs to the segment's group; it refuses a
  segment whose mode is wider than shmreplay makes it. All of this before anything is
  unpickled.
* Names that could leave ``/dev/shm`` or confuse a shell are refused.

A process cannot change its uid without root, so the refusal paths are tested by
faking ``os.getuid``; when the tests run as root, processes of other (numeric) users
also exercise them for real.
"""

import contextlib
import json
import os
import pickle
import signal
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import _names
import shmreplay
from shmreplay import errors
from shmreplay._engine import buffer as _buffer
from shmreplay._shm import layout as _layout
from shmreplay._shm import peek as _peek
from shmreplay._shm import segment as _segment

ROOT = Path(__file__).resolve().parents[1]
SHM = "/dev/shm"
ITEM = {"obs": np.arange(4, dtype=np.float32)}


def tables():
    return [shmreplay.Table.queue("q", 10)]


def entries(name):
    """The /dev/shm entries of buffer ``name``: header first, then data segments."""
    return _peek.segments_of(name)


def mode(entry):
    return stat.S_IMODE(os.stat(os.path.join(SHM, entry)).st_mode)


def remove(name):
    for entry in entries(name):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM, entry))


def run_python(script, *args, timeout=120):
    """Runs ``script`` in a fresh interpreter; returns its stdout (fails on a nonzero exit)."""
    result = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, timeout=timeout,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


INSERT_ONE = """
import sys
import numpy as np
import shmreplay
with shmreplay.Client(sys.argv[1]) as client:
    client.insert({"obs": np.arange(4, dtype=np.float32)}, priorities={"q": 1.0}, timeout=10)
"""


# --------------------------------------------------------------------------------------
# modes
# --------------------------------------------------------------------------------------

def test_every_segment_is_0600_by_default():
    with shmreplay.Server(tables(), name=_names.unique("mode")) as server:
        with shmreplay.Client(server.name) as client:
            client.insert(ITEM, priorities={"q": 1.0}, timeout=1)
        found = entries(server.name)
        assert len(found) == 2                       # the header and the data segment
        assert {entry: mode(entry) for entry in found} == dict.fromkeys(found, 0o600)


def test_share_with_group_makes_every_segment_0660_even_those_another_process_creates():
    with shmreplay.Server(tables(), name=_names.unique("group"),
                          share_with_group=True) as server:
        header = _layout.SEGMENT_PREFIX + server.name
        assert entries(server.name) == [header]
        run_python(INSERT_ONE, server.name)          # a spawned Client creates the data segment
        data = entries(server.name)[-1]
        assert entries(server.name) == [header, data] and data.startswith(header + ":t0:")
        assert mode(header) == mode(data) == 0o660
        assert os.stat(os.path.join(SHM, data)).st_gid == os.stat(os.path.join(SHM, header)).st_gid
        # The same user needs no opt-in, and reads the other process's data segment.
        with shmreplay.Client(server.name) as client:
            sample = client.sample_batch("q", 1, timeout=5)
            np.testing.assert_array_equal(sample.data["obs"][0], ITEM["obs"])


UMASK_CHILD = """
import json, os, sys
import numpy as np
import shmreplay
os.umask(int(sys.argv[2], 8))
name = sys.argv[1]
table = shmreplay.Table.queue("q", 10)
with shmreplay.Server([table], name=name, share_with_group=sys.argv[3] == "1") as server:
    with shmreplay.Client(name) as client:
        client.insert({"obs": np.zeros(2)}, priorities={"q": 1.0}, timeout=10)
    modes = {e: os.stat("/dev/shm/" + e).st_mode & 0o777
             for e in os.listdir("/dev/shm") if e.startswith("shmreplay." + name)}
print(json.dumps(modes))
"""


@pytest.mark.parametrize("umask", [0o000, 0o077, 0o027])
@pytest.mark.parametrize("shared", [False, True])
def test_modes_do_not_follow_the_umask(umask, shared):
    name = _names.unique("umask")
    try:
        modes = json.loads(run_python(UMASK_CHILD, name, f"{umask:o}", "1" if shared else "0"))
    finally:
        remove(name)
    assert len(modes) == 2
    assert set(modes.values()) == {0o660 if shared else 0o600}


def test_create_refuses_other_modes():
    with pytest.raises(ValueError, match="0o644"):
        _buffer.create(_names.unique("badmode"), tables(), mode=0o644)


def test_attach_refuses_segments_wider_than_shmreplay_makes_them():
    with shmreplay.Server(tables(), name=_names.unique("wide")) as server:
        header = os.path.join(SHM, _layout.SEGMENT_PREFIX + server.name)
        with shmreplay.Client(server.name) as client:
            client.insert(ITEM, priorities={"q": 1.0}, timeout=1)
        data = os.path.join(SHM, entries(server.name)[-1])
        os.chmod(header, 0o666)                      # anyone could have written it
        with pytest.raises(errors.LayoutMismatchError, match="(?s)0666.*wider"):
            shmreplay.Client(server.name)
        os.chmod(header, 0o660)                      # the header records a private buffer
        with pytest.raises(errors.LayoutMismatchError, match="(?s)0660.*wider.*0600"):
            shmreplay.Client(server.name)
        os.chmod(header, 0o600)
        os.chmod(data, 0o660)                        # a private buffer's data segment
        with shmreplay.Client(server.name) as client:
            with pytest.raises(errors.LayoutMismatchError, match="(?s)t0.*0660.*wider"):
                client.sample_batch("q", 1, timeout=1)


# --------------------------------------------------------------------------------------
# the access rules, unit by unit
# --------------------------------------------------------------------------------------

ME, MY_GID = os.getuid(), os.getgid()
OTHER_UID = ME + 1
OTHER_GID = max(_segment.caller_groups()) + 1       # a group we are not in


def fake_stat(uid, gid, bits):
    return os.stat_result((stat.S_IFREG | bits, 1, 1, 1, uid, gid, 4096, 0, 0, 0))


GROUP = _segment.Access(_segment.GROUP_MODE, group=MY_GID, trust_group=True)
UNTRUSTING = _segment.Access(_segment.GROUP_MODE)


@pytest.mark.parametrize("uid, gid, bits, access, refusal", [
    (ME, MY_GID, 0o600, _segment.PRIVATE, None),
    (ME, OTHER_GID, 0o600, _segment.PRIVATE, None),             # our own: any group
    (ME, MY_GID, 0o660, UNTRUSTING, None),                      # ours, group-shared
    (ME, MY_GID, 0o660, _segment.PRIVATE, "wider"),             # private buffer, 0660
    (ME, MY_GID, 0o666, GROUP, "wider"),                        # writable by everyone
    (ME, MY_GID, 0o640, _segment.PRIVATE, "wider"),
    (OTHER_UID, MY_GID, 0o600, _segment.PRIVATE, "trust_group=True"),
    (OTHER_UID, MY_GID, 0o660, _segment.PRIVATE, "wider"),
    (OTHER_UID, MY_GID, 0o660, UNTRUSTING, "trust_group=True"),
    (OTHER_UID, MY_GID, 0o660, GROUP, None),                    # the one way in
    (OTHER_UID, MY_GID, 0o660, _segment.Access(_segment.GROUP_MODE, trust_group=True), None),
    (OTHER_UID, MY_GID, 0o600, GROUP, "not shared with its group"),
    (OTHER_UID, OTHER_GID, 0o660, _segment.Access(_segment.GROUP_MODE, trust_group=True),
     "not one of this process's groups"),
    (OTHER_UID, OTHER_GID, 0o660, GROUP, "not to the buffer's group"),
    (OTHER_UID, MY_GID, 0o666, GROUP, "wider"),
])
def test_check_access(uid, gid, bits, access, refusal):
    check = lambda: _segment.check_access("/shmreplay.x", "buffer 'x'", fake_stat(uid, gid, bits),
                                          access)
    if refusal is None:
        check()
    else:
        with pytest.raises(errors.LayoutMismatchError, match=refusal):
            check()


@pytest.fixture
def another_user(monkeypatch):
    """Returns ``become()``, which makes this process look like another uid of the same
    groups (``os.getuid``) from then on, and fails the test if anything is unpickled
    after that unless the returned state's ``allow`` is set."""
    real_loads = pickle.loads
    state = {"allow": False, "loads": 0}

    def loads(*args, **kwargs):
        state["loads"] += 1
        assert state["allow"], "unpickled a segment before deciding to trust it"
        return real_loads(*args, **kwargs)

    def become():
        monkeypatch.setattr(os, "getuid", lambda: OTHER_UID)
        monkeypatch.setattr(_buffer.cloudpickle, "loads", loads)  # the module _table uses too
        return state

    return become


@pytest.mark.parametrize("shared", [False, True])
def test_another_user_is_refused_without_trust_group(another_user, shared):
    with shmreplay.Server(tables(), name=_names.unique("uid"), share_with_group=shared) as server:
        another_user()
        with pytest.raises(errors.LayoutMismatchError,
                           match=f"(?s)belongs to uid {ME}, not to this user.*trust_group=True"):
            shmreplay.Client(server.name)


def test_another_user_is_refused_a_private_buffer_even_with_trust_group(another_user):
    with shmreplay.Server(tables(), name=_names.unique("uid")) as server:
        another_user()
        with pytest.raises(errors.LayoutMismatchError, match="not shared with its group"):
            shmreplay.Client(server.name, trust_group=True)


def test_another_group_member_attaches_with_trust_group(another_user):
    with shmreplay.Server(tables(), name=_names.unique("uid"), share_with_group=True) as server:
        with shmreplay.Client(server.name) as client:
            client.insert(ITEM, priorities={"q": 1.0}, timeout=1)
        state = another_user()
        state["allow"] = True
        with shmreplay.Client(server.name, trust_group=True) as client:
            np.testing.assert_array_equal(
                client.sample_batch("q", 1, timeout=1).data["obs"][0], ITEM["obs"])
        assert state["loads"] == 2                   # the configuration, then the schema


def test_another_user_is_refused_when_the_header_disagrees_with_the_segment(another_user):
    with shmreplay.Server(tables(), name=_names.unique("uid"), share_with_group=True) as server:
        header = server._buffer.header
        header["owner_uid"] = ME + 7                 # not who owns the segment
        another_user()
        with pytest.raises(errors.LayoutMismatchError, match=f"owner uid {ME + 7}"):
            shmreplay.Client(server.name, trust_group=True)
        header["owner_uid"] = ME
        header["segment_mode"] = 0o600               # the file is 0660: widened afterwards
        with pytest.raises(errors.LayoutMismatchError, match="(?s)0660.*wider.*0600"):
            shmreplay.Client(server.name, trust_group=True)
        header["segment_mode"] = 0o660


def test_a_private_buffer_refuses_another_users_data_segment(another_user):
    with shmreplay.Server(tables(), name=_names.unique("uid")) as server:
        with shmreplay.Client(server.name) as reader, shmreplay.Client(server.name) as writer:
            writer.insert(ITEM, priorities={"q": 1.0}, timeout=1)  # reader has not mapped it
            another_user()   # as if the data segment were another uid's
            with pytest.raises(errors.LayoutMismatchError, match=r"(?s):t0:.*belongs to uid"):
                reader.sample_batch("q", 1, timeout=1)


# --------------------------------------------------------------------------------------
# other users, for real (needs root to switch uid)
# --------------------------------------------------------------------------------------

GROUP_ID, OTHER_GROUP_ID = 54321, 54322
OWNER, MEMBER, STRANGER = 54001, 54002, 54003
_kept = []   # the owner child's Server must outlive the function that creates it


def as_user(uid, groups, fn):
    """Runs ``fn()`` in a forked child with uid ``uid``, primary group ``groups[0]`` and
    supplementary groups ``groups``; returns ``("ok", result, warnings)`` or
    ``("error", type name, message)``. The child exits without cleaning up."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        try:
            signal.alarm(60)  # a hung child must not hang the test
            os.close(read)
            os.setgroups(list(groups))
            os.setgid(groups[0])
            os.setuid(uid)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = ("ok", fn(), [str(w.message) for w in caught])
        except BaseException as exc:
            out = ("error", type(exc).__name__, str(exc))
        finally:
            try:
                os.write(write, pickle.dumps(out))
            finally:
                os._exit(0)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return pickle.loads(b"".join(chunks))


def test_a_pickled_client_keeps_its_trust_flag():
    import pickle
    name = _names.unique("pickle")
    with shmreplay.Server(tables(), name=name, share_with_group=True):
        for flag in (False, True):
            with shmreplay.Client(name, trust_group=flag) as client:
                with pickle.loads(pickle.dumps(client)) as copy:
                    assert copy._trust_group is flag and copy.server_address == name


def cli_info(name, trust_group):
    """``shmreplay [--trust-group] info NAME`` in this process: (exit status, output)."""
    import io
    from shmreplay import cli
    out = io.StringIO()
    status = cli.main((["--trust-group"] if trust_group else []) + ["info", name], out=out)
    return status, out.getvalue()


def owner_of(entry):
    st = os.stat(os.path.join(SHM, entry))
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_group_sharing_between_real_users():
    name = _names.unique("users")
    header = _layout.SEGMENT_PREFIX + name

    def create():
        _kept.append(shmreplay.Server(tables(), name=name, share_with_group=True))

    def insert():
        with shmreplay.Client(name, trust_group=True) as client:
            client.insert(ITEM, priorities={"q": 1.0}, timeout=5)

    def sample():
        with shmreplay.Client(name) as client:       # its own buffer: no opt-in
            return client.sample_batch("q", 1, timeout=5).data["obs"][0].tolist()

    try:
        assert as_user(OWNER, [GROUP_ID], create)[0] == "ok"
        assert owner_of(header) == (OWNER, GROUP_ID, 0o660)
        # root is another user, and not in the group
        with pytest.raises(errors.LayoutMismatchError, match=f"belongs to uid {OWNER}"):
            shmreplay.Client(name)
        with pytest.raises(errors.LayoutMismatchError, match="not one of this process's groups"):
            shmreplay.Client(name, trust_group=True)
        # a member whose primary group is another one: refused until it opts in
        member = [OTHER_GROUP_ID, GROUP_ID]
        refused = as_user(MEMBER, member, lambda: shmreplay.Client(name))
        assert refused[:2] == ("error", "LayoutMismatchError") and "trust_group" in refused[2]
        assert as_user(MEMBER, member, insert)[0] == "ok"
        data = entries(name)[-1]
        assert owner_of(data) == (MEMBER, GROUP_ID, 0o660)   # the buffer's group, not its own
        # the operator's CLI takes the same opt-in
        trusted = as_user(MEMBER, member, lambda: cli_info(name, trust_group=True))
        assert trusted[0] == "ok" and trusted[1][0] == 0 and "table q: 1/" in trusted[1][1]
        untrusted = as_user(MEMBER, member, lambda: cli_info(name, trust_group=False))
        assert untrusted[0] == "ok" and untrusted[1][0] == 2  # refused, with a message
        # a non-member cannot even open it
        stranger = as_user(STRANGER, [OTHER_GROUP_ID],
                           lambda: shmreplay.Client(name, trust_group=True))
        assert stranger[:2] == ("error", "LayoutMismatchError") and "not accessible" in stranger[2]
        # the owner reads the member's data segment
        assert as_user(OWNER, [GROUP_ID], sample)[:2] == ("ok", ITEM["obs"].tolist())
        # /dev/shm is sticky: the owner cannot remove the member's segment; it says so
        status, _, caught = as_user(OWNER, [GROUP_ID], lambda: _buffer.unlink_all(name, 1))
        assert status == "ok" and any(data in text and "another user" in text for text in caught)
        assert entries(name) == [data]
    finally:
        remove(name)


# --------------------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "", ".", "..", "../x", "a/../b", "/abs", "a/b", "a\x00b", "\x00", "a b", " a", "a ",
    "a\tb", "a\nb", "\u00e9t\u00e9", "a*", "$(id)", "a;b", "-a", ".a", "_a"])
def test_unsafe_names_are_refused(name):
    for make in (lambda: shmreplay.Server(tables(), name=name), lambda: shmreplay.Client(name),
                 lambda: shmreplay.Table.queue(name, 1)):
        with pytest.raises(errors.InvalidNameError) as info:
            make()
        assert isinstance(info.value, ValueError)


def test_a_trailing_newline_is_refused():
    with pytest.raises(errors.InvalidNameError):
        shmreplay.Client("a\n")

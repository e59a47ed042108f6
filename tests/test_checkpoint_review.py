"""Adversarial tests of checkpoints and of the batch commit's crash safety (review).

Each test pins down one hole found in review and fails without its fix (in
``shmreplay/_snapshot.py``, ``_checkpoint.py``, ``_restore.py``, ``Client.checkpoint``,
or the kernels' batch commit and ``rebuild``).
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import cloudpickle
import numpy as np
import pytest

import _crash_workers as CW
from _background import Background
import _names
import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay._engine import buffer as _buffer
from shmreplay._ops import checkpoint as _checkpoint
from shmreplay._shm import crash_points as _crash_points
from shmreplay._shm import layout as L
from shmreplay._shm.kernels import codes

SPAWN = multiprocessing.get_context("spawn")


def _item(i):
    return {"obs": np.arange(4, dtype=np.float32) + i, "id": np.int64(i)}


def _write_steps(client, table, count):
    """``count`` sequence items of 3 steps (overlapping windows) through a writer."""
    with client.trajectory_writer(3) as writer:
        for t in range(count + 2):
            writer.append({"obs": np.full(3, t, np.int32), "act": np.int64(t)})
            if t >= 2:
                writer.create_item(table, 1.0, {"obs": writer.history["obs"][-3:],
                                                "act": writer.history["act"][-2:]})
        writer.flush(timeout_ms=5000)


# --- snapshots ----------------------------------------------------------------------------


def test_a_step_storage_table_with_no_items_can_be_checkpointed(buffer_name, tmp_path):
    # A drained queue of sequences (every item sampled once) still has its step storage.
    with shmreplay.Server([shmreplay.Table.queue("seq", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        _write_steps(client, "seq", 4)
        client.sample_batch("seq", 4, timeout=5)
        assert client.server_info()["seq"].current_size == 0
        path = client.checkpoint(str(tmp_path / "empty.ckpt"))
        client.close()
    with shmreplay.Server(name=_names.unique("rest"), checkpoint=path) as restored:
        copy = shmreplay.Client(restored.name)
        assert copy.server_info()["seq"].current_size == 0
        assert copy.verify("seq") == []
        _write_steps(copy, "seq", 2)  # and it takes new items
        assert copy.sample_batch("seq", 2, timeout=5).data["act"].tolist() == [[1, 2], [2, 3]]
        copy.close()


def test_step_storage_defined_while_a_snapshot_prepares_is_copied(buffer_name):
    # The snapshot looks at the storage, prepares its outputs, then locks. If a writer
    # of another process defines step storage (and commits) in between, the locked
    # kernel answers UNMAPPED, the engine maps the storage and locks again: the
    # snapshot must then not copy into outputs prepared for no storage.
    with shmreplay.Server([shmreplay.Table.queue("seq", 10)], name=buffer_name) as server:
        reader = shmreplay.Client(server.name)
        engine = reader._engine("seq")
        writer_client = shmreplay.Client(server.name)
        _write_steps(writer_client, "seq", 3)
        real = engine.has_columns
        calls = []

        def not_yet_defined():  # what the reader saw an instant before the writer
            calls.append(1)
            return False if len(calls) == 1 else real()

        engine.has_columns = not_yet_defined
        snapshot = _checkpoint.snapshot_table(engine)
        engine.has_columns = real
        assert snapshot.num_items == 3
        assert snapshot.storage is not None and snapshot.storage.steps
        # (a table without a signature holds items of any length: their lengths, then
        # all their references one after another)
        assert snapshot.arrays["lengths"].sum(axis=1).tolist() == [5] * 3
        assert snapshot.arrays["refs"].shape == (15,)
        assert len(snapshot.arrays["store0"]) == 5  # 5 distinct steps
        writer_client.close()
        reader.close()


_SIGINT_DURING_HOLD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import shmreplay
    from shmreplay._engine import snapshot as _snapshot

    name, path = sys.argv[1:3]
    server = shmreplay.Server([shmreplay.Table.queue("q", 100)], name=name)
    client = shmreplay.Client(name)
    client.insert({"obs": np.zeros(4, np.float32)}, {"q": 1.0}, timeout=5)
    copy_held = _snapshot._copy_held

    def copy_held_and_press_ctrl_c(*args):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the table's lock is held
        return copy_held(*args)

    _snapshot._copy_held = copy_held_and_press_ctrl_c
    try:
        client.checkpoint(path)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def test_ctrl_c_while_a_server_process_holds_a_table_for_a_checkpoint(buffer_name, tmp_path):
    # A Server installs a SIGINT/SIGTERM handler that stops it, locking every table.
    # Run while this very thread holds a table's lock for a snapshot, it deadlocked on
    # that lock: the process hung forever, and so did every other user of the table.
    script = tmp_path / "interrupt.py"
    script.write_text(_SIGINT_DURING_HOLD)
    try:
        result = subprocess.run(
            [sys.executable, str(script), buffer_name, str(tmp_path / "c.ckpt")],
            capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung: its SIGINT handler waited for the lock it held")
    finally:
        _buffer.unlink_all(buffer_name, 1)
    assert "interrupted" in result.stdout, result.stderr
    assert not (tmp_path / "c.ckpt").exists()
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []


_CTRL_Z_DURING_HOLD = textwrap.dedent("""
    import os, signal, sys
    import shmreplay
    from shmreplay._engine import snapshot as _snapshot

    name, path = sys.argv[1:3]
    # Linux discards Ctrl-Z (SIGTSTP) sent to an orphaned process group, and the test's
    # group is orphaned when the run was started detached (nohup, setsid, a CI runner):
    # a group of our own, whose parent (the test) is in this session, never is.
    os.setpgid(0, 0)
    copy_held = _snapshot._copy_held

    def copy_and_press_ctrl_z(*args):
        os.kill(os.getpid(), signal.SIGTSTP)  # Ctrl-Z while the table's lock is held
        return copy_held(*args)

    _snapshot._copy_held = copy_and_press_ctrl_z
    shmreplay.Client(name).checkpoint(path)
    print("checkpointed", flush=True)
""")


def test_ctrl_z_while_a_process_holds_a_table_stops_it_only_after_the_hold(buffer_name,
                                                                           tmp_path):
    # Stopped while holding the table's lock, the checkpointer would block every other
    # process until someone sent SIGCONT; their timeouts could not help.
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"obs": np.zeros(4, np.float32)}, {"q": 1.0}, timeout=5)
        script = tmp_path / "ctrl_z.py"
        script.write_text(_CTRL_Z_DURING_HOLD)
        proc = subprocess.Popen([sys.executable, str(script), server.name,
                                 str(tmp_path / "c.ckpt")], stdout=subprocess.PIPE, text=True)
        try:
            assert _crash_points.wait_stopped(proc.pid, 60), "Ctrl-Z was lost"
            # The table is free. (In a thread: a lock held by a stopped process would
            # block the call past its timeout.)
            sampler = Background(lambda: client.sample_batch("q", 1, timeout=2).data["obs"])
            assert sampler.finish(wait=10).shape == (1, 4)
            os.kill(proc.pid, signal.SIGCONT)
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0 and "checkpointed" in out
            assert (tmp_path / "c.ckpt").exists()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            client.close()


def test_temporaries_of_dead_writers_in_a_checkpoint_directory_are_removed(buffer_name, tmp_path):
    # Checkpoints into a directory (a checkpointer's, or Client.checkpoint(directory))
    # get a new name every time, so "the next checkpoint to the same path" never comes:
    # a dead writer's temporary (as large as the buffer) must go with a later
    # checkpoint into that directory.
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(1), {"q": 1.0}, timeout=5)
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait(30)
        stale = tmp_path / f".20260101T000000.000000Z.shmreplay.tmp-{dead.pid}-0123abcd"
        stale.write_bytes(b"x" * 1000)
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
        recent = tmp_path / f".20260101T000001.000000Z.shmreplay.tmp-{dead.pid}-4567abcd"
        recent.write_bytes(b"x")  # maybe another machine's writer, still at work: kept
        mine = tmp_path / ".notes.tmp-1-0123abcd"  # not a checkpoint's: left alone
        mine.write_bytes(b"x")
        path = client.checkpoint(str(tmp_path))
        assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(path), mine.name,
                                                       recent.name])
        client.close()


# --- restoring ----------------------------------------------------------------------------


def _fifo(max_size):
    return shmreplay.Table("t", selectors.Fifo(), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1))


def _insert_in_batches(client, count):
    """Inserts ``count`` items, 100 per call; returns the keys issued."""
    keys = set()
    for start in range(0, count, 100):
        batch = {"obs": np.zeros((100, 4), np.float32), "id": np.arange(start, start + 100)}
        keys.update(int(k) for k in client.insert_batch(batch, {"t": 1.0}, timeout=5)["t"])
    return keys


def test_keys_of_a_run_never_name_items_after_a_restore_with_another_max_size(
        buffer_name, tmp_path):
    # max_size 300 has 600 slots (10 key bits for the slot), max_size 150 has 300
    # (9 bits), max_size 5000 has 10000 (14 bits). Items restored with another max_size
    # get new keys; neither they nor the table's new items may take a key that the first
    # run issued: a learner holding one would update or delete another item with it.
    with shmreplay.Server([_fifo(300)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        issued = _insert_in_batches(client, 1500)
        path = client.checkpoint(str(tmp_path / "t.ckpt"))
        client.close()
    for max_size in (150, 5000):  # fewer and more slot bits
        table = _fifo(max_size)
        with shmreplay.Server([table], name=_names.unique("keys"), checkpoint=path,
                              override_config=True) as server:
            copy = shmreplay.Client(server.name)
            restored = {int(k) for k in _checkpoint.snapshot_table(copy._engine("t")).arrays["key"]}
            new = _insert_in_batches(copy, 3000)
            assert not restored & issued
            assert not new & issued
            assert not new & restored
            # A stale key updates nothing: every priority stays 1.
            copy.mutate_priorities("t", updates={k: 7.0 for k in issued})
            assert (_checkpoint.snapshot_table(copy._engine("t")).arrays["priority"] == 1.0).all()
            assert copy.verify("t") == []
            copy.close()


def _rewrite(path, edit_manifest=None, edit_file=None):
    """Rewrites a checkpoint with an edited manifest and/or edited bytes, every checksum
    and length recomputed: a forged file that the checksums cannot catch, whose values
    the restore must still check."""
    data = bytearray(open(path, "rb").read())
    header = np.frombuffer(bytes(data[:_checkpoint.FILE_HEADER.itemsize]),
                           _checkpoint.FILE_HEADER)[0].copy()
    offset, length = int(header["manifest_offset"]), int(header["manifest_len"])
    manifest = cloudpickle.loads(bytes(data[offset:offset + length]))
    if edit_manifest is not None:
        edit_manifest(manifest)
    if edit_file is not None:
        edit_file(data, manifest)
    for table in manifest["tables"]:
        for key, (start, descr, shape) in table["arrays"].items():
            nbytes = np.lib.format.descr_to_dtype(descr).itemsize * int(np.prod(shape))
            if 0 <= start and 0 <= nbytes and start + nbytes <= offset:
                table[_checkpoint.CHECKSUMS[_checkpoint.FORMAT_VERSION][0]][key] = (
                    _checkpoint.checksum_of(np.frombuffer(
                        bytes(data[start:start + nbytes]), np.uint8), _checkpoint.FORMAT_VERSION))
    blob = cloudpickle.dumps(manifest)
    data = data[:offset] + blob
    header["manifest_len"] = len(blob)
    header["manifest_crc"] = zlib.crc32(blob)
    header["file_len"] = len(data)
    header["header_crc"] = zlib.crc32(header.tobytes()[:_checkpoint.FILE_HEADER.fields[
        "header_crc"][1]])
    data[:_checkpoint.FILE_HEADER.itemsize] = header.tobytes()
    open(path, "wb").write(bytes(data))


def _checkpoint_of(name, tmp_path, steps=False):
    tables = [shmreplay.Table("t", selectors.Fifo(), selectors.Fifo(), 10,
                              rate_limiters.MinSize(1))]
    with shmreplay.Server(tables, name=name) as server:
        client = shmreplay.Client(server.name)
        if steps:
            _write_steps(client, "t", 4)
        else:
            for i in range(4):
                client.insert(_item(i), {"t": 1.0}, timeout=5)
        path = client.checkpoint(str(tmp_path / "t.ckpt"))
        client.close()
    return path


def _table_entry(manifest):
    return manifest["tables"][0]


def _set_key(index, make_key):
    def edit(data, manifest):
        entry = _table_entry(manifest)
        offset, _, _ = entry["arrays"]["key"]
        keys = np.frombuffer(bytes(data[offset:offset + 8 * entry["num_items"]]), np.int64).copy()
        keys[index] = make_key(keys, entry["slot_bits"])
        data[offset:offset + keys.nbytes] = keys.tobytes()
    return edit


def _set_array(key, make):
    def edit(data, manifest):
        entry = _table_entry(manifest)
        offset, descr, shape = entry["arrays"][key]
        dtype = np.lib.format.descr_to_dtype(descr)
        size = dtype.itemsize * int(np.prod(shape))
        array = np.frombuffer(bytes(data[offset:offset + size]), dtype).reshape(shape).copy()
        make(array)
        data[offset:offset + size] = array.tobytes()
    return edit


def _layout(key, change):
    def edit(manifest):
        arrays = _table_entry(manifest)["arrays"]
        offset, descr, shape = arrays[key]
        arrays[key] = change(offset, descr, tuple(shape))
    return edit


_DAMAGE = {
    # An array whose shape broadcasts into the table's columns.
    "broadcast store": dict(edit_manifest=_layout("store1", lambda o, d, s: (o, d, (1,) + s[1:]))),
    "store dtype": dict(edit_manifest=_layout("store1", lambda o, d, s: (o, "<f8", (s[0], 2)))),
    "negative shape": dict(edit_manifest=_layout("store1", lambda o, d, s: (o, d, (-4,) + s[1:]))),
    "negative offset": dict(edit_manifest=_layout("order", lambda o, d, s: (-64, d, s))),
    "key dtype": dict(edit_manifest=_layout("key", lambda o, d, s: (o, "<f8", s))),
    "fewer keys": dict(edit_manifest=_layout("key", lambda o, d, s: (o, d, (s[0] - 1,)))),
    "object dtype": dict(edit_manifest=_layout("priority", lambda o, d, s: (o, "|O", s))),
    "missing array": dict(edit_manifest=lambda m: _table_entry(m)["arrays"].pop("times")),
    "item count": dict(edit_manifest=lambda m: _table_entry(m).update(num_items=5)),
    # Forged values with matching checksums: the restore's value checks still refuse them.
    "two keys one slot": dict(edit_file=_set_key(
        1, lambda k, b: k[1] & ~((1 << b) - 1) | (k[0] & ((1 << b) - 1)))),
    "key of no slot": dict(edit_file=_set_key(1, lambda k, b: (k[1] >> b << b) | ((1 << b) - 1))),
    "zero key": dict(edit_file=_set_key(1, lambda k, b: 0)),
    "order twice": dict(edit_file=_set_array("order", lambda a: a.__setitem__(1, a[0]))),
    "negative times": dict(edit_file=_set_array("times", lambda a: a.__setitem__(1, -3))),
    "nan priority": dict(edit_file=_set_array("priority", lambda a: a.__setitem__(1, np.nan))),
    "inf priority": dict(edit_file=_set_array("priority", lambda a: a.__setitem__(1, np.inf))),
}


def _assert_restore_refused(path):
    """Restoring ``path`` raises CheckpointError. In a child process: before the fixes,
    some damaged files made the restore write outside the table's memory."""
    name = _names.unique("bad")
    code = textwrap.dedent(f"""
        import shmreplay
        from shmreplay import errors
        try:
            shmreplay.Server(name={name!r}, checkpoint={path!r})
        except errors.CheckpointError as exc:
            print("refused:", exc)
        else:
            print("restored")
    """)
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=120)
    finally:
        _buffer.unlink_all(name, 1)
    assert result.stdout.startswith("refused:"), (result.returncode, result.stdout, result.stderr)


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_inconsistent_arrays_are_refused_with_a_typed_error(buffer_name, tmp_path, damage):
    path = _checkpoint_of(buffer_name, tmp_path)
    _rewrite(path, **_DAMAGE[damage])
    _assert_restore_refused(path)


_STEP_DAMAGE = {  # (references of items of any length: one after another)
    "ref beyond the rows": _set_array("refs", lambda a: a.reshape(-1).__setitem__(1, 1000)),
    "negative ref": _set_array("refs", lambda a: a.reshape(-1).__setitem__(1, -1)),
}


@pytest.mark.parametrize("damage", sorted(_STEP_DAMAGE))
def test_step_references_outside_the_stored_steps_are_refused(buffer_name, tmp_path, damage):
    path = _checkpoint_of(buffer_name, tmp_path, steps=True)
    _rewrite(path, edit_file=_STEP_DAMAGE[damage])
    _assert_restore_refused(path)


def test_an_intact_checkpoint_of_every_kind_of_table_still_restores(buffer_name, tmp_path):
    # The validation accepts what save writes: several tables, one that never stored
    # anything, an emptied one, whole items and steps, with a smaller max_size.
    tables = [shmreplay.Table("whole", selectors.Prioritized(0.6), selectors.MinHeap(), 50,
                              rate_limiters.MinSize(1), max_times_sampled=4),
              shmreplay.Table.queue("seq", 50),
              shmreplay.Table.queue("never", 5),
              shmreplay.Table.queue("emptied", 5)]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for i in range(80):
            client.insert(_item(i), {"whole": float(i % 7 + 1)}, timeout=5)
        client.sample_batch("whole", 30, timeout=5)
        _write_steps(client, "seq", 20)
        client.insert(_item(0), {"emptied": 1.0}, timeout=5)
        client.sample_batch("emptied", 1, timeout=5)
        path = client.checkpoint(str(tmp_path / "all.ckpt"))
        info = client.server_info()
        before = {t: info[t].current_size for t in ("whole", "seq", "never", "emptied")}
        client.close()
    with shmreplay.Server(name=_names.unique("all"), checkpoint=path) as restored:
        copy = shmreplay.Client(restored.name)
        info = copy.server_info()
        assert {t: info[t].current_size for t in before} == before
        for t in before:
            assert copy.verify(t) == []
        copy.close()
    smaller = [shmreplay.Table("whole", selectors.Prioritized(0.6), selectors.MinHeap(), 10,
                               rate_limiters.MinSize(1)), shmreplay.Table.queue("seq", 7)]
    with pytest.warns(UserWarning, match="not restored"):
        server = shmreplay.Server(smaller, name=_names.unique("small"), checkpoint=path,
                                  override_config=True)
    with server:
        copy = shmreplay.Client(server.name)
        info = copy.server_info()
        assert info["whole"].current_size == 10 and info["seq"].current_size == 7
        assert copy.verify("whole") == [] and copy.verify("seq") == []
        acts = copy.sample_batch("seq", 7, timeout=5).data["act"][:, 0].tolist()
        assert acts == list(range(14, 21))  # the newest 7 of 20
        copy.close()


# --- where checkpoints go -----------------------------------------------------------------


def test_checkpoint_into_a_directory_keeps_the_checkpoints_already_there(buffer_name, tmp_path):
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(1), {"q": 1.0}, timeout=5)
        first = client.checkpoint(str(tmp_path))
        second = client.checkpoint(str(tmp_path))
        client.close()
    assert os.path.exists(first) and os.path.exists(second)


# --- the all-or-nothing batch commit (kernel holes) ----------------------------------------


def _crash_table(max_size):
    return shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), max_size,
                           rate_limiters.MinSize(1), signature=CW.ITEM)


def _visible(client):
    """Every live item's value (checked whole: x == v), from a consistent snapshot."""
    arrays = _checkpoint.snapshot_table(client._engine("t")).arrays
    v, x = arrays["store0"], arrays["store1"]
    assert (x == v[:, None]).all(), "a half-written item is visible"
    return set(v.tolist())


@pytest.mark.slow
def test_a_batch_rolled_back_during_its_evictions_evicts_nothing(buffer_name):
    from test_crash_points import Victim
    with shmreplay.Server([_crash_table(20)], name=buffer_name) as server:
        client = server.localhost_client()
        prefill = set(range(10_000_000, 10_000_020))
        client.insert_batch(CW.items(sorted(prefill)), {"t": 1.0}, timeout=5)
        victim = Victim(server, CW.repeat, "insert_batch", point=codes.STOP_COMMIT_EVICT)
        assert victim.acknowledged == set()  # the first batch stopped
        visible = _visible(client)
        info = client.server_info()["t"]
        client.close()
    # All or nothing: the table as before, or with the whole batch and, FIFO, the
    # newest of the others (what the evictions keep).
    batch = visible - prefill
    assert visible == prefill or (
        len(batch) == 8 and visible - batch == set(sorted(prefill)[-(20 - 8):])), (
        f"{len(visible)} items, {len(batch)} of the batch")
    assert info.num_inserted == 20 + len(batch)  # the counters agree with the items
    assert info.current_size == len(visible) <= 20


def _rebuild_then_stop(name, ready, go):
    """Locks the table (rebuilding it after a dead holder) and stops as soon as the
    rebuild has cleared the commit mark."""
    client = shmreplay.Client(name)
    engine = client._engine("t")
    engine.has_columns()
    ctrl = engine.ctrl
    spinning = threading.Event()

    def stop_once_cleared():
        spinning.set()
        while ctrl[L.C_COMMIT_MARK] != 0:
            pass
        os.kill(os.getpid(), signal.SIGSTOP)

    ready.set()
    go.wait(60)
    threading.Thread(target=stop_once_cleared, daemon=True).start()
    spinning.wait(10)
    client.verify("t")


@pytest.mark.slow
def test_a_rollback_interrupted_by_a_second_death_still_rolls_back(buffer_name):
    from test_crash_points import Victim
    count = 300_000
    with shmreplay.Server([_crash_table(count)], name=buffer_name) as server:
        client = server.localhost_client()
        keys = np.concatenate([
            client.insert_batch(CW.items(np.arange(start, start + 50_000)), {"t": 1.0},
                                timeout=30)["t"]
            for start in range(0, count, 50_000)])
        # Free every slot, the lowest last: the next batch takes the lowest slots, which
        # a rebuild (highest slot first) reaches last.
        for part in np.array_split(keys[::-1], count // 50_000):
            client.mutate_priorities("t", deletes=[int(k) for k in part])
        assert client.server_info()["t"].current_size == 0
        victim = Victim(server, CW.repeat, "insert_batch", point=codes.STOP_COMMIT_HALF)
        assert victim.acknowledged == set()
        assert int(client._engine("t").ctrl[L.C_COMMIT_MARK]) != 0

        ready, go = SPAWN.Event(), SPAWN.Event()
        second = SPAWN.Process(target=_rebuild_then_stop, args=(server.name, ready, go))
        second.start()
        try:
            assert ready.wait(60)
            go.set()
            assert _crash_points.wait_stopped(second.pid, 30)
            os.kill(second.pid, signal.SIGKILL)
            second.join(10)
        finally:
            if second.is_alive():
                second.kill()
                second.join(10)
        visible = _visible(client)
        assert client.verify("t") == []
        client.close()
    assert visible == set(), f"{len(visible)} items of the killed batch are visible"


# --- rebuild's sort -----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 2, 3, 7, 64, 1000, 4097])
@pytest.mark.parametrize("layout", ["random", "ascending", "descending", "runs"])
def test_rebuild_sorts_any_slot_layout_by_insertion_order(size, layout):
    from shmreplay._shm.kernels import items
    capacity = max(size, 1) * 2 + 64
    bits = L.slot_bits(capacity)
    rng = np.random.default_rng(size * 31 + len(layout))
    ctrl = np.zeros(L.CTRL_WORDS, np.int64)
    ctrl[L.C_SLOT_BITS] = bits
    meta = np.full((capacity, L.META_FIELDS), -99, np.int64)
    slots = rng.choice(capacity, size, replace=False)
    # The largest orders a key-sized packing allows (order << bits | slot < 2**63).
    orders = np.sort(rng.choice(1 << (62 - bits), size, replace=False)) + (1 << (62 - bits))
    if layout == "ascending":
        slots = np.sort(slots)
    elif layout == "descending":
        slots = np.sort(slots)[::-1]
    elif layout == "runs":
        slots = np.sort(slots)
        slots = np.concatenate([slots[size // 2:], slots[:size // 2]])
    meta[slots, L.M_ORDER] = orders
    # rebuild lists the live slots from the highest down
    live_slots = np.sort(slots)[::-1].copy()
    meta[:size, L.M_LIVE] = live_slots
    items._sort_by_order(ctrl, meta, meta[:, L.M_LIVE], size)
    assert meta[:size, L.M_LIVE].tolist() == slots.tolist()
    assert (meta[slots, L.M_ORDER] == orders).all()  # the records are untouched


def test_a_signature_replaced_by_the_checkpoints_is_warned_about(buffer_name, tmp_path):
    # Without override_config a table takes the checkpoint's configuration, loudly
    # (docs/checkpoints.md): its signature too, which was replaced silently.
    from shmreplay.specs import TensorSpec
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(1), {"q": 1.0}, timeout=5)
        path = client.checkpoint(str(tmp_path / "q.ckpt"))
        client.close()
    table = shmreplay.Table.queue("q", 10, signature={"obs": TensorSpec((4,), np.float64),
                                                     "id": TensorSpec((), np.int32)})
    with pytest.warns(UserWarning, match="signature"):
        server = shmreplay.Server([table], name=_names.unique("sig"), checkpoint=path)
    with server:
        assert table.signature is None  # the checkpoint's (Reverb's behaviour)
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=_names.unique("same"),
                              checkpoint=path):
            pass
    assert [str(w.message) for w in caught] == []  # no difference, no warning


def test_checkpoint_of_a_stopped_buffer_raises_as_documented(buffer_name, tmp_path):
    server = shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name)
    client = shmreplay.Client(server.name)
    client.insert(_item(1), {"q": 1.0}, timeout=5)
    server.stop()
    with pytest.raises(shmreplay.errors.BufferBrokenError, match="stopped"):
        client.checkpoint(str(tmp_path / "q.ckpt"))
    assert os.listdir(tmp_path) == []  # nothing left behind
    client.close()

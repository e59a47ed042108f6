"""Checkpoints: ``Client.checkpoint`` writes every table consistently and atomically;
``Server(checkpoint=...)`` / ``Server(checkpointer=...)`` restores them.

A restored table must *behave* like the original: the tests run the same operations on
the original buffer (still alive) and on the restored one and compare the results.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import _names
import shmreplay
from shmreplay import checkpointers, errors, rate_limiters, selectors
from shmreplay._ops import checkpoint as _checkpoint
from shmreplay.specs import TensorSpec

SPAWN = multiprocessing.get_context("spawn")
SELECTORS = {
    "uniform": lambda: selectors.Uniform(),
    "prioritized": lambda: selectors.Prioritized(0.7),
    "fifo": lambda: selectors.Fifo(),
    "lifo": lambda: selectors.Lifo(),
    "maxheap": lambda: selectors.MaxHeap(),
    "minheap": lambda: selectors.MinHeap(),
}
DETERMINISTIC = ("fifo", "lifo", "maxheap", "minheap")


def _item(i):
    return {"obs": np.arange(4, dtype=np.float32) + i, "id": np.int64(i)}


def _priority(i):
    return float((i * 37) % 101 + 1)  # distinct for i < 101: heaps have no ties


def _state(client, table):
    """``{key: (priority, times_sampled, id, obs)}`` and the keys in insertion order."""
    snapshot = _checkpoint.snapshot_table(client._engine(table))
    a = snapshot.arrays
    state = {int(k): (float(p), int(t), int(i), tuple(o))
             for k, p, t, i, o in zip(a["key"], a["priority"], a["times"], a["store0"],
                                      a["store1"])}
    return state, [int(k) for k in a["key"]]


def _exercise(client, table, rng_seed):
    """Samples, updates and deletes: the history a checkpoint must capture."""
    rng = np.random.default_rng(rng_seed)
    keys = []
    for i in range(30):
        keys.append(client.insert(_item(i), {table: _priority(i)})[table])
    for _ in range(12):
        client.sample_batch(table, 1, timeout=5)
    live = list(_state(client, table)[0])
    chosen = rng.choice(live, 4, replace=False)
    client.mutate_priorities(table, updates={int(chosen[0]): 500.0, int(chosen[1]): 0.5},
                             deletes=[int(chosen[2])])
    return keys


def _drain(client, table, n):
    """What ``n`` single samples return: (key, probability, times_sampled, id)."""
    out = []
    for _ in range(n):
        batch = client.sample_batch(table, 1, timeout=5)
        out.append((int(batch.info.key[0]), round(float(batch.info.probability[0]), 12),
                    int(batch.info.times_sampled[0]), int(batch.data["id"][0])))
    return out


@pytest.mark.parametrize("sampler,remover",
                         [(s, "fifo") for s in SELECTORS] + [("uniform", r) for r in SELECTORS
                                                             if r != "fifo"])
def test_round_trip_restores_items_and_behaviour(tmp_path, sampler, remover):
    table = shmreplay.Table("t", SELECTORS[sampler](), SELECTORS[remover](), 20,
                            rate_limiters.MinSize(1), max_times_sampled=3)
    original = shmreplay.Server([table], name=_names.unique("orig"))
    try:
        client = shmreplay.Client(original.name)
        issued = _exercise(client, "t", rng_seed=len(sampler) * 7 + len(remover))
        before, order = _state(client, "t")
        info_before = client.server_info()["t"]
        path = client.checkpoint(str(tmp_path / "t.ckpt"))

        restored = shmreplay.Server(name=_names.unique("rest"), checkpoint=path)
        try:
            copy = shmreplay.Client(restored.name)
            after, order_after = _state(copy, "t")
            assert after == before  # keys, priorities, times sampled, data
            assert order_after == order  # insertion order
            info = copy.server_info()["t"]
            assert info.current_size == info_before.current_size
            assert info.rate_limiter_info == info_before.rate_limiter_info
            assert (info.num_inserted, info.num_sampled, info.num_deleted) == (
                info_before.num_inserted, info_before.num_sampled, info_before.num_deleted)
            assert info.sampler_options == info_before.sampler_options
            assert copy.verify("t") == []

            # Same behaviour from here on: sampling (with max_times_sampled deletions)...
            if sampler in DETERMINISTIC:
                assert _drain(copy, "t", 10) == _drain(client, "t", 10)
            else:
                for _ in range(10):
                    (key, probability, _, _), = _drain(copy, "t", 1)
                    state, _ = _state(client, "t")
                    if sampler == "prioritized":
                        weights = {k: v[0] ** 0.7 for k, v in state.items()}
                        expected = weights[key] / sum(weights.values())
                    else:
                        expected = 1 / len(state)
                    assert probability == pytest.approx(expected, rel=1e-9)
                    client.mutate_priorities("t", deletes=[key])  # keep both in step
                    copy.mutate_priorities("t", deletes=[key])
            # ... and eviction by the remover when new items arrive.
            for i in range(40, 50):
                new_key = copy.insert(_item(i), {"t": _priority(i)})["t"]
                client.insert(_item(i), {"t": _priority(i)})
                assert new_key > max(issued)  # keys are never reused after a restore
            if remover in DETERMINISTIC:
                assert ({v[2] for v in _state(copy, "t")[0].values()}
                        == {v[2] for v in _state(client, "t")[0].values()})
            assert copy.verify("t") == []
            copy.close()
        finally:
            restored.stop()
        client.close()
    finally:
        original.stop()


def test_step_storage_round_trip_keeps_sequences_and_shared_rows(buffer_name, tmp_path):
    tables = [shmreplay.Table.queue("seq", 100)]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        with client.trajectory_writer(3) as writer:
            for t in range(40):
                writer.append({"obs": np.full(3, t, np.int32), "act": np.int64(t)})
                if t >= 2:
                    writer.create_item("seq", 1.0, {"obs": writer.history["obs"][-3:],
                                                    "act": writer.history["act"][-2:]})
        for _ in range(5):
            client.sample_batch("seq", 1, timeout=5)  # queue: the oldest 5 go
        stored = client.server_info()["seq"].num_stored_steps
        path = client.checkpoint(str(tmp_path / "seq.ckpt"))
        with shmreplay.Server(name=_names.unique("rest"), checkpoint=path) as restored:
            copy = shmreplay.Client(restored.name)
            assert copy.server_info()["seq"].num_stored_steps == stored  # rows still shared
            assert copy.verify("seq") == []  # row reference counts included
            for _ in range(33):
                mine, theirs = (c.sample_batch("seq", 1, timeout=5) for c in (copy, client))
                assert int(mine.info.key[0]) == int(theirs.info.key[0])
                np.testing.assert_array_equal(mine.data["obs"], theirs.data["obs"])
                np.testing.assert_array_equal(mine.data["act"], theirs.data["act"])
                first = int(mine.data["act"][0, 0])
                np.testing.assert_array_equal(mine.data["obs"][0, :, 0], [first - 1, first, first + 1])
            assert copy.server_info()["seq"].num_stored_steps == 0  # every row released
            with copy.trajectory_writer(3) as writer:  # and the table takes new items
                for t in range(3):
                    writer.append({"obs": np.full(3, t, np.int32), "act": np.int64(t)})
                writer.create_item("seq", 1.0, {"obs": writer.history["obs"][-3:],
                                                "act": writer.history["act"][-2:]})
            assert copy.sample_batch("seq", 1, timeout=5).data["act"].tolist() == [[1, 2]]
            copy.close()
        client.close()


def _blocked_limiter_table(**overrides):
    # 1 sample per insert; samples may run ahead of inserts by 2 (inserts ahead by 10):
    # after 10 inserts and 12 samples the limiter blocks sampling.
    return shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 100,
                           rate_limiters.SampleToInsertRatio(1.0, 1, (-2.0, 10.0)), **overrides)


def test_rate_limiter_state_is_restored_unless_reset(buffer_name, tmp_path):
    with shmreplay.Server([_blocked_limiter_table()], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for i in range(10):
            client.insert(_item(i), {"t": 1.0})
        client.sample_batch("t", 12, timeout=5)
        assert not server._tables[0].can_sample(1)
        path = client.checkpoint(str(tmp_path / "t.ckpt"))
        client.close()
    table = _blocked_limiter_table()
    with shmreplay.Server([table], name=_names.unique("kept"), checkpoint=path):
        assert table.info.rate_limiter_info.sample_stats.completed == 12
        assert not table.can_sample(1)  # Reverb's behaviour (its issue #118)
    table = _blocked_limiter_table()
    with shmreplay.Server([table], name=_names.unique("reset"), checkpoint=path,
                          reset_rate_limiter=True) as server:
        info = table.info
        assert info.current_size == 10
        assert info.rate_limiter_info.insert_stats.completed == 10
        assert info.rate_limiter_info.sample_stats.completed == 0
        assert table.can_sample(1)
        copy = shmreplay.Client(server.name)
        assert len(copy.sample_batch("t", 10, timeout=5).info.key) == 10
        assert copy.verify("t") == []
        copy.close()


def test_override_config_changes_max_times_sampled_and_max_size(buffer_name, tmp_path):
    original = shmreplay.Table("t", selectors.Fifo(), selectors.Fifo(), 50, rate_limiters.MinSize(1))
    with shmreplay.Server([original], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for i in range(30):
            client.insert(_item(i), {"t": 1.0})
        path = client.checkpoint(str(tmp_path / "t.ckpt"))
        client.close()

    # Without override_config the checkpoint's configuration wins, loudly.
    wanted = original.replace(max_times_sampled=1)
    with pytest.warns(UserWarning, match="max_times_sampled"):
        server = shmreplay.Server([wanted], name=_names.unique("ckcfg"), checkpoint=path)
    with server:
        assert wanted.info.max_times_sampled == 0

    # With it, the new max_times_sampled applies (Reverb's issue #137) ...
    wanted = original.replace(max_times_sampled=1)
    with shmreplay.Server([wanted], name=_names.unique("mts"), checkpoint=path,
                          override_config=True) as server:
        copy = shmreplay.Client(server.name)
        ids = copy.sample_batch("t", 30, timeout=5).data["id"].tolist()
        assert ids == list(range(30))
        assert wanted.info.current_size == 0  # each sampled once, then removed
        copy.close()

    # ... and a smaller max_size keeps what the remover keeps (the newest, for Fifo).
    smaller = original.replace(max_size=10, max_times_sampled=1)
    with shmreplay.Server([smaller], name=_names.unique("small"), checkpoint=path,
                          override_config=True) as server:
        copy = shmreplay.Client(server.name)
        assert smaller.info.current_size == 10
        assert copy.sample_batch("t", 10, timeout=5).data["id"].tolist() == list(range(20, 30))
        assert copy.verify("t") == []
        copy.close()


def test_restore_into_a_table_with_another_signature_fails_and_leaves_nothing(buffer_name, tmp_path):
    with shmreplay.Server([shmreplay.Table.queue("t", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(0), {"t": 1.0})
        path = client.checkpoint(str(tmp_path / "t.ckpt"))
        client.close()
    other = shmreplay.Table.queue("t", 10, signature={"obs": TensorSpec((5,), np.float32),
                                                      "id": TensorSpec((), np.int64)})
    name = _names.unique("sig")
    with pytest.raises(errors.SchemaError, match=r"Table 't'.*signature"):
        shmreplay.Server([other], name=name, checkpoint=path, override_config=True)
    with pytest.raises(errors.BufferNotFoundError):  # the fixture checks no segment was left
        shmreplay.Client(name).server_info(timeout=0)


def test_tables_not_in_the_checkpoint_start_empty_and_extra_ones_are_ignored(buffer_name, tmp_path):
    with shmreplay.Server([shmreplay.Table.queue("a", 10), shmreplay.Table.queue("b", 10)],
                          name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(1), {"a": 1.0, "b": 1.0})
        path = client.checkpoint(str(tmp_path / "ab.ckpt"))
        client.close()
    tables = [shmreplay.Table.queue("a", 10), shmreplay.Table.queue("c", 10)]
    with pytest.warns(UserWarning, match=r"\['b'\].*not restored"):
        server = shmreplay.Server(tables, name=_names.unique("ac"), checkpoint=path)
    with server:
        assert [t.info.current_size for t in tables] == [1, 0]


def test_reverb_style_checkpointer_keeps_the_latest_and_restores_it(buffer_name, tmp_path):
    root = tmp_path / "ckpts"
    checkpointer = checkpointers.DefaultCheckpointer(str(root))
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name,
                          checkpointer=checkpointer) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(1), {"q": 1.0})
        first = client.checkpoint()
        client.insert(_item(2), {"q": 1.0})
        second = client.checkpoint()
        assert os.path.dirname(first) == os.path.dirname(second) == str(root)
        assert second > first and os.listdir(root) == [os.path.basename(second)]
        client.close()
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=_names.unique("again"),
                          checkpointer=checkpointer) as server:
        copy = shmreplay.Client(server.name)
        assert copy.sample_batch("q", 2, timeout=5).data["id"].tolist() == [1, 2]
        copy.close()
    # An empty directory falls back to fallback_checkpoint_path.
    fallback = checkpointers.DefaultCheckpointer(str(tmp_path / "empty"),
                                                 fallback_checkpoint_path=second)
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=_names.unique("fb"),
                          checkpointer=fallback) as server:
        assert server._tables[0].info.current_size == 2


def test_checkpoint_without_path_or_checkpointer_goes_to_a_private_directory(
        buffer_name, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(3), {"q": 1.0})
        first = client.checkpoint()
        second = client.checkpoint()  # the same directory; only the newest is kept
        base = tmp_path / f"shmreplay-checkpoints-{os.getuid()}"
        assert os.path.dirname(second) == str(base / buffer_name)
        assert os.listdir(base / buffer_name) == [os.path.basename(second)] != [first]
        assert os.stat(base).st_mode & 0o777 == 0o700
        assert os.stat(second).st_mode & 0o777 == 0o600
        assert _checkpoint.load(second).table("q").num_items == 1
        # A directory of that name that is not private is refused, not used.
        os.chmod(base, 0o755)
        with pytest.raises(PermissionError, match="not a directory private to this user"):
            client.checkpoint()
        client.close()


def test_progress_is_reported_in_bytes_up_to_the_total(buffer_name, tmp_path):
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 64, rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert_batch({"frame": np.zeros((64, 512 * 1024), np.uint8)}, {"t": 1.0})
        calls = []
        path = client.checkpoint(str(tmp_path / "big.ckpt"), progress=lambda d, t: calls.append((d, t)))
        assert len(calls) >= 2  # 32 MiB in 16 MiB chunks
        assert all(b[0] >= a[0] for a, b in zip(calls, calls[1:]))
        assert calls[-1][0] == calls[-1][1] >= 32 << 20
        assert os.path.getsize(path) >= calls[-1][1]
        client.close()


@pytest.mark.parametrize("damage", ["truncate", "manifest", "magic", "missing", "version"])
def test_a_damaged_checkpoint_is_refused_with_a_typed_error(buffer_name, tmp_path, damage):
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(3), {"q": 1.0})
        path = client.checkpoint(str(tmp_path / "q.ckpt"))
        client.close()
    data = bytearray(open(path, "rb").read())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "manifest":
        data[-5] ^= 0xFF
    elif damage == "magic":
        data[:8] = b"NOTACKPT"
    elif damage == "version":
        data[8] = 99
    if damage == "missing":
        os.unlink(path)
    else:
        open(path, "wb").write(bytes(data))
    name = _names.unique("bad")
    with pytest.raises(errors.CheckpointError, match=str(tmp_path)):
        shmreplay.Server([shmreplay.Table.queue("q", 10)], name=name, checkpoint=path)
    with pytest.raises(errors.BufferNotFoundError):
        shmreplay.Client(name).server_info(timeout=0)


def test_a_checkpoint_replaced_on_disk_while_it_is_read_is_read_whole(buffer_name, tmp_path):
    # Client.checkpoint(path) renames a new file over ``path``. A restore reading ``path``
    # then must see one file or the other, never tables of both: every array comes from
    # the mapping that load() checked, not from the path again.
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(1), {"q": 1.0})
        first = client.checkpoint(str(tmp_path / "a.ckpt"))
        client.sample_batch("q", 1, timeout=1)  # item 1 leaves the queue
        client.insert(_item(2), {"q": 1.0})
        client.insert(_item(3), {"q": 1.0})
        second = client.checkpoint(str(tmp_path / "b.ckpt"))
        client.close()
    saved = _checkpoint.load(first)
    keys_before = np.array(saved.table("q").array("key"))
    os.replace(second, first)  # a newer checkpoint renamed over the one being read
    assert len(keys_before) == 1
    assert np.array_equal(saved.table("q").array("key"), keys_before)
    assert _checkpoint.load(first).table("q").num_items == 2


def test_a_path_ending_in_a_slash_is_a_new_directory(buffer_name, tmp_path):
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(1), {"q": 1.0})
        path = client.checkpoint(str(tmp_path / "new" / "dir") + "/")
        client.close()
    assert os.path.isdir(tmp_path / "new" / "dir")
    assert os.path.dirname(path) == str(tmp_path / "new" / "dir")
    assert _checkpoint.load(path).table("q").num_items == 1


# --- checkpoints while the buffer is in use, and a writer killed mid-way -----------------


def _actor(name, first, count, started, stop):
    """Inserts ids ``first, first + 1, ...`` until ``stop`` is set (at most ``count``), in
    bursts of 10 with 10 ms pauses: at most 1,000 items/s. Unpaced, two actors filled the
    table (30,000) in a fraction of a second, and a checkpoint on a busy machine came too
    late to see it filling; and a checkpoint prepares its copy for the size it saw plus
    1,024 rows, starting over if the table outgrew that meanwhile, so it cannot complete
    while inserts outrun its preparation. Paced, the table fills in no less than 15 s."""
    client = shmreplay.Client(name)
    started.set()
    for i in range(first, first + count):
        client.insert({"obs": np.full(256, i, np.float32), "id": np.int64(i)}, {"t": 1.0},
                      timeout=10)
        if i % 10 == 9:
            if stop.is_set():
                break
            time.sleep(0.01)
    client.close()


def test_checkpoints_taken_while_actors_insert_are_consistent(buffer_name, tmp_path):
    table = shmreplay.Table("t", selectors.Prioritized(0.5), selectors.Fifo(), 30000,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        started, stop = [SPAWN.Event() for _ in range(2)], SPAWN.Event()
        actors = [SPAWN.Process(target=_actor,
                                args=(server.name, k * 100000, 20000, started[k], stop))
                  for k in range(2)]
        for actor in actors:
            actor.start()
        client = shmreplay.Client(server.name)
        try:
            assert all(event.wait(60) for event in started)
            deadline = time.monotonic() + 30
            while client.server_info()["t"].current_size == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            paths = []
            for n in range(3):
                paths.append(client.checkpoint(str(tmp_path / f"c{n}.ckpt")))
        finally:
            stop.set()
            for actor in actors:
                actor.join(60)
        assert [actor.exitcode for actor in actors] == [0, 0]
        client.close()
    sizes = []
    for path in paths:
        with shmreplay.Server(name=_names.unique("live"), checkpoint=path) as restored:
            copy = shmreplay.Client(restored.name)
            assert copy.verify("t") == []
            state = _checkpoint.snapshot_table(copy._engine("t")).arrays
            ids, obs = state["store0"], state["store1"]
            assert (obs == ids[:, None]).all()  # no item was torn
            for k in range(2):  # each actor's items: one run of its stream, in order
                mine = ids[(ids >= k * 100000) & (ids < (k + 1) * 100000)]
                if len(mine):
                    assert mine.tolist() == list(range(mine[0], mine[0] + len(mine)))
            sizes.append(len(ids))
            copy.close()
    assert sizes == sorted(sizes) and 0 < sizes[0] < 30000  # the first one while inserting


def _write_slow_checkpoint(name, path, writing):
    client = shmreplay.Client(name)

    def progress(done, total):
        writing.set()
        time.sleep(0.05)  # slow enough for the test to kill us mid-file

    client.checkpoint(path, progress=progress)


def test_a_checkpoint_writer_killed_mid_way_leaves_the_previous_checkpoint(buffer_name, tmp_path):
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 64, rate_limiters.MinSize(1))
    path = str(tmp_path / "t.ckpt")
    with shmreplay.Server([table], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert_batch({"frame": np.ones((8, 1 << 20), np.uint8)}, {"t": 1.0})
        client.checkpoint(path)
        previous = open(path, "rb").read()
        client.insert_batch({"frame": np.full((56, 1 << 20), 2, np.uint8)}, {"t": 1.0})

        writing = SPAWN.Event()
        child = SPAWN.Process(target=_write_slow_checkpoint, args=(server.name, path, writing))
        child.start()
        try:
            assert writing.wait(60)
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.join(10)
        assert child.exitcode == -signal.SIGKILL
        assert open(path, "rb").read() == previous  # untouched
        leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".t.ckpt.tmp-")]
        assert len(leftovers) == 1
        # The buffer is unharmed (the lock is not held while the file is written) ...
        assert len(client.sample_batch("t", 4, timeout=2).info.key) == 4
        assert client.verify("t") == []
        # ... and the next checkpoint replaces the file and removes the dead temporary.
        client.checkpoint(path)
        assert os.listdir(tmp_path) == ["t.ckpt"]
        assert _checkpoint.load(path).table("t").num_items == 64
        client.close()
    with shmreplay.Server(name=_names.unique("prev"), checkpoint=path) as restored:
        assert restored._tables[0].info.current_size == 64


def test_cli_checkpoint_writes_a_file_a_server_restores(buffer_name, tmp_path):
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        for i in range(3):
            client.insert(_item(i), {"q": 1.0})
        result = subprocess.run(
            [sys.executable, "-m", "shmreplay.cli", "checkpoint", server.name, str(tmp_path),
             "--progress", "on"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        written, = os.listdir(tmp_path)  # a directory gets a new timestamped file
        assert result.stdout.startswith(f"{tmp_path / written}:") and "q: 3" in result.stdout
        assert "100.0%" in result.stderr  # the progress bar
        client.close()
    with shmreplay.Server(name=_names.unique("cli"), checkpoint=str(tmp_path)) as restored:
        copy = shmreplay.Client(restored.name)  # a directory: its latest checkpoint
        assert copy.sample_batch("q", 3, timeout=5).data["id"].tolist() == [0, 1, 2]
        copy.close()


def test_a_table_served_elsewhere_is_refused_before_the_checkpoint_touches_it(buffer_name,
                                                                              tmp_path):
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        path = client.checkpoint(str(tmp_path / "q.ckpt"))
        client.close()
    live = shmreplay.Table("q", selectors.Uniform(), selectors.Fifo(), 7, rate_limiters.MinSize(1))
    with shmreplay.Server([live], name=_names.unique("live")):
        with pytest.raises(ValueError, match="already served"):
            shmreplay.Server([live], name=_names.unique("again"), checkpoint=path)
        assert live.info.max_size == 7 and live.info.max_times_sampled == 0  # unchanged


def test_a_checkpoint_directory_ignores_files_it_did_not_name(buffer_name, tmp_path):
    root = tmp_path / "ckpts"
    checkpointer = checkpointers.DefaultCheckpointer(str(root))
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name,
                          checkpointer=checkpointer) as server:
        client = shmreplay.Client(server.name)
        client.insert(_item(1), {"q": 1.0})
        mine = client.checkpoint(str(root / "run-17.shmreplay"))  # a user-named file
        client.insert(_item(2), {"q": 1.0})
        first = client.checkpoint()
        second = client.checkpoint()
        assert sorted(os.listdir(root)) == sorted([os.path.basename(second), "run-17.shmreplay"])
        assert checkpointer.latest() == second != first and os.path.exists(mine)
        client.close()
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=_names.unique("dir"),
                          checkpoint=str(root)) as restored:
        assert restored._tables[0].info.current_size == 2  # the timestamped one, not mine

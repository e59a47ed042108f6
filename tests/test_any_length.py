"""Items of any length: a signature whose time dimension is None (issue 19, point 1).

Each step is stored once; each item comes back at its own length from ``sample``, and
padded with its lengths from ``sample_batch``; eviction, ``max_times_sampled``, deletes,
checkpoints, ``verify`` and crashes keep the table whole.
"""

import multiprocessing
import time

import numpy as np
import pytest

import _any_length_workers as W
import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay._shm import layout as L
from shmreplay._shm.kernels import refpool

SPAWN = multiprocessing.get_context("spawn")


def _table(name="eps", max_size=100, sampler=None, remover=None, **kwargs):
    return shmreplay.Table(name, sampler or selectors.Uniform(), remover or selectors.Fifo(),
                           max_size, rate_limiters.MinSize(1), signature=W.SIGNATURE, **kwargs)


def _check_items(batch):
    """Every item of a padded batch is one run of consecutive steps, zero after it."""
    lengths = batch.lengths["step"]
    assert (batch.lengths["obs"] == lengths).all()
    for step, obs, length in zip(batch.data["step"], batch.data["obs"], lengths):
        assert length >= 1
        run = step[:length]
        assert (np.diff(run) == 1).all(), run
        assert (obs[:length] == run[:, None]).all()
        assert (step[length:] == 0).all() and (obs[length:] == 0).all()


def test_items_come_back_at_their_own_length(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", [3, 7, 1, 12], base=100)
        batch = client.sample_batch("eps", 64, timeout=5)
        assert isinstance(batch, shmreplay.PaddedSample)
        info, data = batch  # still Reverb's pair
        assert data["obs"].shape == (64, 12, 4) and data["step"].dtype == np.int64
        assert set(batch.lengths["step"].tolist()) == {3, 7, 1, 12}
        _check_items(batch)
        first = {int(s[0]): int(n) for s, n in zip(data["step"], batch.lengths["step"])}
        assert first == {100: 3, 103: 7, 110: 1, 111: 12}
        mask = shmreplay.PaddedSample.mask(batch.lengths["step"])
        assert mask.shape == (64, 12) and mask.sum() == batch.lengths["step"].sum()
        # Reverb's sample: each item at its own length, flat columns (sorted keys).
        for sample in client.sample("eps", 8, emit_timesteps=False):
            obs, step = sample.data
            assert obs.shape == (len(step), 4) and (obs == step[:, None]).all()
            assert first[int(step[0])] == len(step)
        assert client.server_info()["eps"].num_stored_steps == 23  # each step once
        assert client.verify("eps") == []
        client.close()


def test_columns_of_one_item_have_their_own_lengths(buffer_name):
    signature = {"obs": shmreplay.TensorSpec((None, 2), np.float32),
                 "action": shmreplay.TensorSpec((None,), np.int32),
                 "reward": shmreplay.TensorSpec((), np.float32)}
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 50,
                            rate_limiters.MinSize(1), signature=signature)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        with client.trajectory_writer(num_keep_alive_refs=10) as writer:
            for t in range(9):
                writer.append({"obs": np.full(2, t, np.float32), "action": np.int32(t),
                               "reward": np.float32(t)})
                if t >= 1:
                    length = 1 + t % 4  # obs: length+1 steps, action: length, reward: one
                    if length + 1 <= t + 1:
                        writer.create_item("t", 1.0, {
                            "obs": writer.history["obs"][-(length + 1):],
                            "action": writer.history["action"][-length:],
                            "reward": writer.history["reward"][-1]})
        batch = client.sample_batch("t", 40, timeout=5)
        for i in range(40):
            n_obs = batch.lengths["obs"][i]
            n_action = batch.lengths["action"][i]
            assert n_obs == n_action + 1 and batch.lengths["reward"][i] == 1
            last = batch.data["reward"][i]
            assert (batch.data["obs"][i, :n_obs, 0] == np.arange(last - n_obs + 1, last + 1)).all()
            assert (batch.data["action"][i, :n_action]
                    == np.arange(last - n_action + 1, last + 1)).all()
            assert (batch.data["action"][i, n_action:] == 0).all()
        assert batch.data["reward"].shape == (40,)
        # Stored once: steps 3..8, the only ones items read.
        assert client.server_info()["t"].num_stored_steps == 6
        assert client.verify("t") == []
        client.close()


def test_wrong_items_are_refused_and_change_nothing(buffer_name):
    signature = {"obs": shmreplay.TensorSpec((None, 4), np.float32),
                 "step": shmreplay.TensorSpec((2,), np.int64)}  # fixed length 2
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 50,
                            rate_limiters.MinSize(1), signature=signature)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        with client.trajectory_writer(num_keep_alive_refs=5) as writer:
            for t in range(5):
                writer.append({"obs": np.full(4, t, np.float32), "step": np.int64(t)})
            writer.create_item("t", 1.0, {"obs": writer.history["obs"][-3:],
                                          "step": writer.history["step"][-2:]})
            with pytest.raises(errors.SchemaError, match=r"'step'.*int64\[2\]"):
                writer.create_item("t", 1.0, {"obs": writer.history["obs"][-3:],
                                              "step": writer.history["step"][-3:]})
        with client.trajectory_writer(num_keep_alive_refs=5) as writer:
            writer.append({"obs": np.zeros(3, np.float32), "step": np.int64(0)})
            writer.append({"obs": np.zeros(3, np.float32), "step": np.int64(1)})
            with pytest.raises(errors.SchemaError, match=r"'obs'.*float32\[None, 4\]"):
                writer.create_item("t", 1.0, {"obs": writer.history["obs"][-2:],
                                              "step": writer.history["step"][-2:]})
        with pytest.raises(errors.SchemaError, match=r"\['obs'\]"):
            client.insert({"obs": np.zeros((3, 5), np.float32), "step": np.zeros(2, np.int64)},
                          {"t": 1.0})
        info = client.server_info()["t"]
        assert info.current_size == 1 and info.num_stored_steps == 3
        assert client.verify("t") == []
        client.close()


def test_insert_makes_items_of_one_step_or_whole_sequences(buffer_name):
    """As Reverb's: an inserted leaf is one step (a time dimension of 1); a leaf with
    the time dimension is a whole sequence (shmreplay's, as for fixed tables)."""
    with shmreplay.Server([_table(sampler=selectors.Fifo())], name=buffer_name) as server:
        client = server.localhost_client()
        client.insert({"obs": np.full(4, 5, np.float32), "step": np.int64(5)}, {"eps": 1.0})
        client.insert({"obs": np.arange(3, dtype=np.float32)[:, None].repeat(4, 1),
                       "step": np.arange(3)}, {"eps": 1.0})
        client.insert_batch({"obs": np.ones((2, 4, 4), np.float32),
                             "step": np.ones((2, 4), np.int64)}, {"eps": np.ones(2)})
        W.write_episodes(client, "eps", [2], base=40)  # and writer items, into one table
        got = [(sample.data[1].tolist(), sample.data[0].shape)
               for sample in client.sample("eps", 5, emit_timesteps=False)]
        assert got[0] == ([5], (1, 4))
        client.mutate_priorities("eps", deletes=[k for k in [
            int(client.sample_batch("eps", 1).info.key[0])]])
        batch = client.sample_batch("eps", 1)
        assert batch.data["step"][0].tolist() == [0, 1, 2] and batch.lengths["step"][0] == 3
        info = client.server_info()["eps"]
        # (the writer's columns get rows of their own in a table an insert defined:
        # its stores hold no writer field to share)
        assert info.current_size == 4 and info.num_stored_steps == 3 + 4 + 4 + 2 * 2
        assert client.verify("eps") == []
        client.close()


def test_a_none_after_the_time_dimension_leaves_the_shape_to_the_first_item():
    table = shmreplay.Table("t", selectors.Uniform(), selectors.Fifo(), 10,
                            rate_limiters.MinSize(1),
                            signature=shmreplay.TensorSpec((None, None), np.float32))
    assert table.shapes_from_data  # (the rest: test_open_dims.py)


def test_eviction_deletes_and_max_times_sampled_free_rows_and_blocks(buffer_name):
    tables = [_table("fifo", max_size=5),
              shmreplay.Table.queue("queue", 50, signature=W.SIGNATURE)]
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "fifo", [4, 40, 2, 9, 1, 30, 5, 3], base=0)  # 3 evicted
        info = client.server_info()["fifo"]
        assert info.current_size == 5
        batch = client.sample_batch("fifo", 50, timeout=5)
        _check_items(batch)
        assert set(batch.lengths["step"].tolist()) == {9, 1, 30, 5, 3}
        assert info.num_stored_steps == 9 + 1 + 30 + 5 + 3
        keys = sorted(set(batch.info.key.tolist()))
        client.mutate_priorities("fifo", deletes=keys[:2])
        assert client.server_info()["fifo"].current_size == 3
        assert client.verify("fifo") == []
        # A queue deletes each item as it is sampled (max_times_sampled=1).
        W.write_episodes(client, "queue", [6, 1, 17], base=1000)
        seen = []
        for _ in range(3):
            batch = client.sample_batch("queue", 1, timeout=5)
            _check_items(batch)
            seen.append(int(batch.lengths["step"][0]))
        assert seen == [6, 1, 17]
        info = client.server_info()["queue"]
        assert info.current_size == 0 and info.num_stored_steps == 0
        engine = client._engine("queue")
        counters = engine.counters()
        assert counters[L.C_BLOCK_FREE_TOP] == counters[L.C_BLOCK_FRESH]  # every block back
        assert client.verify("queue") == []
        client.reset("fifo")
        assert client.server_info()["fifo"].num_stored_steps == 0
        assert client.verify("fifo") == []
        client.close()


def test_a_full_step_budget_evicts_and_a_too_long_item_is_refused(buffer_name):
    with shmreplay.Server([_table(max_size=100, max_steps=20)], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", [8, 8], base=0)
        W.write_episodes(client, "eps", [8], base=100)  # 24 steps > 20: the oldest goes
        info = client.server_info()["eps"]
        assert info.current_size == 2 and info.num_stored_steps == 16
        batch = client.sample_batch("eps", 20, timeout=5)
        assert {int(s[0]) for s in batch.data["step"]} == {8, 100}
        with pytest.raises(errors.SchemaError, match="step budget.*max_steps"):
            W.write_episodes(client, "eps", [21], base=500)
        assert client.verify("eps") == []
        client.close()


def test_actors_in_spawned_processes_feed_a_learner_by_name(buffer_name):
    with shmreplay.Server([_table(max_size=1000)], name=buffer_name):
        done = [SPAWN.Event() for _ in range(2)]
        actors = [SPAWN.Process(target=W.actor, args=(buffer_name, "eps", lengths, base, event))
                  for lengths, base, event in (([5, 1, 9, 2] * 5, 0, done[0]),
                                               ([3, 14, 7] * 5, 10_000, done[1]))]
        for process in actors:
            process.start()
        try:
            for event in done:
                assert event.wait(120), "an actor did not finish"
            client = shmreplay.Client(buffer_name)
            assert client.server_info()["eps"].current_size == 35
            batch = client.sample_batch("eps", 256, timeout=5)
            _check_items(batch)
            assert set(batch.lengths["step"].tolist()) == {1, 2, 3, 5, 7, 9, 14}
            assert client.verify("eps") == []
            client.close()
        finally:
            for process in actors:
                process.join(30)
                if process.is_alive():
                    process.kill()


def test_no_torn_items_while_other_processes_overwrite(buffer_name):
    """Items evicted while sampled: their rows and blocks are reused at once. Every
    sampled item must still be whole (the redraw widens a batch if it must)."""
    with shmreplay.Server([_table(max_size=8, max_steps=64)], name=buffer_name):
        ready = [SPAWN.Event() for _ in range(2)]
        stop = SPAWN.Event()
        writers = [SPAWN.Process(target=W.overwriter, args=(buffer_name, "eps", seed, event,
                                                            stop))
                   for seed, event in zip((1, 2), ready)]
        for process in writers:
            process.start()
        try:
            for event in ready:
                assert event.wait(120)
            client = shmreplay.Client(buffer_name)
            deadline = time.monotonic() + 4
            batches = 0
            while time.monotonic() < deadline:
                _check_items(client.sample_batch("eps", 32, timeout=5))
                for sample in client.sample("eps", 4, emit_timesteps=False, timeout=5):
                    obs, step = sample.data
                    assert (np.diff(step) == 1).all() and (obs == step[:, None]).all()
                batches += 1
            assert batches > 10
        finally:
            stop.set()
            for process in writers:
                process.join(30)
                if process.is_alive():
                    process.kill()
        assert client.verify("eps") == []
        client.close()


def test_verify_finds_a_broken_chain(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = server.localhost_client()
        # The first item sizes the heads (3 steps of 2 columns inline); the second
        # takes blocks.
        W.write_episodes(client, "eps", [3, 60], base=0)
        engine = client._engine("eps")
        assert client.verify("eps") == []
        capacity = engine.capacity
        chained = np.flatnonzero(engine.refs[:capacity, refpool.HEAD_FIRST] > 0)
        assert len(chained) == 1
        slot = int(chained[0])
        first = int(engine.refs[slot, refpool.HEAD_FIRST]) - 1
        link = engine.refs[capacity + first, -1]
        engine.refs[capacity + first, -1] = 0  # cut the chain short
        assert any("step rows" in problem for problem in client.verify("eps"))
        engine.refs[capacity + first, -1] = link
        engine.refs[slot, refpool.HEAD_LENGTHS] += 1  # lengths that do not add up
        assert any("step rows" in problem for problem in client.verify("eps"))
        engine.refs[slot, refpool.HEAD_LENGTHS] -= 1
        inline = refpool.HEAD_LENGTHS + 2  # a head's first inline reference
        row = engine.refs[slot, inline]
        engine.refs[slot, inline] = engine.rows.shape[0]  # a row out of range
        assert any("step rows" in problem for problem in client.verify("eps"))
        engine.refs[slot, inline] = row
        assert client.verify("eps") == []
        batch = client.sample_batch("eps", 20, timeout=5)
        _check_items(batch)
        assert set(batch.lengths["step"].tolist()) == {3, 60}
        client.close()


def test_checkpoint_round_trip(buffer_name, tmp_path):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", [3, 7, 1, 12, 5], base=0)
        before = client.sample_batch("eps", 100, timeout=5)
        path = client.checkpoint(str(tmp_path / "ck"))
        client.close()
    with shmreplay.Server([_table()], name=buffer_name, checkpoint=path) as server:
        client = server.localhost_client()
        assert client.server_info()["eps"].current_size == 5
        assert client.server_info()["eps"].num_stored_steps == 28
        after = client.sample_batch("eps", 100, timeout=5)
        _check_items(after)
        want = {int(s[0]): int(n) for s, n in zip(before.data["step"], before.lengths["step"])}
        got = {int(s[0]): int(n) for s, n in zip(after.data["step"], after.lengths["step"])}
        assert got == want
        assert client.verify("eps") == []
        W.write_episodes(client, "eps", [4], base=900)  # and it takes new items
        assert client.verify("eps") == []
        client.close()


def test_sigkill_storm_of_writers_while_a_learner_samples(buffer_name):
    """Writers of items of any length SIGKILLed every 20-80 ms for 8 s (some inside the
    table's lock) while the learner samples: nothing torn, every acknowledged item
    kept, the table verifies, no call of the learner waits long."""
    seconds = 8.0
    with shmreplay.Server([_table(max_size=200_000)], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", [3], base=-1000)
        client.sample_batch("eps", 64, timeout=2)  # (kernels loaded)
        counts = SPAWN.RawArray("q", 5_000)
        incarnations = SPAWN.RawValue("q", 0)
        started, done = SPAWN.Event(), SPAWN.Event()
        controller = SPAWN.Process(target=W.storm, args=(server.name, seconds, 2, 99, counts,
                                                         incarnations, started, done))
        controller.start()
        slowest = 0.0
        try:
            assert started.wait(60)
            while not done.is_set():
                t0 = time.monotonic()
                _check_items(client.sample_batch("eps", 64, timeout=2))
                slowest = max(slowest, time.monotonic() - t0)
            controller.join(30)
        finally:
            if controller.is_alive():
                controller.kill()
                controller.join(10)
        assert controller.exitcode == 0
        killed = incarnations.value
        assert killed > 5 * seconds, f"only {killed} writers ran"
        acknowledged = sum(counts[:killed])
        assert acknowledged > 100
        # Nothing evicted (max_size is far away): every acknowledged item is there.
        assert client.server_info()["eps"].current_size >= acknowledged + 2
        assert client.verify("eps") == []
        assert slowest < 1.5, f"a sample waited {slowest:.2f} s"
        client.close()


def test_tables_without_signature_take_items_of_other_lengths(buffer_name):
    """As in Reverb: the legacy Writer's items of 1 and 2 steps, and TrajectoryWriter
    items whose columns differ in length from the first item's, into one table."""
    table = shmreplay.Table.queue("q", 20)
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        with client.writer(max_sequence_length=3) as writer:
            writer.append({"x": np.int64(1)})
            writer.create_item("q", 1, 1.0)
            writer.append({"x": np.int64(2)})
            writer.create_item("q", 2, 1.0)
        with client.trajectory_writer(num_keep_alive_refs=4) as writer:
            for t in range(4):
                writer.append({"x": np.int64(10 + t)})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-4:]})
        got = [sample.data[0].tolist()
               for sample in client.sample("q", 3, emit_timesteps=False, timeout=5)]
        assert got == [[1], [1, 2], [10, 11, 12, 13]]
        # Other cells do not fit the columns: the item goes to the general store whole.
        with client.trajectory_writer(num_keep_alive_refs=2) as writer:
            writer.append({"x": np.zeros(2)})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
        other = next(client.sample("q", 1, emit_timesteps=False, timeout=5)).data[0]
        assert other.shape == (1, 2) and other.dtype == np.float64
        assert client.verify("q") == []
        client.close()

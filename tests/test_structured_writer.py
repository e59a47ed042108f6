"""``Client.structured_writer`` (Reverb's StructuredWriter: patterns, conditions,
priorities, episodes) through real buffers; building configs and ``infer_signature``
are in ``test_structured_configs.py``.

Restates what Reverb 0.14's ``structured_writer_test.py`` checks, through real buffers
(items sampled back from FIFO queues, so in insertion order), plus the documented
examples of Reverb's ``structured_writer.py``, the rules of its C++ writer
(``structured_writer.cc``: config validation, conditions checked once per step, partial
steps, end of episode) and shmreplay's own guarantees (each step stored once; one shape
per table). Steps carry their index, so an item shows which steps it references.
"""

import contextlib
import multiprocessing

import numpy as np
import optree
import pytest

import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay import structured_writer as sw

import _mp_workers as W
import _names
import _structured_workers as SW

Condition = sw.Condition
TABLES = tuple(f"queue_{i}" for i in range(5))
STEP = {"a": np.zeros([], np.float32),
        "b": {"c": np.zeros([2, 2], np.int32),
              "d": [np.zeros([3], np.int64), np.zeros([6], np.int64)]}}
REF = sw.create_reference_step(STEP)
SPAWN = multiprocessing.get_context("spawn")


def numbered(i, structure=STEP):
    return {k: numbered(i, v) for k, v in structure.items()} if isinstance(structure, dict) \
        else [numbered(i, v) for v in structure] if isinstance(structure, list) \
        else np.ones_like(structure) * i


@contextlib.contextmanager
def serve(*tables):
    tables = tables or [shmreplay.Table.queue(t, 100) for t in TABLES]
    with shmreplay.Server(tables=list(tables), name=_names.unique("sw")) as server:
        client = shmreplay.Client(server.name)
        try:
            yield client
        finally:
            client.close()


def content(client, table, structure=None):
    """Every item of the queue ``table``, oldest first (flat lists, or ``structure``)."""
    size = client.server_info()[table].current_size
    if size == 0:
        return []
    data = [s.data for s in client.sample(table, num_samples=size, emit_timesteps=False)]
    if structure is None:
        return data
    treedef = optree.tree_structure(structure, none_is_leaf=True)
    return [optree.tree_unflatten(treedef, d) for d in data]


def assert_nests_equal(want, got):
    assert len(want) == len(got), (want, got)
    for w, g in zip(want, got):
        w_leaves, w_def = optree.tree_flatten(w, none_is_leaf=True)
        g_leaves, g_def = optree.tree_flatten(g, none_is_leaf=True)
        assert w_def == g_def, (w, g)
        for a, b in zip(w_leaves, g_leaves):
            np.testing.assert_array_equal(a, b)
            assert np.asarray(a).dtype == np.asarray(b).dtype, (a, b)


def last_step_config(table=TABLES[0], conditions=()):
    return sw.create_config(sw.pattern_from_transform(None, lambda x: x[-1]), table,
                            conditions=list(conditions))


# --------------------------------------------------------------------------------------
# conditions and patterns, through a buffer
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("condition, num_steps, want_steps", [
    (Condition.step_index() <= 2, 10, [0, 1, 2]),
    (Condition.step_index() >= 5, 10, [5, 6, 7, 8, 9]),
    (Condition.step_index() == 3, 10, [3]),
    (Condition.step_index() != 3, 10, [0, 1, 2, 4, 5, 6, 7, 8, 9]),
    (Condition.step_index() % 3 == 0, 10, [0, 3, 6, 9]),
    (Condition.step_index() % 3 != 0, 10, [1, 2, 4, 5, 7, 8]),
    (Condition.step_index() > 7, 10, [8, 9]),
    (Condition.step_index() < 2, 10, [0, 1]),
    (Condition.steps_since_applied() >= 4, 10, [3, 7]),
    (Condition.steps_since_applied() >= 3, 10, [2, 5, 8]),
    (Condition.is_end_episode(), 5, [4]),
])
def test_single_condition(condition, num_steps, want_steps):
    with serve() as client:
        writer = client.structured_writer([last_step_config(conditions=[condition])])
        for i in range(num_steps):
            writer.append(i)
        writer.end_episode()
        assert content(client, TABLES[0]) == [[step] for step in want_steps]


@pytest.mark.parametrize("pattern, num_steps, want", [
    ({"x": REF["a"][-3], "y": REF["b"]["c"][-2:], "z": REF["b"]["d"][0][-1]}, 5,
     [{"x": np.float32(i), "y": np.stack([np.full((2, 2), i + 1, np.int32),
                                          np.full((2, 2), i + 2, np.int32)]),
       "z": np.full(3, i + 2, np.int64)} for i in range(3)]),
    ({"older": REF["a"][-3:-1], "last_a": REF["a"][-1]}, 5,
     [{"older": np.array([i, i + 1], np.float32), "last_a": np.float32(i + 2)}
      for i in range(3)]),
    ({"every_second_a": REF["a"][-5::2]}, 10,
     [{"every_second_a": np.array([i, i + 2, i + 4], np.float32)} for i in range(6)]),
])
def test_trajectory_patterns(pattern, num_steps, want):
    with serve() as client:
        writer = client.structured_writer([sw.create_config(pattern, TABLES[0])])
        for i in range(num_steps):
            writer.append(numbered(i))
        writer.end_episode()
        assert_nests_equal(want, content(client, TABLES[0], pattern))


def test_round_robin_into_tables():
    configs = [last_step_config(table, [Condition.step_index() % len(TABLES) == i])
               for i, table in enumerate(TABLES)]
    with serve() as client:
        writer = client.structured_writer(configs)
        for i in range(2 * len(TABLES)):
            writer.append(i)
        writer.end_episode()
        for i, table in enumerate(TABLES):
            assert content(client, table) == [[i], [i + len(TABLES)]]


@pytest.mark.parametrize("spec, pattern_fn, condition_fn, steps, want", [
    ({"a": None, "b": None}, lambda x: {"old_a": x["a"][-2]}, lambda x: x["b"] > 10,
     [{"a": 1, "b": 11}, {"a": 2, "b": 10}, {"a": 3, "b": 11}, {"a": 4, "b": 9},
      {"a": 5, "b": 12}], [{"old_a": 2}, {"old_a": 4}]),
    (STEP, lambda x: {"last_two_a": x["a"][-2:]}, lambda x: x["a"] == 3,
     [{"a": np.int32(v)} for v in (0, 2, 3, 4, 5)],
     [{"last_two_a": np.array([2, 3], np.int32)}]),
    (STEP, lambda x: {"last_two_a": x["a"][-2:]}, lambda x: x["a"] != 4,
     [{"a": np.int64(v)} for v in (1, 2, 3, 4, 5)],
     [{"last_two_a": np.array(p)} for p in ([1, 2], [2, 3], [4, 5])]),
    ({"a": None, "b": None}, lambda x: {"last_a": x["a"][-1]}, lambda x: x["b"] == 1,
     [{"a": a, "b": b} for a, b in ((1, True), (2, False), (3, False), (4, True), (5, False))],
     [{"last_a": 1}, {"last_a": 4}]),
], ids=["condition_on_unused_column", "int32_eq", "int64_ne", "bool_eq"])
def test_data_condition(spec, pattern_fn, condition_fn, steps, want):
    config = sw.create_config(sw.pattern_from_transform(spec, pattern_fn), TABLES[0],
                              conditions=[condition_fn(Condition.data(spec))])
    with serve() as client:
        writer = client.structured_writer([config])
        for step in steps:
            writer.append(step)
        writer.flush()
        got = content(client, TABLES[0], sw.unpack_pattern(config))
        want = [{k: np.asarray(v, np.int64) if type(v) is int else v for k, v in w.items()}
                for w in want]
        assert_nests_equal(want, got)


def test_partial_steps_apply_a_config_once_when_its_fields_are_there():
    ref = sw.create_reference_step({"obs": None, "action": None})
    config = sw.create_config({"obs": ref["obs"][-1], "action": ref["action"][-1]}, TABLES[0])
    with serve() as client:
        writer = client.structured_writer([config])
        assert not writer.step_is_open
        writer.append({"obs": 0, "action": None}, partial_step=True)
        assert writer.step_is_open and content(client, TABLES[0]) == []
        writer.append({"obs": None, "action": 10})       # completes step 0: one item
        assert not writer.step_is_open
        writer.append({"obs": 1, "action": 11}, partial_step=True)  # whole but open: item
        writer.append({"obs": None, "action": None})     # nothing new: no second item
        writer.append({"obs": 2, "action": None}, partial_step=True)
        with pytest.raises(ValueError, match="already been set"):
            writer.append({"obs": 3, "action": None})
        writer.end_episode()                             # ends step 2 as it is
        assert not writer.step_is_open
        assert content(client, TABLES[0]) == [[10, 0], [11, 1]]


def test_step_is_open_follows_reverbs_sequence():
    ref = sw.create_reference_step([None, None, None])
    with serve() as client:
        writer = client.structured_writer([sw.create_config([r[-1] for r in ref], TABLES[0])])
        states = [writer.step_is_open]
        for data, partial in (([1, 1, 1], False), ([None, 2, None], True),
                              ([None, None, 2], True), ([2, None, None], False),
                              ([None, 3, None], True)):
            writer.append(data, partial_step=partial)
            states.append(writer.step_is_open)
        writer.end_episode()
        states.append(writer.step_is_open)
        assert states == [False, False, True, True, False, True, False]
        assert content(client, TABLES[0]) == [[1, 1, 1], [2, 2, 2]]


def test_end_episode_clears_buffers_and_restarts_step_index():
    ref = sw.create_reference_step(None)
    configs = [sw.create_config(ref[-2:], TABLES[0]),
               sw.create_config(ref[-1], TABLES[1], [Condition.step_index() == 0]),
               sw.create_config(ref[-1], TABLES[2], [Condition.steps_since_applied() >= 3])]
    with serve() as client:
        writer = client.structured_writer(configs)
        for episode in range(2):
            for t in range(4):
                writer.append(10 * episode + t)
            writer.end_episode()
        # No pair spans the boundary; step 0 of each episode is step_index 0; and, as in
        # Reverb, steps_since_applied keeps counting across episodes, once per step (the
        # end_episode check is no new step).
        assert [list(x[0]) for x in content(client, TABLES[0])] == [
            [0, 1], [1, 2], [2, 3], [10, 11], [11, 12], [12, 13]]
        assert content(client, TABLES[1]) == [[0], [10]]
        assert content(client, TABLES[2]) == [[2], [11]]


def test_buffer_length_counts_at_most_the_longest_reach():
    """As in Reverb, the buffers keep only the steps some config can read: a condition
    asking for more never holds unless another config reaches that far."""
    ref = sw.create_reference_step(None)
    wants_3 = [sw.ConditionProto(buffer_length=True, ge=3)]
    with serve() as client:
        writer = client.structured_writer([sw.create_config(ref[-2:], TABLES[0], wants_3)])
        for t in range(5):
            writer.append(t)
        writer.end_episode()
        assert content(client, TABLES[0]) == []
        writer = client.structured_writer([sw.create_config(ref[-2:], TABLES[0], wants_3),
                                           sw.create_config(ref[-3:], TABLES[1])])
        for t in range(5):
            writer.append(t)
        writer.end_episode()
        assert [list(x[0]) for x in content(client, TABLES[0])] == [[1, 2], [2, 3], [3, 4]]


def test_clear_buffers_false_refuses_an_item_across_episodes():
    ref = sw.create_reference_step(None)
    with serve() as client:
        writer = client.structured_writer([sw.create_config(ref[-2:], TABLES[0])])
        writer.append(0)
        writer.append(1)
        writer.end_episode(clear_buffers=False)
        with pytest.raises(ValueError, match="across an episode boundary"):
            writer.append(2)
        writer.append(3)  # the writer goes on: [2, 3] is inside the new episode
        writer.end_episode()
        assert [list(x[0]) for x in content(client, TABLES[0])] == [[0, 1], [2, 3]]


# --------------------------------------------------------------------------------------
# priorities
# --------------------------------------------------------------------------------------

def priorities(client, table):
    size = client.server_info()[table].current_size
    return [s.info.priority for s in client.sample(table, num_samples=size,
                                                   emit_timesteps=False)]


def test_constant_and_td_error_priorities():
    spec = {"a": None, "b": None, "c": None}
    ref = sw.create_reference_step(spec)
    configs = [
        sw.create_config({"a": ref["a"][-1], "c": ref["c"][-1]}, TABLES[0],
                         priority=sw.td_error(0.5, spec, lambda x: x["c"])),
        sw.create_config({"c": ref["c"][-3:]}, TABLES[1],
                         priority=sw.td_error(0.25, spec, lambda x: x["c"])),
        sw.create_config(ref["a"][-1], TABLES[2], priority=sw.constant_priority_fn(2.5)),
    ]
    with serve() as client:
        writer = client.structured_writer(configs)
        for i in range(5):
            writer.append({"a": i, "b": i + 1, "c": float(-(i + 2))})
        writer.flush()
        assert priorities(client, TABLES[0]) == [2.0, 3.0, 4.0, 5.0, 6.0]
        # 0.25 * max|e| + 0.75 * mean|e| over the last 3 steps' c.
        assert priorities(client, TABLES[1]) == pytest.approx(
            [0.25 * (i + 4) + 0.75 * (i + 3) for i in range(3)])
        assert priorities(client, TABLES[2]) == [2.5] * 5


def test_a_non_finite_td_error_is_refused_before_the_step_is_appended():
    spec = {"a": None, "c": None}
    ref = sw.create_reference_step(spec)
    config = sw.create_config(ref["c"][-2:], TABLES[0],
                              priority=sw.td_error(1.0, spec, lambda x: x["c"]))
    with serve() as client:
        writer = client.structured_writer([config])
        writer.append({"a": 0, "c": 1.0})
        with pytest.raises(errors.InvalidPriorityError, match="not finite"):
            writer.append({"a": 1, "c": float("nan")})
        writer.append({"a": 2, "c": 3.0})
        writer.flush()
        assert [list(x[0]) for x in content(client, TABLES[0])] == [[1.0, 3.0]]


# --------------------------------------------------------------------------------------
# bad data and bad configs
# --------------------------------------------------------------------------------------

def test_append_wrong_dtype_names_column_and_path():
    with serve() as client:
        writer = client.structured_writer([sw.create_config(REF["b"]["c"][-1], TABLES[0])])
        writer.append({"a": 1, "b": {"c": 1.0}})
        with pytest.raises(errors.SchemaError) as e:
            writer.append({"a": 2, "b": {"c": 2}})
        assert str(e.value) == ("Tensor of wrong dtype provided for column 1 (path=('b', 'c'))."
                                " Got int64 but expected double.")
        writer.append({"a": "unused, never stored", "b": {"c": 3.0}})
        writer.flush()
        assert content(client, TABLES[0]) == [[1.0], [3.0]]


def test_append_incompatible_shape_names_column_and_path():
    with serve() as client:
        writer = client.structured_writer([sw.create_config(REF["b"]["d"][1][-1], TABLES[0])])
        writer.append({"a": 1, "b": {"c": 1.0, "d": [1, 1]}})
        with pytest.raises(errors.SchemaError) as e:
            writer.append({"a": 2, "b": {"c": 2.0, "d": [2, np.array([[2, 2], [2, 2]])]}})
        assert str(e.value) == ("Tensor of incompatible shape provided for column 3 "
                                "(path=('b', 'd', 1)). Got [2,2] which is incompatible with [].")


def test_append_with_different_structures():
    with serve() as client:
        writer = client.structured_writer([sw.create_config(REF["b"]["c"][-1], TABLES[0])])
        writer.append({"a": 1, "b": {"c": 1}})
        with pytest.raises(ValueError, match=r"^Flattened data has an unexpected length, got 4 "
                                             r"but wanted 2\.$"):
            writer.append({"a": 2, "b": {"c": 2, "d": [2, 2]}})


def test_data_condition_on_a_float_field_is_a_schema_error_and_appends_nothing():
    spec = {"a": None, "b": None}
    config = sw.create_config(sw.create_reference_step(spec)["a"][-2:], TABLES[0],
                              conditions=[Condition.data(spec)["b"] == 1])
    with serve() as client:
        writer = client.structured_writer([config])
        with pytest.raises(errors.SchemaError, match=r"data condition on column 1 \(path=\('b',\)"):
            writer.append({"a": 0, "b": 1.5})
        writer.append({"a": 1, "b": 1})  # an int b is fine: the refused step left no trace
        writer.append({"a": 2, "b": 1})
        assert [list(x[0]) for x in content(client, TABLES[0])] == [[1, 2]]


@pytest.mark.parametrize("config, match", [
    (sw.Config(flat=[sw.PatternNode(flat_source_index=0, start=0)], table="t"),
     "`start` must be < 0"),
    (sw.Config(flat=[sw.PatternNode(stop=1)], table="t"), "`stop` must be <= 0"),
    (sw.Config(flat=[sw.PatternNode(start=-2, stop=-3)], table="t"), "must be > `start`"),
    (sw.Config(flat=[sw.PatternNode(stop=-1, step=2)], table="t"), "`step` must only be set"),
    (sw.Config(flat=[sw.PatternNode(start=-2, step=-1)], table="t"), "`step` must be > 0"),
    (sw.Config(flat=[sw.PatternNode()], table="t"), "at least one of `start` and `stop`"),
    (sw.Config(flat=[], table="t"), "`flat` must not be empty"),
    (sw.Config(flat=[sw.PatternNode(stop=-1)]), "`table` must not be empty"),
    (sw.create_config(REF["a"][-1], "t", [sw.ConditionProto(step_index=True)]),
     "must specify a value for `cmp`"),
    (sw.create_config(REF["a"][-1], "t", [Condition.step_index() % 0 == 0]),
     r"`mod_eq.mod` must be > 0"),
    (sw.create_config(REF["a"][-1], "t", [sw.ConditionProto(is_end_episode=True, eq=1,
                                                            inverse=True)]), "eq=1"),
], ids=["start>=0", "stop>0", "stop<=start", "step-no-start", "step<=0", "empty-node",
        "no-flat", "no-table", "no-cmp", "mod-0", "end-episode-inverse"])
def test_invalid_configs_are_refused_by_position(config, match):
    with serve() as client:
        with pytest.raises(ValueError, match=match):
            client.structured_writer([last_step_config(), config])
        with pytest.raises(ValueError, match="position 1"):
            client.structured_writer([last_step_config(), config])


def test_no_configs_negative_priority_and_unknown_table():
    with serve() as client:
        with pytest.raises(ValueError, match="At least one config must be provided"):
            client.structured_writer([])
        with pytest.raises(errors.InvalidPriorityError):
            client.structured_writer([sw.create_config(
                REF["a"][-1], TABLES[0], priority=sw.constant_priority_fn(-1.0))])
        writer = client.structured_writer([last_step_config(TABLES[1]),
                                           last_step_config("nope")])
        with pytest.raises(errors.TableNotFoundError):
            writer.append(1)
        assert content(client, TABLES[1]) == []  # no item of that step was inserted


def test_configs_of_different_structures_or_column_forms_for_one_table_are_refused():
    ref = sw.create_reference_step(None)
    with serve() as client:
        with pytest.raises(errors.SchemaError, match=r"time dimension in one .*'queue_0'"):
            client.structured_writer([sw.create_config(ref[-3:], TABLES[0]),
                                      sw.create_config(ref[-1], TABLES[0])])
        with pytest.raises(errors.SchemaError, match="different structures"):
            client.structured_writer([sw.create_config({"x": ref[-1]}, TABLES[0]),
                                      sw.create_config({"y": ref[-1]}, TABLES[0])])
        # Any lengths into one table (items of any length), or into two tables, are fine.
        client.structured_writer([sw.create_config(ref[-3:], TABLES[0]),
                                  sw.create_config(ref[-2:], TABLES[0])])
        client.structured_writer([sw.create_config(ref[-3:], TABLES[0]),
                                  sw.create_config(ref[-4:-1], TABLES[0]),
                                  sw.create_config(ref[-2:], TABLES[1])])


# --------------------------------------------------------------------------------------
# writing: storage, waiting items, keep-alive
# --------------------------------------------------------------------------------------

def test_each_step_is_stored_once_and_keep_alive_is_the_longest_reach():
    ref = sw.create_reference_step({"obs": None, "t": None})
    configs = [sw.create_config({"obs": ref["obs"][-4:]}, "seq"),
               sw.create_config({"obs": ref["obs"][-2], "t": ref["t"][-1]}, "seq2")]
    tables = [shmreplay.Table("seq", selectors.Uniform(), selectors.Fifo(), 100,
                              rate_limiters.MinSize(1)),
              shmreplay.Table.queue("seq2", 100)]
    with serve(*tables) as client:
        writer = client.structured_writer(configs)
        assert writer.num_keep_alive_refs == 4
        for t in range(12):
            writer.append({"obs": np.full(8, t, np.float32), "t": t})
        writer.end_episode()
        info = client.server_info()["seq"]
        assert info.current_size == 9 and info.num_stored_steps == 12
        sample = client.sample_batch("seq", 9, timeout=5)
        starts = sample.data["obs"][:, 0, 0]
        np.testing.assert_array_equal(sample.data["obs"][:, :, 0],
                                      starts[:, None] + np.arange(4))
        assert [[x[0][0], x[1]] for x in content(client, "seq2")] == \
            [[t - 1, t] for t in range(1, 12)]


def test_items_refused_by_the_rate_limiter_wait_for_flush():
    with serve(shmreplay.Table.queue(TABLES[0], 2)) as client:
        writer = client.structured_writer([last_step_config()])
        for i in range(4):
            writer.append(i)
        assert writer.num_pending_items == 2
        with pytest.raises(errors.DeadlineExceededError):
            writer.flush(timeout_ms=50)
        assert content(client, TABLES[0]) == [[0], [1]]
        writer.flush(timeout_ms=5_000)
        assert writer.num_pending_items == 0
        assert content(client, TABLES[0]) == [[2], [3]]
        writer.close()
        with pytest.raises(errors.ClosedError):
            writer.append(5)


def test_with_block_flushes():
    with serve(shmreplay.Table.queue(TABLES[0], 1)) as client:
        with client.structured_writer([last_step_config()]) as writer:
            writer.append(0)
            writer.append(1)
            assert writer.num_pending_items == 1
            assert content(client, TABLES[0]) == [[0]]
        assert content(client, TABLES[0]) == [[1]]


# --------------------------------------------------------------------------------------
# a writer in another process
# --------------------------------------------------------------------------------------

def test_spawned_writer_attaching_by_name_feeds_a_learner(buffer_name):
    tables = [shmreplay.Table("seq", selectors.Uniform(), selectors.Fifo(), 1000,
                              rate_limiters.MinSize(1)),
              shmreplay.Table("pairs", selectors.Uniform(), selectors.Fifo(), 1000,
                              rate_limiters.MinSize(1))]
    episodes, length = 3, 9
    with shmreplay.Server(tables, name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        try:
            queue = SPAWN.Queue()
            proc = SPAWN.Process(target=SW.write_episodes,
                                 args=(server.name, "seq", "pairs", episodes, length, queue))
            with W.processes(proc):
                assert W.get(queue, 120, "done") == episodes * length
                proc.join(10)
            assert proc.exitcode == 0
            info = client.server_info()
            # Per episode: sequences end at steps 2, 4, 6, 8; pairs at steps 1..8.
            assert info["seq"].current_size == episodes * 4
            assert info["pairs"].current_size == episodes * (length - 1)
            seq = client.sample_batch("seq", 64, timeout=5).data
            obs, t = seq["obs"], seq["t"]
            assert obs.shape == (64, 3, SW.OBS) and t.shape == (64, 3)
            np.testing.assert_array_equal(obs[:, :, 1], t)            # its own steps
            np.testing.assert_array_equal(t - t[:, :1], [[0, 1, 2]] * 64)  # consecutive
            assert set(t[:, -1].tolist()) == {2, 4, 6, 8}
            assert (obs[:, :, 0] == obs[:, :1, 0]).all()              # one episode each
            pairs = client.sample_batch("pairs", 64, timeout=5).data
            np.testing.assert_array_equal(pairs["next_obs"][:, 1] - pairs["obs"][:, 1], 1)
            np.testing.assert_array_equal(pairs["next_obs"][:, 0], pairs["obs"][:, 0])
        finally:
            client.close()


def test_configs_of_different_lengths_write_items_of_any_length_into_one_table():
    """Acme's TRUNCATE sequence configs: a config per length, one table."""
    ref = sw.create_reference_step({"x": None})
    configs = [sw.create_config({"x": ref["x"][-n:]}, "q",
                                conditions=[sw.Condition.step_index() == n - 1])
               for n in (1, 2, 3)]
    table = shmreplay.Table.queue("q", 10, signature=sw.infer_signature(
        configs, {"x": shmreplay.TensorSpec((), np.int64)}))
    assert table.signature["x"].shape == (None,)
    with shmreplay.Server([table], name=_names.unique()) as server:
        client = shmreplay.Client(server.name)
        with client.structured_writer(configs) as writer:
            for t in range(3):
                writer.append({"x": np.int64(t)})
            writer.flush()
        got = [s.data[0].tolist() for s in client.sample("q", 3, emit_timesteps=False,
                                                             timeout=5)]
        assert got == [[0], [0, 1], [0, 1, 2]]
        client.close()

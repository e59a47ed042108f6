"""``shmreplay.tf.PatternDataset`` (Reverb's): StructuredWriter configs applied to a
``tf.data`` dataset of steps, no buffer involved. Restates Reverb 0.14's
``pattern_dataset_test.py`` and checks that the dataset yields what a StructuredWriter
with the same configs inserts. TensorFlow is imported here (and in the other TF files)
only."""

import numpy as np
import pytest
import tensorflow as tf

import shmreplay
from shmreplay import structured_writer as sw
from shmreplay import tf as shmreplay_tf
from shmreplay.replay_sample import SampleInfo


Condition = sw.Condition


def elements(dataset):
    return [tf.nest.map_structure(lambda x: x.numpy(), e) for e in dataset]


def steps_dataset():
    return tf.data.Dataset.from_tensor_slices({
        "observation": {"field_0": [0, 1, 2, 3], "field_1": [0, 1, 2, 3]},
        "action": [0, 1, 2, 3],
        "is_last": [False, False, False, False]})


def last_step_config(conditions=()):
    return sw.create_config(sw.pattern_from_transform(None, lambda x: x[-1]), "unused",
                            conditions=list(conditions))


def test_pattern_and_condition_on_a_dict_of_steps():
    # Flat index 0 of the step is 'action' (dict keys sorted, as Reverb flattens).
    dataset = shmreplay_tf.PatternDataset(
        steps_dataset(), [last_step_config([Condition.step_index() <= 2])],
        respect_episode_boundaries=True, is_end_of_episode=lambda x: x["is_last"])
    assert dataset.element_spec == tf.TensorSpec([], tf.int32)
    assert elements(dataset) == [0, 1, 2]
    assert elements(dataset) == [0, 1, 2]  # each iteration starts afresh


def test_keeps_the_step_shape_and_adds_the_time_dimension():
    steps = tf.data.Dataset.from_tensor_slices([[0, 0], [1, 1], [2, 2], [3, 3]])
    ref = sw.create_reference_step(steps.element_spec)
    last = shmreplay_tf.PatternDataset(
        steps, [last_step_config([Condition.step_index() <= 2])], True, lambda x: False)
    np.testing.assert_array_equal(elements(last), [[0, 0], [1, 1], [2, 2]])
    pairs = shmreplay_tf.PatternDataset(
        steps, [sw.create_config(ref[-2:], "unused")], True, lambda x: False)
    assert pairs.element_spec == tf.TensorSpec([2, 2], tf.int32)
    np.testing.assert_array_equal(elements(pairs), [[[0, 0], [1, 1]], [[1, 1], [2, 2]],
                                                    [[2, 2], [3, 3]]])


def test_nested_result():
    spec = {"observation": {"field_0": np.zeros([], np.int64),
                            "field_1": np.zeros([], np.int64)},
            "action": np.zeros([], np.int64), "is_last": np.zeros([], bool)}
    ref = sw.create_reference_step(spec)
    pattern = {"observation": {k: ref["observation"][k][-2] for k in ("field_0", "field_1")},
               "next_observation": {k: ref["observation"][k][-1]
                                    for k in ("field_0", "field_1")}}
    dataset = shmreplay_tf.PatternDataset(steps_dataset(), [sw.create_config(pattern, "t")],
                                          True, lambda x: x["is_last"])
    got = elements(dataset)
    assert [e["observation"]["field_0"] for e in got] == [0, 1, 2]
    assert [e["next_observation"]["field_1"] for e in got] == [1, 2, 3]


@pytest.mark.parametrize("respect, want", [
    (True, [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6)]),
    (False, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]),
])
def test_episode_boundaries(respect, want):
    ref = sw.create_reference_step({"data": None, "is_last": None})
    config = sw.create_config({"data": ref["data"][-2], "next": ref["data"][-1]}, "t")
    steps = tf.data.Dataset.from_tensor_slices({
        "data": [0, 1, 2, 3, 4, 5, 6],
        "is_last": [False, False, False, True, False, False, True]})
    dataset = shmreplay_tf.PatternDataset(steps, [config], respect, lambda x: x["is_last"])
    assert [(e["data"], e["next"]) for e in elements(dataset)] == want


def test_end_of_episode_conditions_and_lengths_that_differ_between_configs():
    # Acme's TRUNCATE-style configs: 3-step sequences every 3 steps, and at each episode's
    # end whatever came since the last one. The engine's tables cannot hold these (one
    # length per table), a dataset can: the time dimension is None.
    ref = sw.create_reference_step({"x": None, "last": None})
    configs = [sw.create_config(ref["x"][-3:], "t", [Condition.step_index() % 3 == 2])]
    configs += [sw.create_config(ref["x"][-n:], "t", [Condition.is_end_episode(),
                                                      Condition.step_index() % 3 == n - 1])
                for n in (1, 2)]
    steps = tf.data.Dataset.from_tensor_slices({
        "x": [0, 1, 2, 3, 4, 10, 11, 12], "last": [0, 0, 0, 0, 1, 0, 0, 1]})
    dataset = shmreplay_tf.PatternDataset(steps, configs, True,
                                          lambda s: tf.cast(s["last"], tf.bool))
    assert dataset.element_spec.shape.as_list() == [None]
    assert [list(e) for e in elements(dataset)] == [[0, 1, 2], [3, 4], [10, 11, 12]]


def test_with_info_adds_zero_sample_info_of_reverbs_dtypes():
    dataset = shmreplay_tf.pattern_dataset_with_info(
        tf.data.Dataset.from_tensor_slices({"data": [0, 1, 2, 3]}),
        [last_step_config([Condition.step_index() <= 2])], True, lambda _: False)
    got = list(dataset)
    assert [int(s.data) for s in got] == [0, 1, 2]
    info = got[0].info
    assert [f.dtype.as_numpy_dtype for f in info] == list(SampleInfo.dtypes())
    assert all(int(f) == 0 for f in info)


def test_is_end_of_episode_must_return_a_scalar_bool():
    with pytest.raises(ValueError, match="must return `bool`"):
        shmreplay_tf.PatternDataset(steps_dataset(), [last_step_config()], True,
                                    lambda x: x["action"])
    with pytest.raises(ValueError, match="Invalid configuration at position 0"):
        shmreplay_tf.PatternDataset(steps_dataset(), [sw.Config(flat=[sw.PatternNode(
            start=1)], pattern_structure=None, table="t")], True, lambda x: x["is_last"])


def test_infer_signature_gives_tf_specs_with_tensorflow_imported():
    spec = {"a": tf.TensorSpec([3], tf.float32)}
    ref = sw.create_reference_step(spec)
    got = sw.infer_signature([sw.create_config({"x": ref["a"][-3:]}, "t"),
                              sw.create_config({"x": ref["a"][-2:]}, "t")], spec)
    assert got == {"x": tf.TensorSpec([None, 3], tf.float32, "x")}


def test_yields_what_a_structured_writer_inserts(buffer_name):
    """The same configs, one writer into queues and one dataset: the same trajectories,
    in the same order."""
    spec = {"obs": np.zeros([2], np.float32), "done": np.zeros([], bool)}
    ref = sw.create_reference_step(spec)
    pattern = {"obs": ref["obs"][-3:], "last_obs": ref["obs"][-1]}
    configs = [sw.create_config(pattern, "q", [Condition.steps_since_applied() >= 2]),
               sw.create_config(pattern, "q", [Condition.is_end_episode(),
                                               Condition.step_index() % 2 == 1])]
    lengths = [5, 7, 4]
    steps = [{"obs": np.array([e, t], np.float32), "done": t == n - 1}
             for e, n in enumerate(lengths) for t in range(n)]
    with shmreplay.Server([shmreplay.Table.queue("q", 100)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        writer = client.structured_writer(configs)
        for step in steps:
            writer.append(step)
            if step["done"]:
                writer.end_episode()
        size = client.server_info()["q"].current_size
        written = [s.data for s in client.sample("q", num_samples=size, emit_timesteps=False)]
        writer.close()
        client.close()
    dataset = shmreplay_tf.PatternDataset(
        tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(lambda *x: np.stack(x),
                                                                 *steps)),
        configs, True, lambda s: s["done"])
    got = elements(dataset)
    assert len(got) == len(written) > 4
    for from_dataset, (last_obs, obs) in zip(got, written):  # columns in key order
        np.testing.assert_array_equal(from_dataset["obs"], obs)
        np.testing.assert_array_equal(from_dataset["last_obs"], last_obs)


def test_exported_lazily():
    assert shmreplay.PatternDataset is shmreplay_tf.PatternDataset

"""``shmreplay.structured_writer`` without a buffer: reference steps and pattern nodes,
the ``Condition`` builders, configs as protobuf-like objects, Reverb's documented
examples, and ``infer_signature`` (without TensorFlow: ``shmreplay.TensorSpec``; with it,
``test_pattern_dataset.py``)."""

import collections
import pickle
import subprocess
import sys

import numpy as np
import optree
import pytest

import shmreplay
from shmreplay import errors
from shmreplay import structured_writer as sw

Condition = sw.Condition
STEP = {"a": np.zeros([], np.float32),
        "b": {"c": np.zeros([2, 2], np.int32),
              "d": [np.zeros([3], np.int64), np.zeros([6], np.int64)]}}
REF = sw.create_reference_step(STEP)


@pytest.fixture
def without_tensorflow(monkeypatch):
    """infer_signature gives tf.TensorSpec once TensorFlow is imported (the TF test files
    import it at collection): these tests check the other case."""
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)


# --------------------------------------------------------------------------------------
# building configs
# --------------------------------------------------------------------------------------

def test_reference_step_slices_make_pattern_nodes():
    node = REF["b"]["c"][-2]
    assert (node.flat_source_index, node.stop) == (1, -2)
    assert not node.HasField("start") and node.HasField("stop")
    window = REF["a"][-3:-1]
    assert (window.start, window.stop, window.HasField("step")) == (-3, -1, False)
    strided = REF["b"]["d"][1][-6::2]
    assert (strided.flat_source_index, strided.start, strided.step) == (3, -6, 2)
    assert not strided.HasField("stop") and strided.stop == 0  # proto3 default
    with pytest.raises(ValueError, match="Key must be int or slice"):
        REF["a"]["x"]


def test_condition_builders_make_reverbs_conditions():
    le = Condition.step_index() <= 2             # not (step_index >= 3)
    assert (le.WhichOneof("left"), le.WhichOneof("cmp"), le.ge, le.inverse) == \
        ("step_index", "ge", 3, True)
    lt = Condition.step_index() < 2              # not (step_index >= 2)
    assert (lt.ge, lt.inverse) == (2, True)
    gt = Condition.steps_since_applied() > 4
    assert (gt.WhichOneof("left"), gt.ge, gt.inverse) == ("steps_since_applied", 5, False)
    ne = Condition.step_index() % 3 != 1
    assert (ne.mod_eq.mod, ne.mod_eq.eq, ne.inverse) == (3, 1, True)
    end = Condition.is_end_episode()
    assert (end.is_end_episode, end.eq, end.HasField("eq")) == (True, 1, True)
    data = Condition.data({"x": None, "y": None})["y"] == 0
    assert (data.WhichOneof("left"), data.flat_source_index, data.eq, data.HasField("eq")) \
        == ("flat_source_index", 1, 0, True)
    with pytest.raises(ValueError, match="only be compared with == or !="):
        Condition.step_index() % 3 >= 1


def test_config_equality_copy_and_pickle():
    config = sw.create_config({"x": REF["a"][-2:], "y": REF["b"]["c"][-1]}, "t",
                              conditions=[Condition.step_index() % 2 == 0],
                              priority=sw.constant_priority_fn(0.5))
    twin = sw.create_config({"x": REF["a"][-2:], "y": REF["b"]["c"][-1]}, "t",
                            conditions=[Condition.step_index() % 2 == 0],
                            priority=sw.constant_priority_fn(0.5))
    assert config == twin and pickle.loads(pickle.dumps(config)) == config
    other = sw.create_config({"x": REF["a"][-2:], "y": REF["b"]["c"][-1]}, "t")
    assert other != config
    other.CopyFrom(config)
    assert other == config
    assert sw.unpack_pattern(config) == {"x": REF["a"][-2:], "y": REF["b"]["c"][-1]}
    # A namedtuple pattern is not a tuple pattern.
    Pair = collections.namedtuple("Pair", "x y")
    assert sw.create_config(Pair(REF["a"][-1], REF["a"][-2]), "t") != \
        sw.create_config((REF["a"][-1], REF["a"][-2]), "t")
    with pytest.raises(TypeError, match="PatternNode"):
        sw.create_config({"x": 3}, "t")


def test_reverbs_docstring_examples():
    # create_reference_step's example.
    ref_step = sw.create_reference_step({"a": None, "b": {"c": None, "d": None}})
    pattern = {"last_two_a": ref_step["a"][-2:], "second_to_last_c": ref_step["b"]["c"][-2],
               "most_recent_d": ref_step["b"]["d"][-1]}
    assert [(n.flat_source_index, n.start, n.stop) for n in
            (pattern["last_two_a"], pattern["second_to_last_c"], pattern["most_recent_d"])] \
        == [(0, -2, 0), (1, 0, -2), (2, 0, -1)]

    # pattern_from_transform's example.
    def my_transform(step):
        return {"last_two_a": step["a"][-2:],
                "most_recent_b": optree.tree_map(lambda x: x[-1], step["b"])}

    got = sw.pattern_from_transform({"a": None, "b": {"c": None, "d": None}}, my_transform)
    assert got == {"last_two_a": ref_step["a"][-2:],
                   "most_recent_b": {"c": ref_step["b"]["c"][-1], "d": ref_step["b"]["d"][-1]}}


# --------------------------------------------------------------------------------------
# infer_signature (without TensorFlow: shmreplay.TensorSpec)
# --------------------------------------------------------------------------------------

def test_infer_signature(without_tensorflow):
    spec = {"a": np.zeros([3, 3], np.float32), "b": {"c": np.zeros([], np.int32)}}
    ref = sw.create_reference_step(spec)
    patterns = [{"x": ref["a"][-3:-1], "y": ref["a"][-1], "z": {"w": ref["b"]["c"][-6::2]}},
                {"x": ref["a"][-2:], "y": ref["a"][-2], "z": {"w": ref["b"]["c"][-3:]}}]
    got = sw.infer_signature([sw.create_config(p, "t") for p in patterns], spec)
    T = shmreplay.TensorSpec
    assert got == {"x": T([2, 3, 3], np.float32), "y": T([3, 3], np.float32),
                   "z": {"w": T([3], np.int32)}}
    assert got["z"]["w"].name == "z/w"


@pytest.mark.parametrize("configs, match", [
    ([], "At least one config must be provided."),
    ([sw.create_config({"x": REF["a"][-3:]}, t) for t in "abc"],
     "All configs must target the same table but provided configs included a, b, c."),
    ([sw.create_config({"x": REF["a"][-1]}, "a"), sw.create_config({"y": REF["a"][-1]}, "a")],
     "All configs must have exactly the same pattern_structure."),
    ([sw.create_config({"x": REF["a"][-1]}, "a"), sw.create_config({"x": REF["b"]["c"][-1]}, "a")],
     r"multiple dtypes at \('x',\)"),
    ([sw.create_config({"x": REF["a"][-1]}, "a"), sw.create_config({"x": REF["a"][-2:]}, "a")],
     r"incompatible shapes at \('x',\)"),
    ([sw.create_config({"x": REF["b"]["d"][0][-1]}, "a"),
      sw.create_config({"x": REF["b"]["d"][1][-1]}, "a")], "incompatible shapes"),
])
def test_infer_signature_refusals(configs, match):
    step = {"a": np.zeros([], np.float32), "b": {"c": np.zeros([1, 2], np.int32),
                                                 "d": [np.zeros([1, 2]), np.zeros([1, 3])]}}
    with pytest.raises(ValueError, match=match):
        sw.infer_signature(configs, step)


def test_infer_signature_of_different_lengths_without_tensorflow(without_tensorflow):
    configs = [sw.create_config({"x": REF["a"][-3:]}, "t"),
               sw.create_config({"x": REF["a"][-2:]}, "t")]
    signature = sw.infer_signature(configs, STEP)
    assert signature["x"].shape[0] is None  # items of any length


def test_building_configs_loads_no_engine():
    """Configs are built on learners too (PatternDataset): no numba, no TensorFlow."""
    code = ("import sys; from shmreplay import structured_writer as sw; "
            "sw.create_config(sw.create_reference_step(None)[-2:], 't'); "
            "print(sorted({'numba', 'tensorflow'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"

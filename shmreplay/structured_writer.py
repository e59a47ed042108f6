"""Reverb's ``structured_writer`` module: patterns that turn a stream of steps into items.

A *pattern* is a nest whose leaves slice one field of the step stream, counted back
from the newest step (``ref['obs'][-3:]``: the last 3 observations; ``ref['obs'][-2]``:
the one before the newest, without time dimension). A *config* (``create_config``) is a
pattern, the table its items go to, their priority, and the conditions under which it
applies (``Condition``). ``Client.structured_writer(configs)`` returns a
``StructuredWriter``: each ``append`` stores the step once and inserts an item for every
config whose conditions hold. ``shmreplay.tf.PatternDataset`` applies the same configs
to a ``tf.data`` dataset of steps.

    step = {"obs": np.zeros(4, np.float32), "action": 0}
    config = create_config(
        pattern=pattern_from_transform(step, lambda ref: {"obs": ref["obs"][-3:],
                                                          "action": ref["action"][-1]}),
        table="replay",
        conditions=[Condition.step_index() % 2 == 0])
    with client.structured_writer([config]) as writer:
        for t in range(10):
            writer.append({"obs": np.full(4, t, np.float32), "action": t})
        writer.end_episode()
"""

import copy
import sys
from typing import Any, Callable, NewType, Optional, Sequence

import numpy as np
import optree

from shmreplay import specs
from shmreplay._writers import pattern_config as _pattern_config
from shmreplay._writers.pattern_config import PatternNode, Priority, StructuredWriterConfig

Config = StructuredWriterConfig
ConditionProto = _pattern_config.Condition
# Reverb's type names (annotations in its users' code, e.g. Acme's).
Pattern = Any  # a nest of PatternNode
ReferenceStep = NewType("ReferenceStep", Any)
PatternTransform = Callable[[ReferenceStep], Pattern]

__all__ = ["Condition", "ConditionProto", "Config", "Pattern", "PatternNode",
           "PatternTransform", "Priority", "ReferenceStep",
           "StructuredWriter", "constant_priority_fn", "create_config",
           "create_reference_step", "infer_signature", "pattern_from_transform", "td_error",
           "unpack_pattern"]


def __getattr__(name):
    # The writer's module loads the engine (numba); building configs, and PatternDataset,
    # need none of it.
    if name == "StructuredWriter":
        from shmreplay._writers.structured import StructuredWriter
        return StructuredWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _flatten(nest):
    """Leaves and structure as Reverb's (dm-tree's) ``flatten`` sees them: None is a leaf."""
    return optree.tree_flatten(nest, none_is_leaf=True)


class _RefNode:
    """A leaf of a reference step: indexing it makes the ``PatternNode`` of that slice."""

    def __init__(self, index: int):
        self._index = index

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            key = slice(int(key))  # x[-2]: stop=-2, one step without time dimension
        elif not isinstance(key, slice):
            raise ValueError(f"Key must be int or slice by got {key} (type {type(key)}).")
        return PatternNode(flat_source_index=self._index, start=key.start, stop=key.stop,
                           step=key.step)

    def __repr__(self):
        return f"_RefNode({self._index})"


def create_reference_step(step_structure):
    """The structure of the step with each leaf replaced by an object that, indexed,
    gives a pattern leaf: ``ref['a'][-2:]``, ``ref['b']['c'][-1]``.

    Args:
      step_structure: A nest with the structure of the data given to ``append`` (its
        leaves are not read; None leaves count).
    """
    leaves, treedef = _flatten(step_structure)
    return optree.tree_unflatten(treedef, [_RefNode(i) for i in range(len(leaves))])


def pattern_from_transform(step_structure, transform: Callable[[Any], Any]):
    """``transform(create_reference_step(step_structure))``: a pattern built by a
    function from a reference step to the trajectory's structure."""
    return transform(create_reference_step(step_structure))


def constant_priority_fn(value: float) -> Priority:
    """A priority function that always gives ``value``."""
    return Priority(constant_fn=Priority.ConstantPriorityFn(value=float(value)))


def td_error(max_priority_weight: float, step_structure,
             get_field_from_step_fn: Callable[[Any], Any]) -> Priority:
    """The TD error priority (https://openreview.net/pdf?id=r1lyTjAqYX) over one field of
    the step, which the pattern must also take: with ``e`` that field's steps in the
    trajectory, ``w * max|e| + (1 - w) * mean|e|``, ``w = max_priority_weight``.

    Args:
      max_priority_weight: ``w``.
      step_structure: The structure of the step.
      get_field_from_step_fn: Picks the field from a step of that structure.
    """
    leaves, treedef = _flatten(step_structure)
    index = get_field_from_step_fn(optree.tree_unflatten(treedef, list(range(len(leaves)))))
    return Priority(td_error=Priority.TDError(max_priority_weight=float(max_priority_weight),
                                              flat_source_index=index))


def create_config(pattern, table: str, conditions: Sequence[ConditionProto] = (),
                  priority: Optional[Priority] = None) -> Config:
    """A config: ``pattern``'s items go to ``table`` when all ``conditions`` hold.

    Args:
      pattern: A nest of ``PatternNode`` (from a reference step).
      table: The table's name.
      conditions: ``Condition`` s (``Condition.step_index() % 2 == 0``, ...).
      priority: ``constant_priority_fn(1.0)`` unless given.

    Raises:
      TypeError: a leaf of ``pattern`` is not a ``PatternNode``.
    """
    leaves, treedef = _flatten(pattern)
    for leaf in leaves:
        if not isinstance(leaf, PatternNode):
            raise TypeError(
                f"create_config: every leaf of the pattern must be a PatternNode (index a "
                f"reference step: ref['obs'][-2:]), got {type(leaf).__name__}: {leaf!r}.")
    structure = optree.tree_unflatten(treedef, [None] * len(leaves))
    config = Config(flat=[copy.deepcopy(leaf) for leaf in leaves], table=table,
                    priority=priority or constant_priority_fn(1.0),
                    conditions=[copy.deepcopy(c) for c in conditions])
    config.pattern_structure = structure  # (None too: a single leaf, not a flat list)
    return config


def unpack_pattern(config: Config):
    """The config's pattern: its nest of ``PatternNode`` (the flat list if it has no
    structure)."""
    return _pattern_config.unpack(config)


def infer_signature(configs: Sequence[Config], step_spec):
    """The table signature of the items ``configs`` make from steps like ``step_spec``.

    Args:
      configs: All the configs that write to the table.
      step_spec: A nest like the step, of anything with ``shape`` and ``dtype``.

    Returns:
      A nest of ``tf.TensorSpec`` if this process has imported TensorFlow, else of
      ``shmreplay.TensorSpec``. A leaf whose length differs between configs gets the
      length None (a table with that signature takes items of any length there).

    Raises:
      ValueError: no configs, configs of different structures or tables, or leaves of
        different dtypes or of shapes that cannot be concatenated.
    """
    if not configs:
        raise ValueError("At least one config must be provided.")
    structure = _pattern_config.structure_key(configs[0].pattern_structure)
    if any(_pattern_config.structure_key(c.pattern_structure) != structure for c in configs):
        raise ValueError("All configs must have exactly the same pattern_structure.")
    if any(c.table != configs[0].table for c in configs):
        raise ValueError(
            f"All configs must target the same table but provided configs included "
            f"{', '.join(sorted(set(c.table for c in configs)))}.")
    flat_spec = _flatten(step_spec)[0]
    patterns = [unpack_pattern(c) for c in configs]
    leaves, treedef = _flatten(patterns[0])
    paths = [_named_path(patterns[0], path) for path in optree.treespec_paths(treedef)]
    flat_patterns = [_flatten(p)[0] for p in patterns]
    tf = sys.modules.get("tensorflow")
    out = []
    for position, path in enumerate(paths):
        nodes = [flat[position] for flat in flat_patterns]
        dtypes = [specs.to_numpy_dtype(flat_spec[n.flat_source_index].dtype) for n in nodes]
        if any(dtype != dtypes[0] for dtype in dtypes):
            raise ValueError(f"Configs produce trajectories with multiple dtypes at {path}. "
                             f"Got {[d.name for d in dtypes]}.")
        shapes = []
        for node in nodes:
            shape = list(_dims(flat_spec[node.flat_source_index].shape))
            length = _pattern_config.node_length(node)
            shapes.append(shape if length is None else [length] + shape)
        if (any(len(s) != len(shapes[0]) for s in shapes)
                or (len(shapes[0]) > 1 and any(s[1:] != shapes[0][1:] for s in shapes))):
            raise ValueError(f"Configs produce trajectories with incompatible shapes at "
                             f"{path}. Got {shapes}.")
        shape = shapes[0] if all(s == shapes[0] for s in shapes) else [None] + shapes[0][1:]
        name = "/".join(str(p) for p in path)
        if tf is not None and hasattr(tf, "TensorSpec"):
            out.append(tf.TensorSpec(shape, tf.as_dtype(dtypes[0]), name))
        else:
            out.append(specs.TensorSpec(
                specs.to_shape(shape, f"infer_signature, table '{configs[0].table}', leaf "
                                      f"{path}", any_dims=True),
                dtypes[0], name))
    return optree.tree_unflatten(treedef, out)


def _dims(shape):
    as_list = getattr(shape, "as_list", None)  # tf.TensorShape
    return as_list() if as_list is not None else list(shape)


def _named_path(nest, path):
    """``path`` with a namedtuple's fields by name, as Reverb's paths name them."""
    named = []
    for entry in path:
        fields = getattr(type(nest), "_fields", None)
        named.append(fields[entry] if fields is not None and type(entry) is int else entry)
        nest = nest[entry]
    return tuple(named)


class _ConditionBuilder:
    """The left side of a condition; a comparison (``==``, ``!=``, ``>=``, ``>``, ``<=``,
    ``<``, optionally after ``% n``) makes the ``ConditionProto``."""

    def __init__(self, condition: ConditionProto, mod: Optional[int] = None):
        self._condition = condition
        self._mod = mod

    def _with(self, **cmp):
        condition = copy.deepcopy(self._condition)
        for name, value in cmp.items():
            setattr(condition, name, value)
        return condition

    def __mod__(self, mod: int) -> "_ConditionBuilder":
        return _ConditionBuilder(self._condition, int(mod))

    def __eq__(self, value: int) -> ConditionProto:  # type: ignore[override]
        if self._mod is not None:
            return self._with(mod_eq=ConditionProto.ModuloEq(mod=self._mod, eq=int(value)))
        return self._with(eq=int(value))

    def __ne__(self, value: int) -> ConditionProto:  # type: ignore[override]
        condition = self == value
        condition.inverse = True
        return condition

    def __ge__(self, value: int) -> ConditionProto:
        self._no_mod(">=")
        return self._with(ge=int(value))

    def __gt__(self, value: int) -> ConditionProto:
        return self >= int(value) + 1

    def __le__(self, value: int) -> ConditionProto:
        condition = self > value  # not (x >= value + 1)
        condition.inverse = True
        return condition

    def __lt__(self, value: int) -> ConditionProto:
        return self <= int(value) - 1

    def _no_mod(self, op):
        if self._mod is not None:
            raise ValueError(f"Condition: `% {self._mod}` can only be compared with == or !=, "
                             f"not {op}.")

    __hash__ = None


class Condition:
    """The building blocks of conditions: ``Condition.step_index() % 3 == 0``."""

    @staticmethod
    def step_index():
        """The index of the newest step within its episode (0 for the first)."""
        return _ConditionBuilder(ConditionProto(step_index=True))

    @staticmethod
    def steps_since_applied():
        """The number of steps since the config last made an item (counting the newest)."""
        return _ConditionBuilder(ConditionProto(steps_since_applied=True))

    @staticmethod
    def is_end_episode():
        """True only in the check ``end_episode`` makes."""
        return ConditionProto(is_end_episode=True, eq=1)

    @staticmethod
    def data(step_structure):
        """The step's structure, each leaf the left side of a condition on that field's
        newest value (a scalar int or bool: ``Condition.data(spec)['done'] == 1``)."""
        leaves, treedef = _flatten(step_structure)
        return optree.tree_unflatten(
            treedef, [_ConditionBuilder(ConditionProto(flat_source_index=i))
                      for i in range(len(leaves))])

"""The configs of ``StructuredWriter`` and ``PatternDataset``: Reverb's pattern messages
(``PatternNode``, ``Condition``, ``Priority``, ``StructuredWriterConfig``) as small
Python classes with the protobuf behaviour Reverb's users rely on (proto3 defaults,
``oneof`` groups, ``HasField``, ``WhichOneof``, equality, ``CopyFrom``), and their
validation.

Reverb keeps these as protobufs for its C++ core; here nothing crosses a language
boundary, so plain objects do (and pickle, for a writer in a spawned process).
"""

import copy
import math

import optree

_UNSET = object()


class _Message:
    """A proto3-like message: ``_FIELDS`` maps each field to its default (a class for a
    sub-message, a list for a repeated field); ``_ONEOFS`` maps a field to its group.
    Fields of a group (and sub-messages) have presence; setting one clears the others."""

    _FIELDS = {}
    _ONEOFS = {}

    def __init__(self, **fields):
        object.__setattr__(self, "_values", {})
        for name, value in fields.items():
            if value is not None:
                setattr(self, name, value)

    def __getattr__(self, name):
        fields = type(self)._FIELDS
        if name.startswith("_") or name not in fields:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}.")
        values = self.__dict__["_values"]
        if name in values:
            return values[name]
        default = fields[name]
        if default is list:  # a repeated field: an empty list kept, so append() works
            values[name] = []
            return values[name]
        return default() if isinstance(default, type) else default

    def __setattr__(self, name, value):
        fields = type(self)._FIELDS
        if name not in fields:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}.")
        if fields[name] is list:
            value = list(value)
        group = type(self)._ONEOFS.get(name)
        if group is not None:
            for other, other_group in type(self)._ONEOFS.items():
                if other_group == group:
                    self._values.pop(other, None)
        self._values[name] = value

    def HasField(self, name: str) -> bool:  # noqa: N802 (the protobuf name)
        """Whether field ``name`` is set (a oneof's name: whether any of its fields is), as
        a protobuf message's ``HasField``."""
        fields = type(self)._FIELDS
        group = name in type(self)._ONEOFS.values()
        if name not in fields and not group:
            raise ValueError(f"{type(self).__name__} has no field {name!r}.")
        if group:
            return self.WhichOneof(name) is not None
        if name not in type(self)._ONEOFS and not isinstance(fields[name], type):
            raise ValueError(f"Field {name!r} of {type(self).__name__} has no presence "
                             "(a proto3 scalar): read it instead.")
        return name in self._values

    def WhichOneof(self, group: str):  # noqa: N802 (the protobuf name)
        for name, its_group in type(self)._ONEOFS.items():
            if its_group == group and name in self._values:
                return name
        return None

    def CopyFrom(self, other):  # noqa: N802 (the protobuf name)
        if type(other) is not type(self):
            raise TypeError(f"CopyFrom needs a {type(self).__name__}, got {type(other).__name__}.")
        object.__setattr__(self, "_values", copy.deepcopy(other._values))

    def _key(self):
        """What equality compares: present fields, with a plain field at its default
        counting as unset (as in proto3)."""
        fields = type(self)._FIELDS
        key = []
        for name in fields:
            value = self._values.get(name, _UNSET)
            if value is _UNSET or (name not in type(self)._ONEOFS
                                   and not isinstance(fields[name], type)
                                   and value == (fields[name] if fields[name] is not list else [])):
                continue
            key.append((name, value))
        return key

    def __eq__(self, other):
        return type(other) is type(self) and self._key() == other._key()

    def __ne__(self, other):
        return not self == other

    __hash__ = None  # mutable, as protobuf messages are

    def __getstate__(self):
        return self._values

    def __setstate__(self, values):
        object.__setattr__(self, "_values", values)

    def __deepcopy__(self, memo):
        clone = type(self).__new__(type(self))
        object.__setattr__(clone, "_values", copy.deepcopy(self._values, memo))
        return clone

    def __repr__(self):
        inner = ", ".join(f"{name}={value!r}" for name, value in self._key())
        return f"{type(self).__name__}({inner})"


class PatternNode(_Message):
    """One leaf of a pattern: column ``flat_source_index`` of the step, sliced like a
    Python sequence relative to the newest step (``x[-2]``: ``stop=-2``, one step
    without time dimension; ``x[-3:]``: ``start=-3``; ``x[-6::2]``: and ``step=2``)."""

    _FIELDS = {"flat_source_index": 0, "start": 0, "stop": 0, "step": 0}
    _ONEOFS = {"start": "start_or_none", "stop": "stop_or_none", "step": "step_or_none"}


class ModuloEq(_Message):
    _FIELDS = {"mod": 0, "eq": 0}


class Condition(_Message):
    """When a config applies: ``left`` (a number about the step) compared by ``cmp``."""

    ModuloEq = ModuloEq
    _FIELDS = {"step_index": False, "steps_since_applied": False, "buffer_length": False,
               "is_end_episode": False, "flat_source_index": 0,
               "eq": 0, "ge": 0, "mod_eq": ModuloEq, "inverse": False}
    _ONEOFS = {"step_index": "left", "steps_since_applied": "left", "buffer_length": "left",
               "is_end_episode": "left", "flat_source_index": "left",
               "eq": "cmp", "ge": "cmp", "mod_eq": "cmp"}


class ConstantPriorityFn(_Message):
    _FIELDS = {"value": 0.0}


class TDError(_Message):
    _FIELDS = {"max_priority_weight": 0.0, "flat_source_index": 0}


class Priority(_Message):
    """An item's priority: a constant, or the TD error of one of its columns."""

    ConstantPriorityFn = ConstantPriorityFn
    TDError = TDError
    _FIELDS = {"constant_fn": ConstantPriorityFn, "td_error": TDError}
    _ONEOFS = {"constant_fn": "priority_fn", "td_error": "priority_fn"}


class StructuredWriterConfig(_Message):
    """One pattern, the table its items go to, their priority and the conditions under
    which it applies. ``pattern_structure`` is the pattern's nest with None leaves
    (unset: the pattern is the flat list ``flat``)."""

    _FIELDS = {"flat": list, "pattern_structure": _UNSET, "table": "", "priority": Priority,
               "conditions": list}

    def HasField(self, name: str) -> bool:  # noqa: N802 (the protobuf name)
        """Whether field ``name`` is set (``pattern_structure``: whether it was given)."""
        if name == "pattern_structure":
            return name in self._values
        return super().HasField(name)

    def __getattr__(self, name):
        if name == "pattern_structure" and name not in self.__dict__["_values"]:
            return None
        return super().__getattr__(name)

    def _key(self):
        # Structures compare as optree structures: a namedtuple is not a tuple.
        key = super()._key()
        return [(name, structure_key(value) if name == "pattern_structure" else value)
                for name, value in key]


def structure_key(structure):
    return optree.tree_structure(structure, none_is_leaf=True)


def unpack(config: StructuredWriterConfig):
    """The config's pattern: its nest of ``PatternNode`` (the flat list if it has no
    structure)."""
    if not config.HasField("pattern_structure"):
        return list(config.flat)
    return optree.tree_unflatten(structure_key(config.pattern_structure), list(config.flat))


# --- validation (Reverb's rules) ----------------------------------------------------------

def max_age(node: PatternNode) -> int:
    """How many steps back ``node`` reaches."""
    return abs(node.start if node.HasField("start") else node.stop)


def node_length(node: PatternNode):
    """The number of steps ``node`` takes, or None for one step without time dimension."""
    if not node.HasField("start"):
        return None
    return len(range(node.start, node.stop, node.step or 1))


def check_node(node: PatternNode):
    where = f"pattern node {node!r}"
    if not isinstance(node, PatternNode):
        raise TypeError(f"A pattern's leaves must be PatternNode (from create_reference_step "
                        f"or pattern_from_transform), got {type(node).__name__}.")
    has_start, has_stop, has_step = (node.HasField(f) for f in ("start", "stop", "step"))
    if node.flat_source_index < 0:
        raise ValueError(f"{where}: `flat_source_index` must be >= 0 but got "
                         f"{node.flat_source_index}.")
    if not has_start and not has_stop:
        raise ValueError(f"{where}: at least one of `start` and `stop` must be specified.")
    if has_start and node.start >= 0:
        raise ValueError(f"{where}: `start` must be < 0 but got {node.start} (slices count "
                         "back from the newest step: x[-3:]).")
    if has_stop and node.stop > 0:
        raise ValueError(f"{where}: `stop` must be <= 0 but got {node.stop}.")
    if has_start and has_stop and node.start >= node.stop:
        raise ValueError(f"{where}: `stop` ({node.stop}) must be > `start` ({node.start}) "
                         "when both are specified.")
    if has_stop and not has_start and node.stop == 0:
        raise ValueError(f"{where}: `stop` must be < 0 when `start` isn't set but got 0.")
    if has_step and not has_start:
        raise ValueError(f"{where}: `step` must only be set when `start` is set.")
    if has_step and node.step <= 0:
        raise ValueError(f"{where}: `step` must be > 0 but got {node.step}.")


def check_condition(condition: Condition):
    if not isinstance(condition, Condition):
        raise TypeError(f"conditions must be Condition messages (from Condition.step_index() "
                        f"and the like), got {type(condition).__name__}.")
    left, cmp = condition.WhichOneof("left"), condition.WhichOneof("cmp")
    if left is None:
        raise ValueError(f"{condition!r}: conditions must specify a value for `left`.")
    if left == "flat_source_index" and condition.flat_source_index < 0:
        raise ValueError(f"{condition!r}: flat_source_index must be >= 0 but got "
                         f"{condition.flat_source_index}.")
    if cmp is None:
        raise ValueError(f"{condition!r}: conditions must specify a value for `cmp`.")
    if cmp == "mod_eq":
        if condition.mod_eq.mod <= 0:
            raise ValueError(f"{condition!r}: `mod_eq.mod` must be > 0 but got "
                             f"{condition.mod_eq.mod}.")
        if condition.mod_eq.eq < 0:
            raise ValueError(f"{condition!r}: `mod_eq.eq` must be >= 0 but got "
                             f"{condition.mod_eq.eq}.")
    if left == "is_end_episode" and (cmp != "eq" or condition.eq != 1 or condition.inverse):
        raise ValueError(f"{condition!r}: condition must use `eq=1` when using "
                         "`is_end_episode`.")


def check_priority(priority: Priority):
    kind = priority.WhichOneof("priority_fn")
    if kind is None:
        raise ValueError("the config's priority function is undefined (use "
                         "constant_priority_fn or td_error).")
    if kind == "constant_fn":
        value = priority.constant_fn.value
        if not math.isfinite(value) or value < 0:
            from shmreplay import errors
            raise errors.InvalidPriorityError(
                f"constant priority must be finite and >= 0, got {value!r}.")
    elif priority.td_error.flat_source_index < 0:
        raise ValueError(f"td_error.flat_source_index must be >= 0, got "
                         f"{priority.td_error.flat_source_index}.")


def prepared(configs, *, buffer_condition_for=None):
    """Validated copies of ``configs``, each with a ``buffer_length`` condition that holds
    its trajectories back until the buffer has the steps they reach (added unless one is
    there, as Reverb's client does).

    ``buffer_condition_for(position, own_age)`` gives the length a config's added
    condition asks for (default: its own reach).

    Raises:
      ValueError: no configs, or one is invalid (its position is named).
      TypeError: an element is not a config.
    """
    configs = list(configs)
    if not configs:
        raise ValueError("At least one config must be provided.")
    out = []
    for position, config in enumerate(configs):
        if not isinstance(config, StructuredWriterConfig):
            raise TypeError(f"configs[{position}] must be a structured_writer.Config (from "
                            f"create_config), got {type(config).__name__}.")
        config = copy.deepcopy(config)
        try:
            if not config.flat:
                raise ValueError("`flat` must not be empty.")
            if not config.table:
                raise ValueError("`table` must not be empty.")
            for node in config.flat:
                check_node(node)
            for condition in config.conditions:
                check_condition(condition)
            check_priority(config.priority)
        except ValueError as e:
            raise type(e)(f"Invalid configuration at position {position}: {e}") from None
        age = max(max_age(node) for node in config.flat)
        need = age if buffer_condition_for is None else buffer_condition_for(position, age)
        if not any(c.WhichOneof("left") == "buffer_length" and c.WhichOneof("cmp") == "ge"
                   and c.ge >= need for c in config.conditions):
            config.conditions.append(Condition(buffer_length=True, ge=need))
        out.append(config)
    return out


def history_lengths(configs):
    """Per flat column, how many of the newest steps any config can read (0: unused)."""
    lengths = {}
    for config in configs:
        for node in config.flat:
            index = node.flat_source_index
            lengths[index] = max(lengths.get(index, 0), max_age(node))
        for condition in config.conditions:
            if condition.WhichOneof("left") == "flat_source_index":
                index = condition.flat_source_index
                lengths[index] = max(lengths.get(index, 0), 1)
    size = max(lengths) + 1 if lengths else 0
    return [lengths.get(i, 0) for i in range(size)]

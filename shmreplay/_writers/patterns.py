"""Applying patterns to a stream of steps: what ``StructuredWriter`` and ``PatternDataset``
share (Reverb's ``StructuredWriter`` logic, in one place).

``Patterns`` keeps, for each flat column a config reads, the newest steps it can reach
(``history_lengths``), as opaque *cells* (the writer's step references, the dataset's
arrays; None where a step has no value for the column). After each append it checks
every config's conditions against the newest step and returns the trajectories to make:
per pattern leaf, the cells it takes and whether it is squeezed.

Reverb's rules, kept exactly:

* A config applies at most once per step (a step appended in parts is checked after
  each part), and only when all its conditions hold and none of the cells it takes is
  missing (then it simply does not apply at that step).
* ``steps_since_applied`` counts the steps a config was checked at since it last applied
  (it is not reset by ``end_episode``); ``step_index`` is the step's index in its
  episode; ``buffer_length`` the number of steps the buffers hold (at most the longest
  reach); ``is_end_episode`` holds only in the check ``end_episode`` makes.
* A step with no value in any read column is not checked at all.
* A data condition reads the column's value at the newest step (False if it has none).
"""

import collections

import numpy as np

from shmreplay import errors
from shmreplay._writers.pattern_config import history_lengths

_INTEGER_KINDS = "biu"
_TD_DTYPES = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int32),
              np.dtype(np.int64))


class _State:
    """A config, read once into plain tuples (``append`` runs at every step), and when
    it last applied."""

    __slots__ = ("config", "nodes", "conditions", "td", "constant", "steps_since_applied",
                 "last_applied", "last_checked")

    def __init__(self, config):
        self.config = config
        # Per pattern leaf: (column, first, stop, stride, squeeze), first and stop counted
        # from the end of the column's buffer.
        self.nodes = []
        for node in config.flat:
            if node.HasField("start"):
                self.nodes.append((node.flat_source_index, node.start, node.stop,
                                   node.step or 1, False))
            else:  # x[-2]: one step, no time dimension
                self.nodes.append((node.flat_source_index, node.stop, node.stop + 1, 1, True))
        self.conditions = [
            (c.WhichOneof("left"), c.flat_source_index, c.WhichOneof("cmp"),
             c.mod_eq.mod if c.WhichOneof("cmp") == "mod_eq" else getattr(c, c.WhichOneof("cmp")),
             c.mod_eq.eq, c.inverse)
            for c in config.conditions]
        priority = config.priority
        self.td = None
        if priority.WhichOneof("priority_fn") == "td_error":
            self.td = (priority.td_error.flat_source_index, priority.td_error.max_priority_weight)
        self.constant = priority.constant_fn.value
        self.steps_since_applied = 0
        self.last_applied = None    # (episode, step) it last applied at
        self.last_checked = None    # (episode, step) it was last checked at


class Patterns:
    """The state of applying ``configs`` (validated, see ``pattern_config.prepared``).

    Args:
      configs: The configs.
      value_of: Gives a cell's value as a numpy array (for data conditions and TD errors).
    """

    def __init__(self, configs, value_of):
        self.configs = configs
        self.history = history_lengths(configs)
        self.used = [i for i, length in enumerate(self.history) if length]
        self._value_of = value_of
        self._columns = [collections.deque() for _ in self.history]
        self._states = [_State(config) for config in configs]
        self._step_open = False
        self._episode = 0
        self._episode_steps = 0     # completed steps of this episode
        self._newest = None         # (episode, step) of the newest row
        self._data_columns = {c.flat_source_index for config in configs
                              for c in config.conditions
                              if c.WhichOneof("left") == "flat_source_index"}
        self._td_columns = {config.priority.td_error.flat_source_index for config in configs
                            if config.priority.WhichOneof("priority_fn") == "td_error"}

    @property
    def step_is_open(self) -> bool:
        return self._step_open

    def check_values(self, values, describe):
        """Raises SchemaError unless each of ``values`` ({column: array}) can be read as
        the configs read it: a data condition's column as one integer or bool, a TD
        error's as one finite float or int (InvalidPriorityError if not finite).
        ``describe(column)`` names a column in messages. Called before anything changes."""
        for index in self._data_columns.intersection(values):
            value = values[index]
            if value.size != 1 or value.dtype.kind not in _INTEGER_KINDS:
                raise errors.SchemaError(
                    f"A config has a data condition on {describe(index)}, which needs one "
                    f"integer or bool per step; got {value.dtype.name} of shape "
                    f"{list(value.shape)}. Condition on a scalar int or bool field.")
        for index in self._td_columns.intersection(values):
            value = values[index]
            if value.size != 1 or value.dtype not in _TD_DTYPES:
                raise errors.SchemaError(
                    f"A config's td_error priority reads {describe(index)}, which needs one "
                    f"float64, float32, int32 or int64 per step; got {value.dtype.name} of "
                    f"shape {list(value.shape)}.")
            if not np.isfinite(value).all():
                raise errors.InvalidPriorityError(
                    f"A config's td_error priority reads {describe(index)}, whose value "
                    f"{value.reshape(-1)[0]!r} is not finite.")

    def append(self, cells, finalize: bool):
        """Adds ``cells`` ({column: cell}) to the newest step (a new one unless the last
        append left it open) and returns the trajectories the configs make now."""
        opening = not self._step_open
        for index, (column, length) in enumerate(zip(self._columns, self.history)):
            cell = cells.get(index)
            if opening:
                column.append(cell)
                if len(column) > length:
                    column.popleft()
            elif cell is not None:
                if column and column[-1] is not None:
                    raise ValueError(
                        f"A value for column {index} was provided by multiple append calls "
                        "in the same step.")
                column[-1] = cell
        if opening:
            self._newest = (self._episode, self._episode_steps)
        if finalize:
            self._episode_steps += 1
        self._step_open = not finalize
        return self._apply(is_end_of_episode=False)

    def end_episode(self, clear_buffers: bool):
        """The trajectories the configs make at the episode's end; then starts the next
        episode (forgetting the steps if ``clear_buffers``)."""
        made = self._apply(is_end_of_episode=True)
        if clear_buffers:
            for column in self._columns:
                column.clear()
        self._step_open = False
        self._episode += 1
        self._episode_steps = 0
        return made

    def _apply(self, is_end_of_episode: bool):
        columns = self._columns
        if not any(column and column[-1] is not None for column in columns):
            return []
        current = self._newest
        made = []
        for state in self._states:
            if state.last_applied == current:
                continue
            if state.last_checked != current:
                state.steps_since_applied += 1
                state.last_checked = current
            if not all(self._holds(condition, current, state, is_end_of_episode)
                       for condition in state.conditions):
                continue
            trajectory = self._trajectory(state)
            if trajectory is None:
                continue
            made.append((state.config, trajectory[0], trajectory[1]))
            state.last_applied = current
            state.steps_since_applied = 0
        return made

    def _holds(self, condition, current, state, is_end_of_episode) -> bool:
        left, index, cmp, operand, mod_eq, inverse = condition
        if left == "step_index":
            value = current[1]
        elif left == "steps_since_applied":
            value = state.steps_since_applied
        elif left == "buffer_length":
            value = max(len(column) for column in self._columns)
        elif left == "is_end_episode":
            value = int(is_end_of_episode)
        else:
            column = self._columns[index]
            if not column or column[-1] is None:
                return False  # not given (yet) in this step
            value = int(self._value_of(column[-1]).reshape(-1)[0])
        if cmp == "eq":
            result = value == operand
        elif cmp == "ge":
            result = value >= operand
        else:
            result = value % operand == mod_eq
        return result != inverse

    def _trajectory(self, state):
        """``([(cells, squeeze) per pattern leaf], priority)``, or None if a cell the
        pattern takes is missing."""
        leaves = []
        td = state.td
        priority = state.constant if td is None else 0.0  # (Reverb's 0: no leaf reads it)
        columns = self._columns
        for index, first, stop, stride, squeeze in state.nodes:
            column = columns[index]
            length = len(column)
            if length + first < 0:
                return None
            if squeeze:
                cells = [column[first]]
            else:
                cells = [column[i] for i in range(length + first, length + stop, stride)]
            for cell in cells:
                if cell is None:
                    return None
            leaves.append((cells, squeeze))
            if td is not None and td[0] == index:
                priority = self._td_error(cells, td[1])
        return leaves, priority

    def _td_error(self, cells, weight: float) -> float:
        """Reverb's TD error priority: ``weight * max|e| + (1 - weight) * mean|e|``."""
        errors_ = [abs(float(self._value_of(cell).reshape(-1)[0])) for cell in cells]
        return weight * max(errors_) + (1 - weight) * (sum(errors_) / len(errors_))

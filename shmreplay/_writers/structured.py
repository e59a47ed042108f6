"""``StructuredWriter``: a ``TrajectoryWriter`` driven by configs (see
``shmreplay.structured_writer`` for the patterns and conditions, ``patterns`` for when
a config applies).

Each ``append`` hands the fields some config reads to a ``TrajectoryWriter`` (keys: the
fields' flat indices), which keeps each step once; ``patterns.Patterns`` then says which
items to make, from those steps' references, and the ``TrajectoryWriter`` inserts them
(an item the rate limiter refuses waits in the writer until ``flush``).
"""

from typing import Optional

import numpy as np
import optree

from shmreplay import errors, specs
from shmreplay._writers import pattern_config as _pattern_config
from shmreplay._writers.history import TrajectoryColumn, _named_path
from shmreplay._writers.patterns import Patterns
from shmreplay._writers.trajectory_shortcuts import PY_DTYPES
from shmreplay._writers.writing import NUMPY_SCALARS


class StructuredWriter:
    """Appends steps and inserts the items its configs make (Reverb's ``StructuredWriter``).

    Create it with ``Client.structured_writer(configs)``. Not thread-safe: one writer per
    thread.

    Raises (at creation):
      ValueError: no configs, or an invalid one (its position is named).
      SchemaError: configs that send items of different structures or lengths to one
        table (each table holds items of one shape).
      InvalidPriorityError: a negative or non-finite constant priority.
    """

    def __init__(self, client, configs):
        self._configs = _pattern_config.prepared(configs)
        _check_one_shape_per_table(self._configs)
        self._patterns = Patterns(self._configs, lambda ref: ref.value)
        keep = max(self._patterns.history)  # the longest reach: Reverb's num_keep_alive_refs
        self._writer = client.trajectory_writer(num_keep_alive_refs=keep)
        self._structures = {id(c): optree.tree_structure(_pattern_config.unpack(c),
                                                         none_is_leaf=True)
                            for c in self._configs}
        self._num_leaves = None
        self._paths = None           # per flat leaf, its path (namedtuple fields by name)
        self._firsts = {}            # column -> (dtype, shape) of its first value
        self._given = set()          # columns given in the open step
        self._tables = set()         # tables resolved (so an unknown one fails before items)

    @property
    def step_is_open(self) -> bool:
        """True if the last ``append`` had ``partial_step=True``."""
        return self._patterns.step_is_open

    @property
    def num_keep_alive_refs(self) -> int:
        """Steps kept per field: the longest reach of any config (as Reverb sizes it)."""
        return max(self._patterns.history)

    def append(self, data, *, partial_step: bool = False):
        """Appends a step (or part of it) and inserts the items the configs make now.

        Args:
          data: A nest with the same structure (and number of leaves) at every step;
            None leaves are fields not given in this call.
          partial_step: Keep the step open: the next ``append`` gives more of its fields
            (a field must not be given twice in one step).

        Raises:
          ValueError: the data has another number of leaves than the first step's, a
            field is given twice in one step, or a config reads a leaf the data lacks.
          SchemaError: a field's dtype or shape differs from its first value, or a
            data condition's (TD error's) field is not one integer (number). Nothing was
            appended.
          TableNotFoundError: an item's table does not exist (the step was appended).
        """
        leaves, treedef = optree.tree_flatten(data, none_is_leaf=True)
        if self._num_leaves is None:
            self._first_structure(data, leaves, treedef)
        elif len(leaves) != self._num_leaves:
            raise ValueError(f"Flattened data has an unexpected length, got {len(leaves)} "
                             f"but wanted {self._num_leaves}.")
        values = {}
        for index in self._patterns.used:
            leaf = leaves[index]
            if leaf is None:
                continue
            if index in self._given:
                raise ValueError(
                    f"Field {index} (path={self._paths[index]}) has already been set in "
                    "the active step by a previous (partial) append call and must be None "
                    "now.")
            values[index] = self._checked(index, leaf)
        self._patterns.check_values(values, self._describe)
        for index, value in values.items():
            self._firsts.setdefault(index, (value.dtype, value.shape))
        self._writer.append(values, partial_step=partial_step)
        self._given = set(values).union(self._given) if partial_step else set()
        columns = self._writer._columns  # the references of the step just appended
        refs = {index: columns[(index,)].refs[-1] for index in values}
        self._insert(self._patterns.append(refs, finalize=not partial_step))

    def _first_structure(self, data, leaves, treedef):
        reach = len(self._patterns.history)
        if reach > len(leaves):
            raise ValueError(
                f"The configs read leaf {reach - 1} of the step, but the data has "
                f"{len(leaves)} leaves; build the patterns from a reference step of this "
                "structure (create_reference_step).")
        self._num_leaves = len(leaves)
        self._paths = [_named_path(data, tuple(p)) for p in optree.treespec_paths(treedef)]

    def _describe(self, index) -> str:
        return f"column {index} (path={self._paths[index]})"

    def _checked(self, index, leaf):
        """The leaf as an array (Python scalars as int64, float64, bool), checked against
        its field's first value with Reverb's messages."""
        kind = type(leaf)
        if kind in PY_DTYPES:
            value = np.asarray(leaf, PY_DTYPES[kind])
        elif kind is np.ndarray or kind in NUMPY_SCALARS:
            value = leaf
        else:
            value = np.asarray(leaf)
        value = specs.step_value(value, self._describe(index))
        first = self._firsts.get(index)
        if first is not None:
            if value.dtype != first[0]:
                raise errors.SchemaError(
                    f"Tensor of wrong dtype provided for {self._describe(index)}. Got "
                    f"{specs.tf_dtype_name(value.dtype)} but expected "
                    f"{specs.tf_dtype_name(first[0])}.")
            if value.shape != first[1]:
                raise errors.SchemaError(
                    f"Tensor of incompatible shape provided for {self._describe(index)}. Got "
                    f"{specs.tf_shape_str(value.shape)} which is incompatible with "
                    f"{specs.tf_shape_str(first[1])}.")
        return value

    def _insert(self, made):
        """Creates the items ``made`` (config, [(refs, squeeze)], priority) after checking
        them all: an unknown table or an item across an episode boundary creates none."""
        if not made:
            return
        for config, leaves, _ in made:
            if config.table not in self._tables:
                self._writer._rows(config.table)  # TableNotFoundError for an unknown table
                self._tables.add(config.table)
            episodes = {ref.episode for refs, _ in leaves for ref in refs}
            if len(episodes) > 1:
                raise ValueError(
                    f"A config for table '{config.table}' would make an item across an "
                    "episode boundary (end_episode(clear_buffers=False) kept the old steps); "
                    "items never span episodes here. Use clear_buffers=True, or conditions "
                    "such as Condition.step_index() >= n that wait for enough new steps.")
        for config, leaves, priority in made:
            columns = [TrajectoryColumn._trusted(refs, squeeze, None) for refs, squeeze in leaves]
            trajectory = optree.tree_unflatten(self._structures[id(config)], columns)
            self._writer.create_item(config.table, priority, trajectory)

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None):
        """Blocks until at most ``block_until_num_items`` items wait for their table's
        rate limiter.

        Raises:
          ValueError: ``block_until_num_items < 0``.
          DeadlineExceededError: ``timeout_ms`` passed first (the items keep waiting).
        """
        self._writer.flush(block_until_num_items, timeout_ms)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None):
        """Applies the configs conditioned on the episode's end, flushes, and starts a new
        episode (``step_index`` back to 0).

        Args:
          clear_buffers: Forget the episode's steps (keep them only for configs whose
            conditions wait for enough steps of the next episode).
          timeout_ms: Bounds the flush; on DeadlineExceededError the episode still ends.
        """
        self._writer._check_open()
        try:
            self._insert(self._patterns.end_episode(clear_buffers))
        finally:
            self._given = set()
            self._writer.end_episode(clear_buffers, timeout_ms)

    @property
    def num_pending_items(self) -> int:
        """Items created but not yet admitted by their table's rate limiter."""
        return self._writer.num_pending_items

    def close(self):
        """Closes the writer; items still waiting are dropped (``flush`` first to keep
        them). Closing twice is allowed."""
        self._writer.close()

    def __enter__(self):
        self._writer.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        return self._writer.__exit__(exc_type, exc, tb)


def _check_one_shape_per_table(configs):
    """Each table holds items of one structure, and each column either has a time
    dimension in every item (of any length: ``docs/writers.md``) or in none, so configs
    that would send it others are refused now, not at their first item."""
    seen = {}
    for position, config in enumerate(configs):
        pattern = _pattern_config.unpack(config)
        shape = (optree.tree_structure(pattern, none_is_leaf=True),
                 [_pattern_config.node_length(node) is None for node in config.flat])
        first = seen.setdefault(config.table, (position, shape))
        if first[1] == shape:
            continue
        if first[1][0] != shape[0]:
            what = "of different structures"
        else:
            what = ("whose columns have a time dimension in one and none in the other "
                    f"(True: one step without it: {first[1][1]} and {shape[1]})")
        raise errors.SchemaError(
            f"configs[{first[0]}] and configs[{position}] send items {what} to table "
            f"'{config.table}'. A table holds items of one structure and column form; "
            "send each to a table of its own.")


"""A ``TrajectoryWriter``'s history: per field, the references to its recent steps,
and the nest ``history`` returns them in.

``TrajectoryColumn`` (Reverb's name: an item's column of step references) is what
indexing a field's history gives. A field's history keeps the last steps it may still
be referenced at; the structure of ``history`` grows with the fields appended (and keeps
fields given only as None, as Reverb does).
"""

import collections
import itertools

import numpy as np

from shmreplay import errors, specs



class TrajectoryColumn:
    """A column of an item: references to one field at several steps.

    Args:
      data_references: The references, e.g. taken from ``TrajectoryWriter.history``.
      squeeze: If True the column is a single step without a time dimension (needs
        exactly one reference).
      path: The column's path, for error messages.

    Raises:
      ValueError: if a reference is None (the step has no value for the field, or it is
        older than ``num_keep_alive_refs``), or ``squeeze`` is set with != 1 reference.
    """

    # ``_window``: the refs are consecutive steps of one field's history, oldest first
    # (``history[field][-n:]``, or one step ``[-k]``), so ``create_item`` checks only
    # their ends.
    __slots__ = ("_refs", "_squeeze", "_path", "_window")

    def __init__(self, data_references, *, squeeze: bool = False, path=None):
        refs = data_references if type(data_references) is list else list(data_references)
        if None in refs:
            raise ValueError(
                f"TrajectoryColumn{f' {path}' if path is not None else ''} cannot contain any "
                "None data references (a step without this field, or one older than "
                "num_keep_alive_refs).")
        if squeeze and len(refs) != 1:
            raise ValueError(
                f"TrajectoryColumn{f' {path}' if path is not None else ''}: squeeze needs "
                f"exactly one data reference, got {len(refs)}.")
        self._refs = refs
        self._squeeze = squeeze
        self._path = path
        self._window = False

    @classmethod
    def _trusted(cls, refs, squeeze, path, window=False):
        """A column over ``refs`` that the caller checked (no None; one ref if squeezed)."""
        column = cls.__new__(cls)
        column._refs = refs
        column._squeeze = squeeze
        column._path = path
        column._window = window
        return column

    @property
    def is_squeezed(self) -> bool:
        """Whether the column has no time dimension (one step, taken as
        ``history[path][-1]``)."""
        return self._squeeze

    def __len__(self):
        return len(self._refs)

    def __iter__(self):
        return iter(self._refs)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return TrajectoryColumn([self._refs[index]], squeeze=True, path=self._path)
        if isinstance(index, slice):
            return TrajectoryColumn(self._refs[index], path=self._path)
        if isinstance(index, (list, tuple, np.ndarray)):
            return TrajectoryColumn([self._refs[i] for i in index], path=self._path)
        raise TypeError(f"TrajectoryColumn indices must be int, slice or list, not {index!r}.")

    @property
    def shape(self):
        """The column's shape: ``(steps, *step_shape)``, or the step's shape if squeezed."""
        if not self._refs:
            return (0,)
        step = self._refs[0].shape
        return step if self._squeeze else (len(self._refs),) + step

    @property
    def dtype(self):
        """The dtype of the referenced steps (None for an empty column)."""
        return self._refs[0].dtype if self._refs else None

    def numpy(self) -> np.ndarray:
        """The referenced values, stacked along a time dimension (unless squeezed).

        Raises:
          RuntimeError: if a reference expired (fell out of ``num_keep_alive_refs``).
        """
        values = []
        for ref in self._refs:
            if ref.expired:
                break
            values.append(ref.value)
        else:
            if self._squeeze:
                return np.array(values[0])  # a copy, as an array
            if self._window and values[0].dtype.kind in "biufc":
                # One field's numbers (one dtype and shape): np.array stacks them in a
                # fraction of np.stack's time (its per-array checks and concatenate).
                return np.array(values, dtype=values[0].dtype)
            return np.stack(values)
        raise RuntimeError(
            f"TrajectoryColumn{f' {self._path}' if self._path is not None else ''}: a "
            "data reference expired (older than num_keep_alive_refs).")

    def __repr__(self):
        return f"TrajectoryColumn(len={len(self)}, squeeze={self._squeeze}, path={self._path})"




_new_column = object.__new__


def check_value(path, value, first):
        """``value`` as the column stores it (``specs.step_value``); SchemaError unless
        it can be stored there."""
        value = specs.step_value(value, f"Column {path}")
        if first is not None:
            if value.dtype != first.dtype:
                raise errors.SchemaError(
                    f"Tensor of wrong dtype provided for column {path}. Got "
                    f"{specs.tf_dtype_name(value.dtype)} but expected "
                    f"{specs.tf_dtype_name(first.dtype)}.")
            if value.shape != first.shape:
                raise errors.SchemaError(
                    f"Tensor of incompatible shape provided for column {path}. Got "
                    f"{specs.tf_shape_str(value.shape)} which is incompatible with "
                    f"{specs.tf_shape_str(first.shape)}.")
        return value


class _ColumnHistory:
    """One field's references over the current episode, indexed by step in the episode.

    The last ``span`` steps are kept (the writer's largest ``num_keep_alive_refs``
    when the column was created, or the field's own if larger); older positions read
    as None. A reference expires after ``keep`` newer values of its field (its own
    ``num_keep_alive_refs``).
    """

    def __init__(self, path, keep: int, length: int = 0, span: int = 0):
        self.path = path
        self.named = path        # the path with namedtuple fields by name (``configure``)
        self.keep = keep
        self.span = max(keep, span)
        self.start = length      # episode position of refs[0]
        self.refs = collections.deque()
        # The field's last ``keep`` values (no None). As in Reverb, a reference expires
        # when ``keep`` newer values of its field came, not ``keep`` steps: a field that
        # skips steps keeps its values longer than ``history`` shows them.
        self.values = collections.deque()

    def __len__(self):
        return self.start + len(self.refs)

    def extend_to(self, length: int):
        """Pads with None up to ``length`` steps (the field was absent from those steps)."""
        while len(self) < length:
            self.push(None)

    def push(self, ref):
        """Adds the next step's position: ``ref``, or None if the step lacks the field."""
        self.refs.append(ref)
        if len(self.refs) > self.span:
            self.refs.popleft()
            self.start += 1
        if ref is not None:
            self.keep_alive(ref)

    def keep_alive(self, ref):
        """Counts ``ref`` as the field's newest value; the oldest beyond ``keep`` expires."""
        values = self.values
        values.append(ref)
        if len(values) > self.keep:
            self.expire(values.popleft())

    def expire(self, ref):
        """Marks ``ref`` expired. If history still shows it (a field kept for fewer steps
        than the writer's largest keep), its place there gets a copy without the data,
        so history holds no more than ``keep`` values of the field (items and columns
        made before keep the original)."""
        ref.expired = True
        if self.span > self.keep:
            refs = self.refs
            # Newest first: the field's (keep + 1)-th newest value is near that end.
            for position in range(len(refs) - 1, -1, -1):
                if refs[position] is ref:
                    refs[position] = ref.without_data()
                    break

    def ref_at(self, position: int):
        """The reference at ``position`` (negative: from the end), or None if the field
        has no value there: the step lacks it, is no longer kept, or (as in Reverb)
        comes before the first step.

        Raises:
          IndexError: ``position`` is at or past the end.
        """
        length = len(self)
        if position < 0:
            position += length
        if position >= length:
            raise IndexError(f"history {self.path}: index {position} out of range for "
                             f"{length} steps.")
        if position < self.start:
            return None
        return self.refs[position - self.start]

    def __getitem__(self, index):
        if type(index) is int:
            refs = self.refs
            if index >= 0:  # a step by its position in the episode (Acme's n-step adder)
                index -= self.start + len(refs)
                if index >= 0:
                    raise IndexError(f"history {self.path}: index {index + len(self)} out of "
                                     f"range for {len(self)} steps.")
            if -len(refs) <= index < 0:
                # ``[-k]``, a recent step (Acme's transition adders): as ``ref_at`` reads
                # it; a single step counts as a window (``TrajectoryColumn._window``).
                ref = refs[index]
                if ref is not None:
                    column = _new_column(TrajectoryColumn)
                    column._refs = [ref]
                    column._squeeze = True
                    column._path = self.path
                    column._window = True
                    return column
        if type(index) is slice:
            first = index.start
            refs = self.refs
            if (type(first) is int and index.stop is None and index.step is None
                    and -len(refs) <= first < 0):
                # ``[-n:]``, the usual recent window: straight from the kept refs.
                kept = len(refs)
                window = (list(refs) if first == -kept
                          else list(itertools.islice(refs, kept + first, None)))
                if None not in window:
                    column = _new_column(TrajectoryColumn)
                    column._refs = window
                    column._squeeze = False
                    column._path = self.path
                    column._window = True
                    return column
            start = self.start
            length = start + len(self.refs)
            first, stop, stride = index.indices(length)
            if stride > 0 and index.start is not None and index.start < -length:
                # As in Reverb, a window reaching back before the first step is not cut
                # short: it reads None there (so ``[-5:]`` over 3 steps raises).
                first = index.start + length
            if stride == 1 and first >= start:  # the usual recent window
                refs = list(itertools.islice(self.refs, first - start, max(first, stop) - start))
                if refs and None not in refs:  # consecutive steps of this field
                    return TrajectoryColumn._trusted(refs, False, self.path, window=True)
            else:
                refs = [None if i < 0 else self.ref_at(i) for i in range(first, stop, stride)]
            return TrajectoryColumn(refs, path=self.path)
        if isinstance(index, (int, np.integer)):
            return TrajectoryColumn([self.ref_at(int(index))], squeeze=True, path=self.path)
        if isinstance(index, (list, tuple, np.ndarray)):
            return TrajectoryColumn([self.ref_at(int(i)) for i in index], path=self.path)
        raise TypeError(f"history indices must be int, slice or list, not {index!r}.")

    def set_keep(self, keep: int, span: int):
        """Keeps the last ``keep`` values (older ones expire) and ``max(keep, span)``
        steps from now on."""
        self.keep = keep
        self.span = max(keep, span)
        while len(self.refs) > self.span:
            self.refs.popleft()
            self.start += 1
        while len(self.values) > keep:
            self.expire(self.values.popleft())

    def emptied(self) -> "_ColumnHistory":
        """A history of the same field and keep, with no steps."""
        column = _ColumnHistory(self.path, self.keep, 0, self.span)
        column.named = self.named
        return column

    def expire_all(self):
        for ref in self.values:
            ref.expired = True

    def __repr__(self):
        return f"ColumnHistory(path={self.path}, steps={len(self)})"


def _named_path(data, path):
    """``path`` (optree's: a namedtuple's fields by position) with a namedtuple's fields
    by name, as Reverb's (dm-tree's) paths name them: what ``configure`` may be given."""
    named = []
    node = data
    try:
        for entry in path:
            fields = getattr(type(node), "_fields", None)
            named.append(fields[entry] if fields is not None and type(entry) is int else entry)
            node = node[entry]
    except (LookupError, TypeError):  # a container that is not indexed by its path
        return tuple(path)
    return tuple(named)


# --- the structure of `history` --------------------------------------------------------

def _merge_structure(old, data):
    """A skeleton of every field seen: dicts/lists/tuples of ... ``True`` at leaves
    (``_ABSENT`` at fields given only as None so far)."""
    if data is None:
        return _ABSENT if old is None else old
    if isinstance(data, dict):
        merged = dict(old) if isinstance(old, dict) else {}
        for key, value in data.items():
            merged[key] = _merge_structure(merged.get(key), value)
        return {k: v for k, v in merged.items() if v is not None}
    if isinstance(data, (list, tuple)):
        old_items = list(old[1]) if isinstance(old, _Seq) else []
        items = []
        for i in range(max(len(old_items), len(data))):
            previous = old_items[i] if i < len(old_items) else None
            items.append(_merge_structure(previous, data[i]) if i < len(data) else previous)
        kind = type(data) if not isinstance(old, _Seq) else old[0]
        return _Seq(kind, items)
    return True


class _Seq(tuple):
    """(sequence type, [children]) in a structure skeleton."""

    def __new__(cls, kind, items):
        return super().__new__(cls, (kind, items))


_ABSENT = object()


class _AbsentColumn(_ColumnHistory):
    """A field appended only as None so far: as long as every other field's history,
    None at every step (as in Reverb, where such a field has a column of None)."""

    def __init__(self, path, writer):
        self._writer = writer
        super().__init__(path, keep=1)

    @property
    def start(self):  # every position reads None
        return self._writer._history_steps

    @start.setter
    def start(self, value):
        pass


def _build_history(node, path, columns, absent):
    if node is True or node is _ABSENT:
        column = columns.get(path)
        return absent(path) if column is None else column
    if isinstance(node, dict):
        return {key: _build_history(child, path + (key,), columns, absent)
                for key, child in sorted(node.items(), key=lambda kv: repr(kv[0]))}
    if isinstance(node, _Seq):
        kind, items = node
        built = [None if child is None else _build_history(child, path + (i,), columns, absent)
                 for i, child in enumerate(items)]
        if kind is list:
            return built
        if hasattr(kind, "_fields"):  # namedtuple
            return kind(*built)
        return tuple(built)
    return None

"""``RemoteColumn``: what a remote writer's history gives, and its items are made of;
``history_of``: the remote writer's ``history``, fields of ``_ColumnHistory``."""

import numpy as np

from shmreplay._writers.history import _build_history, _merge_structure


class RemoteColumn:
    """An item's column: one field of the writer's history at some steps of the episode."""

    __slots__ = ("keys", "steps", "squeeze")

    def __init__(self, keys, steps, squeeze):
        self.keys = keys
        self.steps = steps
        self.squeeze = squeeze

    def __len__(self):
        return len(self.steps)

    def __getstate__(self):
        return self.keys, self.steps, self.squeeze

    def __setstate__(self, state):
        self.keys, self.steps, self.squeeze = state

    def __repr__(self):
        return f"RemoteColumn({self.keys}, steps={self.steps}, squeeze={self.squeeze})"


class _ColumnHistory:
    """``writer.history[...]`` for one field: indexing gives a ``RemoteColumn``."""

    def __init__(self, writer, keys):
        self._writer = writer
        self._keys = keys

    def _step(self, index, length, oldest):
        step = int(index) + length if index < 0 else int(index)
        if step >= length or step < 0:
            raise IndexError(f"history {self._keys}: index {index} out of range for "
                             f"{length} steps.")
        if step < oldest:
            raise ValueError(f"history {self._keys}: step {step} is older than "
                             f"num_keep_alive_refs ({self._writer._keep}).")
        return step

    def __len__(self):
        return self._writer._positions()

    def __getitem__(self, index):
        length = self._writer._positions()
        oldest = max(0, length - self._writer._keep)
        if isinstance(index, (int, np.integer)):
            return RemoteColumn(self._keys, [self._step(index, length, oldest)], True)
        if isinstance(index, slice):
            steps = list(range(*index.indices(length)))
            if index.start is not None and index.start < -length:
                raise ValueError(f"history {self._keys}: {index} reaches before the "
                                 "episode's first step.")
            return RemoteColumn(self._keys, [self._step(s, length, oldest) for s in steps],
                                False)
        if isinstance(index, (list, tuple, np.ndarray)):
            return RemoteColumn(self._keys, [self._step(i, length, oldest) for i in index],
                                False)
        raise TypeError(f"history indices must be int, slice or list, not {index!r}.")


def history_of(writer, root, data):
    """``(root, history)``: the skeleton of every field seen (``root``, merged with
    ``data``'s), and the history over it, as a local writer's: fields that appeared in
    any step, each a ``_ColumnHistory`` of ``writer``."""
    root = _merge_structure(root, data)
    return root, _build_history(root, (), {}, lambda path: _ColumnHistory(writer, path))

"""The ``TrajectoryWriter``'s short path for parts of a step (``partial_step=True``).

Acme's adders build every step from two or three ``append`` calls of different
structures (the observation opens the step, the n-step return is added to it, the
action, reward and discount complete it), so the writer's one cached structure
(``_WholeSteps``, ``TrajectoryWriter._flat``) never matches twice in a row. ``StepParts``
keeps a flattening plan (``_schema.nest_plans``) per structure of such a part, with what
that part fills: its fields' histories, their first values (dtype and shape) and the
fields it leaves to other parts. A part of a known structure whose fields all have a
history is then checked, copied and pushed field by field, without flattening or
looking fields up by path; anything else (a new field, a field set twice, a value of
another dtype or shape, a nest the plan does not read) takes the general path, which
checks everything and explains what is wrong.

The cache is only valid for one set of field histories: the writer drops it
(``StepParts.clear``) whenever a field appears or the histories are replaced
(``end_episode(clear_buffers=True)``).
"""

import weakref

import optree

from shmreplay._schema import nest_plans as _nest_plans
from shmreplay._writers.writing import StepRef

_MAX_PARTS = 16  # structures per writer; more are appended by the general path


class StepPart:
    """What a part of one structure fills: per leaf, its field's path, history and first
    value; ``others``: the histories of the fields it does not set."""

    __slots__ = ("plan", "paths", "columns", "firsts", "others")

    def __init__(self, plan, paths, columns, firsts, others):
        self.plan = plan
        self.paths = paths
        self.columns = columns
        self.firsts = firsts
        self.others = others

    def push(self, values, step: dict, uid: int, episode: int, opening: bool):
        """Sets this part's fields of the step ``uid`` (``step``: its ``{path: ref}``).

        ``opening``: the step is new, so every field's history takes a position for it
        (None until a part sets it, as ``append``'s general path does). Otherwise each of
        this part's histories ends with the open step's placeholder, replaced here: a
        writer keeps every history as long as the number of steps since it was cleared.
        """
        if opening:
            for column in self.others:
                refs = column.refs
                refs.append(None)
                if len(refs) > column.span:
                    refs.popleft()
                    column.start += 1
        for path, column, value in zip(self.paths, self.columns, values):
            ref = StepRef(uid, episode, path, value)
            refs = column.refs
            if opening:
                refs.append(ref)
                if len(refs) > column.span:
                    refs.popleft()
                    column.start += 1
            else:
                refs[-1] = ref
            alive = column.values  # (``_ColumnHistory.keep_alive``, inlined)
            alive.append(ref)
            if len(alive) > column.keep:
                old = alive.popleft()
                old.expired = True
                if column.span > column.keep:
                    column.expire(old)
            step[path] = ref


class StepParts:
    """Plans per structure of appended data, each with its ``StepPart`` (None: the
    structure has a field without a history).

    Plans are kept across ``clear`` (making one costs about a hundred steps' appends);
    only the parts, bound to the writer's histories, are made again when next used.
    Dicts are looked up by their keys (in their order), other nests by type.
    """

    __slots__ = ("writer", "by_key", "refused", "count", "taken")

    def __init__(self, writer):
        # (its ``_columns``: field histories; ``_specs``: first values. A weak reference:
        # a writer that holds no cycle closes when its last reference goes.)
        self.writer = weakref.ref(writer)
        self.by_key = {}      # tuple(dict) or type -> [[plan, paths, part, bound]]
        self.refused = set()  # treedefs without a plan
        self.count = 0
        self.taken = 0        # parts appended by this path (tests read it)

    def clear(self):
        """The writer's histories changed: every part is made again when next used."""
        for entries in self.by_key.values():
            for entry in entries:
                entry[3] = False

    def find(self, data):
        """``(leaves, part)`` for data of a known structure, else None."""
        entries = self.by_key.get(tuple(data) if type(data) is dict else type(data))
        if entries is not None:
            for entry in entries:
                leaves = entry[0](data)
                if leaves is not None:
                    if not entry[3]:
                        writer = self.writer()
                        entry[2] = _part(entry[0], entry[1], writer._columns, writer._specs)
                        entry[3] = True
                    return leaves, entry[2]
        return None

    def learn(self, data, columns, first_values):
        """Learns ``data``'s structure (``columns``: the writer's ``{path: history}``,
        ``first_values``: its fields' first values); returns ``(leaves, part)`` as
        ``find`` does, or None if no plan reads it."""
        if self.count >= _MAX_PARTS:
            return None
        leaves, treedef = optree.tree_flatten(data, none_is_leaf=False)
        if treedef in self.refused:
            return None
        plan = _nest_plans.checked_plan(data, leaves, treedef)
        if plan is None:
            self.refused.add(treedef)
            return None
        paths = [tuple(p) for p in optree.treespec_paths(treedef)]
        part = _part(plan, paths, columns, first_values)
        key = tuple(data) if type(data) is dict else type(data)
        self.by_key.setdefault(key, []).append([plan, paths, part, True])
        self.count += 1
        return leaves, part


def _part(plan, paths, columns, first_values):
    """The ``StepPart`` of a structure whose leaves are at ``paths``, or None if a field
    has no history yet (or a path repeats)."""
    if not all(path in columns for path in paths) or len(set(paths)) != len(paths):
        return None
    mine = set(paths)
    return StepPart(plan, paths, [columns[path] for path in paths],
                    [first_values[path] for path in paths],
                    [column for path, column in columns.items() if path not in mine])

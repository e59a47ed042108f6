"""``TrajectoryWriter.create_item``'s general path, first half: a trajectory's columns
read and checked (every leaf a ``TrajectoryColumn``, no expired reference, one episode),
and what the rest of ``create_item`` needs to know about them to plan and insert the item.
"""

from shmreplay import specs
from shmreplay._writers import writing as _writing
from shmreplay._writers.history import TrajectoryColumn

_ONLY_COLUMNS = {TrajectoryColumn}


def trajectory_columns(layouts, trajectory):
    """``(leaves, treedef, paths)`` of ``trajectory`` (``layouts``: the writer's cache of
    flat dict trajectories' keys, ``tuple(dict) -> (keys, treedef, paths)``).

    Raises:
      TypeError: a leaf is not a TrajectoryColumn (or is None).
      ValueError: the trajectory is empty.
    """
    known = layouts.get(tuple(trajectory)) if type(trajectory) is dict else None
    leaves = None
    keys = None
    if known is not None:  # a dict with the keys of an earlier trajectory
        keys, treedef, paths = known
        leaves = [trajectory[key] for key in keys]
        if set(map(type, leaves)) != _ONLY_COLUMNS:
            leaves = None  # nested, or invalid: the general path explains
    if leaves is None:
        leaves, treedef = specs.flatten(trajectory)
        paths = specs.path_strings(treedef)
        if len(specs.optree.tree_leaves(trajectory, none_is_leaf=True)) != len(leaves):
            raise TypeError("create_item: every leaf of the trajectory must be a "
                            "TrajectoryColumn, got None.")
        if not leaves:
            raise ValueError("create_item: the trajectory is empty.")
        for leaf in leaves:
            if not isinstance(leaf, TrajectoryColumn):
                raise TypeError(
                    f"create_item: every leaf of the trajectory must be a "
                    f"TrajectoryColumn, got {type(leaf).__name__}.")
        keys = _writing.flat_dict_keys(treedef) if type(trajectory) is dict else None
        if keys is not None:
            layouts[tuple(trajectory)] = (keys, treedef, paths)
    return leaves, treedef, paths


def check_columns(leaves, paths):
    """``(column_refs, shape, uids, window_ends)`` of an item's columns: per column its
    references and ``(source field, length, squeeze)``; the steps every column reads if
    they all read the same ones (else False); and the first and last step of the
    columns if every one is a history window (else False).

    Raises:
      ValueError: a column is empty, references an expired step, or the references
        span an episode boundary.
    """
    column_refs = []
    shape = []       # per column: (source field, length, squeeze)
    episode = leaves[0]._refs[0].episode if leaves[0]._refs else None
    uids = None      # the steps every column reads, while they all read the same ones
    window_ends = None  # (first uid, last uid) while every column is a history window
    for leaf, path in zip(leaves, paths):
        refs = leaf._refs
        if leaf._window:
            # Consecutive steps of one field, oldest first: the oldest expires first
            # and episodes only grow, so checking the ends checks them all.
            first, last = refs[0], refs[-1]
            if not first.expired and first.episode == episode == last.episode:
                source = first.path
                column_refs.append(refs)
                shape.append((source, len(refs), leaf._squeeze))
                ends = (first.uid, last.uid)
                if uids is None:
                    uids = [ref.uid for ref in refs]
                    window_ends = ends
                elif ends != window_ends:
                    uids = False
                continue
        window_ends = False
        if not refs:
            raise ValueError(f"create_item: column {path} is empty.")
        source = refs[0].path
        for ref in refs:
            if ref.expired or ref.episode != episode or ref.path != source:
                if ref.expired:
                    raise ValueError(
                        f"create_item: column {path} references a step older than "
                        "num_keep_alive_refs (expired).")
                if ref.episode != episode:
                    raise ValueError(
                        "create_item: the trajectory's references span an episode "
                        "boundary (an item never crosses end_episode).")
                source = None
        column_refs.append(refs)
        shape.append((source, len(refs), leaf._squeeze))
        column_uids = [ref.uid for ref in refs]
        if uids is None:
            uids = column_uids
        elif uids is not False and column_uids != uids:
            uids = False
    return column_refs, shape, uids, window_ends

"""Episode ids of a table's live items, for ``TableInfo.num_episodes`` and
``num_deleted_episodes`` (under the lock).

A writer records ``(version, episode id)`` for the slot it reserved
(``shmreplay._shm.layout``'s ``episodes`` array); the record is the item's while its version
equals the slot's. Counting is lazy: nothing on the insert or sample paths changes.
"""

from shmreplay._shm.kernels import kernel
from shmreplay._shm.kernels.locking import _lock, _unlock
from shmreplay._shm.layout import (
    C_EPISODE_REPEATS, C_SIZE, C_TOTAL_INSERTED, E_EPISODE, E_VERSION, M_KEY, M_LIVE, M_VERSION)


@kernel
def live_episodes(ctrl, fctrl, meta, prio, trees, refs, rows, episodes, out, stays):
    """Writes the episode of each live item to ``out``: its writer's episode id (>= 0),
    or ``-1 - key`` for an item that is its own episode (from ``insert``), and to
    ``stays[0]`` how many stays of episodes in the table began since the last reset
    (``shmreplay._writers.episode_stays``). Returns the number of items, a negative
    status, or ``-(size + 1000)`` if ``out`` is too small."""
    status = _lock(ctrl, fctrl, meta, prio, trees, refs, rows)
    if status != 0:
        return status
    size = ctrl[C_SIZE]
    if size > out.shape[0]:
        _unlock(ctrl)
        return -(size + 1000)
    for i in range(size):
        slot = meta[i, M_LIVE]
        if episodes[slot, E_VERSION] == meta[slot, M_VERSION]:
            out[i] = episodes[slot, E_EPISODE]
        else:
            out[i] = -1 - meta[slot, M_KEY]
    stays[0] = ctrl[C_TOTAL_INSERTED] - ctrl[C_EPISODE_REPEATS]
    _unlock(ctrl)
    return size

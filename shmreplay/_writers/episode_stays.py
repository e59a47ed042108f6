"""Which episode a writer's item belongs to, and whether it starts the episode's stay in
a table: what ``TableInfo.num_episodes`` and ``num_deleted_episodes`` count.

Reverb counts, per table, the items that reference each episode; an episode is deleted
when its count drops to zero (it may come back with a later item, and go again). The
kernels keep no per-episode counts. Instead each writer remembers, per table, the slots
of its current episode's items, and tells the commit whether the new item continues a
stay (some remembered item is still live) or starts one. The table counts the items
that continue one (``C_EPISODE_REPEATS``); every other item, each ``insert`` included,
starts a stay. The stays that ended are those started and not live now
(``shmreplay._engine.table_info.count_episodes``).

The check reads the remembered slots without the table's lock: if the episode's last
live item is deleted between the check and the commit, the count is one lower than
Reverb's would be (a race within one call; the other counts are exact).
"""

from shmreplay._shm import layout as L
from shmreplay._shm.kernels import codes

_F = L.META_FIELDS


class EpisodeStays:
    """One writer's current episode in one table, and the slots of its items there.

    ``at(episode)`` names the episode of the next item; ``record(engine, slot)`` writes
    the reserved slot's episode record and returns 1 if the item continues a stay of
    its episode in the table, else 0 (the commit's ``repeats``); ``committed()`` adds the
    item once its commit succeeded.
    """

    __slots__ = ("episode", "_slots", "_pending", "_meta", "_compact_at")

    def __init__(self):
        self.episode = -1
        self._slots = []        # [slot, version, slot, version, ...], oldest first
        self._pending = None    # (slot, version) of the item being committed
        self._meta = None       # the table's slot records, flat (``_flat_views``)
        self._compact_at = 128  # prune dead slots when the list grows this long

    def at(self, episode: int) -> "EpisodeStays":
        """This object, with ``episode`` as the episode of the next item."""
        if episode != self.episode:
            self.episode = episode
            self._slots.clear()
            self._compact_at = 128
        return self

    def record(self, engine, slot: int) -> int:
        """Ties reserved ``slot`` to the episode (its record; see ``shmreplay._shm.layout``)
        and returns 1 if an item of the episode is live in the table, else 0."""
        views = engine.episode_views
        if views is None:
            views = engine.episode_views = _flat_views(engine)
        records, meta, ctrl = views
        version = meta[slot * _F + L.M_VERSION]
        records[L.EPISODE_FIELDS * slot + L.E_EPISODE] = self.episode
        records[L.EPISODE_FIELDS * slot + L.E_VERSION] = version
        if not ctrl[L.C_EPISODES_RECORDED]:  # (a flag, set before the item's commit)
            ctrl[L.C_EPISODES_RECORDED] = 1
        self._pending = (slot, version)
        self._meta = meta
        return self._continues()

    def committed(self):
        """The item ``record`` saw is in the table."""
        slots = self._slots
        slots.extend(self._pending)
        if len(slots) >= self._compact_at:
            meta = self._meta
            slots[:] = [value for i in range(0, len(slots), 2)
                        if _live(meta, slots[i], slots[i + 1]) for value in slots[i:i + 2]]
            self._compact_at = max(128, 2 * len(slots))

    def _continues(self) -> int:
        # Newest first: the newest item is nearly always still there. Items newer than
        # the newest live one are gone for good (a slot's version never comes back), so
        # they are dropped; the rest are pruned when the list doubles.
        slots, meta = self._slots, self._meta
        i = len(slots) - 2
        while i >= 0:
            if _live(meta, slots[i], slots[i + 1]):
                del slots[i + 2:]
                return 1
            i -= 2
        slots.clear()
        return 0


def _live(meta, slot: int, version: int) -> bool:
    return (meta[slot * _F + L.M_VERSION] == version
            and meta[slot * _F + L.M_STATE] == codes.READY)


def _flat_views(engine):
    """Flat int64 memoryviews of the episode records, slot records and control words:
    a writer's item sets its record with a few cheap element accesses (numpy's tuple
    indexing costs several times more)."""
    return (memoryview(engine.episodes.reshape(-1)), memoryview(engine.meta.reshape(-1)),
            memoryview(engine.ctrl))

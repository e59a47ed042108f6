"""Locked entry points: one native call per table operation (protocol: ``shmreplay._shm.sync``).

Each function takes the table's arrays ``(ctrl, fctrl, meta, prio, trees, refs, rows)`` first,
locks the table's robust mutex (repairing the table if the previous holder died),
does the whole operation, unlocks, then wakes waiters if it changed something they wait
for. Return values >= 0 are counts; negative values are ``codes`` statuses. When a call
returns ``BLOCKED`` it has registered the caller as a waiter (if asked) and stored the
futex sequence value to wait on in ``io[0]``.

Python calls kernels through this module only: it names every entry point (the
warm-up's cache probe, ``_jit.entry_points``, lists them from here). They are defined by
job: ``locking`` (the mutex, blocking and waking, rate checks), ``views`` (a table's
arrays made from its header segment), ``inserting``, ``sampling``, ``priorities``, and
``upkeep`` (reset, close, snapshots and restores, verify); ``creation.grow`` raises how
much of a data segment's stores is reserved (``shmreplay._engine.growth``).
"""

from shmreplay._shm.kernels.locking import (
    BROKEN, wake_all, rate_check, wait, unwait, wait_for_items)
from shmreplay._shm.kernels.views import (
    TABLE_CTRL, TABLE_FCTRL, TABLE_META, TABLE_TREES, TABLE_CAPACITY, TABLE_TREE_LENGTH,
    TABLE_STAMP, TABLE_FIELDS, TABLE_WEIGH_BETA, TABLE_WEIGH_NORMALIZE, TABLE_LARGEST,
    TABLE_SCRATCH, TABLE_SCRATCH_KEYS)
from shmreplay._shm.kernels.inserting import (
    reserve, commit, reserve_one, reserve_item, commit_one, insert_staged, cancel, release_drained,
    reserve_whole, commit_whole, ascending_run)
from shmreplay._shm.kernels.sampling import (
    OUT_SLOT, OUT_KEY, OUT_TABLE_SIZE, OUT_TIMES, OUT_VERSION, OUT_INT_ROWS, OUT_PROBABILITY,
    OUT_PRIORITY, OUT_FLOAT_ROWS, sample, LAYOUT_OUT_I, LAYOUT_OUT_F, LAYOUT_TIMES, LAYOUT_TORN,
    LAYOUT_IO, LAYOUT_WEIGHTS, LAYOUT_WEIGHED, LAYOUT_COLUMNS, GATHER_COUNT, GATHER_TORN,
    GATHER_IO, sample_gather, seed, torn_rows, importance_weights)
from shmreplay._shm.kernels.priorities import (
    mutate, update_whole, update_whole_weighed, first_invalid_priority)
from shmreplay._shm.kernels.arena import arena_reserve, arena_read, arena_verify
from shmreplay._shm.kernels.upkeep import (
    reset, close, snapshot, hold_items, release_hold, restore_items, writing_slots, verify)
from shmreplay._shm.kernels.creation import grow

__all__ = [
    "arena_read", "arena_reserve", "arena_verify",
    "ascending_run", "cancel", "close", "commit", "commit_one", "commit_whole",
    "first_invalid_priority", "grow", "hold_items", "importance_weights", "insert_staged", "mutate",
    "rate_check", "release_drained", "release_hold", "reserve", "reserve_item", "reserve_one",
    "reserve_whole", "reset", "restore_items", "sample", "sample_gather", "seed", "snapshot",
    "torn_rows", "unwait", "update_whole", "update_whole_weighed", "verify", "wait",
    "wait_for_items", "wake_all", "writing_slots", "BROKEN", "GATHER_COUNT", "GATHER_IO",
    "GATHER_TORN", "LAYOUT_COLUMNS", "LAYOUT_IO", "LAYOUT_OUT_F", "LAYOUT_OUT_I", "LAYOUT_TIMES",
    "LAYOUT_TORN", "LAYOUT_WEIGHED", "LAYOUT_WEIGHTS", "OUT_FLOAT_ROWS", "OUT_INT_ROWS", "OUT_KEY",
    "OUT_PRIORITY", "OUT_PROBABILITY", "OUT_SLOT", "OUT_TABLE_SIZE", "OUT_TIMES", "OUT_VERSION",
    "TABLE_CAPACITY", "TABLE_CTRL", "TABLE_FCTRL", "TABLE_FIELDS", "TABLE_META", "TABLE_STAMP",
    "TABLE_TREES", "TABLE_TREE_LENGTH", "TABLE_WEIGH_BETA", "TABLE_WEIGH_NORMALIZE",
    "TABLE_LARGEST", "TABLE_SCRATCH", "TABLE_SCRATCH_KEYS",
]

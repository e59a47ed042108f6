"""Integer codes shared by the kernels and the Python layer.

Kernels return these instead of raising; ``shmreplay._engine.table_engine`` turns them into typed
errors that name the table. Numba reads module-level ints as compile-time constants.
"""

# Selector kinds (``shmreplay.selectors``).
UNIFORM = 0
PRIORITIZED = 1
FIFO = 2
LIFO = 3
MIN_HEAP = 4
MAX_HEAP = 5

# Slot states.
FREE = 0
WRITING = 1
READY = 2
DRAINING = 3  # removed while being sampled: kept until the sampler has copied it

# Kernel status codes (>= 0 means success and usually carries a count).
BLOCKED = -1  # the rate limiter (or a full table) does not allow the call now
CLOSED = -2  # the buffer was stopped
TOO_BIG = -3  # the batch can never fit in the free slots
UNMAPPED = -5  # the caller passed placeholder step arrays: map the data segment, call again
NO_ROWS = -6  # step storage cannot hold the item even with the table emptied
UNFINISHED = -7  # sample_gather: the batch needs the general steps (details in its io)
INVALID_PRIORITY = -8  # update_whole, reserve_whole: a priority is negative, NaN or too large
# The table's lock stayed held for a whole ``_sync.LOCK_SLICE_NS``: nothing was done. The
# caller checks its deadline (and Ctrl-C, and a stopped buffer) and calls again.
LOCK_BUSY = -10
NO_ARENA = -11  # arena.reserve: the item does not fit the arena even with the table emptied
# The call needs a slot or step row past what the data segment's stores have reserved
# (``C_SLOT_LIMIT``, ``C_ROW_LIMIT``): nothing was done; the caller reserves more
# (``shmreplay._engine.growth``) and calls again.
GROW = -12
LOST = -9  # commit: a reserved slot is no longer the caller's (freed as a dead writer's)

# Crash points (tests only, ``shmreplay._shm.crash_points``): places inside locked kernels
# where an armed process stops itself, so a test can SIGKILL it there.
STOP_COMMIT_HALF = 1      # commit: half of a batch's items added, lock held
STOP_COMMIT_EVICT = 2     # commit: the first eviction done, lock held
STOP_COMMIT_ONE = 3       # commit_one: the item added, counters not yet, lock held
STOP_SAMPLE_DRAWN = 4     # sample: every item drawn and counted, lock held
STOP_MUTATE_HALF = 5      # mutate: deletes done, updates not yet, lock held
STOP_RESERVE_ITEM = 6     # reserve_item: rows pinned (and evictions done), lock held
STOP_ARENA_RESERVED = 7   # arena.reserve: the slot and its pages taken, lock held
STOP_GROW = 8             # creation.grow: the watermarks raised, lock held

"""Every byte of a buffer's shared memory is placed here, and nowhere else.

A buffer named ``NAME`` is a set of POSIX shared-memory segments:

``/shmreplay.NAME`` (the *header segment*, created by the Server)::

    0       HEADER        256 bytes, the structured dtype ``HEADER`` below
    256     config blob   cloudpickle of ``{"tables": [Table, ...], "checkpoint_root": str}``
    ...     table 0       control block, slot metadata, priorities, sum-trees
    ...     table 1       ...

``/shmreplay.NAME:tI:TOKEN`` (the *data segment* of table ``I``, created when its
columns are known: by the Server when the table has a signature, else by the first
insert; ``TOKEN`` is random per creation and recorded in the table's ``C_DATA_TOKEN``,
see ``data_segment_name``)::

    0       DATA_HEADER   64 bytes: magic, layout version, schema length, complete flag
    64      schema blob   cloudpickle of the signature (a nest of TensorSpec)
    ...     column 0      [capacity, *shape] of its dtype, 64-byte aligned
    ...     column 1      ...

One table region is five arrays (kernels receive them as views, never offsets):

* ``ctrl``  int64[CTRL_WORDS]: words 0..7 hold the process-shared robust pthread mutex,
  the rest the ``C_*`` counters and settings below. Two words are futexes (their low
  32 bits): ``C_ITEMS_SEQ`` (bumped when items appear) and ``C_SPACE_SEQ`` (bumped when
  room or sample credit appears).
* ``fctrl`` float64[F_WORDS]: the ``F_*`` float settings (rate limiter, exponents).
* ``meta``  int64[capacity, META_FIELDS]: one 128-byte record per slot, ``meta[slot, M_*]``
  (key, state, version, ...). Sampling and priority updates touch a slot's key, state,
  version, times sampled, update number and priority, so those share the record's first
  64-byte cache line: on tables larger than the cache, one miss per item instead of one
  per field. Three columns are indexed by position instead of slot: the dense
  ``M_LIVE`` array of live slots and the two heaps ``M_HEAP0/1``. Free slots form a
  linked stack through ``M_NEXT`` (which only live items use otherwise).
* ``prio``  float64 view of the ``M_PRIO`` column of ``meta``: each slot's priority.
* ``trees`` float64[2, 2 * P]: a 1-indexed sum-tree per selector role (0 = sampler,
  1 = remover) whose leaves ``P + slot`` hold ``priority ** exponent``.
* ``episodes`` int64[capacity, 2]: ``(version, episode id)`` per slot, written by a
  writer while it holds the slot reserved. The record belongs to the item in the slot
  only while the version equals the slot's ``M_VERSION`` (a new reservation bumps it),
  so an item from ``insert``, which writes none, is its own episode, and a record is
  never cleared. Read only by ``TableInfo.num_episodes`` and checkpoints.

Capacity is ``max_size + spare`` slots: ``spare`` slots let writers copy new items while
the table is full (the remover evicts at commit, as Reverb does). Memory is reserved
before it is written (``_segment.Segment.create``), so that no write can meet a full
/dev/shm later: the header segment and a data segment's small parts when they are
created, a data segment's stores as the table fills (``shmreplay._engine.growth``), so
a large ``max_size`` costs its memory only as it is used.
"""

import dataclasses
import os
from typing import List

import numpy as np

from shmreplay._shm.kernels import codes

MAGIC = b"SHMRPLY1"
DATA_MAGIC = b"SHMRPLYD"
LAYOUT_VERSION = 9  # 4: the episodes array; 5: item forms and layout stamps; 6: segment
# names, and writer stamps and the owner carry their pid namespace (``shmreplay._shm.procs``);
# 7: the reference pool of items of any length (``kernels.refpool``); 8: stores reserved
# as they fill (``C_SLOT_LIMIT``, ``C_ROW_LIMIT``); 9: ``C_EPISODE_REPEATS``
ALIGN = 64
SEGMENT_PREFIX = "shmreplay."

# Header states.
STATE_CREATING = 0
STATE_ACTIVE = 1
STATE_STOPPED = 2

HEADER = np.dtype([
    ("magic", "S8"),
    ("layout_version", "<u4"),
    ("header_size", "<u4"),
    ("total_bytes", "<i8"),
    ("owner_pid", "<i8"),
    ("owner_start", "<i8"),     # the owner's start time (clock ticks), against pid reuse
    ("owner_uid", "<i8"),
    ("state", "<i8"),
    ("num_tables", "<i8"),
    ("config_offset", "<i8"),
    ("config_len", "<i8"),
    ("tables_offset", "<i8"),
    ("created_ns", "<i8"),
    ("segment_mode", "<i8"),    # 0o600, or 0o660 when shared with the owner's group
    ("owner_ns", "<i8"),        # the owner's pid namespace (``shmreplay._shm.procs``; 0: unknown)
])
HEADER_SIZE = 256
assert HEADER.itemsize <= HEADER_SIZE

DATA_HEADER = np.dtype([
    ("magic", "S8"),
    ("layout_version", "<u4"),
    ("complete", "<u4"),
    ("schema_len", "<i8"),
    ("total_bytes", "<i8"),
    ("generation", "<i8"),  # the table's C_LAYOUT_GEN when the segment was made
])
DATA_HEADER_SIZE = 64

# ctrl words. 0..7 are the mutex (glibc's pthread_mutex_t is 40 bytes on x86_64).
MUTEX_WORDS = 8
(C_CLOSED, C_CAPACITY, C_MAX_SIZE, C_MAX_TIMES_SAMPLED, C_SAMPLER_KIND, C_REMOVER_KIND,
 C_MIN_SIZE, C_SLOT_BITS, C_TREE_LEAVES,
 C_SIZE, C_INSERTS, C_SAMPLES, C_DELETES, C_PENDING,
 C_NEXT_ID, C_ORDER_SEQ, C_UPDATE_SEQ, C_HEAD, C_TAIL, C_FREE_TOP, C_FRESH,
 C_HEAP_N0, C_HEAP_N1, C_ITEMS_SEQ, C_SPACE_SEQ, C_ITEMS_WAITERS, C_SPACE_WAITERS,
 C_NUM_UNIQUE, C_TOTAL_INSERTED, C_TOTAL_SAMPLED, C_TOTAL_DELETED, C_RECOVERIES,
 C_SCHEMA_READY, C_RESERVES, C_FREE_HEAD,
 # Step storage (sequence items); all zero for tables that store whole items.
 C_REFS_WIDTH, C_ROW_CAPACITY, C_ROW_FREE_HEAD, C_ROW_FREE_TOP, C_ROW_FRESH, C_ROWS_LIVE,
 C_ROWS_DIRTY,
 # A batch commit in progress: 1 + the insertion order of its first item (0: none). A
 # commit cut short by its process's death is rolled back by ``rebuild``.
 C_COMMIT_MARK,
 # Tests only (``shmreplay._shm.crash_points``): the process ``C_STOP_PID`` stops itself
 # (SIGSTOP) when it reaches stop point ``C_STOP_POINT`` inside a kernel.
 C_STOP_POINT, C_STOP_PID,
 # 1 once a writer has recorded an episode (``episodes``): until then every item is
 # its own episode, and ``TableInfo`` reads no record (nor maps its pages).
 C_EPISODES_RECORDED,
 # Bumped when ``Client.reset`` forgets the layout of a table without a signature. Every
 # process's step arrays carry the generation they were mapped for (``stamp_rows``),
 # and kernels refuse a stale one with UNMAPPED: no process writes or reads through a
 # mapping of a forgotten layout.
 C_LAYOUT_GEN,
 # The data segment's creation (``shmreplay._engine.data_segment``): the random token in its
 # name, and the process creating it now (0 once it is made). Others wait while that
 # process lives and take over only once it is dead (pid and start time, never a delay).
 C_DATA_TOKEN, C_CREATOR_PID, C_CREATOR_START,
 # Variable-length step references (``shmreplay._shm.kernels.refpool``): the item
 # columns each slot head records, and the block pool's free stack; 0 otherwise.
 C_REF_COLUMNS, C_BLOCK_FREE_HEAD, C_BLOCK_FREE_TOP, C_BLOCK_FRESH,
 # Arena reservations (items of any shape, ``shmreplay._shm.kernels.arena``) since the
 # layout was defined; never decremented. While 0, sampling takes the fused fast path.
 # The page after the last run taken: where the next search starts (a hint, any value).
 C_ARENA_ITEMS, C_ARENA_ROVER,
 # How much of the data segment's stores is reserved (``shmreplay._engine.growth``):
 # slots of a whole-item table (its capacity for step storage), and step rows. No
 # kernel hands out a slot (``C_FRESH``) or row (``C_ROW_FRESH``) at or past these; it
 # returns ``GROW`` instead, and the caller reserves more and raises them.
 C_SLOT_LIMIT, C_ROW_LIMIT,
 # Items committed since the last reset that continued an episode with a live item in
 # the table (a writer's later items). Every other item starts an episode's stay, so
 # ``C_TOTAL_INSERTED - C_EPISODE_REPEATS`` episodes came and those not live left:
 # ``TableInfo.num_deleted_episodes`` (``shmreplay._engine.table_info``). Reset sets it
 # to ``C_TOTAL_INSERTED``.
 C_EPISODE_REPEATS) = range(MUTEX_WORDS, MUTEX_WORDS + 59)
CTRL_WORDS = 72

# Fields of a step row's int32 record ``rows[row, R_*]``. A live row counts the item
# references to it (> 0); a free row holds ``-2 - next`` (the free stack's link). The
# generation changes whenever the row is handed out again, so a writer's remembered
# ``(row, generation)`` can never name someone else's step.
R_COUNT, R_GEN = range(2)
ROW_FIELDS = 2

(F_SAMPLES_PER_INSERT, F_MIN_DIFF, F_MAX_DIFF, F_EXPONENT0, F_EXPONENT1) = range(5)
F_SCRATCH = 7  # where ``rebuild``'s evictions write a probability nobody reads (no allocation)
F_WORDS = 8

# meta columns: per-slot fields, the hot ones in the first cache line ...
(M_KEY, M_STATE, M_VERSION, M_TIMES, M_UPDATE, M_PRIO, M_LIVE_POS, M_WRITER,
 M_ORDER, M_PREV, M_NEXT, M_HEAP_POS0, M_HEAP_POS1,
 # ... and dense structures indexed by position, not slot.
 M_LIVE, M_HEAP0, M_HEAP1) = range(16)
META_FIELDS = 16  # 128 bytes: two cache lines per slot

# Fields of a slot's episode record ``episodes[slot, E_*]``.
E_VERSION, E_EPISODE = range(2)
EPISODE_FIELDS = 2


def _align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def spare_slots(max_size: int) -> int:
    """Extra slots for items being written while the table is full."""
    return max(64, min(max_size, 65536))


def slot_bits(capacity: int) -> int:
    return max(1, int(capacity - 1).bit_length())


def tree_leaves(capacity: int) -> int:
    """P: the number of leaves of a sum-tree over ``capacity`` slots (a power of two)."""
    return 1 << max(0, int(capacity - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class TableRegion:
    """Where one table's arrays live in the header segment."""

    offset: int
    capacity: int
    tree_leaves: int       # 0 when no selector of the table is Prioritized
    ctrl: int
    fctrl: int
    meta: int
    prio: int
    trees: int
    episodes: int
    end: int


def plan_table(offset: int, table) -> TableRegion:
    """Places one table's region at ``offset`` (64-byte aligned pieces)."""
    capacity = table.max_size + spare_slots(table.max_size)
    kinds = (table.sampler.kind, table.remover.kind)
    leaves = tree_leaves(capacity) if codes.PRIORITIZED in kinds else 0
    ctrl = _align(offset)
    fctrl = _align(ctrl + CTRL_WORDS * 8)
    meta = _align(fctrl + F_WORDS * 8)
    prio = meta + M_PRIO * 8
    trees = _align(meta + META_FIELDS * capacity * 8)
    episodes = _align(trees + 2 * max(2 * leaves, 1) * 8)
    end = _align(episodes + EPISODE_FIELDS * capacity * 8)
    return TableRegion(offset, capacity, leaves, ctrl, fctrl, meta, prio, trees, episodes, end)


@dataclasses.dataclass(frozen=True)
class BufferPlan:
    config_offset: int
    config_len: int
    tables: List[TableRegion]
    total_bytes: int


def plan_buffer(tables, config_len: int) -> BufferPlan:
    """The byte map of a header segment holding ``tables`` and a config blob."""
    config_offset = HEADER_SIZE
    offset = _align(config_offset + config_len, 4096)
    regions = []
    for table in tables:
        region = plan_table(offset, table)
        regions.append(region)
        offset = region.end
    return BufferPlan(config_offset, config_len, regions, _align(offset, 4096))


@dataclasses.dataclass
class TableViews:
    """The numpy views of one table region (what the kernels receive)."""

    ctrl: np.ndarray
    fctrl: np.ndarray
    meta: np.ndarray
    prio: np.ndarray
    trees: np.ndarray


def table_views(buf, region: TableRegion) -> TableViews:
    cap = region.capacity
    tree_len = max(2 * region.tree_leaves, 1)
    return TableViews(
        ctrl=np.frombuffer(buf, np.int64, CTRL_WORDS, region.ctrl),
        fctrl=np.frombuffer(buf, np.float64, F_WORDS, region.fctrl),
        meta=np.frombuffer(buf, np.int64, META_FIELDS * cap, region.meta).reshape(cap, META_FIELDS),
        prio=np.frombuffer(buf, np.float64, META_FIELDS * cap, region.meta)[M_PRIO::META_FIELDS],
        trees=np.frombuffer(buf, np.float64, 2 * tree_len, region.trees).reshape(2, tree_len),
    )


def episode_view(buf, region: TableRegion) -> np.ndarray:
    """The ``episodes`` array of one table region: ``[capacity, EPISODE_FIELDS]``."""
    return np.frombuffer(buf, np.int64, EPISODE_FIELDS * region.capacity,
                         region.episodes).reshape(region.capacity, EPISODE_FIELDS)


def table_offsets(region: TableRegion) -> np.ndarray:
    """``table_views`` as numbers, for kernels that make the views themselves (one
    argument instead of five): see ``shmreplay._shm.kernels.table.TABLE_*``."""
    # (+ the layout stamp, the importance weights' beta and normalize (none yet), the
    # largest priority (set by the handle) and a scratch of 2 x 64 keys)
    return np.array([region.ctrl, region.fctrl, region.meta, region.trees, region.capacity,
                     max(2 * region.tree_leaves, 1), 0, 0, -1, 0] + [0] * 128, np.int64)


def header_view(buf) -> np.ndarray:
    """The header record (a 0-d structured array view)."""
    return np.frombuffer(buf, HEADER, 1, 0)[0:1]


@dataclasses.dataclass(frozen=True)
class DataPlan:
    schema_offset: int
    row_capacity: int      # rows of each store (slots when items are stored whole)
    rows: int              # byte offset of the int32 [row_capacity, ROW_FIELDS] row records
    refs: int              # byte offset of the int32 [capacity, width] item references
    width: int             # references per item (0 when items are stored whole)
    stores: List[int]      # byte offset of each store
    total_bytes: int
    forms: int = 0         # byte offset of the int64 [capacity, 2] item forms
    pool_blocks: int = 0   # blocks after the slot heads in ``refs`` (items of any length)
    arena_extents: int = 0  # byte offset of the int64 [capacity, EXTENT_FIELDS] extents
    arena_pages: int = 0   # pages of the arena (0: none)
    arena_owners: int = 0  # byte offset of the int64 [arena_pages] page owners
    arena: int = 0         # byte offset of the arena's bytes
    row_bytes: tuple = ()  # bytes of one row of each store


# The general store (``shmreplay._shm.kernels.arena``): items of any shape, encoded, in
# runs of pages. Per slot ``extents[slot, X_*]``; per page the slot that took it.
ARENA_PAGE = 256
(X_PAGE, X_PAGES, X_VERSION, X_BYTES) = range(4)
EXTENT_FIELDS = 4
MAX_ARENA_BYTES = 1 << 40


def plan_data(storage, capacity: int, schema_len: int) -> DataPlan:
    """The byte map of a table's data segment.

    ``storage`` (a ``shmreplay._schema.storage.Storage``) says what the stores hold. Whole
    items: one store per column, ``[capacity, *shape]``, indexed by slot. Steps: a row
    space shared by every store (row ``r`` of each store holds one step of one writer),
    a reference count per row, and per slot the rows its item references::

        rows    int32 [row_capacity, ROW_FIELDS]
        refs    int32 [capacity, width]        (items of any length: [capacity + blocks,
                                                block width], ``kernels.refpool``)
        store i [row_capacity, *cell_shape]

    Either kind ends with ``forms``: int64 [capacity, 2], per slot the key of an item
    stored in another form than the table's usual one and which columns differ (see
    ``shmreplay._schema.item_forms``); an entry whose key is not the slot's item means none.
    """
    offset = _align(DATA_HEADER_SIZE + schema_len, 4096)
    width = storage.width
    row_capacity = storage.row_capacity(capacity)
    pool = storage.pool_blocks if storage.variable else 0
    rows = refs = offset
    if storage.steps:  # (one more row record: the layout stamp, see ``stamp_rows``)
        refs = _align(rows + (row_capacity + 1) * ROW_FIELDS * 4)
        offset = _align(refs + (capacity + pool) * width * 4)
    stores, row_bytes = [], []
    for spec in storage.store_specs:
        stores.append(offset)
        row = int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize
        row_bytes.append(row)
        offset = _align(offset + row_capacity * row)
    forms = offset
    offset = _align(forms + capacity * 2 * 8)
    pages = getattr(storage, "arena_bytes", 0) // ARENA_PAGE
    extents = owners = arena = 0
    if pages:  # the general store (``arena_views``)
        extents = offset
        owners = _align(extents + capacity * EXTENT_FIELDS * 8)
        arena = _align(owners + pages * 8, 4096)
        offset = arena + pages * ARENA_PAGE
    return DataPlan(DATA_HEADER_SIZE, row_capacity, rows, refs, width, stores,
                    _align(max(offset, 4096), 4096), forms, pool, extents, pages, owners,
                    arena, tuple(row_bytes))


def store_ranges(plan: DataPlan, start: int, stop: int):
    """``(offset, length)`` of rows ``start .. stop`` of each store, in bytes."""
    return [(offset + start * row, (stop - start) * row)
            for offset, row in zip(plan.stores, plan.row_bytes) if row and stop > start]


def store_views(buf, plan: DataPlan, store_specs) -> List[np.ndarray]:
    views = []
    for offset, spec in zip(plan.stores, store_specs):
        count = plan.row_capacity * int(np.prod(spec.shape, dtype=np.int64))
        views.append(np.frombuffer(buf, spec.dtype, count, offset)
                     .reshape((plan.row_capacity,) + spec.shape))
    return views


def forms_view(buf, plan: DataPlan, capacity: int) -> np.ndarray:
    """The ``[capacity, 2]`` item forms: ``(key, flipped columns)`` per slot."""
    return np.frombuffer(buf, np.int64, capacity * 2, plan.forms).reshape(capacity, 2)


def arena_views(buf, plan: DataPlan, capacity: int):
    """``(extents, owners, data)`` of the general store, or None if the table has none."""
    if not plan.arena_pages:
        return None
    extents = np.frombuffer(buf, np.int64, capacity * EXTENT_FIELDS,
                            plan.arena_extents).reshape(capacity, EXTENT_FIELDS)
    owners = np.frombuffer(buf, np.int64, plan.arena_pages, plan.arena_owners)
    data = np.frombuffer(buf, np.uint8, plan.arena_pages * ARENA_PAGE, plan.arena)
    return extents, owners, data


def step_views(buf, plan: DataPlan, capacity: int, generation: int):
    """``(refs, rows)``: the arrays the kernels keep step references in (``rows`` ends
    with the layout stamp; for whole items, placeholders stamped with ``generation``)."""
    if plan.width == 0:
        return no_step_views(generation)
    records = capacity + plan.pool_blocks  # (slot heads, then blocks: ``refpool``)
    refs = np.frombuffer(buf, np.int32, records * plan.width, plan.refs).reshape(
        records, plan.width)
    rows = np.frombuffer(buf, np.int32, (plan.row_capacity + 1) * ROW_FIELDS,
                         plan.rows).reshape(plan.row_capacity + 1, ROW_FIELDS)
    return refs, rows


def no_step_views(generation: int = 0):
    """Placeholders for tables (or processes) without step storage: width 0, and the
    layout stamp of ``generation``."""
    return np.zeros((0, 0), np.int32), stamp_rows(generation)


def stamp_rows(generation: int) -> np.ndarray:
    """A ``rows`` array of the stamp record alone. The kernels' ``rows`` always ends
    with one record whose count is the layout generation it was mapped for (step
    storage keeps it after its rows, in the data segment)."""
    return np.full((1, ROW_FIELDS), generation, np.int32)


def data_header_view(buf) -> np.ndarray:
    return np.frombuffer(buf, DATA_HEADER, 1, 0)[0:1]


# Segment names. A buffer's name is ``[A-Za-z0-9_.-]`` (``table.validate_name``), so it
# never contains ``DATA_SEPARATOR``: everything from the first ``:`` on is a data
# segment's own part, and no buffer's segment can be named like another buffer's.
DATA_SEPARATOR = ":"


def header_segment_name(buffer_name: str) -> str:
    return "/" + SEGMENT_PREFIX + buffer_name


def data_segment_prefix(buffer_name: str) -> str:
    """What every data segment entry of buffer ``buffer_name`` in /dev/shm starts with."""
    return f"{SEGMENT_PREFIX}{buffer_name}{DATA_SEPARATOR}t"


def data_segment_name(buffer_name: str, table_index: int, token: int) -> str:
    """``/shmreplay.NAME:tI:TOKEN``. The token is random per creation (``new_token``)
    and kept in the table's ``C_DATA_TOKEN``: nobody who cannot read the buffer's header
    can know the name before the segment exists, so nobody can take it first."""
    return f"/{data_segment_prefix(buffer_name)}{table_index}{DATA_SEPARATOR}{token:016x}"


def new_token() -> int:
    """A random, nonzero 63-bit data segment token."""
    return (int.from_bytes(os.urandom(8), "little") >> 1) or 1


def parse_segment(entry: str):
    """``(buffer name, table index)`` of a /dev/shm entry of ours (index None for a
    header segment), or None if the entry is not a shmreplay segment name."""
    if not entry.startswith(SEGMENT_PREFIX):
        return None
    rest = entry[len(SEGMENT_PREFIX):]
    name, separator, tail = rest.partition(DATA_SEPARATOR)
    if not name:
        return None
    if not separator:
        return name, None
    table, separator, token = tail[1:].partition(DATA_SEPARATOR)
    if (not tail.startswith("t") or not table.isdigit() or not separator
            or len(token) != 16 or token.strip("0123456789abcdef")):
        return None
    return name, int(table)

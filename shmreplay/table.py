"""``Table``: the configuration of one table, and a live handle once a Server owns it."""

import functools
import re
from typing import Optional

from shmreplay import errors, rate_limiters, selectors, specs

# Table and buffer names end up in POSIX object names: keep them boring.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
MAX_TABLE_NAME = 64
# The largest max_size: a table's slot records and sum-trees are addressed with int64
# byte offsets, and attaching refuses a configuration beyond this.
MAX_SIZE = (1 << 40) - 1
MAX_STEPS = (1 << 30) - 1  # step rows are int32 indices (``_schema.storage.MAX_POOL``)


def validate_name(name, what: str, max_len: int) -> str:
    """Checks a buffer or table name and returns it.

    Raises:
      InvalidNameError: if ``name`` is not a non-empty string of at most ``max_len``
        characters from ``[A-Za-z0-9_.-]`` starting with a letter or digit.
    """
    if not isinstance(name, str) or not name:
        raise errors.InvalidNameError(f"{what} name must be a non-empty string, got {name!r}.")
    if len(name) > max_len:
        raise errors.InvalidNameError(
            f"{what} name {name!r} is {len(name)} characters long; the limit is {max_len}.")
    if not NAME_PATTERN.fullmatch(name):  # (match would let '$' accept a trailing newline)
        raise errors.InvalidNameError(
            f"{what} name {name!r} may only contain letters, digits, '_', '.' and '-', "
            "and must start with a letter or digit.")
    return name


class Table:
    """One table of a buffer: how items are sampled, evicted and rate limited.

    Args:
      name: Unique within the server; letters, digits, ``_ . -``.
      sampler: The selector that picks sampled items (``shmreplay.selectors``).
      remover: The selector that picks the item to evict when ``max_size`` is exceeded.
        It may pick the item that was just inserted (e.g. ``Lifo`` or ``MinHeap``).
      max_size: The maximum number of items.
      rate_limiter: A ``shmreplay.rate_limiters`` limiter.
      max_times_sampled: Remove an item once it has been sampled this many times
        (``0`` or less: never, as in Reverb). The sample that reaches the limit still
        returns the item.
      signature: Optional nest of specs (``TensorSpec``, ``tf.TensorSpec``, ...) fixing
        each column's shape and dtype. Without one, the first inserted item fixes them.
        A ``None`` first (time) dimension takes writer items of any length there.
      max_steps: shmreplay's own, for writer items of any length (no signature, or a
        ``None`` time dimension): how many distinct steps the table's shared memory
        holds (None: room for ``max_size`` items twice as long as the first). An item
        that does not fit makes the remover evict items, as ``max_size`` does
        (``docs/writers.md``).
      arena_bytes: shmreplay's own keyword (keyword-only): bytes of shared memory for
        items that the table's columns cannot hold (another structure, dtype or shape,
        strings), its general store. Reverb allocates each item on its heap; a shared
        segment has a fixed size, so it is chosen here. None: 1 MiB for a table
        without a signature. 0 turns it off: such items are then refused with
        ``SchemaError`` as before. A table with a signature has none (a value > 0
        raises ``ValueError``).

    Raises:
      ValueError: on an invalid name, a ``max_size`` outside 1 .. 2**40 - 1, a
        ``max_times_sampled`` outside int64, or a signature leaf that is not a spec with
        a fixed shape.
      TypeError: if ``sampler``/``remover``/``rate_limiter`` are of the wrong type, or
        ``max_size``/``max_times_sampled`` is not an integer.

    Once the table is passed to a ``Server``, ``info``, ``can_sample`` and
    ``can_insert`` report the live table.
    """

    # (a Table pickled before the keyword existed, in a checkpoint: the default)
    arena_bytes: Optional[int] = None
    max_steps: Optional[int] = None

    def __init__(self, name: str, sampler: selectors.ItemSelector,
                 remover: selectors.ItemSelector, max_size: int,
                 rate_limiter: rate_limiters.RateLimiter, max_times_sampled: int = 0,
                 extensions=(), signature=None, *, max_steps: Optional[int] = None,
                 arena_bytes: Optional[int] = None):
        self.name = validate_name(name, "Table", MAX_TABLE_NAME)
        for arg, value in (("sampler", sampler), ("remover", remover)):
            if not isinstance(value, selectors.ItemSelector):
                raise TypeError(
                    f"Table '{name}': {arg} must be a shmreplay.selectors selector, got {value!r}.")
        if not isinstance(rate_limiter, rate_limiters.RateLimiter):
            raise TypeError(
                f"Table '{name}': rate_limiter must be a shmreplay.rate_limiters limiter, "
                f"got {rate_limiter!r}.")
        _check_integer(name, "max_size", max_size, 1, MAX_SIZE)
        _check_integer(name, "max_times_sampled", max_times_sampled, -2**63, 2**63 - 1)
        if max_steps is not None:
            _check_integer(name, "max_steps", max_steps, 1, MAX_STEPS)
        self.max_steps = None if max_steps is None else int(max_steps)
        if extensions:
            raise ValueError(f"Table '{name}': table extensions are not supported by shmreplay.")
        self.sampler = sampler
        self.remover = remover
        self.max_size = int(max_size)
        self.rate_limiter = rate_limiter
        self.max_times_sampled = max(0, int(max_times_sampled))
        if arena_bytes is not None:
            _check_integer(name, "arena_bytes", arena_bytes, 0, 1 << 40)
        # shmreplay's own keyword: bytes of shared memory for items of another shape
        # than the table's columns (None: 1 MiB without a signature, else 0).
        self.arena_bytes = None if arena_bytes is None else int(arena_bytes)
        self.signature = None
        self.column_specs = None
        if signature is not None:
            self.signature, _, self.column_specs = specs.normalize_signature(signature, self.name)
            if arena_bytes and not (self.shapes_from_data or self.has_strings):
                raise ValueError(
                    f"Table '{name}': arena_bytes holds items of other shapes than the "
                    "table's columns; this signature fixes every item's shapes (a None "
                    "after the first dimension would leave some open). Leave one out.")
        self._engine = None  # set by the Server that owns this table

    @functools.cached_property  # (the signature never changes)
    def has_strings(self) -> bool:
        """Whether the signature has a string column (``tf.string``): every item then
        goes to the table's general store, which such a table has by default."""
        return self.signature is not None and any(
            specs.is_string_dtype(spec.dtype) for spec in self.column_specs)

    @functools.cached_property
    def shapes_from_data(self) -> bool:
        """Whether the table's first item fixes the shapes its columns store: it has no
        signature, or one with a None after some first dimension (``reset`` forgets
        them; items of other shapes go to the general store, ``arena_bytes``)."""
        return self.signature is None or any(map(specs.has_open_cells, self.column_specs))

    @classmethod
    def queue(cls, name: str, max_size: int, extensions=(), signature=None, *,
              arena_bytes: Optional[int] = None) -> "Table":
        """A FIFO queue: each item is sampled once, in insertion order.

        Inserts block while ``max_size`` unsampled items wait; samples block while empty.
        """
        return cls(name, selectors.Fifo(), selectors.Fifo(), max_size,
                   rate_limiters.Queue(max_size), max_times_sampled=1,
                   extensions=extensions, signature=signature, arena_bytes=arena_bytes)

    @classmethod
    def stack(cls, name: str, max_size: int, extensions=(), signature=None, *,
              arena_bytes: Optional[int] = None) -> "Table":
        """A LIFO stack: each item is sampled once, newest first. Blocks like ``queue``."""
        return cls(name, selectors.Lifo(), selectors.Lifo(), max_size,
                   rate_limiters.Stack(max_size), max_times_sampled=1,
                   extensions=extensions, signature=signature, arena_bytes=arena_bytes)

    def replace(self, name: Optional[str] = None, sampler=None, remover=None,
                max_size: Optional[int] = None, rate_limiter=None,
                max_times_sampled: Optional[int] = None, extensions=None,
                signature=None, *, arena_bytes: Optional[int] = None) -> "Table":
        """Returns a new, unbound table with some settings replaced."""
        return Table(
            name=self.name if name is None else name,
            sampler=self.sampler if sampler is None else sampler,
            remover=self.remover if remover is None else remover,
            max_size=self.max_size if max_size is None else max_size,
            rate_limiter=self.rate_limiter if rate_limiter is None else rate_limiter,
            max_times_sampled=(self.max_times_sampled if max_times_sampled is None
                               else max_times_sampled),
            signature=self.signature if signature is None else signature,
            arena_bytes=self.arena_bytes if arena_bytes is None else arena_bytes)

    # --- live handle -----------------------------------------------------------------

    def _live(self):
        if self._engine is None:
            raise RuntimeError(
                f"Table '{self.name}' is not served yet: pass it to shmreplay.Server first.")
        return self._engine

    @property
    def info(self):
        """A ``TableInfo`` snapshot (the configuration only, until served)."""
        if self._engine is None:
            # local: config objects stay import-light
            from shmreplay._engine import table_info as _table_info
            return _table_info.static_info(self)
        return self._engine.info()

    def can_sample(self, num_samples: int) -> bool:
        """Whether the rate limiter would allow ``num_samples`` samples now."""
        return self._live().can_sample(num_samples)

    def can_insert(self, num_inserts: int) -> bool:
        """Whether the rate limiter would allow ``num_inserts`` inserts now."""
        return self._live().can_insert(num_inserts)

    def __repr__(self):
        return (f"Table(name={self.name!r}, sampler={self.sampler!r}, remover={self.remover!r}, "
                f"max_size={self.max_size}, rate_limiter={self.rate_limiter!r}, "
                f"max_times_sampled={self.max_times_sampled})")

    def __getstate__(self):  # a config travels without its live engine
        state = dict(self.__dict__)
        state["_engine"] = None
        return state


def _check_integer(table: str, argument: str, value, low: int, high: int):
    """Refuses a ``value`` that is not an integer in ``low .. high`` (a bool, a float with
    a fraction, text), naming the table and the argument."""
    try:
        whole = int(value) == value and not isinstance(value, (bool, str, bytes))
    except (TypeError, ValueError, OverflowError):  # int(None), int("x"), int(inf)
        whole = False
    if not whole:
        raise TypeError(f"Table '{table}': {argument} must be an integer, got "
                        f"{type(value).__name__} {value!r}.")
    if not low <= int(value) <= high:
        raise ValueError(f"Table '{table}': {argument} must be an integer in {low} .. "
                         f"{high}, got {int(value)}.")

"""Writer items the table's columns cannot hold, for its general store.

A table without a signature (or whose signature leaves some dimensions open) stores
``insert`` items of other shapes, dtypes or structures, and strings, whole in its
general store (``shmreplay._engine.kinds.general``). Writers' items go there too, as in
Reverb where any item goes into such a table: an item that does not fit the columns
the table's first item defined is stacked from its steps (the writer keeps each step's
values) and stored whole, with its episode. Its steps are not shared with other items:
the general store is for the unusual item, the columns stay the fast path.
"""

from shmreplay import errors, specs
from shmreplay._engine.kinds import general as _general
from shmreplay._schema import general_codec as _codec
from shmreplay._schema import item_forms as _item_forms
from shmreplay._schema import open_shapes as _open_shapes
from shmreplay._schema import storage as _storage
from shmreplay._writers import one_item as _one_item


class GeneralPlan:
    """How items of one shape go into a table's general store (``plan_item``'s answer
    when the columns refuse them)."""

    general = True
    uniform = False  # (never the writers' shortcut over shared steps)
    steps = False

    def __init__(self, engine, treedef, paths, per_step: bool, refused):
        self.generation = engine.layout_gen
        self.treedef, self.paths, self.per_step = treedef, paths, per_step
        self.refused = refused  # (the columns' reason, for an item that fits nothing)


def plan(engine, treedef, columns, paths, per_step: bool, refused) -> GeneralPlan:
    """A plan for the general store if the table has one and may hold the item;
    ``refused`` (the columns' refusal) otherwise.

    A table whose first item this is, and which cannot define columns for it (strings,
    say), gets a storage of no columns, so that every item goes to its store.
    """
    config = engine.config
    arena_bytes = _general.arena_bytes_of(config)
    if not arena_bytes or not (config.shapes_from_data or config.has_strings):
        raise refused  # (a fixed signature is the items' contract)
    if not engine.has_columns():
        if config.signature is not None and not config.has_strings:
            raise refused  # (the first item settles an open signature's columns)
        _encode(engine, treedef, columns, refused)  # (refused if it cannot be stored)
        engine.define_storage(_storage.whole_items((), arena_bytes))
    if engine.arena is None:
        raise refused  # (another process defined storage without a store first)
    _encode(engine, treedef, columns, refused)  # (refused if it fits no signature)
    return GeneralPlan(engine, treedef, paths, per_step, refused)


def insert(engine, plan: GeneralPlan, columns, priority: float, timeout, stays):
    """Stores one planned item whole in ``engine``'s general store; returns its key.

    Raises:
      DeadlineExceededError: the rate limiter did not admit it within ``timeout``
        (nothing stored).
      ArenaFullError: the item is larger than the whole store.
    """
    blob = _encode(engine, plan.treedef, columns, plan.refused)
    slots = engine.arena.reserve([blob], timeout)
    squeezed = sum(1 << i for i, column in enumerate(columns[:62]) if column.squeeze)
    return _one_item.commit(engine, slots, lambda: engine.arena.write(slots, [blob]),
                            priority, timeout, stays, _item_forms.AS_WRITTEN | squeezed)


def _encode(engine, treedef, columns, refused) -> bytes:
    """The item's bytes: each column stacked from its steps (a squeezed one is its one
    step), in the signature's forms if the table has one."""
    values = _one_item.stacked(columns)
    if engine.config.signature is not None:
        item = _open_shapes.signature_item(engine, values, treedef, False, refused)
    else:
        item = specs.optree.tree_unflatten(treedef, values)
    try:
        return _codec.encode(item, engine.name)
    except errors.SchemaError:
        raise refused from None

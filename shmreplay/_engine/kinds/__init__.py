"""Storage kinds: how a table's data segment holds its items, one module per kind.

* ``whole_items``: one row per slot and column (``Client.insert`` defined the storage).
* ``step_refs``: shared step rows that items reference (a writer defined it).
* ``any_length``: the same, for items of any length (a signature's ``None`` time
  dimension): each item's references in a chain of pool blocks.

Each is a ``base.StorageKind``: what the engine needs of a kind, and nothing else. A
new kind (say, variable-length step references) is a new module here and one line in
``mapped``; the storage description (``shmreplay._schema.storage``) says which it is.
"""

from shmreplay._engine.kinds.any_length import AnyLength
from shmreplay._engine.kinds.step_refs import StepRefs
from shmreplay._engine.kinds.whole_items import WholeItems


def mapped(engine, segment, plan):
    """The kind of ``engine.storage``, mapped for ``engine`` over the data ``segment``."""
    storage = engine.storage
    kind = (AnyLength if storage.variable else StepRefs) if storage.steps else WholeItems
    return kind(engine, segment, plan)

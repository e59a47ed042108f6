"""The general insert path: one item or a batch, into one or more tables, all or none.

``Client.insert`` and ``insert_batch`` take a shorter path for the common case (one
table, data already in its columns' shapes and dtypes); everything else comes here,
where the data is converted and checked against every table first.
"""

import time
from typing import Optional

from shmreplay import errors, specs
from shmreplay._schema import inputs as _inputs
from shmreplay._schema import item_forms as _item_forms


def insert(engine_of, data, priorities, timeout, batched: bool):
    """``Client.insert``'s and ``insert_batch``'s general path: ``data`` (one item, or
    a batch) into every table named in ``priorities``, all or none; returns the keys.

    ``engine_of(table)`` is the table's engine. Everything is checked before anything
    changes (a table's first item defines its storage first); then a slot in every
    table is reserved, the data copied, and each table's items committed.
    """
    if not isinstance(priorities, dict) or not priorities:
        raise errors.InvalidPriorityError(
            f"priorities must be a non-empty dict {{table_name: priority}}, got {priorities!r}.")
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    leaves, treedef = specs.flatten(data)
    count = _inputs.batch_size(leaves, treedef) if batched else 1
    # Validate everything before changing anything (columns included).
    plans = []
    for table, priority in priorities.items():
        engine = engine_of(table)
        prios = _inputs.check_priorities(engine, priority, count)
        arrays, proposal, form = _inputs.prepare_leaves(engine, leaves, treedef, batched)
        _inputs.check_batch_fits(engine, count)
        plans.append([engine, arrays, prios, proposal, form])
    for plan in plans:
        engine, proposal = plan[0], plan[3]
        if proposal is not None:  # a table's first item fixes its storage
            engine.define_storage(proposal, timeout)
            plan[1], _, plan[4] = _inputs.prepare_leaves(engine, leaves, treedef, batched)
    reserved = _reserve_in_every_table([plan[0] for plan in plans], [plan[1] for plan in plans],
                                       count, deadline, timeout)
    try:
        for (engine, arrays, *_), (slots, rows) in zip(plans, reserved):
            engine.write_items(slots, rows, arrays, batched)
    except BaseException:
        for (engine, *_), (slots, _) in zip(plans, reserved):
            engine.cancel(slots)
        raise
    keys = {}
    # The first commit honours the timeout if the table's lock stays held (by a stopped
    # process, say): the call then gives every reservation up. Once one table has the
    # item, the others wait for their locks as long as it takes (Ctrl-C still works):
    # an item is in every table it names or in none.
    for i, ((engine, _, prios, _, form), (slots, _)) in enumerate(zip(plans, reserved)):
        try:
            committed = engine.commit(slots, prios, deadline if i == 0 else None, timeout)
        except BaseException:
            for (later, *_), (later_slots, _) in zip(plans[i + 1:], reserved[i + 1:]):
                later._abandoned.extend(int(slot) for slot in later_slots)
            raise
        _item_forms.record(engine, committed, form)
        keys[engine.name] = committed if batched else int(committed[0])
    return keys


def _reserve_in_every_table(engines, arrays, count: int, deadline, timeout: Optional[float]):
    """``count`` slots in each table (``engine.reserve_items``, for its ``arrays``), all or
    none.

    Only one table is ever waited on, and nothing is held while waiting: holding one
    table's slots while waiting for another's rate limiter could deadlock two inserts
    that name the same tables in other orders. The others are taken without waiting;
    if one refuses, everything is handed back and that table is waited on next.

    Raises:
      DeadlineExceededError: ``deadline`` passed (``timeout`` names it); nothing is
        reserved.
    """
    first = 0
    while True:
        reserved = [None] * len(engines)
        refused = None
        try:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                reserved[first] = engines[first].reserve_items(count, remaining, arrays[first])
            except errors.LockTimeoutError:
                raise
            except errors.DeadlineExceededError:
                raise errors.DeadlineExceededError(  # name the caller's timeout, not the rest
                    f"Table '{engines[first].name}': the rate limiter did not allow the "
                    f"insert within the timeout of {errors.seconds(timeout)}.") from None
            for i, engine in enumerate(engines):
                if reserved[i] is None:
                    try:
                        reserved[i] = engine.reserve_items(count, 0.0, arrays[i])
                    except errors.DeadlineExceededError:
                        refused = i
                        break
        except BaseException:
            _cancel_reserved(engines, reserved)
            raise
        if refused is None:
            return reserved
        _cancel_reserved(engines, reserved)
        first = refused


def _cancel_reserved(engines, reserved):
    for engine, got in zip(engines, reserved):
        if got is not None:
            engine.cancel(got[0])


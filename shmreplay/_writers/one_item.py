"""One writer item stored whole (not as references to shared steps): its columns
stacked from the steps the writer keeps, then reserved, written and committed. Used for
tables of whole items (``writing``) and for a table's general store
(``general_items``)."""

import time

import numpy as np

from shmreplay._schema import item_forms as _item_forms


def stacked(columns) -> list:
    """Each column's values: its one step if squeezed, else its steps stacked."""
    return [column.refs[0].value if column.squeeze
            else np.stack([ref.value for ref in column.refs]) for column in columns]


def commit(engine, slots, write, priority: float, timeout, stays, form: int) -> int:
    """``write()`` into the reserved ``slots`` (one), its episode recorded (``stays``, an
    ``episode_stays.EpisodeStays``), then the commit; the slots are given back if anything
    before the commit fails. Returns the key."""
    try:
        write()
        repeats = stays.record(engine, int(slots[0]))
    except BaseException:
        engine.cancel(slots)
        raise
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    key = int(engine.commit(slots, np.array([priority], np.float64), deadline, timeout,
                            repeats)[0])
    stays.committed()
    _item_forms.record(engine, key, form)
    return key

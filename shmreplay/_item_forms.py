"""How an item looks to Reverb's own calls (``Client.sample``), whatever form it was
stored in.

Reverb keeps a time dimension on every column that is not squeezed: an ``insert`` item
is a trajectory of one step (``[1, ...]``), as are the legacy ``Writer``'s items and a
``TrajectoryWriter``'s ``[-1:]`` windows; a squeezed ``history[k][-1]`` column has none.
shmreplay's own calls (``sample_batch``, datasets) return the table's layout instead;
this module maps the stored columns back to Reverb's view of each item.
"""


from shmreplay import specs


def reverb_columns(engine, batch) -> list:
    """The flat columns of the one-item ``batch`` sampled from ``engine``, each as
    Reverb would return it."""
    leaves = specs.flatten(batch.data)[0]
    if engine.storage.steps:
        return [leaf[0, ...] for leaf in leaves]
    # Whole items were inserted (or written as one step): a time dimension of 1.
    return [leaf[0:1] for leaf in leaves]


def unflattener(engine):
    """``columns -> nest`` in the table's structure."""
    return engine._unflatten

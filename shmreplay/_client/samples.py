"""One sampled item as Reverb's ``Client.sample`` yields it (``Client.sample``'s job)."""

from shmreplay._schema import inputs as _inputs
from shmreplay._schema import item_forms as _item_forms
from shmreplay._schema import open_shapes as _open_shapes
from shmreplay.replay_sample import ReplaySample, SampleInfo


def as_reverb(engine, batch, arena_rows, emit_timesteps: bool, unpack_as_table_signature: bool):
    """The one-item ``batch`` of ``engine`` (``arena_rows``: the item, if it is one of
    another shape) as a ``ReplaySample`` of Python scalars and Reverb's columns, or with
    ``emit_timesteps`` a list of one per timestep.

    Raises:
      ValueError: ``emit_timesteps`` on columns of different lengths (Reverb's error).
    """
    info = SampleInfo(*(_inputs.scalar(field[0]) for field in batch.info))
    if arena_rows:  # an item of another shape: its own leaves, as Reverb's view
        leaves = arena_rows[0][1]
        timed = _item_forms.timed_columns(_item_forms.form_of(engine, int(batch.info.key[0])),
                                          len(leaves))
        if timed is not None:  # a writer's item: its columns as they were made
            timed = [True] * len(leaves)
        else:
            timed = _open_shapes.timed_leaves(engine, len(leaves))
        columns = [leaf if has_time else leaf[None] for leaf, has_time in zip(leaves, timed)]
    else:
        columns = _item_forms.reverb_columns(engine, batch)
    # As in Reverb: unpacked only for a table with a signature, else flat.
    unpack = unpack_as_table_signature and engine.config.signature is not None
    unflatten = _item_forms.unflattener(engine) if unpack else list
    if unpack and arena_rows:  # (a general store item of a signature's table: its nest)
        unflatten = _open_shapes.signature_unflattener(engine)
    if not emit_timesteps:
        return ReplaySample(info, unflatten(columns))
    # Reverb splits every column along its first dimension (a squeezed column included)
    # and refuses columns of different lengths.
    if len({len(column) for column in columns}) != 1:
        raise ValueError("Can't split non timestep trajectory into timesteps.")
    return [ReplaySample(info, unflatten([column[t, ...] for column in columns]))
            for t in range(len(columns[0]))]

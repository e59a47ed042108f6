"""Whether a writer's item fits its table, and the storage a table's first item defines.

Both writers build items of ``shmreplay._writers.writing.ItemColumn``s (step references);
these checks run once per item shape (``_writing.plan_item`` caches the result), so they
may explain at length. The table's layout comes from its storage, else its declared
signature; a one-step column fits either form of a one-step stored column, and the item's
form says which (``shmreplay._schema.item_forms``).
"""

import dataclasses

from shmreplay import errors, specs
from shmreplay._engine.kinds import general as _general
from shmreplay._schema import item_forms as _item_forms
from shmreplay._schema import open_shapes as _open_shapes
from shmreplay._schema import storage as _storage


def check_column(column, table: str, where: str):
    """Every reference of a column must hold values of one shape and of one dtype that
    a column stores (strings go to the general store: ``_writers.general_items``)."""
    first = column.refs[0]
    specs.check_storable_dtype(first.value.dtype, f"Table '{table}', column {where}")
    for ref in column.refs:
        if ref.value.dtype != first.value.dtype or ref.value.shape != first.value.shape:
            raise errors.SchemaError(
                f"Table '{table}', column {where}: its steps mix {first.value.dtype}"
                f"{list(first.value.shape)} and {ref.value.dtype}{list(ref.value.shape)}.")


def item_specs(columns: list):
    """The TensorSpec each column of the item is sampled with (no batch dimension)."""
    out = []
    for column in columns:
        ref = column.refs[0]
        shape = ref.value.shape if column.squeeze else (len(column.refs),) + ref.value.shape
        out.append(specs.TensorSpec(shape, ref.value.dtype))
    return out


def check_rows_fit(engine, storage, columns: list):
    """Raises SchemaError, before a table's first item fixes its storage, if that item
    needs more step rows than the storage would have (a row per distinct step of the
    shared columns, one per reference of a mixed column)."""
    shared = {ref.uid for column in columns if column.source is not None
              for ref in column.refs}
    needed = len(shared) + sum(len(c.refs) for c in columns if c.source is None)
    rows = storage.row_capacity(engine.capacity)
    if needed > rows:
        sized = ("its step budget, max_steps" if storage.variable
                 else f"sized for {storage.steps_per_item} steps per item")
        raise errors.SchemaError(
            f"Table '{engine.name}': the item references {needed} distinct steps, more "
            f"than the step storage it would define can hold ({rows} rows: {sized}). "
            "Nothing was stored.")


def validate_item(engine, treedef, columns: list, paths: list[str],
                  per_step: bool = False):
    """Checks an item against the table's items; returns the storage to define, or None.

    A one-step column fits a column the table stores with or without a time dimension
    of 1 (as in Reverb, where both go into one table); the item's form records which
    (``shmreplay._schema.item_forms``). Before the table stores anything, its signature
    decides the layout, matched by flattened leaves; with ``per_step`` (the legacy
    ``Writer``) a column of ``T`` steps also matches a signature spec of one step, and
    then takes items of any length, as in Reverb.

    Raises:
      SchemaError: if the item's structure, shapes or dtypes differ from the table's.
    """
    table = engine.name
    for column, path in zip(columns, paths):
        check_column(column, table, path)
    got = item_specs(columns)
    layout = engine.known_layout()
    if layout is None:
        # No signature: as in Reverb, later items may have other lengths than this one
        # (each column its own), so the table stores items of any length.
        lengths = [len(c.refs) for c in columns]
        squeezes = [c.squeeze for c in columns]
        stored = [specs.TensorSpec(cell.shape if squeeze else (None,) + cell.shape, cell.dtype)
                  for cell, squeeze in zip(_cells(columns), squeezes)]
        storage = _storage.step_storage(specs.optree.tree_unflatten(treedef, stored),
                                        _cells(columns), lengths, squeezes,
                                        [c.source for c in columns])
        return _variable(engine, storage, columns, lengths)
    expected_treedef, expected_specs, _ = layout
    if not specs.same_structure(treedef, expected_treedef):
        problems, _ = specs.structure_mismatch(treedef, expected_treedef, expected_specs)
        mismatch = errors.SchemaError(
            f"Table '{table}': the item does not match the structure of the table's "
            f"items: {'; '.join(problems)}.")
        if (engine.config.signature is None or not specs.positional(treedef)
                or len(columns) != len(expected_specs)):
            raise mismatch
        try:  # Reverb matches a signature by flattened leaves
            return validate_item(engine, expected_treedef, columns, paths, per_step)
        except errors.SchemaError:
            raise mismatch from None
    if engine.has_columns():
        item_form(engine, columns, got, paths)  # raises if a column does not fit
        return None
    # Only the signature so far: the item defines step storage in the signature's layout.
    lengths, squeezes = [], []
    variable = [specs.varies_in_time(want) for want in expected_specs]
    fits = specs.compatible  # (a signature's None after the first dimension: any size)
    for index, (spec, want, path, column) in enumerate(zip(got, expected_specs, paths,
                                                           columns)):
        cell = column.refs[0].value.shape
        length, squeeze = len(column.refs), column.squeeze
        if spec.dtype != want.dtype:
            raise _mismatch(table, path, spec, want)
        if (per_step and not squeeze and not fits(spec.shape, want.shape)
                and fits(spec.shape[1:], want.shape)):
            # The legacy Writer's items against a signature of one step: Reverb takes
            # them at any length, so the column has any length.
            variable[index] = True
        elif length == 1 and (fits(cell, want.shape) or fits((1,) + cell, want.shape)):
            squeeze = fits(cell, want.shape)  # the signature's form of a one-step column
        elif not (fits(spec.shape, want.shape) or (
                variable[index] and not squeeze and fits(spec.shape[1:], want.shape[1:]))):
            raise _mismatch(table, path, spec, want)
        lengths.append(length)
        squeezes.append(squeeze)
    stored = [specs.TensorSpec(cell.shape if squeeze
                               else (None if any_length else length,) + cell.shape, cell.dtype)
              for cell, length, squeeze, any_length
              in zip(_cells(columns), lengths, squeezes, variable)]
    storage = _storage.step_storage(specs.optree.tree_unflatten(expected_treedef, stored),
                                    _cells(columns), lengths, squeezes,
                                    [c.source for c in columns])
    if not any(variable):
        return _with_arena(engine, storage)
    return _variable(engine, storage, columns, lengths)


def _variable(engine, storage, columns, lengths):
    """``storage`` made one of items of any length, sized by this first item."""
    distinct = len({ref.uid for column in columns for ref in column.refs})
    return _with_arena(engine, _storage.variable_step_storage(
        storage, engine.capacity, distinct, sum(lengths),
        getattr(engine.config, "max_steps", None), engine.name))


def _with_arena(engine, storage):
    """``storage`` with the general store the table gets (items of other shapes)."""
    return dataclasses.replace(storage, arena_bytes=_general.arena_bytes_of(engine.config))


def item_form(engine, columns: list, got, paths) -> int:
    """The form of an item for ``engine``'s storage (``shmreplay._schema.item_forms``).

    Raises:
      SchemaError: a column fits the stored one in neither form.
    """
    bits = []
    for spec, want, (kind, stored), path, column in zip(
            got, engine.column_specs, _item_forms.column_kinds(engine), paths, columns):
        bit = _item_forms.flip_bit(kind, stored, spec.shape) if spec.dtype == want.dtype else None
        if bit is None:
            if spec.dtype != want.dtype or spec.shape != want.shape or column.squeeze:
                raise _mismatch(engine.name, path, spec, want,
                                _open_shapes.explain(engine, path, spec, want))
            bit = 0  # (the legacy Writer's sequences into a table of whole items)
        bits.append(bit)
    return _item_forms.mask(bits, engine.name, paths)


def _cells(columns: list):
    return [specs.TensorSpec(c.refs[0].value.shape, c.refs[0].value.dtype) for c in columns]


def _mismatch(table, path, spec, want, why=""):
    return errors.SchemaError(
        f"Table '{table}', column {path}: the item has {spec.dtype}{list(spec.shape)}, "
        f"the table's items have {want.dtype}{list(want.shape)}.{why}")

"""Restoring a checkpoint into the tables of a new Server (before clients can attach).

Tables are matched by name (``tables_to_serve``); each one gets its items, their keys
and counters (``restore_table``). Every value read from the file is checked before it
reaches a kernel, and every array's checksum (format 3 on) before the table is served.
"""

import dataclasses
import errno
import warnings
from typing import Dict, List

import numpy as np

from shmreplay._shm import layout as L
from shmreplay import errors, specs
from shmreplay._schema import item_forms as _item_forms
from shmreplay._engine.kinds import general as _general
from shmreplay._ops.checkpoint_read import Checkpoint, TableCheckpoint
from shmreplay._shm.kernels import table as kernels
from shmreplay._engine.snapshot import ITEM_FIELDS


def tables_to_serve(checkpoint: Checkpoint, tables, override_config: bool):
    """The Table objects a restoring Server serves.

    With no ``tables``, the checkpoint's. Otherwise the given ones, matched with the
    checkpoint's tables by name; unless ``override_config``, a matched table takes the
    checkpoint's configuration (Reverb's behaviour), with a warning when it differs.
    """
    if not tables:
        return [t.config.replace() for t in checkpoint.tables]
    names = {t.name for t in tables}
    ignored = [t.name for t in checkpoint.tables if t.name not in names]
    if ignored:
        warnings.warn(f"Checkpoint {checkpoint.path}: tables {ignored} are not among the "
                      "Server's tables and are not restored.", stacklevel=3)
    if override_config:
        return list(tables)
    for table in tables:
        saved = checkpoint.table(table.name)
        if saved is None:
            continue
        differences = _config_differences(table, saved.config)
        if differences:
            warnings.warn(
                f"Table '{table.name}' is restored with the checkpoint's configuration "
                f"({'; '.join(differences)}). Pass override_config=True to keep the "
                "configuration given to the Server.", stacklevel=3)
        for field in ("sampler", "remover", "max_size", "rate_limiter", "max_times_sampled",
                      "signature", "column_specs"):
            setattr(table, field, getattr(saved.config, field))
    return list(tables)


def _config_differences(table, saved) -> List[str]:
    differences = []
    for field in ("sampler", "remover", "max_size", "rate_limiter", "max_times_sampled"):
        mine, theirs = getattr(table, field), getattr(saved, field)
        if repr(mine) != repr(theirs):
            differences.append(f"{field} {theirs!r} instead of {mine!r}")
    if _signature_key(table.signature) != _signature_key(saved.signature):
        differences.append(f"signature {saved.signature} instead of {table.signature}")
    return differences


def _signature_key(signature):
    """What makes two signatures the same: their paths, shapes and dtypes."""
    if signature is None:
        return None
    leaves, tree = specs.flatten(signature)
    return (specs.path_strings(tree), [(tuple(s.shape), np.dtype(s.dtype)) for s in leaves])


def restore_table(engine, saved: TableCheckpoint, reset_rate_limiter: bool) -> int:
    """Fills a new, empty table from a checkpoint (see ``_restore_checked``); every
    array's checksum is checked before this returns: the data columns' as they are
    read, the others' in a second thread meanwhile.

    The data segment's stores (the rows restored, or more: ``_engine.growth``) are
    reserved by a second thread while the main one reads into them (``Segment.create(..., later=...)``), and this waits for it: the
    two overlap on two cores (a checkpoint of 20,000 frames restored in 0.55 s instead
    of 0.9 s), and /dev/shm filling up meanwhile is an error here, never SIGBUS: the
    stores are written only by ``preadv`` (EFAULT) or after the reservation.

    Raises:
      CheckpointError: naming the array, if one is damaged.
      SharedMemoryFullError: if /dev/shm filled up during the restore.
    """
    try:
        with saved.checking():
            evicted = _restore_checked(engine, saved, reset_rate_limiter)
    except BaseException as exc:
        if engine.data_segment is not None:
            try:  # (bounded: the thread only reserves what is left)
                engine.data_segment.wait_reserved()
            except Exception as full:
                # /dev/shm filled up: a page of a store could not be had (EFAULT).
                if isinstance(exc, OSError) and exc.errno == errno.EFAULT:
                    raise full from exc
        raise
    if engine.data_segment is not None:
        engine.data_segment.wait_reserved()
    return evicted


def _restore_checked(engine, saved: TableCheckpoint, reset_rate_limiter: bool) -> int:
    """Fills a new, empty table (not yet visible to other processes) from a checkpoint.

    The table is not visible to other processes yet: values that only the checksums can
    show to be damaged may reach its memory, as the restore fails before it is served.
    Values a kernel relies on are checked here first.

    Keys are kept when the table has the checkpoint's slot layout (the same capacity
    and key bits); otherwise items get new keys, which no key issued before the
    checkpoint can name. Items beyond the new ``max_size`` are evicted
    by the remover. Returns the number evicted.

    Raises:
      SchemaError: if the table's signature does not match the checkpoint's items.
      ValueError: if the table cannot hold the checkpoint's items.
      CheckpointError: if the checkpoint's arrays are inconsistent (damaged).
    """
    count = saved.num_items
    storage = saved.storage
    fields = _checked_items(saved)
    if storage is not None:
        _check_signature(engine, storage)
    counters = dict(saved.counters)
    if "C_EPISODE_REPEATS" not in counters:  # (an older format: none deleted so far)
        counters["C_EPISODE_REPEATS"] = counters["C_TOTAL_INSERTED"] - _distinct_episodes(saved)
    if reset_rate_limiter:
        counters.update(C_INSERTS=count, C_SAMPLES=0, C_DELETES=0)
    if count > engine.capacity:
        raise ValueError(
            f"Table '{engine.name}': the checkpoint holds {count} items, more than a table "
            f"of max_size {engine.config.max_size} has room for ({engine.capacity} slots).")
    invalid = kernels.first_invalid_priority(fields["priority"], engine.max_priority)
    if invalid >= 0:
        raise errors.CheckpointError(
            f"Table '{engine.name}': the checkpoint's priority {fields['priority'][invalid]} "
            f"is above the largest this table's selectors allow ({engine.max_priority}).")
    keys = fields["key"]
    bits = int(engine.ctrl[L.C_SLOT_BITS])
    if engine.capacity == saved.capacity and bits == saved.slot_bits:
        slots = keys & ((1 << bits) - 1)
    else:
        slots = np.arange(count, dtype=np.int64)
        ids = keys >> saved.slot_bits
        if bits != saved.slot_bits:
            # Keys the checkpointed run issued are below NEXT_ID << its slot bits: new
            # item ids start where none of them, read with these bits, can reach.
            next_id = counters["C_NEXT_ID"]
            first = max(next_id, ((next_id << saved.slot_bits) >> bits) + 1)
            if (first + count) << bits >= 1 << 63:
                raise ValueError(f"Table '{engine.name}': no keys left for the restored items.")
            ids = first + slots
            counters["C_NEXT_ID"] = first + count
        keys = (ids << bits) | slots
    rows = slice(int(slots[0]), int(slots[0]) + count) if (
        count and kernels.ascending_run(slots)) else slots
    if storage is not None:
        # The general store is sized by the table being served, not the checkpointed one.
        storage = dataclasses.replace(storage, arena_bytes=_general.arena_bytes_of(engine.config))
        # The stores' rows it fills are reserved (``_engine.growth``); the rest as it grows.
        if storage.steps:
            filled = int(saved.layout["store0"][2][0]) if "store0" in saved.layout else 0
        else:
            filled = int(slots.max()) + 1 if count else 0
        engine._create_data_segment(storage, filled)
        engine.kind.restore(saved, rows, count)
    for name, value in counters.items():
        engine.ctrl[getattr(L, name)] = value
    fresh = int(slots.max()) + 1 if count else 0
    evicted = kernels.restore_items(
        *engine.arrays, slots, keys, fields["order"], fields["update"], fields["times"],
        fields["priority"], fresh, np.zeros(2, np.float64))
    if evicted < 0:
        engine._raise_status(evicted)
    if storage is not None and "forms" in saved.layout:  # (older checkpoints have none)
        forms = saved.array("forms")
        for index in np.flatnonzero(forms).tolist():
            _item_forms.record(engine, int(keys[index]), int(forms[index]))
    if storage is not None and "arena_lengths" in saved.layout:
        _general.restore(engine, slots, saved.array("arena_lengths"), saved.array("arena_data"))
    _restore_episodes(engine, saved, slots)
    return evicted


def _restore_episodes(engine, saved: TableCheckpoint, slots):
    """Ties restored items to their writers' episodes again (``_layout``'s records;
    ``restore_items`` gave each slot a new version). A format 1 checkpoint has no
    episodes: each of its items is its own."""
    if "episode" not in saved.layout or not saved.num_items:
        return
    episodes = np.array(saved.array("episode"))
    mine = episodes >= 0
    slots = np.asarray(slots)[mine]
    engine.episodes[slots, L.E_EPISODE] = episodes[mine]
    engine.episodes[slots, L.E_VERSION] = engine.meta[slots, L.M_VERSION]
    if slots.size:
        engine.ctrl[L.C_EPISODES_RECORDED] = 1


def _distinct_episodes(saved: TableCheckpoint) -> int:
    """How many episodes the checkpoint's items belong to (each item without a writer's
    episode its own)."""
    if "episode" not in saved.layout or not saved.num_items:
        return saved.num_items
    episodes = np.array(saved.array("episode"))
    return int(np.count_nonzero(episodes < 0) + np.unique(episodes[episodes >= 0]).size)


def _damaged(saved: TableCheckpoint, problem: str) -> errors.CheckpointError:
    return errors.CheckpointError(f"Checkpoint {saved.path}: table '{saved.name}' {problem}.")


def _checked_items(saved: TableCheckpoint) -> Dict[str, np.ndarray]:
    """The items' fields, read into memory and checked against each other and the
    counters: the kernels trust what they get, the checksums are checked only at the end
    (and format 1 and 2 files have none)."""
    fields = {name: np.array(saved.array(name)) for name in (*ITEM_FIELDS, "priority")}
    keys, orders = fields["key"], fields["order"]
    bits, counters = saved.slot_bits, saved.counters
    slots = keys & ((1 << bits) - 1)
    ids = keys >> bits
    if saved.num_items:
        if ids.min() < 1 or ids.max() >= counters["C_NEXT_ID"] or slots.max() >= saved.capacity:
            raise _damaged(saved, "has invalid keys")
        taken = np.zeros(saved.capacity, np.bool_)
        taken[slots] = True
        if int(taken.sum()) != saved.num_items:
            raise _damaged(saved, "has two items in one slot")
        if (orders[0] < 0 or orders[-1] >= counters["C_ORDER_SEQ"]
                or (np.diff(orders) <= 0).any()):
            raise _damaged(saved, "has items out of insertion order")
        update = fields["update"]
        if update.min() < 0 or update.max() >= counters["C_UPDATE_SEQ"]:
            raise _damaged(saved, "has invalid update numbers")
        if fields["times"].min() < 0:
            raise _damaged(saved, "has negative sample counts")
        priority = fields["priority"]
        if not (priority >= 0).all():  # also NaN
            raise _damaged(saved, "has negative or NaN priorities")
    return fields


def _check_signature(engine, storage):
    signature = engine.config.signature
    if signature is None:
        return
    wanted, wanted_tree = specs.flatten(signature)
    saved, saved_tree = specs.flatten(storage.signature)
    same = (specs.path_strings(wanted_tree) == specs.path_strings(saved_tree)
            and [(s.shape, np.dtype(s.dtype)) for s in wanted]
            == [(s.shape, np.dtype(s.dtype)) for s in saved])
    if not same:
        raise errors.SchemaError(
            f"Table '{engine.name}': the checkpoint's items have signature "
            f"{storage.signature}, the table's signature is {signature}.")


"""Storage kinds (``shmreplay._engine.kinds``): each kind provides the whole interface,
and the engine calls the kind it mapped, without a kind test of its own."""

import numpy as np

import shmreplay
from shmreplay._engine.kinds import any_length, base, step_refs, whole_items

INTERFACE = [name for name, value in vars(base.StorageKind).items()
             if callable(value) and not name.startswith("__")]
DEFAULTS = {"put_row"}  # methods with a default that suits most kinds


def test_every_kind_provides_the_whole_interface():
    assert INTERFACE  # the scan found the methods
    assert set(INTERFACE) - DEFAULTS == set(base.StorageKind.__abstractmethods__)
    for kind in (whole_items.WholeItems, step_refs.StepRefs, any_length.AnyLength):
        missing = [name for name in set(INTERFACE) - DEFAULTS
                   if getattr(kind, name) is getattr(base.StorageKind, name)]
        assert missing == [], (kind.__name__, missing)


def test_the_engine_calls_the_kind_it_mapped_and_forgets_it_on_reset(buffer_name):
    with shmreplay.Server([shmreplay.Table.queue("q", 10)], name=buffer_name) as server, \
            shmreplay.Client(server.name) as client:
        engine = client._engine("q")
        client.insert({"x": np.arange(3, dtype=np.float32)}, {"q": 1.0}, timeout=1)
        assert engine.has_columns() and type(engine.kind) is whole_items.WholeItems
        for bound, method in (("reserve_items", "reserve_items"), ("write_items", "write_items"),
                              ("_gather", "gather")):
            assert getattr(engine, bound) == getattr(engine.kind, method)  # bound once
        assert client.server_info()["q"].num_stored_steps == 1
        client.reset("q")
        with client.trajectory_writer(2) as writer:
            for t in range(3):
                writer.append({"obs": np.full(2, t, np.float32)})
                if t:
                    writer.create_item("q", 1.0, {"obs": writer.history["obs"][-2:]})
        # (no signature: later items may have other lengths, as in Reverb)
        assert engine.has_columns() and type(engine.kind) is any_length.AnyLength
        assert engine.reserve_items == engine.kind.reserve_items
        assert client.server_info()["q"].num_stored_steps == 3  # rows 0, 1, 2: shared
        # Whole data into step storage gets rows of its own.
        client.insert({"obs": np.full((2, 2), 9, np.float32)}, {"q": 1.0}, timeout=1)
        obs = client.sample_batch("q", 3, timeout=1).data["obs"]
        assert obs[:, :, 0].tolist() == [[0, 1], [1, 2], [9, 9]]

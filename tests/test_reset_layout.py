"""``Client.reset`` on a table without a signature forgets the layout its first item
fixed (Reverb's tables take any item; Acme's and Reverb's own test classes reuse one
table for items of many shapes), in every process attached to it."""

import multiprocessing

import numpy as np
import pytest

import shmreplay
from shmreplay import errors
from shmreplay.specs import TensorSpec
import _names


def queue(signature=None):
    # (arena_bytes=0: refused, not stored whole in the general store; see test_general_items)
    return shmreplay.Table.queue("q", 20, signature=signature, arena_bytes=0)


def test_a_reset_table_takes_items_of_another_layout():
    with shmreplay.Server([queue()], name=_names.unique("reset")) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"x": np.ones(3, np.float32)}, {"q": 1.0}, timeout=1)
        with pytest.raises(errors.SchemaError):
            client.insert({"y": np.ones((2, 2), np.int64)}, {"q": 1.0}, timeout=1)
        client.reset("q")
        client.insert({"y": np.full((2, 2), 7, np.int64)}, {"q": 1.0}, timeout=1)
        batch = client.sample_batch("q", 1, timeout=1)
        assert batch.data["y"].tolist() == [[[7, 7], [7, 7]]]
        with pytest.raises(errors.SchemaError):  # the new layout is fixed in turn
            client.insert({"x": np.ones(3, np.float32)}, {"q": 1.0}, timeout=1)
        # Whole items, then a writer's sequences, then whole items again.
        client.reset("q")
        with client.trajectory_writer(3) as writer:
            for t in range(3):
                writer.append({"obs": np.full(2, t, np.float32)})
            writer.create_item("q", 1.0, {"obs": writer.history["obs"][-3:]})
        assert client.sample_batch("q", 1, timeout=1).data["obs"].shape == (1, 3, 2)
        client.reset("q")
        client.insert(np.int32(5), {"q": 1.0}, timeout=1)
        assert client.sample_batch("q", 1, timeout=1).data.tolist() == [5]
        assert client.verify("q") == []


def test_a_signature_is_never_forgotten():
    signature = {"x": TensorSpec((3,), np.float32)}
    with shmreplay.Server([queue(signature)], name=_names.unique("reset")) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"x": np.ones(3, np.float32)}, {"q": 1.0}, timeout=1)
        client.reset("q")
        with pytest.raises(errors.SchemaError):
            client.insert({"x": np.ones(4, np.float32)}, {"q": 1.0}, timeout=1)


def test_writers_plan_their_items_again_after_a_reset():
    with shmreplay.Server([queue()], name=_names.unique("reset")) as server, \
            shmreplay.Client(server.name) as client:
        writer = client.trajectory_writer(2)
        legacy = client.writer(2)
        for step in range(2):
            writer.append({"a": np.float32(step)})
            writer.create_item("q", 1.0, {"a": writer.history["a"][-1:]})
        writer.flush(timeout_ms=1000)
        client.reset("q")
        for step in range(2):  # the same writer, other fields and shapes
            writer.append({"b": np.full(4, step, np.int16)})
            writer.create_item("q", 1.0, {"b": writer.history["b"][-2:]} if step else
                               {"b": writer.history["b"][-1:]})
            if not step:
                writer.flush(timeout_ms=1000)
                client.sample_batch("q", 1, timeout=1)
                client.reset("q")  # the one-step layout goes too
        writer.flush(timeout_ms=1000)
        assert client.sample_batch("q", 1, timeout=1).data["b"].tolist() == [[[0] * 4, [1] * 4]]
        client.reset("q")
        legacy.append(np.float64(1.5))
        legacy.create_item("q", 1, 1.0)
        legacy.flush()
        client.reset("q")
        legacy.append(np.float64(2.5))
        legacy.append(np.float64(3.5))
        legacy.create_item("q", 2, 1.0)
        legacy.flush()
        assert client.sample_batch("q", 1, timeout=1).data.tolist() == [[2.5, 3.5]]
        writer.close()
        legacy.close()
        assert client.verify("q") == []


def test_a_slot_being_written_keeps_the_layout():
    with shmreplay.Server([queue()], name=_names.unique("reset")) as server, \
            shmreplay.Client(server.name) as client:
        client.insert({"x": np.ones(3, np.float32)}, {"q": 1.0}, timeout=1)
        engine = client._engine("q")
        slots = engine.reserve(1, 0)  # as a writer between reserving and committing
        with pytest.warns(UserWarning, match="keeps its layout"):
            client.reset("q")
        with pytest.raises(errors.SchemaError):
            client.insert({"y": np.ones(2, np.int64)}, {"q": 1.0}, timeout=1)
        engine.cancel(slots)
        client.reset("q")
        client.insert({"y": np.ones(2, np.int64)}, {"q": 1.0}, timeout=1)


def _attached_worker(name, commands, replies):
    """Runs commands from the parent in a process attached by name (stale mappings)."""
    with shmreplay.Client(name) as client:
        writer = client.trajectory_writer(2)
        while True:
            command = commands.get(timeout=30)
            if command == "stop":
                break
            try:
                if command == "insert-x":
                    client.insert({"x": np.full(3, 1.5, np.float32)}, {"q": 1.0}, timeout=5)
                    reply = "ok"
                elif command == "write-x":
                    writer.append({"x": np.full(3, 2.5, np.float32)})
                    writer.create_item("q", 1.0, {"x": writer.history["x"][-1]})
                    writer.flush(timeout_ms=5000)
                    reply = "ok"
                elif command == "write-y":
                    writer.append({"y": np.full((2, 2), 9, np.int64)})
                    writer.create_item("q", 1.0, {"y": writer.history["y"][-1:]})
                    writer.flush(timeout_ms=5000)
                    reply = "ok"
                elif command == "sample":
                    batch = client.sample_batch("q", 1, timeout=5)
                    reply = {key: value.tolist() for key, value in batch.data.items()}
            except Exception as exc:  # (reported to the parent, which fails the test)
                reply = f"{type(exc).__name__}: {exc}"
            replies.put(reply)
        writer.close()


def test_another_process_follows_the_new_layout():
    context = multiprocessing.get_context("spawn")
    commands, replies = context.Queue(), context.Queue()
    with shmreplay.Server([queue()], name=_names.unique("reset")) as server, \
            shmreplay.Client(server.name) as client:
        child = context.Process(target=_attached_worker, args=(server.name, commands, replies))
        child.start()
        try:
            def ask(command):
                commands.put(command)
                return replies.get(timeout=60)

            # The child maps the first layout (both its insert path and its writer's).
            assert ask("insert-x") == "ok"
            assert ask("write-x") == "ok"
            assert client.sample_batch("q", 2, timeout=1).data["x"].tolist() == [
                [1.5] * 3, [2.5] * 3]
            client.reset("q")
            client.insert({"y": np.full((1, 2, 2), 4, np.int64)}, {"q": 1.0}, timeout=1)
            # Its mappings are stale: it must read and write the new layout.
            assert ask("sample") == {"y": [[[[4, 4], [4, 4]]]]}
            assert ask("write-y") == "ok"
            assert client.sample_batch("q", 1, timeout=1).data["y"].tolist() == [[[[9, 9],
                                                                                   [9, 9]]]]
            assert "SchemaError" in ask("insert-x")
            client.reset("q")
            assert ask("write-x") == "ok"  # its writer, planned for the first layout
            assert client.sample_batch("q", 1, timeout=1).data["x"].tolist() == [[2.5] * 3]
            assert client.verify("q") == []
            commands.put("stop")
            child.join(30)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()

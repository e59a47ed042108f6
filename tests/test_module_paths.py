"""The private modules live in folders (``_shm``, ``_schema``, ``_engine``, ``_writers``,
``_client``, ``_ops``); what names a module by its path keeps working across the move.

``data/checkpoint-flat-modules.ckpt`` was written by the code before the move: its
manifest pickles the storage description as ``shmreplay._storage.Storage``.
"""

import os
import shutil

import numpy as np

import _names
import shmreplay
from shmreplay._ops import checkpoint as _checkpoint

OLD_CHECKPOINT = os.path.join(os.path.dirname(__file__), "data", "checkpoint-flat-modules.ckpt")


def _manifest_bytes(path):
    with open(path, "rb") as file:
        data = file.read()
    header = np.frombuffer(data[:_checkpoint.FILE_HEADER.itemsize], _checkpoint.FILE_HEADER)[0]
    start = int(header["manifest_offset"])
    return data[start:start + int(header["manifest_len"])]


def test_a_checkpoint_written_before_the_folders_restores(tmp_path):
    path = str(tmp_path / "old.ckpt")
    shutil.copyfile(OLD_CHECKPOINT, path)
    assert b"shmreplay._storage" in _manifest_bytes(path)  # the old path, as written then
    with shmreplay.Server(name=_names.unique("oldck"), checkpoint=path) as server:
        client = shmreplay.Client(server.name)
        seq = client.sample_batch("seq", 3, timeout=5)
        assert seq.data["act"].tolist() == [[1, 2], [2, 3], [3, 4]]
        np.testing.assert_array_equal(seq.data["obs"][:, :, 0], [[0, 1, 2], [1, 2, 3], [2, 3, 4]])
        assert client.server_info()["whole"].current_size == 3
        whole = client.sample_batch("whole", 1, timeout=5)  # Fifo: the oldest
        np.testing.assert_array_equal(whole.data["x"], [[0.0, 1.0]])
        assert client.verify("seq") == [] and client.verify("whole") == []
        client.close()


def test_a_new_checkpoint_names_the_storage_by_its_new_path(buffer_name, tmp_path):
    with shmreplay.Server([shmreplay.Table.queue("q", 4)], name=buffer_name) as server:
        client = shmreplay.Client(server.name)
        client.insert({"x": np.zeros(2, np.float32)}, {"q": 1.0})
        manifest = _manifest_bytes(client.checkpoint(str(tmp_path / "new.ckpt")))
        client.close()
    assert b"shmreplay._schema.storage" in manifest
    assert b"shmreplay._storage" not in manifest


def test_the_public_modules_keep_their_paths():
    import importlib
    for name in ("client", "server", "table", "selectors", "rate_limiters", "specs", "errors",
                 "replay_sample", "writer", "trajectory_writer", "checkpointers", "cli"):
        assert importlib.import_module(f"shmreplay.{name}").__name__ == f"shmreplay.{name}"

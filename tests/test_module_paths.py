"""The private modules live in folders (``_shm``, ``_schema``, ``_engine``, ``_writers``,
``_client``, ``_ops``); what names a module by its path keeps working across the move.

``data/checkpoint-flat-modules.ckpt`` was written by the code before the move: its
manifest pickles the storage description as ``shmreplay._storage.Storage``.
"""

import os
import re
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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Named on purpose: checkpoints written before the folders name the first; the
# checkpoint benchmark's A/B loads the second from checkouts before the folders.
OLD_PATHS = {"shmreplay._storage", "shmreplay._checkpoint"}
PRIVATE_PATH = re.compile(r"shmreplay((?:\.\w+)+)")
FROM_PACKAGE = re.compile(r"from shmreplay import (?:\(([^)]*)\)|([^(\n]+))")


def _missing(dotted):
    """The first part of ``shmreplay.<dotted>`` that names no module or package (None:
    all do, as far as they are modules: what follows a module is an attribute)."""
    path = os.path.join(ROOT, "shmreplay")
    for part in dotted.strip(".").split("."):
        if not os.path.isdir(path):
            return None
        inside = os.path.join(path, part)
        if os.path.isdir(inside) or os.path.isfile(inside + ".py"):
            path = inside
        elif part.startswith("_") and not part.startswith("__"):
            return part
        else:
            return None  # a public attribute (shmreplay.Client)
    return None


def test_every_private_module_named_in_the_code_exists():
    """Also in strings (the scripts tests run in subprocesses) and docstrings: a moved
    module still named by its old path would fail only where that line runs."""
    stale = []
    for top in ("shmreplay", "tests", "benchmarks", "examples"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                with open(path) as file:
                    text = file.read()
                for match in PRIVATE_PATH.finditer(text):
                    named = "shmreplay" + match[1]
                    if not any(named.startswith(old) for old in OLD_PATHS) and _missing(match[1]):
                        stale.append(f"{path}: shmreplay{match[1]}")
                for match in FROM_PACKAGE.finditer(text):
                    for imported in (match[1] or match[2]).replace("\n", " ").split(","):
                        module = imported.split(" as ")[0].strip()
                        if module and _missing(module):
                            stale.append(f"{path}: from shmreplay import {module}")
    assert stale == []

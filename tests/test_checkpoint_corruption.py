"""Checkpoint files refuse every damaged byte (issue 18, point 9).

A checkpoint of every kind of array (whole items, step storage with references,
episodes, forms, priorities, keys) is damaged in many ways, one at a time: a bit
flipped at the first, middle and last byte of every array, in every header byte, and
at every k-th byte across the whole file; truncations; a byte appended. Each damaged
file is restored by a child process (a crash there must not take the test down with
it), and each restore must raise ``CheckpointError`` naming the damaged part: never a
restored buffer with changed values, another exception type or a crash.
"""

import json
import multiprocessing
import zlib

import cloudpickle
import numpy as np

import _names
import shmreplay
from shmreplay import errors, rate_limiters, selectors
from shmreplay._ops import checkpoint as _checkpoint

SPAWN = multiprocessing.get_context("spawn")
_SAMPLED_OFFSETS = 300  # about this many flips at every k-th byte of the file


def _item(i):
    return {"obs": np.arange(4, dtype=np.float32) + i, "id": np.int64(i)}


def _write_checkpoint(name, path):
    """A checkpoint holding every kind of array ``save`` writes."""
    tables = [shmreplay.Table("items", selectors.Prioritized(0.8), selectors.Fifo(), 16,
                              rate_limiters.MinSize(1)),
              shmreplay.Table.queue("steps", 16)]
    with shmreplay.Server(tables, name=name) as server:
        client = shmreplay.Client(server.name)
        for i in range(6):
            client.insert(_item(i), {"items": 1.0 + i}, timeout=5)
        client.sample_batch("items", 3, timeout=5)  # times sampled, updates
        with client.trajectory_writer(3) as writer:  # episodes and step references
            for t in range(5):
                writer.append({"obs": np.full(3, t, np.int32), "act": np.int64(t)})
                if t >= 2:
                    writer.create_item("steps", 1.0, {"obs": writer.history["obs"][-3:],
                                                      "act": writer.history["act"][-2:]})
            writer.flush(timeout_ms=5000)
        client.checkpoint(path)
        client.close()


def _parts(data):
    """``[(start, end, kind, label)]``: the header, each array, the manifest, the gaps."""
    header = np.frombuffer(data[:_checkpoint.FILE_HEADER.itemsize], _checkpoint.FILE_HEADER)[0]
    start, length = int(header["manifest_offset"]), int(header["manifest_len"])
    manifest = cloudpickle.loads(data[start:start + length])
    parts = [(0, _checkpoint.FILE_HEADER_SIZE, "header", "header"),
             (start, start + length, "manifest", "manifest")]
    for table in manifest["tables"]:
        for key, (offset, descr, shape) in table["arrays"].items():
            nbytes = np.lib.format.descr_to_dtype(descr).itemsize * int(np.prod(shape))
            if nbytes:
                parts.append((offset, offset + nbytes, "array", (table["name"], key)))
    parts.sort()
    covered, gaps = _checkpoint.FILE_HEADER_SIZE, []
    for begin, end, _, _ in parts[1:]:
        if begin > covered:
            gaps.append((covered, begin, "padding", "padding"))
        covered = max(covered, end)
    return sorted(parts + gaps)


def _damages(data, parts):
    """Each damage once: ``("flip", offset, mask)``, ``("truncate", length)``, ``("append",)``."""
    offsets = set(range(_checkpoint.FILE_HEADER_SIZE))
    for begin, end, kind, _ in parts:
        offsets.update({begin, (begin + end) // 2, end - 1})
    step = max(1, len(data) // _SAMPLED_OFFSETS)
    offsets.update(range(step // 2, len(data), step))
    damages = [("flip", offset, 1 << (offset % 8)) for offset in sorted(offsets)]
    damages += [("flip", begin, 0xFF) for begin, _, kind, _ in parts if kind == "array"]
    damages += [("truncate", n) for n in sorted({0, 1, 63, 64, len(data) // 2,
                                                 len(data) - 1})]
    damages.append(("append",))
    return damages


def _restore_each(path, damages, results):
    """Child: restores ``path`` damaged each way; one JSON line per damage to ``results``."""
    original = open(path, "rb").read()
    damaged = path + ".damaged"
    with open(results, "w") as out:
        for damage in damages:
            data = bytearray(original)
            if damage[0] == "flip":
                data[damage[1]] ^= damage[2]
            elif damage[0] == "truncate":
                data = data[:damage[1]]
            else:
                data += b"\0"
            with open(damaged, "wb") as file:
                file.write(data)
            try:
                with shmreplay.Server(name=_names.unique("dmg"), checkpoint=damaged):
                    outcome, message = "restored", ""
            except errors.CheckpointError as exc:
                outcome, message = "refused", str(exc)
            except Exception as exc:  # noqa: BLE001 - the test reports which, and where
                outcome, message = type(exc).__name__, str(exc)
            out.write(json.dumps({"damage": damage, "outcome": outcome,
                                  "message": message}) + "\n")
            out.flush()


def _part_of(parts, offset):
    return next(p for p in parts if p[0] <= offset < p[1])


def test_every_damaged_byte_and_truncation_is_refused_naming_the_part(buffer_name, tmp_path):
    path = str(tmp_path / "all.shmreplay")
    _write_checkpoint(buffer_name, path)
    data = open(path, "rb").read()
    parts = _parts(data)
    assert {p[3][1] for p in parts if p[2] == "array"} >= {
        "key", "order", "update", "times", "priority", "episode", "forms", "refs", "store0"}
    damages = _damages(data, parts)
    results = str(tmp_path / "results.jsonl")
    child = SPAWN.Process(target=_restore_each, args=(path, damages, results))
    child.start()
    child.join(240)
    if child.is_alive():
        child.kill()
        child.join(5)
    seen = [json.loads(line) for line in open(results)]
    assert child.exitcode == 0, (f"the restoring child ended with {child.exitcode} at "
                                 f"{damages[len(seen)] if len(seen) < len(damages) else '?'}")
    assert len(seen) == len(damages)
    wrong = []
    for result in seen:
        damage, outcome, message = result["damage"], result["outcome"], result["message"]
        if outcome != "refused" or path not in message:
            wrong.append((damage, outcome, message))
            continue
        if damage[0] != "flip":
            continue
        _, _, kind, label = _part_of(parts, damage[1])
        named = (f"table '{label[0]}' array '{label[1]}'" if kind == "array" else kind)
        if named not in message:
            wrong.append((damage, f"does not name {named}", message))
    restored = sum(1 for w in wrong if w[1] == "restored")
    assert not wrong, (f"{len(wrong)} of {len(damages)} damaged files were not refused "
                       f"naming the part ({restored} restored); first ones: {wrong[:8]}")


def _as_format(path, version):
    """Rewrites a checkpoint as format ``version`` wrote it: 2 has no checksums of the
    header or arrays, 3 has crc32s of the arrays."""
    data = bytearray(open(path, "rb").read())
    header = np.frombuffer(bytes(data[:_checkpoint.FILE_HEADER.itemsize]),
                           _checkpoint.FILE_HEADER)[0].copy()
    offset, length = int(header["manifest_offset"]), int(header["manifest_len"])
    manifest = cloudpickle.loads(bytes(data[offset:offset + length]))
    manifest["format"] = version
    for table in manifest["tables"]:
        del table[_checkpoint.CHECKSUMS[_checkpoint.FORMAT_VERSION][0]]
        if version == 3:
            table["crc32"] = {
                key: zlib.crc32(data[start:start + np.lib.format.descr_to_dtype(
                    descr).itemsize * int(np.prod(shape))])
                for key, (start, descr, shape) in table["arrays"].items()}
    blob = cloudpickle.dumps(manifest)
    data = data[:offset] + blob
    header["version"] = version
    header["manifest_len"] = len(blob)
    header["manifest_crc"] = zlib.crc32(blob)
    header["file_len"] = len(data)
    header["header_crc"] = 0
    if version >= 3:
        header["header_crc"] = zlib.crc32(header.tobytes()[:_checkpoint.FILE_HEADER.fields[
            "header_crc"][1]])
    data[:_checkpoint.FILE_HEADER.itemsize] = header.tobytes()
    open(path, "wb").write(bytes(data))


def test_a_format_3_checkpoint_restores_and_its_crc32s_still_refuse_damage(
        buffer_name, tmp_path):
    path = str(tmp_path / "crc32.shmreplay")
    _write_checkpoint(buffer_name, path)
    _as_format(path, 3)
    saved = _checkpoint.load(path)
    assert all(t.version == 3 and t.checksums for t in saved.tables)
    with shmreplay.Server(name=_names.unique("crc"), checkpoint=path) as server:
        with shmreplay.Client(server.name) as client:
            assert client.server_info()["items"].current_size == 6
    offset, _, _ = saved.table("items").layout["priority"]
    with open(path, "r+b") as file:  # one bit of one priority
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ 4]))
    try:
        shmreplay.Server(name=_names.unique("crc"), checkpoint=path).stop()
    except errors.CheckpointError as exc:
        assert "'priority' is damaged: its crc32" in str(exc)
    else:
        raise AssertionError("a damaged format 3 checkpoint restored")


def test_a_format_2_checkpoint_still_restores_without_checksums(buffer_name, tmp_path):
    path = str(tmp_path / "old.shmreplay")
    _write_checkpoint(buffer_name, path)
    _as_format(path, 2)
    saved = _checkpoint.load(path)
    assert all(t.checksums is None for t in saved.tables)
    with shmreplay.Server(name=_names.unique("old"), checkpoint=path) as server:
        client = shmreplay.Client(server.name)
        info = client.server_info()
        assert (info["items"].current_size, info["steps"].current_size) == (6, 3)
        assert client.verify("items") == [] and client.verify("steps") == []
        assert client.sample_batch("steps", 3, timeout=5).data["act"][:, 0].tolist() == [1, 2, 3]
        client.close()

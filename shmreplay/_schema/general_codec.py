"""Items of any shape as bytes, for a table's general store (its arena).

Layout of one encoded item::

    b"SRG1"  uint32 header length  header (JSON, utf-8)  padding to 8  leaves' bytes

The header is ``{"s": structure, "l": [[kind, dtype, shape, offset, nbytes], ...]}``:
the structure is ``0`` for a leaf, ``{"d": [[key, sub], ...]}`` for a dict (keys
sorted, as ``tree.flatten`` orders them), ``{"l": [...]}``/``{"t": [...]}`` for a
list/tuple (a namedtuple comes back as a tuple). A leaf is numbers (kind ``"n"``: a
numpy dtype of booleans or numbers, C order) or strings (kind ``"s"``: each element
as a uint32 length and its bytes; ``str`` is stored as utf-8 and comes back as
``bytes``, as Reverb's numpy client returns ``tf.string``).

No pickle: another process (another user of the buffer's group) may have written the
arena, so ``decode`` checks every length, offset, dtype and shape against the bytes it
was given and raises ``CorruptItemError`` instead of trusting any.
"""

import json
import struct

import numpy as np

from shmreplay import errors

MAGIC = b"SRG1"
_MAX_DEPTH = 64
_MAX_DIMS = 32


def _walk(data, path, structure_out, leaves, paths, depth):
    if depth > _MAX_DEPTH:
        raise errors.SchemaError(f"the item nests deeper than {_MAX_DEPTH} levels.")
    if isinstance(data, dict):
        keys = sorted(data)
        if not all(isinstance(key, str) for key in keys):
            raise errors.SchemaError(
                f"{path or 'the item'}: an item of another shape needs string dict keys.")
        subs = []
        for key in keys:
            subs.append([key, _walk(data[key], f"{path}['{key}']", None, leaves, paths,
                                    depth + 1)])
        return {"d": subs}
    if isinstance(data, (list, tuple)):
        kind = "l" if isinstance(data, list) else "t"
        return {kind: [_walk(sub, f"{path}[{i}]", None, leaves, paths, depth + 1)
                       for i, sub in enumerate(data)]}
    leaves.append(data)
    paths.append(path or "<root>")
    return 0


def flatten(data):
    """``(structure, leaves, paths)`` of an item, in ``tree.flatten`` order."""
    leaves, paths = [], []
    structure = _walk(data, "", None, leaves, paths, 0)
    return structure, leaves, paths


def _string_bytes(value, table, path):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.bytes_):
        return bytes(value)
    raise errors.SchemaError(
        f"Table '{table}', column {path}: a string leaf holds a {type(value).__name__}; "
        "only bytes and str can be stored.")


def _leaf_record(leaf, table, path):
    """``(kind, dtype string, shape, payload bytes)`` of one leaf."""
    if isinstance(leaf, (bytes, str, np.bytes_, np.str_)):
        return "s", "|O", (), _strings([leaf], table, path)
    array = leaf if isinstance(leaf, np.ndarray) else np.asarray(leaf)
    if array.dtype.kind in "SUO":
        flat = array.reshape(-1).tolist()
        return "s", "|O", array.shape, _strings(flat, table, path)
    if array.dtype.kind not in "biufc" or array.dtype.fields is not None:
        raise errors.SchemaError(
            f"Table '{table}', column {path}: cannot store {type(leaf).__name__} of dtype "
            f"{array.dtype}: a leaf holds numbers, booleans or strings.")
    return "n", array.dtype.str, array.shape, array.tobytes(order="C")


def _strings(values, table, path):
    parts = []
    for value in values:
        raw = _string_bytes(value, table, path)
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return b"".join(parts)


def encode(data, table: str) -> bytes:
    """The bytes of one item ``data`` (a nest of arrays, numbers and strings).

    Raises:
      SchemaError: a leaf is neither numbers nor strings, or dict keys are not strings.
    """
    structure, leaves, paths = flatten(data)
    records = [_leaf_record(leaf, table, path) for leaf, path in zip(leaves, paths)]
    # Offsets count from the start of the payload; the payload starts 8-aligned.
    entries, offset = [], 0
    for kind, dtype, shape, payload in records:
        entries.append([kind, dtype, [int(d) for d in shape], offset, len(payload)])
        offset += (len(payload) + 7) // 8 * 8
    header = json.dumps({"s": structure, "l": entries}, separators=(",", ":")).encode()
    head = MAGIC + struct.pack("<I", len(header)) + header
    head += b"\0" * (-len(head) % 8)
    body = b"".join(payload + b"\0" * (-len(payload) % 8) for *_, payload in records)
    return head + body


class _Corrupt(Exception):
    pass


def _check(condition, problem):
    if not condition:
        raise _Corrupt(problem)


def _rebuild(structure, leaves, at, depth):
    """The nest of ``structure`` over ``leaves`` from index ``at[0]``."""
    _check(depth <= _MAX_DEPTH, "a structure nested too deep")
    if structure == 0 and type(structure) is int:
        _check(at[0] < len(leaves), "a structure with more leaves than its records")
        at[0] += 1
        return leaves[at[0] - 1]
    _check(isinstance(structure, dict) and len(structure) == 1, "an invalid structure")
    (kind, subs), = structure.items()
    _check(kind in ("d", "l", "t") and isinstance(subs, list), "an invalid structure")
    if kind == "d":
        out = {}
        for pair in subs:
            _check(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str),
                   "an invalid dict entry")
            out[pair[0]] = _rebuild(pair[1], leaves, at, depth + 1)
        return out
    items = [_rebuild(sub, leaves, at, depth + 1) for sub in subs]
    return items if kind == "l" else tuple(items)


def _numbers(dtype_text, shape, payload):
    _check(isinstance(dtype_text, str) and len(dtype_text) < 8, "an invalid dtype")
    try:
        dtype = np.dtype(dtype_text)
    except TypeError:
        raise _Corrupt(f"an unknown dtype {dtype_text!r}") from None
    _check(dtype.kind in "biufc" and not dtype.hasobject and dtype.fields is None
           and dtype.str == dtype_text, f"a dtype {dtype_text!r} that is not numbers")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    _check(count * dtype.itemsize == len(payload),
           f"{len(payload)} bytes for a {dtype_text} leaf of shape {tuple(shape)}")
    return np.frombuffer(payload, dtype, count).reshape(shape).copy()


def _strings_of(shape, payload):
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    out = np.empty(count, object)
    at = 0
    for i in range(count):
        _check(at + 4 <= len(payload), "a string without its length")
        length, = struct.unpack_from("<I", payload, at)
        at += 4
        _check(at + length <= len(payload), "a string longer than its leaf")
        out[i] = bytes(payload[at:at + length])
        at += length
    _check(at == len(payload), "a string leaf with trailing bytes")
    return out.reshape(shape) if shape else out.reshape(())


def decode(raw, table: str, key: int):
    """``(nest, leaves, paths)`` of an encoded item (``raw``: bytes or uint8 array);
    strings come back as numpy object arrays of ``bytes``.

    Raises:
      CorruptItemError: anything in ``raw`` is inconsistent.
    """
    raw = bytes(raw)
    try:
        _check(len(raw) >= 8 and raw[:4] == MAGIC, "no item header")
        length, = struct.unpack_from("<I", raw, 4)
        _check(8 + length <= len(raw), f"a header length {length} past its end")
        try:
            header = json.loads(raw[8:8 + length].decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise _Corrupt("an unreadable header") from None
        _check(isinstance(header, dict) and isinstance(header.get("l"), list),
               "a header without leaves")
        start = 8 + length + (-(8 + length) % 8)
        leaves = []
        for entry in header["l"]:
            _check(isinstance(entry, list) and len(entry) == 5, "an invalid leaf record")
            kind, dtype_text, shape, offset, nbytes = entry
            _check(isinstance(shape, list) and len(shape) <= _MAX_DIMS
                   and all(type(d) is int and 0 <= d < 1 << 40 for d in shape),
                   f"an invalid shape {shape!r}")
            _check(type(offset) is int and type(nbytes) is int and offset >= 0
                   and nbytes >= 0 and start + offset + nbytes <= len(raw),
                   f"a leaf at {offset!r} of {nbytes!r} bytes past the item's end")
            payload = memoryview(raw)[start + offset:start + offset + nbytes]
            shape = tuple(shape)
            if kind == "n":
                leaves.append(_numbers(dtype_text, shape, payload))
            else:
                _check(kind == "s", f"an unknown leaf kind {kind!r}")
                leaves.append(_strings_of(shape, payload))
        at = [0]
        nest = _rebuild(header.get("s"), leaves, at, 0)
        _check(at[0] == len(leaves), "a structure with fewer leaves than its records")
    except _Corrupt as exc:
        raise errors.CorruptItemError(
            f"Table '{table}': item {key} in the table's general store (arena) holds "
            f"{exc}: the shared memory was damaged or written by another program. Delete "
            "the item (Client.mutate_priorities(deletes=[key])) or reset the table.") from None
    paths = flatten(nest)[2]
    return nest, leaves, paths

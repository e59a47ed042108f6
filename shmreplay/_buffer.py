"""Creating and attaching a whole buffer: the header segment and its table engines.

``create`` is the Server's half (it writes the header and initializes every table);
``attach`` is every Client's half (it checks magic, version and the header's
consistency before trusting any offset, then maps the same tables).
"""

import os
import time

import cloudpickle

from shmreplay import _layout as L
from shmreplay import _segment, errors
from shmreplay._procs import start_time
from shmreplay._table import TableEngine

MAX_BUFFER_NAME = 100


class Buffer:
    """The mapped header segment of a buffer and one ``TableEngine`` per table."""

    def __init__(self, name, segment, configs, plan):
        self.name = name
        self.segment = segment
        self.header = L.header_view(segment.buf)
        self.configs = configs
        self.engines = [TableEngine(name, i, config, region, segment.buf)
                        for i, (config, region) in enumerate(zip(configs, plan.tables))]
        self.by_name = {engine.name: engine for engine in self.engines}

    @property
    def state(self) -> int:
        return int(self.header["state"][0])

    def close(self):
        """Unmaps this process's views of the buffer."""
        for engine in self.engines:
            engine.detach()
        self.engines = []
        self.by_name = {}
        self.header = None
        self.segment.close()


def create(name: str, configs, mode: int = 0o600) -> Buffer:
    """Creates the segments of a new buffer holding ``configs`` (Table objects)."""
    blob = cloudpickle.dumps(list(configs))
    plan = L.plan_buffer(configs, len(blob))
    segment = _segment.Segment.create(L.header_segment_name(name), plan.total_bytes, mode)
    try:
        header = L.header_view(segment.buf)
        header["magic"] = L.MAGIC
        header["layout_version"] = L.LAYOUT_VERSION
        header["header_size"] = L.HEADER_SIZE
        header["total_bytes"] = plan.total_bytes
        header["owner_pid"] = os.getpid()
        header["owner_start"] = start_time(os.getpid())
        header["owner_uid"] = os.getuid()
        header["state"] = L.STATE_CREATING
        header["num_tables"] = len(configs)
        header["config_offset"] = plan.config_offset
        header["config_len"] = len(blob)
        header["tables_offset"] = plan.tables[0].offset
        header["created_ns"] = time.time_ns()
        segment.buf[plan.config_offset:plan.config_offset + len(blob)] = blob
        buffer = Buffer(name, segment, configs, plan)
        for engine in buffer.engines:
            engine.initialize()
        header["state"] = L.STATE_ACTIVE
        return buffer
    except BaseException:
        for index in range(len(configs)):
            _segment.unlink(L.data_segment_name(name, index))
        segment.unlink()
        segment.close()
        raise


def attach(name: str, wait_active: float = 2.0) -> Buffer:
    """Attaches to an existing buffer by name after validating its header.

    Raises:
      BufferNotFoundError: no buffer has this name.
      LayoutMismatchError: the segment is not a shmreplay buffer of this layout version.
      BufferBrokenError: the buffer was stopped by its owner.
    """
    segment = _segment.Segment.attach(L.header_segment_name(name), f"buffer '{name}'")
    try:
        if segment.size < L.HEADER_SIZE:
            raise errors.LayoutMismatchError(
                f"Segment for '{name}' has {segment.size} bytes, less than a shmreplay header "
                f"({L.HEADER_SIZE}).")
        header = L.header_view(segment.buf)
        if header["magic"][0] != L.MAGIC:
            raise errors.LayoutMismatchError(
                f"Segment for '{name}' is not a shmreplay buffer: magic {header['magic'][0]!r}, "
                f"expected {L.MAGIC!r}.")
        if header["layout_version"][0] != L.LAYOUT_VERSION:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}' has layout version {header['layout_version'][0]}; this "
                f"shmreplay reads version {L.LAYOUT_VERSION}. Use the same shmreplay version "
                "in every process.")
        deadline = time.monotonic() + wait_active
        while header["state"][0] == L.STATE_CREATING and time.monotonic() < deadline:
            time.sleep(0.001)
        state = header["state"][0]
        if state == L.STATE_STOPPED:
            raise errors.BufferBrokenError(f"Buffer '{name}' was stopped by its owner.")
        if state != L.STATE_ACTIVE:
            raise errors.LayoutMismatchError(f"Buffer '{name}' has an invalid state {state}.")
        total = int(header["total_bytes"][0])
        offset, length = int(header["config_offset"][0]), int(header["config_len"][0])
        if total != segment.size or not (L.HEADER_SIZE <= offset and 0 < length
                                         and offset + length <= total):
            raise errors.LayoutMismatchError(
                f"Buffer '{name}' has an inconsistent header (size {segment.size}, "
                f"recorded {total}, config at {offset}+{length}).")
        try:
            configs = cloudpickle.loads(segment.buf[offset:offset + length])
        except Exception as exc:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': its table configuration cannot be read.") from exc
        plan = L.plan_buffer(configs, length)
        if plan.total_bytes != total or len(configs) != header["num_tables"][0]:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': the header does not match its table configuration.")
        return Buffer(name, segment, configs, plan)
    except BaseException:
        segment.close()
        raise


def unlink_all(name: str, num_tables: int):
    """Removes every segment name of a buffer (idempotent)."""
    for index in range(num_tables):
        _segment.unlink(L.data_segment_name(name, index))
    _segment.unlink(L.header_segment_name(name))

"""Creating and attaching a whole buffer: the header segment and its table engines.

``create`` is the Server's half (it writes the header and initializes every table);
``attach`` is every Client's half (it checks magic, version and the header's
consistency before trusting any offset, then maps the same tables).

What ``attach`` verifies, in order (``docs/security.md``): who owns the segment and who
may write it (``_segment.check_access``); the magic, layout version and header size;
that the buffer is active; the recorded segment mode against the file's, and for
another user's buffer that it is group-shared; every offset and length against the
segment's size. Only then does it unpickle the configuration, which it checks against
the header and the tables' control blocks before any kernel sees them.
"""

import os
import time

import cloudpickle

from shmreplay._shm import layout as L
from shmreplay import errors
from shmreplay._shm import peek as _peek
from shmreplay._shm import procs as _procs
from shmreplay._shm import segment as _segment
from shmreplay._shm.procs import start_time
from shmreplay._shm.kernels import codes
from shmreplay._engine.table_engine import TableEngine
from shmreplay._engine.table_info import static_info
from shmreplay.table import Table



class Buffer:
    """The mapped header segment of a buffer and one ``TableEngine`` per table."""

    def __init__(self, name, segment, configs, plan, checkpoint_root=None):
        self.name = name
        self.checkpoint_root = checkpoint_root  # where Client.checkpoint() writes by default
        self.segment = segment
        self.header = L.header_view(segment.buf)
        self.configs = configs
        self.access = _data_access(self.header, segment)
        self.engines = [TableEngine(name, i, config, region, segment.buf)
                        for i, (config, region) in enumerate(zip(configs, plan.tables))]
        for engine in self.engines:
            engine.access = self.access  # read by the engine's data-segment create/attach
        self.by_name = {engine.name: engine for engine in self.engines}

    @property
    def state(self) -> int:
        return int(self.header["state"][0])

    def close(self):
        """Unmaps this process's views of the buffer."""
        for engine in self.engines:
            engine.closed_here = True  # (calls still blocked in it see this, and end)
            engine.detach()
        self.engines = []
        self.by_name = {}
        self.header = None
        self.segment.close()


def _data_access(header, segment) -> _segment.Access:
    """How this process creates and accepts data segments, from the header's mode.

    In a group-shared buffer data segments are created 0660 with the header segment's
    group, and other group members' data segments are accepted: the owner opted in by
    creating the buffer shared, and a process of another user got this far only by
    opting in too (``trust_group``).
    """
    if int(header["segment_mode"][0]) == _segment.GROUP_MODE:
        return _segment.Access(_segment.GROUP_MODE, group=segment.gid, trust_group=True)
    return _segment.PRIVATE


# Buffers this process is creating: name -> its header segment's inode.
_creating = {}


def create(name: str, configs, mode: int = 0o600, checkpoint_root=None,
           restore=None) -> Buffer:
    """Creates the segments of a new buffer holding ``configs`` (Table objects).

    ``restore(buffer)``, if given, fills the tables (from a checkpoint) before the
    buffer becomes visible to clients; ``checkpoint_root`` is where ``Client.checkpoint``
    writes by default. ``mode`` is that of every segment of the buffer, whoever creates
    it: ``0o600`` (owner only) or ``0o660`` (shared with the owner's group).
    """
    if mode not in (_segment.PRIVATE_MODE, _segment.GROUP_MODE):
        raise ValueError(f"Segment mode must be 0o600 or 0o660, got {mode:#o}.")
    blob = cloudpickle.dumps({"tables": list(configs), "checkpoint_root": checkpoint_root})
    plan = L.plan_buffer(configs, len(blob))
    segment = _segment.Segment.create(L.header_segment_name(name), plan.total_bytes, mode,
                                      what=f"buffer '{name}'")
    _creating[name] = segment.inode
    try:
        header = L.header_view(segment.buf)
        header["magic"] = L.MAGIC
        header["layout_version"] = L.LAYOUT_VERSION
        header["header_size"] = L.HEADER_SIZE
        header["total_bytes"] = plan.total_bytes
        header["owner_pid"] = os.getpid()
        header["owner_start"] = start_time(os.getpid())
        header["owner_ns"] = _procs.NS[0]
        header["owner_uid"] = os.getuid()
        header["state"] = L.STATE_CREATING
        header["num_tables"] = len(configs)
        header["config_offset"] = plan.config_offset
        header["config_len"] = len(blob)
        header["tables_offset"] = plan.tables[0].offset
        header["created_ns"] = time.time_ns()
        header["segment_mode"] = mode
        segment.buf[plan.config_offset:plan.config_offset + len(blob)] = blob
        buffer = Buffer(name, segment, configs, plan, checkpoint_root)
        for engine in buffer.engines:
            engine.initialize()
        if restore is not None:
            restore(buffer)
        header["state"] = L.STATE_ACTIVE
        return buffer
    except BaseException:
        _unlink_data_segments(name)
        segment.unlink()
        segment.close()
        raise
    finally:
        _creating.pop(name, None)


def abandon_creations():
    """Removes the segments of every buffer this process is still creating, from any
    thread: SIGTERM's last act (``Server``'s handler), when the process is about to die
    by the signal and ``create`` will never finish or clean up. A name that leads to
    another header now (not ours) is left alone."""
    for name, inode in list(_creating.items()):
        try:
            if os.lstat(_peek.header_path(name)).st_ino != inode:
                continue
        except FileNotFoundError:
            continue
        unlink_all(name)


def attach(name: str, wait_active: float = 2.0, trust_group: bool = False) -> Buffer:
    """Attaches to an existing buffer by name after validating its header.

    Args:
      name: The buffer's (validated) name.
      wait_active: Seconds to wait for a buffer that is being created.
      trust_group: Accept a buffer of another user that its owner shared with a group
        this process belongs to. Its configuration is unpickled, which runs code its
        writer chose: trust every member of that group.

    Raises:
      BufferNotFoundError: no buffer has this name.
      LayoutMismatchError: the segment is not a shmreplay buffer of this layout version,
        its header is inconsistent, or it belongs to another user and is not shared
        with (or not trusted from) a group of ours.
      BufferBrokenError: the buffer was stopped by its owner.
    """
    segment = _segment.Segment.attach(
        L.header_segment_name(name), f"buffer '{name}'",
        _segment.Access(_segment.GROUP_MODE, trust_group=trust_group))
    try:
        if segment.size < L.HEADER_SIZE:
            raise errors.LayoutMismatchError(
                f"Segment for '{name}' has {segment.size} bytes, less than a shmreplay header "
                f"({L.HEADER_SIZE}).")
        header = L.header_view(segment.buf)
        deadline = time.monotonic() + wait_active
        # A Server writes the magic first, but only once its segment is created and its
        # memory reserved: zeros until then.
        while header["magic"][0] == b"" and time.monotonic() < deadline:
            time.sleep(0.001)
        if header["magic"][0] != L.MAGIC:
            raise errors.LayoutMismatchError(
                f"Segment for '{name}' is not a shmreplay buffer: magic {header['magic'][0]!r}, "
                f"expected {L.MAGIC!r}.")
        if header["layout_version"][0] != L.LAYOUT_VERSION:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}' has layout version {header['layout_version'][0]}; this "
                f"shmreplay reads version {L.LAYOUT_VERSION}. Use the same shmreplay version "
                "in every process.")
        while header["state"][0] == L.STATE_CREATING and time.monotonic() < deadline:
            time.sleep(0.001)
        state = header["state"][0]
        if state == L.STATE_STOPPED:
            raise errors.BufferBrokenError(f"Buffer '{name}' was stopped by its owner.")
        if state == L.STATE_CREATING:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}' is still being created after {errors.seconds(wait_active)} "
                "(its Server may be restoring a large checkpoint): attach again once the "
                "Server exists.")
        if state != L.STATE_ACTIVE:
            raise errors.LayoutMismatchError(f"Buffer '{name}' has an invalid state {state}.")
        total = int(header["total_bytes"][0])
        offset, length = int(header["config_offset"][0]), int(header["config_len"][0])
        if total != segment.size or not (L.HEADER_SIZE <= offset and 0 < length
                                         and offset + length <= total):
            raise errors.LayoutMismatchError(
                f"Buffer '{name}' has an inconsistent header (size {segment.size}, "
                f"recorded {total}, config at {offset}+{length}).")
        _check_header(name, header, segment)
        try:
            settings = cloudpickle.loads(segment.buf[offset:offset + length])
            configs, checkpoint_root = settings["tables"], settings["checkpoint_root"]
        except Exception as exc:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': its table configuration cannot be read.") from exc
        if checkpoint_root is not None and not isinstance(checkpoint_root, str):
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': its checkpoint directory is {checkpoint_root!r}, not a path.")
        _check_configs(name, configs)
        plan = L.plan_buffer(configs, length)
        if plan.total_bytes != total or len(configs) != header["num_tables"][0]:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': the header does not match its table configuration.")
        _check_plan(name, header, plan)
        buffer = Buffer(name, segment, configs, plan, checkpoint_root)
        try:
            _check_tables(name, buffer)
        except BaseException:
            buffer.close()
            raise
        return buffer
    except BaseException:
        segment.close()
        raise


_MAX_TABLES = 1 << 16
_PICKLE_STOP = ord(".")  # the last byte of every pickle
_SELECTOR_KINDS = frozenset((codes.UNIFORM, codes.PRIORITIZED, codes.FIFO, codes.LIFO,
                             codes.MIN_HEAP, codes.MAX_HEAP))


def _check_header(name: str, header, segment):
    """Checks the header fields that decide what to trust and where things lie.

    Runs after the magic, version and state checks and before anything is unpickled.

    Raises:
      LayoutMismatchError: naming the first field that is wrong.
    """
    size = int(header["header_size"][0])
    if size != L.HEADER_SIZE:
        raise errors.LayoutMismatchError(
            f"Buffer '{name}' has a header of {size} bytes; expected {L.HEADER_SIZE}.")
    mode = int(header["segment_mode"][0])
    if mode not in (_segment.PRIVATE_MODE, _segment.GROUP_MODE):
        raise errors.LayoutMismatchError(
            f"Buffer '{name}' records an invalid segment mode {mode:#o}.")
    if segment.mode & ~mode & 0o666:
        raise errors.LayoutMismatchError(
            f"Buffer '{name}': its segment has mode {segment.mode:04o}, wider than the "
            f"{mode:04o} its header records.")
    if segment.uid != os.getuid():
        # check_access let another user's segment through: the caller trusts the group.
        if mode != _segment.GROUP_MODE:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}' belongs to uid {segment.uid} and its header does not "
                "share it with a group.")
        owner = int(header["owner_uid"][0])
        if owner != segment.uid:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': its header names owner uid {owner}, but the segment "
                f"belongs to uid {segment.uid}.")
    config_end = int(header["config_offset"][0]) + int(header["config_len"][0])
    tables = int(header["num_tables"][0])
    tables_offset = int(header["tables_offset"][0])
    if not 1 <= tables <= _MAX_TABLES or not config_end <= tables_offset < segment.size:
        raise errors.LayoutMismatchError(
            f"Buffer '{name}' has an inconsistent header ({tables} tables at "
            f"{tables_offset}, configuration ending at {config_end}, size {segment.size}).")
    if segment.buf[config_end - 1] != _PICKLE_STOP:
        raise errors.LayoutMismatchError(
            f"Buffer '{name}': its configuration does not end where its header says.")


def _check_configs(name: str, configs):
    """Checks that the unpickled configuration is a list of valid ``Table`` objects.

    Each table goes through ``Table``'s own validation again (``replace``) and through
    everything its info reads, so that a damaged setting surfaces here and not in the
    middle of a later call.

    Raises:
      LayoutMismatchError: if it is anything else.
    """
    if not isinstance(configs, list) or not configs:
        raise errors.LayoutMismatchError(
            f"Buffer '{name}': its configuration holds a {type(configs).__name__}, not a "
            "list of tables.")
    for config in configs:
        if not isinstance(config, Table):
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': its configuration holds a {type(config).__name__} "
                "instead of a Table.")
        try:
            config.replace()
            static_info(config)
            config.rate_limiter.max_batch_insert()
            valid = (type(config.max_size) is int and config.max_size < 1 << 40
                     and config.sampler.kind in _SELECTOR_KINDS
                     and config.remover.kind in _SELECTOR_KINDS)
        except Exception as exc:  # any failure to read a just-unpickled setting
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': its configuration holds an invalid table ({exc}).") from exc
        if not valid:
            raise errors.LayoutMismatchError(
                f"Buffer '{name}': its configuration holds an invalid table "
                f"{config.name!r}.")


def _check_plan(name: str, header, plan):
    """Checks the header's offsets against those the configuration implies.

    Raises:
      LayoutMismatchError: if they differ.
    """
    if (plan.config_offset != int(header["config_offset"][0])
            or plan.tables[0].offset != int(header["tables_offset"][0])):
        raise errors.LayoutMismatchError(
            f"Buffer '{name}': the header's offsets do not match its table configuration.")


def _check_tables(name: str, buffer: Buffer):
    """Checks each table's fixed settings in its control block against its configuration.

    Kernels index arrays with these words, so a control block that disagrees with the
    views mapped from the configuration is refused before any kernel runs.

    Raises:
      LayoutMismatchError: naming the table whose control block disagrees.
    """
    for engine in buffer.engines:
        config, ctrl, fctrl = engine.config, engine.ctrl, engine.arrays[1]
        limiter = config.rate_limiter
        expected = ((L.C_CAPACITY, engine.capacity), (L.C_MAX_SIZE, config.max_size),
                    (L.C_SAMPLER_KIND, config.sampler.kind),
                    (L.C_REMOVER_KIND, config.remover.kind),
                    (L.C_SLOT_BITS, L.slot_bits(engine.capacity)),
                    (L.C_TREE_LEAVES, engine.region.tree_leaves),
                    (L.C_MAX_TIMES_SAMPLED, config.max_times_sampled),
                    (L.C_MIN_SIZE, limiter.min_size_to_sample))
        for word, value in expected:
            if int(ctrl[word]) != value:
                raise errors.LayoutMismatchError(
                    f"Buffer '{name}', table '{engine.name}': its control block holds "
                    f"{int(ctrl[word])} where its configuration implies {value} "
                    f"(word {word}).")
        expected = ((L.F_SAMPLES_PER_INSERT, limiter.samples_per_insert),
                    (L.F_MIN_DIFF, limiter.min_diff), (L.F_MAX_DIFF, limiter.max_diff),
                    (L.F_EXPONENT0, getattr(config.sampler, "priority_exponent", 1.0)),
                    (L.F_EXPONENT0 + 1, getattr(config.remover, "priority_exponent", 1.0)))
        for word, value in expected:
            if float(fctrl[word]) != float(value):
                raise errors.LayoutMismatchError(
                    f"Buffer '{name}', table '{engine.name}': its control block holds "
                    f"{float(fctrl[word])} where its configuration implies {value} "
                    f"(float word {word}).")


def unlink_all(name: str, num_tables: int = 0):
    """Removes every segment name of a buffer (idempotent): its data segments, then its
    header segment (while the header exists no new buffer can take the name, so every
    data segment listed is this buffer's). ``num_tables`` is not needed any more."""
    _unlink_data_segments(name)
    _segment.unlink(L.header_segment_name(name))


def _unlink_data_segments(name: str):
    """Unlinks every data segment of buffer ``name``: those of its live layouts, of
    layouts forgotten by ``reset`` and of creations their process did not finish."""
    for entry in _peek.segments_of(name):
        if L.parse_segment(entry) != (name, None):
            _segment.unlink("/" + entry)

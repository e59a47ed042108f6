"""The operator's command line, ``shmreplay``: ls, info, top, verify, checkpoint, rm, gc, compile.

Buffers are found by listing ``/dev/shm`` for header segments ``shmreplay.NAME``. A
buffer whose owner process is gone (it was SIGKILLed, so it could not clean up) is
reported as ``dead`` and removed by ``gc``.

``ls``, ``rm``, ``gc`` and ``--help`` read headers and control blocks as numbers
(``shmreplay._shm.peek``): they attach to no table and load no kernel, so they start fast
and a segment that is not ours cannot run code in them. The other commands attach
with a ``Client``, imported where they need it.
"""

import argparse
import os
import sys
import time

from shmreplay import errors
from shmreplay._client import address as _address
from shmreplay._shm import layout as _layout
from shmreplay._shm import peek as _peek
from shmreplay._ops import retire as _retire
from shmreplay._ray import ledger as _ledger   # plain files: imports no Ray


def cmd_ls(args, out):
    """``shmreplay ls``: one line per buffer: owner, state, tables, items, memory."""
    found = _peek.segments()
    if not found:
        print("no shmreplay buffers", file=out)
        _ls_ledgers(out)
        return 0
    labels = {name: _label(name) for name in found}
    width = max([40] + [len(label) for label in labels.values()])
    print(f"{'NAME':{width}s} {'OWNER':>8s} {'STATE':8s} {'TABLES':>6s} {'ITEMS':>10s} "
          f"{'MEMORY':>10s}", file=out)
    for name, entries in found.items():
        seen = _peek.peek(name)
        print(f"{labels[name]:{width}s} {_or_unknown(seen.pid):>8s} {seen.status:8s} "
              f"{_or_unknown(seen.tables):>6s} {_or_unknown(seen.items):>10s} "
              f"{_peek.format_bytes(_peek.memory(entries)):>10s}", file=out)
    _ls_ledgers(out)
    return 0


def _ls_ledgers(out):
    """``ls``'s second part: shmreplay.ray's ledger directories, with their buffer's state
    (``gone``: no such buffer; ``gc`` removes the ledgers of gone and dead buffers)."""
    found = _ledger.ledgers(_peek.SHM_DIR)
    if not found:
        return
    width = max([40] + [len(name) for name in found])
    print(f"\n{'RAY LEDGER OF BUFFER':{width}s} {'BUFFER':8s} {'FILES':>6s} {'MEMORY':>10s}",
          file=out)
    for name, path in found.items():
        files, size = _ledger.ledger_files(path)
        print(f"{name:{width}s} {_buffer_state(name)[0]:8s} {files:>6d} "
              f"{_peek.format_bytes(size):>10s}", file=out)


def _buffer_state(name):
    """``(word, Peek)``: ``gone`` (no header segment), or the buffer's ``ls`` state."""
    seen = _peek.peek(name, tables=False)
    return ("gone" if not seen.exists else seen.status), seen


def _gc_ledgers(out) -> int:
    """``gc``'s second part: removes each ledger whose buffer is gone or dead; never one
    whose buffer is alive or cannot be judged. Returns how many it removed."""
    removed = 0
    for name, path in _ledger.ledgers(_peek.SHM_DIR).items():
        word, seen = _buffer_state(name)
        if word != "gone" and seen.alive is not False:
            if seen.alive is None:
                print(f"ray ledger {path}: left alone: buffer {name}: {seen.problem}",
                      file=out)
            continue
        try:
            files = _ledger.remove_directory(path)
        except OSError as exc:
            print(f"shmreplay: cannot remove {path}: {exc.strerror}", file=sys.stderr)
            continue
        removed += 1
        print(f"ray ledger {path}: buffer {name} is {'gone' if word == 'gone' else 'dead'}; "
              f"removed ({files} file(s))", file=out)
    return removed


def _label(name) -> str:
    """A port's buffer shows the address clients reach it at."""
    port = _address.port_of(name)
    return name if port is None else f"{name} (localhost:{port})"


def _attach(client_type, args):
    """A Client attached now: the operator's commands never wait for a buffer."""
    client = client_type(args.name, trust_group=args.trust_group)
    client._connected(0.0)
    return client


def _or_unknown(value) -> str:
    return "?" if value is None else str(value)


LOCK_WAIT = 1.0  # seconds a command waits for each table's lock before it reports it held


def _table_infos(client):
    """``{table: TableInfo, or the LockTimeoutError saying who holds its lock}``: a table
    whose lock a stopped process holds is reported, never waited for."""
    from shmreplay import errors
    infos = {}
    for engine in client._connected(0.0).engines:
        try:
            infos[engine.name] = engine.info(time.monotonic() + LOCK_WAIT, LOCK_WAIT)
        except errors.LockTimeoutError as exc:
            infos[engine.name] = exc
    return infos


def cmd_info(args, out):
    """``shmreplay info NAME``: each table's settings, sizes and rate limiter."""
    from shmreplay.client import Client
    with _attach(Client, args) as client:
        print(_info_owner(client, args.name), file=out)
        for table, info in _table_infos(client).items():
            if isinstance(info, Exception):
                print(f"table {table}: LOCKED, nothing read: {info}", file=out)
                continue
            limiter = info.rate_limiter_info
            print(f"table {table}: {info.current_size}/{info.max_size} items, "
                  f"sampler {info.sampler_options}, remover {info.remover_options}, "
                  f"max_times_sampled {info.max_times_sampled}", file=out)
            print(f"  rate limiter: samples_per_insert={limiter.samples_per_insert} "
                  f"min_size_to_sample={limiter.min_size_to_sample} min_diff={limiter.min_diff:g} "
                  f"max_diff={limiter.max_diff:g}; inserts={limiter.insert_stats.completed} "
                  f"samples={limiter.sample_stats.completed} deletes={limiter.delete_stats.completed}",
                  file=out)
            engine = client._engine(table)
            if engine.storage is not None:
                kind = "steps shared by items" if engine.storage.steps else "whole items"
                print(f"  storage: {kind}; {info.num_stored_steps} stored, "
                      f"{_peek.format_bytes(info.storage_bytes)} in memory (its data "
                      "segment)", file=out)
            print(f"  can insert now: {engine.can_insert(1)}; can sample now: "
                  f"{engine.can_sample(1)}", file=out)
            insert_reason, sample_reason = engine.blocked()
            for call, reason in (("insert", insert_reason), ("sample", sample_reason)):
                if reason is not None:
                    print(f"  next {call} {reason}", file=out)
    return 0


def _info_owner(client, name) -> str:
    """The first line of ``info``: the owner, and what a dead one means."""
    from shmreplay._shm.procs import judge
    header = client._buffer.header
    pid, start = int(header["owner_pid"][0]), int(header["owner_start"][0])
    alive = judge(pid, int(header["owner_ns"][0]), start)
    del header  # no view may outlive the mapping when the client closes
    memory = _peek.format_bytes(_peek.memory(_peek.segments_of(name)))
    memory = f"{memory} in memory (all its segments, as ls and top count it)"
    if alive is None:
        return f"buffer {name}: owner {pid}: {_peek.OTHER_NS}; {memory}"
    if alive:
        return f"buffer {name}: owner {pid} alive; {memory}"
    return (f"buffer {name}: owner {pid} is DEAD: it was killed before it could remove "
            "the buffer. The tables below are as it left them; `shmreplay gc` removes the "
            f"buffer. {memory[0].upper()}{memory[1:]}.")


def cmd_verify(args, out):
    """``shmreplay verify NAME``: checks each table's structures; exit 1 on a problem."""
    from shmreplay.client import Client
    status = 0
    from shmreplay import errors
    with _attach(Client, args) as client:
        for engine in client._connected(0.0).engines:
            try:
                problems = engine.verify(time.monotonic() + LOCK_WAIT, LOCK_WAIT)
            except errors.LockTimeoutError as exc:
                problems = [f"LOCKED, not verified: {exc}"]
            print(f"{engine.name}: {'ok' if not problems else '; '.join(problems)}", file=out)
            status |= bool(problems)
    return status


def _top_gone(client, name, inode):
    """Why the watched buffer is gone (stopped, removed or replaced), or None."""
    header = client._buffer.header
    stopped = int(header["state"][0]) == _layout.STATE_STOPPED
    del header  # no view may outlive the mapping when the client closes
    if stopped:
        return f"buffer '{name}' was stopped by its owner"
    try:
        if os.lstat(_peek.header_path(name)).st_ino != inode:
            return f"buffer '{name}' was removed and another one of that name created"
    except FileNotFoundError:
        return f"buffer '{name}' was removed (its segments are gone from {_peek.SHM_DIR})"
    return None


def _top_snapshot(client):
    """``{table: (info, can_insert, can_sample, insert_waiters, sample_waiters)}``, now."""
    snapshot = {}
    for table, info in _table_infos(client).items():
        engine = client._engine(table)
        if isinstance(info, Exception):
            snapshot[table] = info
            continue
        snapshot[table] = (info, engine.can_insert(1), engine.can_sample(1),
                           int(engine.ctrl[_layout.C_SPACE_WAITERS]),
                           int(engine.ctrl[_layout.C_ITEMS_WAITERS]))
    return snapshot


def _top_limiter(allowed, waiters, info, inserting):
    """'ok' or 'BLOCKED (why)', as the rate limiter's rules (see ``info``) explain it."""
    if allowed:
        text = "ok"
    elif inserting:
        text = "BLOCKED (needs samples)"  # (inserts + 1) * spi - samples > max_diff
    else:
        limiter = info.rate_limiter_info
        size = limiter.insert_stats.completed - limiter.delete_stats.completed
        text = (f"BLOCKED (size < {limiter.min_size_to_sample})"
                if size < limiter.min_size_to_sample else "BLOCKED (needs inserts)")
    return text + (f", {waiters} waiting" if waiters else "")


def _top_frame(name, before, after, elapsed, interval):
    seen = _peek.peek(name, tables=False)
    owner = f"owner {_or_unknown(seen.pid)} " + (
        "DEAD (see shmreplay gc)" if seen.alive is False else seen.status)
    memory = _peek.format_bytes(_peek.memory(_peek.segments_of(name)))
    lines = [f"shmreplay top: {name}  {owner}  memory {memory}  "
             f"{time.strftime('%H:%M:%S')}  every {interval:g} s (Ctrl-C quits)"]
    locked = {table: v for table, v in after.items() if isinstance(v, Exception)}
    after = {table: v for table, v in after.items() if table not in locked}
    width = max([5] + [len(table) for table in after])
    sizes = {table: f"{v[0].current_size}/{v[0].max_size}" for table, v in after.items()}
    items_width = max([9] + [len(text) for text in sizes.values()])
    lines.append(f"{'TABLE':{width}s} {'ITEMS':>{items_width}s} {'INSERT/S':>10s} "
                 f"{'SAMPLE/S':>10s} {'INSERTED':>11s} {'SAMPLED':>11s} {'DELETED':>11s}  "
                 "INSERTS | SAMPLES")
    for table, (info, can_insert, can_sample, insert_waiters, sample_waiters) in after.items():
        old = before.get(table, (info,))
        old = info if isinstance(old, Exception) else old[0]
        # The totals only grow (reset() keeps them); max() guards against anything else.
        insert_rate = max(0, info.num_inserted - old.num_inserted) / elapsed
        sample_rate = max(0, info.num_sampled - old.num_sampled) / elapsed
        lines.append(
            f"{table:{width}s} {sizes[table]:>{items_width}s} "
            f"{insert_rate:10.1f} {sample_rate:10.1f} "
            f"{info.num_inserted:11d} {info.num_sampled:11d} {info.num_deleted:11d}  "
            f"{_top_limiter(can_insert, insert_waiters, info, True)} | "
            f"{_top_limiter(can_sample, sample_waiters, info, False)}")
    for table, error in locked.items():
        lines.append(f"{table}: LOCKED, nothing read: {error}")
    return "\n".join(lines) + "\n"


def _positive_float(text):
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def cmd_top(args, out):
    """Refreshes a view of every table every ``--interval`` s; rates are over that interval."""
    tty = getattr(out, "isatty", lambda: False)()
    client = None
    try:
        from shmreplay.client import Client
        try:
            client = _attach(Client, args)
            inode = os.lstat(_peek.header_path(args.name)).st_ino
        except (errors.BufferNotFoundError, FileNotFoundError):
            print(f"shmreplay top: no buffer named '{args.name}' on this machine "
                  "(shmreplay ls lists them)", file=sys.stderr)
            return 1
        before, then = _top_snapshot(client), time.monotonic()
        shown = 0
        while args.iterations is None or shown < args.iterations:
            time.sleep(max(0.0, then + args.interval - time.monotonic()))
            gone = _top_gone(client, args.name, inode)
            if gone:
                raise errors.BufferBrokenError(gone)
            after, now = _top_snapshot(client), time.monotonic()
            frame = _top_frame(args.name, before, after, now - then, args.interval)
            out.write(("\x1b[H\x1b[2J" + frame) if tty else (frame + "\n"))
            out.flush()
            before, then = after, now
            shown += 1
        return 0
    except errors.BufferBrokenError as exc:  # stopped, removed or replaced while watched
        print(f"shmreplay top: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # the reader went away (``shmreplay top NAME | head``)
        _quiet_stdout(out)
        return 0
    finally:
        if client is not None:
            client.close()


def cmd_checkpoint(args, out):
    """``shmreplay checkpoint NAME PATH``: writes a consistent snapshot of every table."""
    from shmreplay._ops import checkpoint as _checkpoint
    from shmreplay.client import Client
    with _attach(Client, args) as client:
        progress = None if args.progress is None else args.progress == "on"
        path = client.checkpoint(args.path, progress=progress)
    saved = _checkpoint.load(path)
    items = ", ".join(f"{t.name}: {t.num_items}" for t in saved.tables)
    print(f"{path}: {os.path.getsize(path) / 2**20:.1f} MiB; items {items}", file=out)
    return 0


def cmd_rm(args, out):
    """``shmreplay rm NAME``: removes a buffer whose owner is gone (``--force``: any)."""
    status = 0
    for name in args.names:
        seen = _peek.peek(name, tables=False)
        entries = _peek.segments_of(name)
        if not entries:
            print(f"{name}: not found", file=out)
            status = 1
            continue
        if not args.force and seen.alive:
            print(f"{name}: owner {seen.pid} is alive; stop it there, or use --force", file=out)
            status = 1
            continue
        if not args.force and seen.exists and seen.alive is None:
            print(f"{name}: not removed: {_peek.SHM_DIR}/{_layout.SEGMENT_PREFIX}{name}: "
                  f"{seen.problem}; --force removes it anyway", file=out)
            status = 1
            continue
        removed = _remove(seen, entries)
        print(f"{name}: removed {removed} segment(s)", file=out)
        status |= not removed
    return status


def cmd_gc(args, out):
    """``shmreplay gc``: removes every buffer whose owner process is gone, then the
    shmreplay.ray ledgers of buffers that are gone."""
    removed = 0
    for name, entries in _peek.segments().items():
        seen = _peek.peek(name, tables=False)
        if seen.alive is False:
            removed += 1
            print(f"{name}: owner {seen.pid} is gone; removed {_remove(seen, entries)} "
                  "segment(s)", file=out)
        elif seen.alive is None:  # nothing says it is dead: never removed on a guess
            print(f"{name}: left alone: {seen.problem} (if it stays, `shmreplay rm --force "
                  f"{name}` removes it)", file=out)
    removed += _gc_ledgers(out)
    if not removed:
        print("nothing to remove", file=out)
    return 0


def cmd_compile(args, out):
    """``shmreplay compile``: compiles and caches the kernels for this machine."""
    from shmreplay._ops import warmup as _warmup
    report = _warmup.warm_up()
    done = (f"compiled {report.compiled} of {report.kernels} kernels"
            if report.compiled else f"all {report.kernels} kernels were already compiled")
    print(f"{done} ({report.seconds:.1f} s); cached in {report.cache_directory}", file=out)
    return 0


def _remove(seen, entries):
    """Marks the buffer stopped for every process still attached (``_retire``), then
    unlinks ``entries``, data segments first and the header last; nothing if the header
    segment is no longer the one ``seen`` read (the name went to a new buffer meanwhile).
    An entry that cannot be unlinked is reported and skipped."""
    header = _layout.SEGMENT_PREFIX + seen.name
    if seen.inode is not None:
        try:
            if os.lstat(os.path.join(_peek.SHM_DIR, header)).st_ino != seen.inode:
                return 0
        except FileNotFoundError:
            pass
        _retire.retire(seen.name, seen.inode)
    count = 0
    for entry in sorted(entries, key=lambda e: e == header):
        try:
            os.unlink(os.path.join(_peek.SHM_DIR, entry))
            count += 1
        except FileNotFoundError:
            pass
        except PermissionError:
            # /dev/shm is sticky: a segment a group member created is theirs to remove.
            print(f"shmreplay: cannot remove {_peek.SHM_DIR}/{entry}: it belongs to another "
                  "user", file=sys.stderr)
        except OSError as exc:  # a directory (EISDIR as root), ...
            print(f"shmreplay: cannot remove {_peek.SHM_DIR}/{entry}: {exc.strerror}; it is "
                  "not a shared-memory segment: remove it by hand if it is not needed",
                  file=sys.stderr)
    return count


def main(argv=None, out=None):
    """The ``shmreplay`` command: runs the subcommand ``argv`` names; returns its exit status."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="shmreplay", description=__doc__.splitlines()[0])
    parser.add_argument("--trust-group", action="store_true",
                        help="also attach to a buffer that another user of your group "
                             "shared with it (Server(share_with_group=True))")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "ls", help="list buffers on this machine",
        description="List the buffers in /dev/shm: owner pid; STATE alive, dead (gc "
                    "removes it), creating, stopped, other-ns (the owner runs in another "
                    "pid namespace: not judged from here), or ? (not a buffer this "
                    "shmreplay can read); tables; items now; MEMORY, what the buffer's "
                    "segments occupy now (pages written so far, not the size reserved), "
                    "the figure top and info show too. Then shmreplay.ray's ledger "
                    "directories (/dev/shm/shmreplay-ray-ledger.BUFFER), with their "
                    "buffer's state (gone: it does not exist).").set_defaults(run=cmd_ls)
    info = commands.add_parser("info", help="tables, sizes, counters and rate-limiter state")
    info.add_argument("name")
    info.set_defaults(run=cmd_info)
    verify = commands.add_parser("verify", help="check every table's invariants")
    verify.add_argument("name")
    verify.set_defaults(run=cmd_verify)
    top = commands.add_parser("top", help="live view: sizes, insert/sample rates, blocked calls")
    top.add_argument("name")
    top.add_argument("--interval", type=_positive_float, default=1.0, metavar="SECONDS",
                     help="seconds between refreshes; rates are over this interval (1.0)")
    top.add_argument("--iterations", type=_positive_int, default=None, metavar="N",
                     help="stop after N refreshes (default: until Ctrl-C)")
    top.set_defaults(run=cmd_top)
    checkpoint = commands.add_parser(
        "checkpoint", help="write a consistent snapshot of every table to a file")
    checkpoint.add_argument("name")
    checkpoint.add_argument("path", help="the file, or a directory for a timestamped file")
    checkpoint.add_argument("--progress", choices=("on", "off"), default=None,
                            help="progress bar on stderr (default: for large buffers on a terminal)")
    checkpoint.set_defaults(run=cmd_checkpoint)
    rm = commands.add_parser("rm", help="remove buffers by name")
    rm.add_argument("names", nargs="+")
    rm.add_argument("--force", action="store_true",
                    help="even if the owner is alive, or the segment is not a buffer this "
                         "shmreplay can read")
    rm.set_defaults(run=cmd_rm)
    commands.add_parser("gc", help="remove buffers whose owner is dead (never one whose owner "
                                   "cannot be judged), and shmreplay.ray's ledgers of "
                                   "buffers gone or dead").set_defaults(run=cmd_gc)
    commands.add_parser(
        "compile", help="compile the kernels now (the first Server would), e.g. in an image build",
        description="Fill numba's cache with every kernel of this shmreplay for this CPU, "
                    "as the first Server created on a machine does; a no-op when the cache "
                    "already holds them. Safe to run while other processes use shmreplay."
    ).set_defaults(run=cmd_compile)
    args = parser.parse_args(argv)
    try:
        return args.run(args, out)
    except errors.ShmReplayError as exc:
        print(f"shmreplay: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``shmreplay info NAME | head -2``)
        _quiet_stdout(out)
        return 0


def _quiet_stdout(out):
    """Points ``out`` at /dev/null, so the interpreter's final flush does not complain."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    except (AttributeError, OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())

"""The operator's command line: ``shmreplay ls | info | top | verify | checkpoint | rm | gc``.

Buffers are found by listing ``/dev/shm`` for header segments ``shmreplay.NAME``. A
buffer whose owner process is gone (it was SIGKILLed, so it could not clean up) is
reported as ``dead`` and removed by ``gc``.
"""

import argparse
import os
import sys
import time

from shmreplay import _buffer, _layout, _segment, errors
from shmreplay._procs import pid_alive

SHM_DIR = "/dev/shm"


def _buffer_names():
    """Names of the buffers whose header segment is in /dev/shm."""
    names = []
    for entry in sorted(os.listdir(SHM_DIR)):
        if not entry.startswith(_layout.SEGMENT_PREFIX):
            continue
        name = entry[len(_layout.SEGMENT_PREFIX):]
        if ".t" in name and name.rsplit(".t", 1)[1].isdigit():
            continue  # a data segment
        names.append(name)
    return names


def _segments_of(name):
    prefix = _layout.SEGMENT_PREFIX + name
    return [entry for entry in os.listdir(SHM_DIR)
            if entry == prefix or (entry.startswith(prefix + ".t")
                                   and entry[len(prefix) + 2:].isdigit())]


def _owner(name):
    """(pid, alive) of a buffer's owner, read from its header; (None, False) if unreadable."""
    try:
        with open(os.path.join(SHM_DIR, _layout.SEGMENT_PREFIX + name), "rb") as segment:
            raw = segment.read(_layout.HEADER.itemsize)
    except OSError:
        return None, False
    import numpy as np
    if len(raw) < _layout.HEADER.itemsize:
        return None, False
    header = np.frombuffer(raw, _layout.HEADER, 1)[0]
    if header["magic"] != _layout.MAGIC:
        return None, False
    pid, start = int(header["owner_pid"]), int(header["owner_start"])
    alive = pid_alive(pid, start)
    return pid, alive


def _bytes_in_use(name):
    return sum(_segment.resident_bytes("/" + entry) for entry in _segments_of(name))


def cmd_ls(args, out):
    names = _buffer_names()
    if not names:
        print("no shmreplay buffers", file=out)
        return 0
    print(f"{'NAME':40s} {'OWNER':>8s} {'STATE':6s} {'TABLES':>6s} {'ITEMS':>10s} {'MEMORY':>10s}",
          file=out)
    for name in names:
        pid, alive = _owner(name)
        tables, items = "?", "?"
        try:
            client_buffer = _buffer.attach(name, wait_active=0.0)
            try:
                tables = str(len(client_buffer.engines))
                items = str(sum(int(e.ctrl[_layout.C_SIZE]) for e in client_buffer.engines))
            finally:
                client_buffer.close()
        except (errors.ShmReplayError, OSError, ValueError):
            pass  # being created or removed right now, or not ours: list what we know
        state = "alive" if alive else "dead"
        print(f"{name:40s} {pid if pid else '?':>8} {state:6s} {tables:>6s} {items:>10s} "
              f"{_bytes_in_use(name) / 2**20:9.1f}M", file=out)
    return 0


def cmd_info(args, out):
    from shmreplay.client import Client
    with Client(args.name, trust_group=args.trust_group) as client:
        for table, info in client.server_info().items():
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
                      f"{info.storage_bytes / 2**20:.1f} MiB in memory", file=out)
            print(f"  can insert now: {engine.can_insert(1)}; can sample now: "
                  f"{engine.can_sample(1)}", file=out)
            insert_reason, sample_reason = engine.blocked()
            for call, reason in (("insert", insert_reason), ("sample", sample_reason)):
                if reason is not None:
                    print(f"  next {call} {reason}", file=out)
    return 0


def cmd_verify(args, out):
    from shmreplay.client import Client
    status = 0
    with Client(args.name, trust_group=args.trust_group) as client:
        for table in client.server_info():
            problems = client.verify(table)
            print(f"{table}: {'ok' if not problems else '; '.join(problems)}", file=out)
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
        if os.stat(os.path.join(SHM_DIR, _layout.SEGMENT_PREFIX + name)).st_ino != inode:
            return f"buffer '{name}' was removed and another one of that name created"
    except FileNotFoundError:
        return f"buffer '{name}' was removed (its segments are gone from {SHM_DIR})"
    return None


def _top_snapshot(client):
    """``{table: (info, can_insert, can_sample, insert_waiters, sample_waiters)}``, now."""
    snapshot = {}
    for table, info in client.server_info().items():
        engine = client._engine(table)
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
    pid, alive = _owner(name)
    owner = f"owner {pid if pid else '?'} {'alive' if alive else 'DEAD (see shmreplay gc)'}"
    memory = _bytes_in_use(name)
    memory = f"{memory / 2**20:.1f} MiB" if memory >= 2**20 else f"{memory / 2**10:.0f} KiB"
    lines = [f"shmreplay top: {name}  {owner}  shared memory {memory}  "
             f"{time.strftime('%H:%M:%S')}  every {interval:g} s (Ctrl-C quits)"]
    width = max([5] + [len(table) for table in after])
    sizes = {table: f"{v[0].current_size}/{v[0].max_size}" for table, v in after.items()}
    items_width = max([9] + [len(text) for text in sizes.values()])
    lines.append(f"{'TABLE':{width}s} {'ITEMS':>{items_width}s} {'INSERT/S':>10s} "
                 f"{'SAMPLE/S':>10s} {'INSERTED':>11s} {'SAMPLED':>11s} {'DELETED':>11s}  "
                 "INSERTS | SAMPLES")
    for table, (info, can_insert, can_sample, insert_waiters, sample_waiters) in after.items():
        old = before.get(table, (info,))[0]
        # The totals only grow (reset() keeps them); max() guards against anything else.
        insert_rate = max(0, info.num_inserted - old.num_inserted) / elapsed
        sample_rate = max(0, info.num_sampled - old.num_sampled) / elapsed
        lines.append(
            f"{table:{width}s} {sizes[table]:>{items_width}s} "
            f"{insert_rate:10.1f} {sample_rate:10.1f} "
            f"{info.num_inserted:11d} {info.num_sampled:11d} {info.num_deleted:11d}  "
            f"{_top_limiter(can_insert, insert_waiters, info, True)} | "
            f"{_top_limiter(can_sample, sample_waiters, info, False)}")
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
            client = Client(args.name, trust_group=args.trust_group)
            inode = os.stat(os.path.join(SHM_DIR, _layout.SEGMENT_PREFIX + args.name)).st_ino
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
    from shmreplay import _checkpoint
    from shmreplay.client import Client
    with Client(args.name, trust_group=args.trust_group) as client:
        progress = None if args.progress is None else args.progress == "on"
        path = client.checkpoint(args.path, progress=progress)
    saved = _checkpoint.load(path)
    items = ", ".join(f"{t.name}: {t.num_items}" for t in saved.tables)
    print(f"{path}: {os.path.getsize(path) / 2**20:.1f} MiB; items {items}", file=out)
    return 0


def cmd_rm(args, out):
    status = 0
    for name in args.names:
        pid, alive = _owner(name)
        if alive and not args.force:
            print(f"{name}: owner {pid} is alive; stop it there, or use --force", file=out)
            status = 1
            continue
        removed = _remove(name)
        print(f"{name}: removed {removed} segment(s)" if removed else f"{name}: not found",
              file=out)
        status |= not removed
    return status


def cmd_gc(args, out):
    removed = 0
    for name in _buffer_names():
        pid, alive = _owner(name)
        if not alive:
            removed += 1
            print(f"{name}: owner {pid} is gone; removed {_remove(name)} segment(s)", file=out)
    if not removed:
        print("nothing to remove", file=out)
    return 0


def _remove(name):
    count = 0
    for entry in _segments_of(name):
        try:
            os.unlink(os.path.join(SHM_DIR, entry))
            count += 1
        except FileNotFoundError:
            pass
        except PermissionError:
            # /dev/shm is sticky: a segment a group member created is theirs to remove.
            print(f"shmreplay: cannot remove {SHM_DIR}/{entry}: it belongs to another "
                  "user", file=sys.stderr)
    return count


def main(argv=None, out=None):
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="shmreplay", description=__doc__.splitlines()[0])
    parser.add_argument("--trust-group", action="store_true",
                        help="also attach to a buffer that another user of your group "
                             "shared with it (Server(share_with_group=True))")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("ls", help="list buffers on this machine").set_defaults(run=cmd_ls)
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
    rm.add_argument("--force", action="store_true", help="even if the owner is alive")
    rm.set_defaults(run=cmd_rm)
    commands.add_parser("gc", help="remove buffers whose owner is dead").set_defaults(run=cmd_gc)
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

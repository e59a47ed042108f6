"""The operator's command line: ``shmreplay ls | info NAME | verify NAME | rm NAME | gc``.

Buffers are found by listing ``/dev/shm`` for header segments ``shmreplay.NAME``. A
buffer whose owner process is gone (it was SIGKILLed, so it could not clean up) is
reported as ``dead`` and removed by ``gc``.
"""

import argparse
import os
import sys

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
    with Client(args.name) as client:
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
    return 0


def cmd_verify(args, out):
    from shmreplay.client import Client
    status = 0
    with Client(args.name) as client:
        for table in client.server_info():
            problems = client.verify(table)
            print(f"{table}: {'ok' if not problems else '; '.join(problems)}", file=out)
            status |= bool(problems)
    return status


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
    return count


def main(argv=None, out=None):
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="shmreplay", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("ls", help="list buffers on this machine").set_defaults(run=cmd_ls)
    info = commands.add_parser("info", help="tables, sizes, counters and rate-limiter state")
    info.add_argument("name")
    info.set_defaults(run=cmd_info)
    verify = commands.add_parser("verify", help="check every table's invariants")
    verify.add_argument("name")
    verify.set_defaults(run=cmd_verify)
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


if __name__ == "__main__":
    sys.exit(main())

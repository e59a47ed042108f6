"""Processes of another pid namespace, for ``test_pid_namespaces``.

Run as ``unshare --pid --fork --mount-proc --kill-child python _pidns_workers.py PID
ROLE NAME``. The script starts as the namespace's init (pid 1); it makes the next pid
PID (``/proc/sys/kernel/ns_last_pid``) and runs ROLE as a child, so the role's pid is
PID inside the namespace: a pid the test chose because no process has it outside,
where it would look dead. The role talks over stdin/stdout, one JSON line per message.
"""

import json
import os
import subprocess
import sys

import numpy as np


def _say(**message):
    print(json.dumps(message), flush=True)


def _wait_for(word):
    line = sys.stdin.readline().strip()
    if line != word:
        raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


def actor(name):
    """Inserts items 0 and 1, reserves a slot for item 2 and holds it until told to
    commit (a writer with an item under way), then commits it."""
    import shmreplay
    from shmreplay import errors
    from shmreplay._shm import layout as L
    client = shmreplay.Client(name)
    engine = client._engine("q")
    keys = [int(client.insert({"id": np.int64(i)}, {"q": 1.0}, timeout=5)["q"])
            for i in range(2)]
    slots = engine.reserve(1, timeout=5)
    _say(pid=os.getpid(), stamp=int(engine.meta[slots[0], L.M_WRITER]), keys=keys,
         slot=int(slots[0]))
    _wait_for("commit")
    engine.write(slots, [np.int64(2)], False)
    try:
        key = int(engine.commit(slots, np.ones(1))[0])
    except errors.ShmReplayError as exc:
        _say(error=f"{type(exc).__name__}: {exc}")
    else:
        _say(key=key)
    client.close()


def owner(name):
    """Owns buffer ``name`` (a queue ``q`` of 4) until told to check it, then inserts,
    verifies and stops it."""
    import shmreplay
    with shmreplay.Server([shmreplay.Table.queue("q", 4)], name=name):
        _say(pid=os.getpid())
        _wait_for("check")
        with shmreplay.Client(name) as client:
            key = int(client.insert({"id": np.int64(7)}, {"q": 1.0}, timeout=5)["q"])
            _say(key=key, problems=client.verify("q"))


def main(pid, role, name):
    if os.getpid() == 1:  # the namespace's init: run the role as pid ``pid``
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(int(pid) - 1))
        return subprocess.call([sys.executable, __file__, pid, role, name])
    {"actor": actor, "owner": owner}[role](name)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

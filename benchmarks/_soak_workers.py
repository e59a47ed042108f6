"""The worker processes of ``bench_soak.py`` (actors and the learner), and what they share
with the parent: the table's settings and the words of the control block.

Not a public module. Workers are started with ``multiprocessing`` spawn and attach to the
buffer by name; the parent coordinates them through the control block (a shared int64
array: the phase, the probes' ids and start times, acknowledgements and counters).
"""

import os
import signal
import time
import traceback

import numpy as np

TABLE = "replay"
REFERENCE = "reference"   # a table nobody waits on: the probe calls' cost without a wake-up
MAX_SIZE = 100_000
BATCH = 256
ALPHA = 0.6
BETA = 0.4
SPI = 8.0                 # samples per insert
MIN_SIZE = 1000
ERROR_BUFFER = 10 * BATCH  # the band is SPI * MIN_SIZE +- this
PROBE_PRIORITY = 1e9      # probe items: the learner's next draw takes them
CALL_TIMEOUT = 30.0       # every blocking call of a worker
STEP_TIMEOUT = 10.0       # every wait of the parent for a worker's state
STARTUP_TIMEOUT = 180.0
OBS = 8

# Words of the shared control block (int64).
(PHASE, SERIAL, SMP_PROBE_ID, SMP_PROBE_T0, INS_PROBE_ID, INS_PROBE_T0, LEARNER_ACK,
 LEARNER_SEEN, LEARNER_CALLS, LEARNER_ITEMS) = range(10)
ACTOR_ACK = 16            # + actor index
ACTOR_INSERTS = 48        # + actor index
CONTROL_WORDS = 80
MAX_ACTORS = 32
RUN, PAUSE_ACTORS, PAUSE_LEARNER, STOP = range(4)
POLL = 0.001              # how often a paused worker looks at the control block
WAIT_POLL = 0.0002        # how often the parent does, while it runs a probe


def transition(rng, actor):
    return {"obs": rng.standard_normal(OBS).astype(np.float32),
            "action": np.int32(rng.integers(0, 4)),
            "reward": np.float32(rng.standard_normal()),
            "discount": np.float32(0.99),
            "next_obs": rng.standard_normal(OBS).astype(np.float32),
            "actor": np.int32(actor),
            "probe": np.zeros((), np.int64),    # 0, or the id of a sample probe
            "t_ns": np.zeros((), np.int64)}     # monotonic_ns() before the insert call


def _paused():
    """One poll interval of a paused worker; exits if the parent died (it was killed)."""
    if os.getppid() != _PARENT[0]:
        os._exit(3)
    time.sleep(POLL)


_PARENT = [0]


def worker(role, index, name, control, msgs, seed):
    """Runs one actor or the learner; reports ("ready" | "done" | "error", ...)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates the shutdown
    _PARENT[0] = os.getppid()
    try:
        import shmreplay
        from shmreplay import errors
        client = shmreplay.Client(name)
        try:
            result = (_actor if role == "actor" else _learner)(
                client, errors, index, control, msgs, seed)
        finally:
            client.close()
        msgs.put(("done", role, index, result))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        msgs.put(("error", role, index, traceback.format_exc()))


def _actor(client, errors, index, control, msgs, seed):
    rng = np.random.default_rng(seed)
    item = transition(rng, index)
    stamp = item["t_ns"]
    prio = {TABLE: 1.0}
    insert = client.insert
    now = time.monotonic_ns
    insert(item, prio, timeout=CALL_TIMEOUT)  # warm-up: attach the columns, load kernels
    msgs.put(("ready", "actor", index, None))
    wakeups = []                              # (probe id, ns from unblocking call to return)
    seen = 0
    inserted = 0
    while True:
        phase = control[PHASE]
        if phase == STOP:
            break
        if phase == PAUSE_ACTORS:
            control[ACTOR_ACK + index] = control[SERIAL]
            _paused()
            continue
        t_call = now()
        stamp[...] = t_call
        try:
            insert(item, prio, timeout=CALL_TIMEOUT)
        except errors.BufferBrokenError:
            if control[PHASE] == STOP:
                break  # the parent stopped the buffer to end the run
            raise
        t_return = now()
        inserted += 1
        control[ACTOR_INSERTS + index] = inserted
        if control[INS_PROBE_ID] != seen:
            seen = control[INS_PROBE_ID]
            t0 = control[INS_PROBE_T0]
            if t_call < t0:  # this insert was waiting when the probe's sample began
                wakeups.append((int(seen), t_return - t0))
            control[ACTOR_ACK + index] = control[SERIAL]
            while control[PHASE] == PAUSE_LEARNER:
                _paused()
    return {"inserted": inserted, "wakeups": wakeups}


def _learner(client, errors, index, control, msgs, seed):
    rng = np.random.default_rng(seed)
    pool = [rng.random(BATCH) + 0.05 for _ in range(8)]
    sample_batch, update = client.sample_batch, client.update_priorities
    now = time.monotonic_ns
    for _ in range(20):  # warm-up on the parent's reference table: load every kernel now
        warm = sample_batch(REFERENCE, 8, timeout=CALL_TIMEOUT)
        warm.info.importance_weights(BETA)
        update(REFERENCE, warm.info.key, pool[0][:len(warm.info.key)])
    msgs.put(("ready", "learner", index, None))
    wakeups = []         # (probe id, ns from the probe's t_ns to the return)
    missed = []          # probes whose items were not in the returned batch (t0 used)
    seen = 0
    calls = items = 0
    while True:
        phase = control[PHASE]
        if phase == STOP:
            break
        if phase == PAUSE_LEARNER:
            control[LEARNER_ACK] = control[SERIAL]
            _paused()
            continue
        t_call = now()
        try:
            sample = sample_batch(TABLE, BATCH, timeout=CALL_TIMEOUT)
        except errors.BufferBrokenError:
            if control[PHASE] == STOP:
                break
            raise
        t_return = now()
        if control[SMP_PROBE_ID] != seen:
            seen = control[SMP_PROBE_ID]
            t0 = control[SMP_PROBE_T0]
            if t_call < t0:  # this call was waiting when the probe's insert began
                hit = sample.data["probe"] == seen
                if hit.any():
                    wakeups.append((int(seen), t_return - int(sample.data["t_ns"][hit].min())))
                else:
                    missed.append((int(seen), t_return - t0))
            control[LEARNER_SEEN] = seen
        sample.info.importance_weights(BETA)
        keys = sample.info.key
        calls += 1
        update(TABLE, keys, pool[calls & 7][:len(keys)])
        items += len(keys)
        control[LEARNER_CALLS] = calls
        control[LEARNER_ITEMS] = items
    return {"calls": calls, "items": items, "wakeups": wakeups, "missed": missed}

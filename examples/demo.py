"""shmreplay demo: actor processes insert transitions, a learner samples prioritized batches.

    python examples/demo.py                    # 2 actors, 10 seconds
    python examples/demo.py --actors 4 --seconds 30
    python examples/demo.py --samples-per-insert 0    # MinSize limiter: no ratio control

The main process creates the buffer (a ``shmreplay.Server``) and owns its lifetime.
Actors and the learner are separate processes started with multiprocessing's 'spawn'
method; each attaches with nothing but the buffer's name, ``shmreplay.Client(name)``.

- Actors step a toy 8-D random-walk environment with a random policy and insert one
  transition per step, ``{obs, action, reward, next_obs, done}``, with priority 1.0.
- The learner samples batches of 256 with ``Client.sample_batch``, weights them with
  ``info.importance_weights(beta)``, takes a TD(0) step of a linear value function and
  writes ``|TD error|`` back as the new priorities with ``Client.update_priorities``.
- The main process prints the table's counters once a second (``Client.server_info``).

Stopping: after ``--seconds``, on Ctrl-C or on SIGTERM the main process tells the workers
to stop, joins them and stops the server, which removes the buffer from /dev/shm. Workers
ignore Ctrl-C themselves (the terminal sends it to every process of the group); they
stop when told, when the buffer is gone, or when the main process has died.

The first run in a fresh checkout compiles shmreplay's numba kernels in every process
(a few seconds); later runs load them from numba's on-disk cache. The clock starts once
every worker has done its first insert or sample.
"""

import argparse
import contextlib
import os
import queue
import signal
import sys
import time
import traceback
import uuid

import multiprocessing as mp

import numpy as np

import shmreplay
from shmreplay import errors, rate_limiters, selectors

TABLE = "replay"
OBS_DIM = 8
NUM_ACTIONS = 2 * OBS_DIM  # push one coordinate up or down
GAMMA = 0.99
LEARNING_RATE = 0.01
POLL = 0.1  # seconds: how long a blocked call waits before workers check whether to stop

# With a signature the server creates every column up front; without one, the first
# inserted item would fix the columns' shapes and dtypes.
SIGNATURE = {
    "obs": shmreplay.TensorSpec((OBS_DIM,), np.float32),
    "action": shmreplay.TensorSpec((), np.int64),
    "reward": shmreplay.TensorSpec((), np.float32),
    "next_obs": shmreplay.TensorSpec((OBS_DIM,), np.float32),
    "done": shmreplay.TensorSpec((), np.bool_),
}


# --- the toy environment --------------------------------------------------------------------


class RandomWalk:
    """A point in 8-D. Each action pushes one coordinate up or down, plus noise.

    The reward is minus the distance from the origin; an episode ends when the point
    strays further than 3 from it, or after 200 steps.
    """

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.reset()

    def reset(self) -> np.ndarray:
        self.pos = self.rng.normal(0.0, 0.5, OBS_DIM).astype(np.float32)
        self.steps = 0
        return self.pos

    def step(self, action: int):
        push = np.zeros(OBS_DIM, np.float32)
        push[action // 2] = 0.1 if action % 2 else -0.1
        self.pos = self.pos + push + self.rng.normal(0.0, 0.05, OBS_DIM).astype(np.float32)
        self.steps += 1
        distance = float(np.linalg.norm(self.pos))
        done = distance > 3.0 or self.steps >= 200
        return self.pos, np.float32(-0.1 * distance), done


# --- worker processes -----------------------------------------------------------------------


class _Stop(Exception):
    """Raised inside an actor to leave its loops."""


def _parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid  # an orphan is adopted by another process


def actor(index, name, stop, events, parent_pid):
    """Steps the environment and inserts one transition per step."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides when to stop
    role = f"actor {index}"
    inserted = 0
    try:
        with shmreplay.Client(name) as client:
            env = RandomWalk(seed=index)
            actions = env.rng.integers(NUM_ACTIONS, size=1 << 16)
            obs = env.reset()
            step = 0
            while True:
                if step % 256 == 0 and (stop.is_set() or not _parent_alive(parent_pid)):
                    break
                action = actions[step % actions.size]  # a random policy: np.int64
                next_obs, reward, done = env.step(action)
                transition = {"obs": obs, "action": action, "reward": reward,
                              "next_obs": next_obs, "done": np.bool_(done)}
                # New items get a high priority so that they are sampled soon; the
                # learner lowers it to |TD error|. With SampleToInsertRatio the insert
                # blocks while actors run ahead of the learner: wait a little at a time
                # so that a stop request is noticed.
                while True:
                    try:
                        client.insert(transition, priorities={TABLE: 1.0}, timeout=POLL)
                        break
                    except errors.DeadlineExceededError:
                        if stop.is_set() or not _parent_alive(parent_pid):
                            raise _Stop from None
                if inserted == 0:
                    events.put(("ready", role, None))
                inserted += 1
                step += 1
                obs = env.reset() if done else next_obs
    except _Stop:
        pass
    except (errors.BufferBrokenError, errors.BufferNotFoundError):
        pass  # the owner removed the buffer (Ctrl-C or SIGTERM in the main process)
    except BaseException:
        events.put(("error", role, traceback.format_exc()))
        raise
    events.put(("done", role, {"inserted": inserted}))


def learner(name, stop, events, parent_pid, batch_size, seconds):
    """Samples prioritized batches, takes TD(0) steps and updates the priorities."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    role = "learner"
    weights = np.zeros(OBS_DIM + 1)  # a linear value function over [obs, 1]
    stats = {"batches": 0, "sampled": 0, "updated": 0, "beta": 0.4, "mean_weight": 1.0}
    started = None
    try:
        with shmreplay.Client(name) as client:
            while not stop.is_set() and _parent_alive(parent_pid):
                try:
                    batch = client.sample_batch(TABLE, batch_size, timeout=POLL)
                except errors.DeadlineExceededError:
                    continue  # the rate limiter holds us back: check for stop, retry
                if started is None:
                    started = time.monotonic()
                # Anneal the importance-sampling exponent from 0.4 to 1 over the run.
                progress = min(1.0, (time.monotonic() - started) / seconds)
                beta = 0.4 + 0.6 * progress
                is_weights = batch.info.importance_weights(beta)  # float32 [B], max 1

                data = batch.data
                x = _features(data["obs"])
                x_next = _features(data["next_obs"])
                not_done = 1.0 - data["done"].astype(np.float64)
                td = data["reward"] + GAMMA * not_done * (x_next @ weights) - x @ weights
                td = np.clip(td, -1.0, 1.0)  # DQN-style error clipping keeps the toy stable
                weights += LEARNING_RATE * (is_weights * td) @ x / len(td)

                # New priorities: |TD error|, plus a floor so that no item becomes
                # unsampleable. Items evicted since the sample are skipped.
                stats["updated"] += client.update_priorities(
                    TABLE, batch.info.key, np.abs(td) + 1e-3)
                if stats["batches"] == 0:  # every kernel the loop needs is compiled now
                    events.put(("ready", role, None))
                stats["batches"] += 1
                stats["sampled"] += len(td)
                stats["beta"] = beta
                stats["mean_weight"] = float(np.mean(is_weights))
    except (errors.BufferBrokenError, errors.BufferNotFoundError):
        pass
    except BaseException:
        events.put(("error", role, traceback.format_exc()))
        raise
    events.put(("done", role, stats))


def _features(obs: np.ndarray) -> np.ndarray:
    return np.concatenate([obs, np.ones((len(obs), 1), obs.dtype)], axis=1).astype(np.float64)


# --- the main process -----------------------------------------------------------------------


class _Terminated(Exception):
    """SIGTERM arrived: unwinds the main process the way KeyboardInterrupt does for Ctrl-C."""


class _WorkerFailed(Exception):
    def __init__(self, role, detail):
        super().__init__(role)
        self.role, self.detail = role, detail


def _on_sigterm(signum, frame):
    raise _Terminated()


@contextlib.contextmanager
def _signals_ignored(*signums):
    """Ignores signals for a while; children started meanwhile ignore them from birth."""
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def make_table(args) -> shmreplay.Table:
    if args.samples_per_insert > 0:
        # Keep about `samples_per_insert` sampled items per inserted one once `min_size`
        # items are in, with slack for a few batches either way.
        limiter = rate_limiters.SampleToInsertRatio(
            samples_per_insert=args.samples_per_insert,
            min_size_to_sample=args.min_size,
            error_buffer=4 * args.batch_size * max(1.0, args.samples_per_insert))
    else:
        limiter = rate_limiters.MinSize(args.min_size)
    return shmreplay.Table(
        name=TABLE,
        sampler=selectors.Prioritized(priority_exponent=0.6),
        remover=selectors.Fifo(),
        max_size=args.max_size,
        rate_limiter=limiter,
        signature=SIGNATURE)


class Progress:
    """Turns the table's counters (``Client.server_info``) into per-second rates."""

    def __init__(self, client):
        self.client = client
        self.first = self.last = self._counters()
        self.t0 = self.t_last = time.monotonic()

    def _counters(self):
        info = self.client.server_info()[TABLE]
        return info.num_inserted, info.num_sampled, info.current_size

    def print_header(self):
        print(f"{'time':>6}  {'inserts/s':>11}  {'samples/s':>11}  {'table size':>10}", flush=True)

    def print_line(self):
        now, current = time.monotonic(), self._counters()
        dt = now - self.t_last
        print(f"{now - self.t0:5.1f}s  {(current[0] - self.last[0]) / dt:>11,.0f}  "
              f"{(current[1] - self.last[1]) / dt:>11,.0f}  {current[2]:>10,}", flush=True)
        self.last, self.t_last = current, now

    def summary(self) -> str:
        seconds = self.t_last - self.t0
        if seconds <= 0:
            return "  no full second was measured"
        inserted = self.last[0] - self.first[0]
        sampled = self.last[1] - self.first[1]
        ratio = f"{sampled / inserted:.2f}" if inserted else "n/a"
        return (f"  {seconds:.1f} s measured: {inserted:,} inserted ({inserted / seconds:,.0f}/s), "
                f"{sampled:,} sampled ({sampled / seconds:,.0f}/s), {ratio} samples per insert, "
                f"table size {self.last[2]:,}")


def start_workers(ctx, args, name, stop, events):
    workers = [ctx.Process(target=actor, args=(i, name, stop, events, os.getpid()),
                           name=f"actor {i}") for i in range(args.actors)]
    workers.append(ctx.Process(
        target=learner, args=(name, stop, events, os.getpid(), args.batch_size, args.seconds),
        name="learner"))
    # The terminal sends Ctrl-C to every process in the foreground group. Children started
    # while SIGINT is ignored ignore it from their first instruction; only the main
    # process reacts, and it stops them in order.
    with _signals_ignored(signal.SIGINT):
        for worker in workers:
            worker.start()
    return workers


def next_event(events, workers, timeout):
    """The next worker message, or None after ``timeout``. Raises if a worker failed."""
    try:
        kind, role, payload = events.get(timeout=max(0.0, timeout))
    except queue.Empty:
        kind = None
    if kind == "error":
        raise _WorkerFailed(role, payload)
    for worker in workers:
        if worker.exitcode is not None:
            raise _WorkerFailed(worker.name, f"exited early with code {worker.exitcode}")
    return None if kind is None else (kind, role, payload)


def shutdown(workers, stop, events, reports, timeout=10.0):
    """Asks the workers to stop, collects their reports and joins them (killing stragglers)."""
    stop.set()
    deadline = time.monotonic() + timeout
    while len(reports) < len(workers) and time.monotonic() < deadline:
        try:
            kind, role, payload = events.get(timeout=0.1)
        except queue.Empty:
            if not any(worker.is_alive() for worker in workers):
                break  # a worker that was killed sends no report
            continue
        if kind == "done":
            reports[role] = payload
    for worker in workers:
        worker.join(timeout=max(0.1, deadline - time.monotonic()))
        if worker.is_alive():
            print(f"warning: {worker.name} did not stop; terminating it", file=sys.stderr)
            worker.terminate()
            worker.join(timeout=5.0)
            if worker.is_alive():
                worker.kill()
                worker.join()
    events.close()
    events.join_thread()


def print_summary(args, progress, reports):
    print("summary:")
    if progress is not None:
        print(progress.summary())
    actors = [reports[role] for role in sorted(reports) if role.startswith("actor")]
    if actors:
        each = ", ".join(f"{r['inserted']:,}" for r in actors)
        print(f"  actors inserted {sum(r['inserted'] for r in actors):,} in all ({each})")
    stats = reports.get("learner")
    if stats and stats["batches"]:
        print(f"  learner: {stats['batches']:,} batches, mean size "
              f"{stats['sampled'] / stats['batches']:.0f} of {args.batch_size}, "
              f"{stats['updated']:,} priorities updated; last batch: beta {stats['beta']:.2f}, "
              f"mean importance weight {stats['mean_weight']:.3f}")


def leftovers(name: str):
    """What this buffer left in /dev/shm (it should be nothing)."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"shmreplay.{name}"))
    except FileNotFoundError:
        return []


def run(args) -> int:
    name = args.name or f"demo-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    ctx = mp.get_context("spawn")
    stop, events = ctx.Event(), ctx.Queue()
    workers, reports, progress = [], {}, None
    exit_code, interrupted = 0, None

    # SIGTERM unwinds like Ctrl-C's KeyboardInterrupt. The Server leaves a handler the
    # program installed alone, so the demo stops its workers first, then the buffer.
    signal.signal(signal.SIGTERM, _on_sigterm)
    server = shmreplay.Server(tables=[make_table(args)], name=name)
    client = shmreplay.Client(server.name)  # the main process reads the counters too
    try:
        limiter = client.server_info()[TABLE].rate_limiter_info
        kind = (f"SampleToInsertRatio({args.samples_per_insert:g}), min_size {args.min_size:,}, "
                f"diff band [{limiter.min_diff:,.0f}, {limiter.max_diff:,.0f}]"
                if args.samples_per_insert > 0 else f"MinSize({args.min_size:,})")
        print(f"buffer '{server.name}': table '{TABLE}', Prioritized(0.6) sampler, Fifo remover, "
              f"max_size {args.max_size:,}, {kind}")
        print(f"starting {args.actors} actor(s) and 1 learner (spawn); the first run in a "
              "checkout compiles numba kernels, later runs load them from the cache", flush=True)
        started = time.monotonic()
        workers = start_workers(ctx, args, server.name, stop, events)

        ready = set()  # each worker reports once its first insert or sample went through
        while len(ready) < len(workers):
            if time.monotonic() - started > args.startup_timeout:
                raise _WorkerFailed("startup", f"workers not ready after {args.startup_timeout} s")
            event = next_event(events, workers, timeout=0.2)
            if event is not None and event[0] == "ready":
                ready.add(event[1])
        print(f"workers ready after {time.monotonic() - started:.1f} s", flush=True)

        progress = Progress(client)
        progress.print_header()
        end = progress.t0 + args.seconds
        tick = progress.t0
        while time.monotonic() < end - 1e-3:
            tick = min(tick + 1.0, end)
            while time.monotonic() < tick:  # sleep, but notice a failing worker at once
                next_event(events, workers, timeout=tick - time.monotonic())
            progress.print_line()
    except KeyboardInterrupt:
        interrupted, exit_code = "Ctrl-C", 128 + signal.SIGINT
    except _Terminated:
        interrupted, exit_code = "SIGTERM", 128 + signal.SIGTERM
    except _WorkerFailed as failure:
        print(f"error: {failure.role} failed:\n{failure.detail}", file=sys.stderr)
        exit_code = 1
    finally:
        # Stop in order: workers first (their blocked calls wait 0.1 s at a time, so they
        # see the stop request), then the buffer. A second Ctrl-C must not abandon the
        # children.
        with _signals_ignored(signal.SIGINT, signal.SIGTERM):
            if interrupted:
                print(f"\n{interrupted}: stopping", flush=True)
            shutdown(workers, stop, events, reports)
            client.close()
            server.stop()
    print_summary(args, progress, reports)
    left = leftovers(server.name)
    if left:
        print(f"error: left behind in /dev/shm: {left}", file=sys.stderr)
        return exit_code or 1
    print(f"server stopped, {len(workers)} workers joined, nothing left in /dev/shm"
          + (f" (stopped early by {interrupted})" if interrupted else ""))
    return exit_code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Actor processes insert and a learner samples prioritized batches, "
                    "through a shmreplay buffer in shared memory.")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to run (10)")
    parser.add_argument("--actors", type=int, default=2, help="actor processes (2)")
    parser.add_argument("--batch-size", type=int, default=256, help="learner batch size (256)")
    parser.add_argument("--max-size", type=int, default=100_000, help="table capacity (100000)")
    parser.add_argument("--min-size", type=int, default=1_000,
                        help="items in the table before sampling starts (1000)")
    parser.add_argument("--samples-per-insert", type=float, default=8.0,
                        help="target of the SampleToInsertRatio limiter; 0 uses MinSize (8)")
    parser.add_argument("--name", default=None, help="buffer name (default: a unique one)")
    parser.add_argument("--startup-timeout", type=float, default=300.0,
                        help="seconds to wait for every worker's first insert or sample (300)")
    args = parser.parse_args(argv)
    if args.actors < 1 or args.batch_size < 1 or args.seconds <= 0:
        parser.error("--actors and --batch-size must be >= 1 and --seconds > 0")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

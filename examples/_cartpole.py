"""What the CartPole DQN examples share: the buffer, the actors, and the owner's loop.

* ``make_server``: a prioritized ``replay`` table of transitions, rate-limited to about
  one learner step of ``BATCH`` items per 4 environment steps, and a one-item
  ``params`` table through which the learner publishes its network.
* ``actor``: a process that steps gymnasium's CartPole-v1 with an epsilon-greedy policy
  (a numpy copy of the learner's Q-network, read from ``params`` by name) and writes
  each step with a ``TrajectoryWriter``; a transition item is cut out of the last two
  steps, so an observation is stored once although two items use it.
* ``run_goes_on``: what a learner asks when its batches ran dry. The actors may still be
  starting (a first run loads or compiles kernels and imports gymnasium) or busy; the
  learner waits for as long as the owner has not said stop.
* ``main``: creates the buffer, spawns the actors and a learner, prints a progress line
  every second, stops once the average return reaches the target (or at the time cap),
  and cleans up. Its exit status says whether the network learned.

The learners live in ``jax_dqn.py`` (JAX, ``shmreplay.jax.BatchIterator``) and
``tf_dqn.py`` (TensorFlow, ``shmreplay.tf.make_dataset``).
"""

import argparse
import collections
import contextlib
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import time
import traceback

import numpy as np

HIDDEN = 64
GAMMA = 0.99
BATCH = 128
WINDOW = 20  # episodes in the average return
# A learner's iterator (or dataset) ends after this long without a batch; the learner
# then asks ``run_goes_on`` and, if so, opens a new one. It is also how long a learner
# may take to notice a stop while no batches come.
WAIT_MS = 1_000
# The time cap, in seconds. A run stops as soon as the average return reaches the target,
# which a warm run on 2 cores does in well under a minute; the cap leaves room for a
# busy machine and a first run's kernel compilation (see examples/README.md).
DEFAULT_SECONDS = 300

OBS_SPEC = ((4,), np.float32)


def make_server(name):
    import shmreplay
    from shmreplay import rate_limiters, selectors
    spec = shmreplay.TensorSpec
    replay = shmreplay.Table(
        "replay", sampler=selectors.Prioritized(priority_exponent=0.6),
        remover=selectors.Fifo(), max_size=50_000,
        # About one learner step of BATCH items per 4 environment steps.
        rate_limiter=rate_limiters.SampleToInsertRatio(
            samples_per_insert=BATCH / 4, min_size_to_sample=1_000, error_buffer=20_000),
        # The items' shapes, known before the first one: a learner that starts before
        # the actors (they import gymnasium, and a first run compiles kernels) can build
        # its dataset at once (``shmreplay.tf.make_dataset`` reads them from the table).
        signature={"obs": spec(*OBS_SPEC), "action": spec((), np.int64),
                   "reward": spec((), np.float32), "discount": spec((), np.float32),
                   "next_obs": spec(*OBS_SPEC)})
    params = shmreplay.Table("params", sampler=selectors.Uniform(), remover=selectors.Fifo(),
                             max_size=1, rate_limiter=rate_limiters.MinSize(1))
    return shmreplay.Server([replay, params], name=name)


# --- the Q-network (numpy here; ``np_`` lets a learner pass jax.numpy) ---------------------

def init_params(rng):
    def layer(n_in, n_out):
        return (rng.normal(0, np.sqrt(2 / n_in), (n_in, n_out)).astype(np.float32),
                np.zeros(n_out, np.float32))
    (w1, b1), (w2, b2), (w3, b3) = layer(4, HIDDEN), layer(HIDDEN, HIDDEN), layer(HIDDEN, 2)
    return {"w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3, "b3": b3}


def q_values(params, obs, np_=np):
    h = np_.maximum(obs @ params["w1"] + params["b1"], 0)
    h = np_.maximum(h @ params["w2"] + params["b2"], 0)
    return h @ params["w3"] + params["b3"]


# --- workers -------------------------------------------------------------------------------

def run_goes_on(stop, owner_pid):
    """Whether a worker should keep going: the owner has not said stop and is alive (an
    orphan is adopted by another process)."""
    return not stop.is_set() and os.getppid() == owner_pid


def actor(name, actor_id, seed, stop, stats):
    import gymnasium as gym
    import shmreplay

    owner = os.getppid()
    client = shmreplay.Client(name)
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed + actor_id)
    params, steps, episodes = None, 0, 0
    writer = client.trajectory_writer(num_keep_alive_refs=2)
    try:
        while run_goes_on(stop, owner):
            obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
            episode_return, done = 0.0, False
            while not done and not stop.is_set():
                if steps % 200 == 0:  # the learner's latest network, if there is one yet
                    try:
                        latest = client.sample_batch("params", 1, timeout=0).data
                        params = {k: v[0] for k, v in latest.items()}
                    except shmreplay.DeadlineExceededError:
                        pass
                epsilon = max(0.05, 1.0 - steps / 5_000)
                if params is None or rng.random() < epsilon:
                    action = int(rng.integers(2))
                else:
                    action = int(np.argmax(q_values(params, obs.astype(np.float32))))
                next_obs, reward, terminated, truncated, _ = env.step(action)
                writer.append({"obs": obs.astype(np.float32), "action": action,
                               "reward": np.float32(reward),
                               "discount": np.float32(0.0 if terminated else GAMMA)})
                if writer.episode_steps >= 2:
                    add_transition(writer)
                obs, done = next_obs, terminated or truncated
                episode_return += reward
                steps += 1
            if done:
                # The final observation closes the last transition (its action and reward
                # are never used).
                writer.append({"obs": obs.astype(np.float32), "action": 0,
                               "reward": np.float32(0), "discount": np.float32(0)})
                add_transition(writer)
                try:
                    # Waits while the learner is behind (the rate limiter); items left
                    # waiting stay in the writer and go in with the next ones.
                    writer.end_episode(timeout_ms=1_000)
                except shmreplay.DeadlineExceededError:
                    pass
                episodes += 1
                stats.put(("episode", actor_id, episode_return, steps))
        writer.close()  # drops items still waiting: the learner has stopped
        client.close()
    except (shmreplay.errors.BufferBrokenError, shmreplay.errors.BufferNotFoundError):
        pass  # the owner removed the buffer: it is gone, and so is the run


def add_transition(writer):
    history = writer.history
    writer.create_item("replay", priority=1.0, trajectory={
        "obs": history["obs"][-2],            # obs and next_obs share one stored step
        "action": history["action"][-2],
        "reward": history["reward"][-2],
        "discount": history["discount"][-2],
        "next_obs": history["obs"][-1],
    })


# --- the owner -----------------------------------------------------------------------------

class _Terminated(Exception):
    """SIGTERM arrived: unwinds the owner the way KeyboardInterrupt does for Ctrl-C."""


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


def _leftovers(name):
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"shmreplay.{name}"))
    except FileNotFoundError:
        return []


def main(learner, description, default_name, target, argv=None):
    """Runs actors and ``learner`` (a top-level function ``(name, seed, stop, stats)``)
    against a fresh buffer, printing progress, until the average return of the last
    ``WINDOW`` episodes reaches ``target`` or the time cap passes. Returns the exit
    status: 0 if the target was reached, 1 if not (a line on stderr says why), 130 on
    Ctrl-C and 143 on SIGTERM."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS,
                        help=f"time cap in seconds ({DEFAULT_SECONDS}); the run stops "
                             "earlier once the target is reached")
    parser.add_argument("--target", type=float, default=target,
                        help=f"average return of the last {WINDOW} episodes at which the "
                             f"run stops, solved ({target:g}); CartPole-v1's cap is 500")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=f"{default_name}-{os.getpid()}")
    args = parser.parse_args(argv)
    begun = time.monotonic()

    # Ctrl-C raises KeyboardInterrupt in this process only (the workers ignore it), and
    # SIGTERM raises _Terminated: either way the workers are stopped and joined, then
    # the buffer is removed.
    signal.signal(signal.SIGTERM, _on_sigterm)
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    run = _Run(args, spawn.Queue())
    server = client = None
    workers = []
    exit_code, interrupted = 1, None
    try:
        server = make_server(args.name)  # a first run compiles kernels here
        client = server.localhost_client()
        workers = [spawn.Process(target=actor, args=(server.name, i, args.seed, stop, run.stats),
                                 name=f"actor {i}") for i in range(args.actors)]
        workers.append(spawn.Process(target=learner,
                                     args=(server.name, args.seed, stop, run.stats),
                                     name="learner"))
        print(f"{args.actors} actor(s) and a learner on buffer '{server.name}': until the "
              f"average return of {WINDOW} episodes reaches {args.target:g}, at most "
              f"{args.seconds:g} s", flush=True)
        with _signals_ignored(signal.SIGINT):  # only this process reacts to Ctrl-C
            for worker in workers:
                worker.start()
        run.watch(client, workers)
    except KeyboardInterrupt:
        interrupted, exit_code = "Ctrl-C", 128 + signal.SIGINT
    except _Terminated:
        interrupted, exit_code = "SIGTERM", 128 + signal.SIGTERM
    except Exception as exc:  # the traceback, then the usual ending
        traceback.print_exc()
        run.failure = f"{type(exc).__name__}: {exc}"
    finally:
        # Workers first (each notices the stop within about a second), then the buffer.
        # A second Ctrl-C or SIGTERM must not abandon the children.
        with _signals_ignored(signal.SIGINT, signal.SIGTERM):
            run.end()
            stop.set()
            _join(workers, run.stats)
            if client is not None:
                client.close()
            if server is not None:
                server.stop()
    if interrupted:
        print(f"{interrupted}: stopped after {run.elapsed():.0f} s", file=sys.stderr, flush=True)
    elif run.solved_at is not None:
        exit_code = 0
        print(f"solved in {run.solved_at:.0f} s: an average return of {run.best:.1f} over the "
              f"last {WINDOW} episodes (target {args.target:g}) after {run.learner_steps:,} "
              f"learner steps; {time.monotonic() - begun:.0f} s since the start, kernels and "
              "imports included", flush=True)
    else:
        print(f"error: not solved: {run.why_not()}", file=sys.stderr, flush=True)
    left = _leftovers(args.name) if server is not None else []
    if left:
        print(f"error: left behind in /dev/shm: {left}", file=sys.stderr, flush=True)
        exit_code = exit_code or 1
    print(f"best average return (last {WINDOW} episodes): {run.best:.1f}", flush=True)
    return exit_code


def _join(workers, stats, timeout=15.0):
    """Joins the workers (they were told to stop), killing any still alive after
    ``timeout`` seconds. Meanwhile it reads what they still report: a process that put
    items on a queue exits only once they are in the pipe, and a full pipe would keep
    it waiting for a reader."""
    deadline = time.monotonic() + timeout
    started = [worker for worker in workers if worker.pid is not None]
    while any(worker.is_alive() for worker in started) and time.monotonic() < deadline:
        try:
            stats.get(timeout=0.05)
        except queue.Empty:
            pass
        except (EOFError, OSError, pickle.UnpicklingError):
            pass  # a worker that Ctrl-C ended in the middle of a report left half of it
    for worker in started:
        if worker.is_alive():
            print(f"warning: {worker.name} did not stop; killing it", file=sys.stderr,
                  flush=True)
            worker.kill()
        worker.join()


class _Run:
    """The owner's view of a run: the workers' reports, the progress table, the outcome."""

    def __init__(self, args, stats):
        self.args, self.stats = args, stats
        self.returns = collections.deque(maxlen=WINDOW)
        self.env_steps = collections.defaultdict(int)
        self.episodes = self.learner_steps = self.inserted = 0
        self.best_full = None  # the best average of WINDOW episodes
        self.solved_at = self.failure = self.start = self.ended = None

    @property
    def best(self):
        """The best average of ``WINDOW`` episodes (of all of them, if fewer came)."""
        if self.best_full is not None:
            return self.best_full
        return float(np.mean(self.returns)) if self.returns else 0.0

    def elapsed(self):
        """Seconds since the workers started, until the run ended (``end``)."""
        if self.start is None:
            return 0.0
        return (time.monotonic() if self.ended is None else self.ended) - self.start

    def end(self):
        if self.ended is None:
            self.ended = time.monotonic()

    def watch(self, client, workers):
        """Prints a row a second until the target is reached, the time cap passes, or a
        worker dies."""
        self.start = last = time.monotonic()
        last_inserted = last_sampled = 0
        print(f"{'time':>6s} {'env steps':>10s} {'episodes':>8s} {'return':>7s} "
              f"{'items/s':>9s} {'samples/s':>10s} {'learner steps':>13s}", flush=True)
        while self.solved_at is None and self.failure is None:
            if self.elapsed() >= self.args.seconds:
                break
            try:
                self._report(self.stats.get(timeout=0.1))
            except queue.Empty:
                pass
            for worker in workers:
                if worker.exitcode is not None:  # nobody asked it to stop yet
                    self.failure = (f"{worker.name} exited with code {worker.exitcode} "
                                    "(its error, if any, is above)")
            now = time.monotonic()
            if now - last >= 1.0 or self.solved_at is not None or self.failure is not None:
                info = client.server_info()["replay"]
                self.inserted, sampled = info.num_inserted, info.num_sampled
                average = float(np.mean(self.returns)) if self.returns else 0.0
                print(f"{now - self.start:5.0f}s {sum(self.env_steps.values()):10,d} "
                      f"{self.episodes:8d} {average:7.1f} "
                      f"{(self.inserted - last_inserted) / (now - last):9,.0f} "
                      f"{(sampled - last_sampled) / (now - last):10,.0f} "
                      f"{self.learner_steps:13,d}", flush=True)
                last, last_inserted, last_sampled = now, self.inserted, sampled

    def _report(self, event):
        if event[0] == "learner":
            self.learner_steps = event[1]
            return
        _, actor_id, episode_return, steps = event
        self.returns.append(episode_return)
        self.env_steps[actor_id] = steps
        self.episodes += 1
        if len(self.returns) == WINDOW:
            average = float(np.mean(self.returns))
            self.best_full = max(average, self.best_full or 0.0)
            if average >= self.args.target:
                self.solved_at = self.elapsed()

    def why_not(self):
        if self.failure is not None:
            return self.failure
        seconds = f"{self.elapsed():.0f} s"
        if self.start is None:
            return "stopped before the workers started"
        if self.inserted == 0:
            return (f"the actors inserted nothing in {seconds} (still starting? they import "
                    "gymnasium and load kernels first; a longer --seconds may help)")
        if self.learner_steps == 0:
            return (f"the learner took no step in {seconds}: no batch arrived, although the "
                    f"actors inserted {self.inserted:,} items")
        return (f"learning too slow: the best average return was {self.best:.1f}, below the "
                f"target {self.args.target:g}, after {seconds} and {self.learner_steps:,} "
                "learner steps (a longer --seconds may get there)")

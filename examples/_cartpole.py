"""What the CartPole DQN examples share: the buffer, the actors, and the owner's loop.

* ``make_server``: a prioritized ``replay`` table of transitions, rate-limited to about
  one learner step of ``BATCH`` items per 4 environment steps, and a one-item
  ``params`` table through which the learner publishes its network.
* ``actor``: a process that steps gymnasium's CartPole-v1 with an epsilon-greedy policy
  (a numpy copy of the learner's Q-network, read from ``params`` by name) and writes
  each step with a ``TrajectoryWriter``; a transition item is cut out of the last two
  steps, so an observation is stored once although two items use it.
* ``main``: creates the buffer, spawns the actors and a learner, prints a progress line
  every second, and cleans up.

The learners live in ``jax_dqn.py`` (JAX, ``shmreplay.jax.BatchIterator``) and
``tf_dqn.py`` (TensorFlow, ``shmreplay.tf.make_dataset``).
"""

import argparse
import collections
import multiprocessing
import os
import queue
import time

import numpy as np

HIDDEN = 64
GAMMA = 0.99
BATCH = 128


def make_server(name):
    import shmreplay
    from shmreplay import rate_limiters, selectors
    replay = shmreplay.Table(
        "replay", sampler=selectors.Prioritized(priority_exponent=0.6),
        remover=selectors.Fifo(), max_size=50_000,
        # About one learner step of BATCH items per 4 environment steps.
        rate_limiter=rate_limiters.SampleToInsertRatio(
            samples_per_insert=BATCH / 4, min_size_to_sample=1_000, error_buffer=20_000))
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


# --- actors --------------------------------------------------------------------------------

def actor(name, actor_id, seed, stop, stats):
    import gymnasium as gym
    import shmreplay

    client = shmreplay.Client(name)
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed + actor_id)
    params, steps, episodes = None, 0, 0
    writer = client.trajectory_writer(num_keep_alive_refs=2)
    while not stop.is_set():
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

def main(learner, description, default_name, argv=None):
    """Runs actors and ``learner`` (a top-level function ``(name, seed, stop, stats)``)
    against a fresh buffer, printing progress; returns the best average return."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=f"{default_name}-{os.getpid()}")
    args = parser.parse_args(argv)

    spawn = multiprocessing.get_context("spawn")
    stop, stats = spawn.Event(), spawn.Queue()
    with make_server(args.name) as server:
        workers = [spawn.Process(target=actor, args=(server.name, i, args.seed, stop, stats))
                   for i in range(args.actors)]
        workers.append(spawn.Process(target=learner, args=(server.name, args.seed, stop, stats)))
        for worker in workers:
            worker.start()
        returns = collections.deque(maxlen=20)
        env_steps = collections.defaultdict(int)
        learner_steps, episodes, best = 0, 0, 0.0
        client = server.localhost_client()
        start = last = time.monotonic()
        last_inserted = last_sampled = 0
        print(f"{'time':>6s} {'env steps':>10s} {'episodes':>8s} {'return':>7s} "
              f"{'items/s':>9s} {'samples/s':>10s} {'learner steps':>13s}", flush=True)
        try:
            while time.monotonic() - start < args.seconds:
                try:
                    event = stats.get(timeout=0.1)
                    if event[0] == "episode":
                        _, actor_id, episode_return, steps = event
                        returns.append(episode_return)
                        env_steps[actor_id] = steps
                        episodes += 1
                    else:
                        learner_steps = event[1]
                except queue.Empty:
                    pass
                now = time.monotonic()
                if now - last >= 1.0:
                    info = client.server_info()["replay"]
                    inserted, sampled = info.num_inserted, info.num_sampled
                    average = float(np.mean(returns)) if returns else 0.0
                    best = max(best, average)
                    print(f"{now - start:5.0f}s {sum(env_steps.values()):10,d} {episodes:8d} "
                          f"{average:7.1f} {(inserted - last_inserted) / (now - last):9,.0f} "
                          f"{(sampled - last_sampled) / (now - last):10,.0f} "
                          f"{learner_steps:13,d}", flush=True)
                    last, last_inserted, last_sampled = now, inserted, sampled
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=15)
                if worker.is_alive():
                    worker.kill()
            client.close()
        print(f"best average return (last 20 episodes): {best:.1f}", flush=True)
    return best


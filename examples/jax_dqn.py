"""CartPole with DQN: actor processes and a JAX learner share one shmreplay buffer.

* Actor processes (``multiprocessing``, spawn) step gymnasium's CartPole with an
  epsilon-greedy policy and write transitions with a ``TrajectoryWriter``. Each item is
  ``{obs, action, reward, discount, next_obs}`` cut out of the last two steps, so an
  observation is stored once although two items use it.
* A learner process samples prioritized batches through ``shmreplay.jax.BatchIterator``
  (prefetched onto the JAX device), trains a double DQN, and sends the TD errors back
  as priorities. It publishes its network to a one-item ``params`` table that the
  actors read by name.
* This process owns the buffer and prints a progress line every second.

Run it::

    pip install -e '.[jax]' gymnasium && python examples/jax_dqn.py --seconds 120

The average return (of the last 20 episodes) climbs from about 20 (random) towards
500 (CartPole-v1's cap) within a couple of minutes on 2 cores.
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


# --- the Q-network, in numpy for actors and in JAX for the learner -------------------------

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


# --- the learner ---------------------------------------------------------------------------

def learner(name, seed, stop, stats, learning_rate=1e-3):
    import jax
    import jax.numpy as jnp
    import shmreplay
    from shmreplay.jax import BatchIterator

    client = shmreplay.Client(name)
    params = jax.tree_util.tree_map(jnp.asarray, init_params(np.random.default_rng(seed)))
    target = params
    adam = (jax.tree_util.tree_map(jnp.zeros_like, params),
            jax.tree_util.tree_map(jnp.zeros_like, params), 0)

    def loss_fn(params, target, batch, weights):
        q = q_values(params, batch["obs"], jnp)
        q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=1)[:, 0]
        best_next = jnp.argmax(q_values(params, batch["next_obs"], jnp), axis=1)
        q_next = jnp.take_along_axis(q_values(target, batch["next_obs"], jnp),
                                     best_next[:, None], axis=1)[:, 0]
        td = batch["reward"] + batch["discount"] * jax.lax.stop_gradient(q_next) - q_taken
        huber = jnp.where(jnp.abs(td) < 1, 0.5 * td ** 2, jnp.abs(td) - 0.5)
        return jnp.mean(weights * huber), td

    @jax.jit
    def update(params, target, adam, batch, weights):
        (_, td), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, target, batch, weights)
        m, v, t = adam
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        scale = learning_rate * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        params = jax.tree_util.tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + 1e-8),
                                        params, m, v)
        return params, (m, v, t), td

    def publish(params):
        host = {k: np.asarray(v) for k, v in params.items()}
        client.insert(host, priorities={"params": 1.0}, timeout=5)

    publish(params)
    steps = 0
    with BatchIterator(client, "replay", BATCH, importance_beta=0.4, prefetch=2,
                       rate_limiter_timeout_ms=1_000) as batches:
        while not stop.is_set():
            try:
                batch = next(batches)
            except StopIteration:  # no sample for a second: the actors are gone
                break
            params, adam, td = update(params, target, adam, batch.data, batch.weights)
            batches.update_priorities(batch.info.key, td, epsilon=1e-3)
            steps += 1
            if steps % 200 == 0:
                target = params
            if steps % 100 == 0:
                publish(params)
                stats.put(("learner", steps))
    client.close()


# --- the owner -----------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=f"jax-dqn-{os.getpid()}")
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


if __name__ == "__main__":
    main()

"""CartPole with DQN: actor processes and a JAX learner share one shmreplay buffer.

* Actor processes (``multiprocessing``, spawn) step gymnasium's CartPole and write
  transitions with a ``TrajectoryWriter`` (``_cartpole.py``).
* A learner process samples prioritized batches through ``shmreplay.jax.BatchIterator``
  (prefetched onto the JAX device), trains a double DQN, and sends the TD errors back
  as priorities. It publishes its network to a one-item ``params`` table that the
  actors read by name.
* This process owns the buffer and prints a progress line every second.

Run it::

    pip install -e '.[examples]' && python examples/jax_dqn.py

The average return (of the last 20 episodes) climbs from about 20 (random) towards
500 (CartPole-v1's cap). The run stops once it reaches 475 ("solved in N s", exit
status 0), or after ``--seconds`` (300) with exit status 1 and a line saying why. A
first run waits for the Server to compile shmreplay's kernels (it says so); later runs
load them from numba's cache.
"""

import os
import sys

import numpy as np

from _cartpole import BATCH, WAIT_MS, init_params, main, q_values, run_goes_on


def learner(name, seed, stop, stats, learning_rate=1e-3):
    """Trains a double DQN from prioritized batches; publishes params every 100 steps."""
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
    owner, steps = os.getppid(), 0
    while run_goes_on(stop, owner):
        # The iterator ends after WAIT_MS without a batch: the actors may still be
        # starting (a first run compiles kernels), or busy. The learner then opens
        # another, for as long as the owner has not said stop.
        with BatchIterator(client, "replay", BATCH, importance_beta=0.4, prefetch=2,
                           rate_limiter_timeout_ms=WAIT_MS) as batches:
            for batch in batches:
                params, adam, td = update(params, target, adam, batch.data, batch.weights)
                batches.update_priorities(batch.info.key, td, epsilon=1e-3)
                steps += 1
                if steps % 200 == 0:
                    target = params
                if steps % 100 == 0 or steps == 1:
                    publish(params)
                    stats.put(("learner", steps))
                if stop.is_set():
                    break
    client.close()


if __name__ == "__main__":
    sys.exit(main(learner, __doc__.split("\n\n")[0], "jax-dqn", target=475))

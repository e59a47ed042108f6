"""CartPole with DQN: actor processes and a TensorFlow learner share one shmreplay buffer.

* Actor processes (``multiprocessing``, spawn) step gymnasium's CartPole and write
  transitions with a ``TrajectoryWriter`` (``_cartpole.py``).
* A learner process reads prioritized batches from a tf.data dataset
  (``shmreplay.tf.make_dataset``: whole batches, prefetched), trains a double DQN in a
  ``tf.function``, and sends the TD errors back as priorities. It publishes its network
  to a one-item ``params`` table that the actors read by name.
* This process owns the buffer and prints a progress line every second.

Run it::

    pip install -e '.[examples,tf]' && python examples/tf_dqn.py

The average return (of the last 20 episodes) climbs from about 20 (random) towards
500 (CartPole-v1's cap). The run stops once it reaches 400 ("solved in N s", exit
status 0), or after ``--seconds`` (300) with exit status 1 and a line saying why. A
first run waits for the Server to compile shmreplay's kernels (it says so); later runs
load them from numba's cache.
"""

import os
import sys

import numpy as np

from _cartpole import BATCH, WAIT_MS, init_params, main, run_goes_on

BETA = 0.4  # importance-sampling correction


def learner(name, seed, stop, stats, learning_rate=1e-3):
    """Trains a double DQN from prioritized batches; publishes params every 100 steps."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import shmreplay
    from shmreplay import tf as shmreplay_tf

    client = shmreplay.Client(name)
    params = {k: tf.Variable(v) for k, v in init_params(np.random.default_rng(seed)).items()}
    target = {k: tf.Variable(v) for k, v in params.items()}
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    variables = list(params.values())

    def q_values(weights, obs):
        h = tf.nn.relu(obs @ weights["w1"] + weights["b1"])
        h = tf.nn.relu(h @ weights["w2"] + weights["b2"])
        return h @ weights["w3"] + weights["b3"]

    @tf.function
    def update(sample):
        data, info = sample.data, sample.info
        # Prioritized replay's importance weights, from the SampleInfo of the batch.
        weights = tf.cast(info.table_size, tf.float64) * info.probability
        weights = tf.cast(weights ** -BETA, tf.float32)
        weights = weights / tf.reduce_max(weights)
        best_next = tf.argmax(q_values(params, data["next_obs"]), axis=1)
        q_next = tf.gather(q_values(target, data["next_obs"]), best_next, batch_dims=1)
        goal = data["reward"] + data["discount"] * q_next
        with tf.GradientTape() as tape:
            q_taken = tf.gather(q_values(params, data["obs"]), data["action"], batch_dims=1)
            td = tf.stop_gradient(goal) - q_taken
            loss = tf.reduce_mean(weights * tf.keras.losses.huber(td[:, None], 0.0))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return info.key, td

    def publish():
        client.insert({k: v.numpy() for k, v in params.items()}, priorities={"params": 1.0},
                      timeout=5)

    publish()
    owner, steps = os.getppid(), 0
    while run_goes_on(stop, owner):
        # The dataset ends after WAIT_MS without a batch: the actors may still be
        # starting (a first run compiles kernels), or busy. The learner then makes
        # another, for as long as the owner has not said stop.
        dataset = shmreplay_tf.make_dataset(name, "replay", batch_size=BATCH, prefetch_size=2,
                                            rate_limiter_timeout_ms=WAIT_MS)
        for sample in dataset:
            keys, td = update(sample)
            client.update_priorities("replay", keys.numpy(), np.abs(td.numpy()) + 1e-3)
            steps += 1
            if steps % 200 == 0:
                for k in params:
                    target[k].assign(params[k])
            if steps % 100 == 0 or steps == 1:
                publish()
                stats.put(("learner", steps))
            if stop.is_set():
                break
    client.close()


if __name__ == "__main__":
    sys.exit(main(learner, __doc__.split("\n\n")[0], "tf-dqn", target=400))

"""The models of ``bench_learner_feed.py``: parameters, and the TensorFlow step.

Not a public module; the benchmark imports it from its own directory.
"""

import numpy as np

WORKLOADS = {  # time: how much longer than --seconds a round of the workload runs
    "transitions": {"batch": 256, "size": 32_768, "per": True, "time": 1},
    "atari": {"batch": 32, "size": 3_000, "per": False, "time": 3},
}


def make_items(workload, n, rng):
    """``n`` random items of the workload (both feeds' tables are filled with these)."""
    if workload == "transitions":
        return {"obs": rng.standard_normal((n, 15), np.float32),
                "act": rng.standard_normal((n, 3), np.float32),
                "rew": rng.standard_normal(n, np.float32),
                "next_obs": rng.standard_normal((n, 15), np.float32),
                "done": (rng.random(n) < 0.05).astype(np.float32)}
    return {"obs": rng.integers(0, 255, (n, 84, 84, 4), np.uint8),
            "action": rng.integers(0, 18, n).astype(np.int32),
            "reward": rng.standard_normal(n, np.float32),
            "discount": np.full(n, 0.99, np.float32),
            "next_obs": rng.integers(0, 255, (n, 84, 84, 4), np.uint8)}


def random_rows(workload):
    """``rows() -> {column: [B, ...]}``: a batch of random rows of columns as large as
    the table's, gathered by numpy (the least any replay must read; no replay)."""
    spec = WORKLOADS[workload]
    rng = np.random.default_rng(2)
    columns = make_items(workload, spec["size"], rng)

    def rows():
        picked = rng.integers(0, spec["size"], spec["batch"])
        return {key: column[picked] for key, column in columns.items()}
    return rows


def jax_init(workload, key):
    import jax
    import jax.numpy as jnp

    def dense(k, n_in, n_out):
        return [jax.random.normal(k, (n_in, n_out), jnp.float32) / float(np.sqrt(n_in)),
                jnp.zeros(n_out, jnp.float32)]
    keys = jax.random.split(key, 5)
    if workload == "transitions":
        return dense(keys[0], 18, 256) + dense(keys[1], 256, 256) + dense(keys[2], 256, 1)
    convs = []
    for k, (size, n_in, n_out) in zip(keys, ((8, 4, 32), (4, 32, 64), (3, 64, 64))):
        convs += [jax.random.normal(k, (size, size, n_in, n_out), jnp.float32)
                  / float(np.sqrt(size * size * n_in)), jnp.zeros(n_out, jnp.float32)]
    return convs + dense(keys[3], 3136, 512) + dense(keys[4], 512, 18)


def tf_train(workload):
    """``train(sample) -> td errors``: one SGD step of ``workload`` 's model (to trace)."""
    import tensorflow as tf
    per = WORKLOADS[workload]["per"]
    variables = tf_init(workload)
    # The targets come from a frozen copy (DQN's target network, never refreshed): the
    # same work per step, and it keeps thousands of steps on random data from diverging
    # to NaN TD errors (which the priority update would rightly refuse; it happened).
    frozen = [tf.Variable(var, trainable=False) for var in variables]

    if workload == "transitions":
        def q_values(obs, act, w=variables):
            h = tf.concat([obs, act], axis=1)
            h = tf.nn.relu(h @ w[0] + w[1])
            h = tf.nn.relu(h @ w[2] + w[3])
            return (h @ w[4] + w[5])[:, 0]

        def td_errors(data):
            target = data["rew"] + 0.99 * (1 - data["done"]) * tf.stop_gradient(
                q_values(data["next_obs"], data["act"], frozen))
            return target - q_values(data["obs"], data["act"])
    else:
        def q_all(frames, w=variables):
            h = tf.cast(frames, tf.float32) / 255.0
            for i, stride in ((0, 4), (2, 2), (4, 1)):
                h = tf.nn.relu(tf.nn.conv2d(h, w[i], stride, "VALID") + w[i + 1])
            h = tf.nn.relu(tf.reshape(h, [tf.shape(h)[0], -1]) @ w[6] + w[7])
            return h @ w[8] + w[9]

        def td_errors(data):
            target = data["reward"] + data["discount"] * tf.stop_gradient(
                tf.reduce_max(q_all(data["next_obs"], frozen), axis=1))
            q = tf.gather(q_all(data["obs"]), data["action"], axis=1, batch_dims=1)
            return target - q

    def train(sample):
        if per:
            n_p = tf.cast(sample.info.table_size, tf.float64) * sample.info.probability
            weights = tf.cast(n_p ** -0.4, tf.float32)
            weights = weights / tf.reduce_max(weights)
        else:
            weights = 1.0
        with tf.GradientTape() as tape:
            td = td_errors(sample.data)
            loss = tf.reduce_mean(weights * td ** 2)
        for var, grad in zip(variables, tape.gradient(loss, variables)):
            var.assign_sub(1e-4 * grad)
        return td

    return train, variables + frozen


def tf_init(workload):
    import tensorflow as tf
    rng = np.random.default_rng(0)

    def dense(n_in, n_out):
        return [tf.Variable(rng.standard_normal((n_in, n_out), np.float32) / float(np.sqrt(n_in))),
                tf.Variable(np.zeros(n_out, np.float32))]
    if workload == "transitions":
        return dense(18, 256) + dense(256, 256) + dense(256, 1)
    convs = []
    for size, n_in, n_out in ((8, 4, 32), (4, 32, 64), (3, 64, 64)):
        convs += [tf.Variable(rng.standard_normal((size, size, n_in, n_out), np.float32)
                              / float(np.sqrt(size * size * n_in))),
                  tf.Variable(np.zeros(n_out, np.float32))]
    return convs + dense(3136, 512) + dense(512, 18)

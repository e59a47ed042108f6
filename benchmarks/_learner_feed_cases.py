"""The learner-feed benchmark's cases: for one framework and workload, the train step
fed each way ``bench_learner_feed.py`` compares (its docstring says what each case is).

``jax_cases`` and ``tf_cases`` return ``{label: (step, finish)}``: ``step()`` runs one
train step, ``finish()`` waits for the work still in flight. Objects to close when the
row ends are appended to ``refs``.
"""

import numpy as np

from _learner_models import WORKLOADS

TABLE = "replay"
FLOOR_K = 8  # batches per numpy_function call in the TF floor_k case


# --------------------------------------------------------------------------- JAX

def jax_cases(client, name, workload, refs):
    import _learner_models
    import jax
    import jax.numpy as jnp
    import shmreplay
    from shmreplay.jax import BatchIterator
    spec = WORKLOADS[workload]
    key = jax.random.PRNGKey(0)
    params = _learner_models.jax_init(workload, key)

    if workload == "transitions":
        def q_values(p, obs, act):
            h = jnp.concatenate([obs, act], axis=1)
            h = jax.nn.relu(h @ p[0] + p[1])
            h = jax.nn.relu(h @ p[2] + p[3])
            return (h @ p[4] + p[5])[:, 0]

        def loss(p, data, weights):
            target = data["rew"] + 0.99 * (1 - data["done"]) * jax.lax.stop_gradient(
                q_values(p, data["next_obs"], data["act"]))
            td = target - q_values(p, data["obs"], data["act"])
            return jnp.mean(weights * td ** 2), td
    else:
        def q_all(p, frames):
            h = frames.astype(jnp.float32) / 255.0
            for i, stride in ((0, 4), (2, 2), (4, 1)):
                h = jax.lax.conv_general_dilated(h, p[i], (stride, stride), "VALID",
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
                h = jax.nn.relu(h + p[i + 1])
            h = jax.nn.relu(h.reshape(h.shape[0], -1) @ p[6] + p[7])
            return h @ p[8] + p[9]

        def loss(p, data, weights):
            target = data["reward"] + data["discount"] * jax.lax.stop_gradient(
                q_all(p, data["next_obs"]).max(axis=1))
            q = jnp.take_along_axis(q_all(p, data["obs"]), data["action"][:, None], 1)[:, 0]
            td = target - q
            return jnp.mean(weights * td ** 2), td

    @jax.jit
    def step(p, data, weights):
        (_, td), grads = jax.value_and_grad(loss, has_aux=True)(p, data, weights)
        return jax.tree_util.tree_map(lambda w, g: w - 1e-4 * g, p, grads), td

    state = {"p": params}
    beta = 0.4 if spec["per"] else None
    batches = BatchIterator(client, TABLE, spec["batch"], importance_beta=beta)
    refs.append(batches)
    first = next(batches)
    const_data = first.data
    const_w = first.weights if beta is not None else jnp.ones(spec["batch"], jnp.float32)

    def constant():
        state["p"], _ = step(state["p"], const_data, const_w)

    def feeding(iterator, update=True, wait=False):
        """``(step, finish)`` of the step fed by ``iterator``; ``update``: set the
        priorities after each step (``wait``: as ``update_priorities``)."""
        def fed():
            batch = next(iterator)
            weights = batch.weights if beta is not None else const_w
            state["p"], td = step(state["p"], batch.data, weights)
            if update and spec["per"]:
                iterator.update_priorities(batch.info.key, td, wait=wait)

        def finish():
            jax.block_until_ready(state["p"])
            if update and spec["per"]:
                iterator.flush()
        return fed, finish

    # The floor: the same iterator (thread, transfer, queue) over one batch sampled
    # once, and no priority updates: what feeding from host memory costs with no
    # sampling and no table.
    fixed_client = shmreplay.Client(name)
    fixed_sample = fixed_client.sample_batch(TABLE, spec["batch"])
    fixed_client.sample_batch = lambda *args, **kwargs: fixed_sample
    floor_batches = BatchIterator(fixed_client, TABLE, spec["batch"], importance_beta=beta)
    # prefetch=0: no thread; next() samples in this thread while the step dispatched
    # before computes, and queued updates are applied by later calls when ready.
    inline_batches = BatchIterator(client, TABLE, spec["batch"], importance_beta=beta,
                                   prefetch=0)
    inline_floor = BatchIterator(fixed_client, TABLE, spec["batch"], importance_beta=beta,
                                 prefetch=0)
    refs += [floor_batches, fixed_client, inline_batches, inline_floor]

    # The framework's own floor for fresh data: the batch as numpy arrays, copied to
    # fresh memory each step (as a new batch is) and passed to the step, which moves
    # them in its call. No iterator, no thread, no shmreplay.
    host_weights = (fixed_sample.info.importance_weights(beta) if beta is not None
                    else np.ones(spec["batch"], np.float32))

    def host():
        data = jax.tree_util.tree_map(np.copy, fixed_sample.data)
        state["p"], _ = step(state["p"], data, host_weights.copy())

    # The least any replay must do for a batch, with no replay: numpy gathering random
    # rows of columns as large as the table's (no sampling structure, no priorities, no
    # update), passed to the step as host's are.
    random_rows = _learner_models.random_rows(workload)

    def gather():
        state["p"], _ = step(state["p"], random_rows(), host_weights.copy())

    just_wait = feeding(floor_batches, update=False)[1]
    cases = {"constant": (constant, just_wait), "host": (host, just_wait),
             "gather": (gather, just_wait),
             "fed": feeding(batches), "floor": feeding(floor_batches, update=False),
             "fed_inline": feeding(inline_batches),
             "floor_inline": feeding(inline_floor, update=False)}
    if spec["per"]:
        cases["fed_wait"] = feeding(batches, wait=True)
    return cases


# --------------------------------------------------------------------------- TensorFlow

def tf_cases(client, name, workload, refs):
    import _learner_models
    import tensorflow as tf
    from shmreplay import _tf_packing, tf as stf
    spec = WORKLOADS[workload]
    per = spec["per"]
    train, variables = _learner_models.tf_train(workload)
    tf_client = stf.TFClient(name)

    @tf.function
    def constant_arg_step(sample):
        train(sample)

    @tf.function
    def in_graph_step(iterator):
        sample = next(iterator)
        td = train(sample)
        tf_client.update_priorities(
            TABLE, sample.info.key, tf.cast(tf.abs(td), tf.float64) + 1e-6)

    @tf.function
    def iterator_step(iterator):
        sample = next(iterator)
        td = train(sample)
        return (sample.info.key, td) if per else td

    train_fn = tf.function(train)
    dataset = stf.make_dataset(name, TABLE, spec["batch"])
    iterator = iter(dataset)
    eager_iterator = iter(stf.make_dataset(name, TABLE, spec["batch"]))
    in_graph_iterator = iter(stf.make_dataset(name, TABLE, spec["batch"]))
    const = next(iterator)
    refs += [dataset, iterator, eager_iterator, in_graph_iterator, variables, tf_client]

    # The constant batch reaches the same step through the cheapest iterator there is
    # (from_tensors(batch).repeat(): no Python, no copy). Not captured in the function:
    # TensorFlow would then fold what depends on the batch alone (the weights, the
    # concatenated inputs) and the step would do less work than the fed one.
    const_iterator = iter(tf.data.Dataset.from_tensors(const).repeat())
    refs.append(const_iterator)

    def constant_step():
        iterator_step(const_iterator)

    def eager_loop():
        sample = next(eager_iterator)
        td = train_fn(sample)
        if per:
            client.update_priorities(TABLE, sample.info.key.numpy(),
                                     np.abs(td.numpy().astype(np.float64)) + 1e-6)

    def feeding(batches):
        def fed():
            if not per:
                iterator_step(batches)
                return
            keys, td = iterator_step(batches)
            client.update_priorities(TABLE, keys.numpy(),
                                     np.abs(td.numpy().astype(np.float64)) + 1e-6)
        return fed

    # PackedBatches: each batch sampled in this thread when the step asks for it, its
    # leaves packed in one tensor that the step takes as its argument and unpacks.
    packed_batches = stf.PackedBatches(name, TABLE, spec["batch"])
    refs.append(packed_batches)

    @tf.function
    def packed_step(packed):
        return train(packed_batches.unpack(packed))

    def fed_packed():
        batch = next(packed_batches)
        td = packed_step(batch.packed)
        if per:  # (|td| + 1e-6, as fed's update)
            packed_batches.update_priorities(batch.info.key, td)

    # make_dataset's default against one batch per numpy_function call
    k1_iterator = iter(stf.make_dataset(name, TABLE, spec["batch"], batches_per_call=1))
    refs.append(k1_iterator)
    def nothing():
        pass

    # The floor: make_dataset's way into TensorFlow (a range mapped through one
    # numpy_function, the small leaves packed, prefetch 2) returning one batch sampled
    # once, and no priority updates: what tf.data costs with no sampling and no table.
    flat_spec = tf.nest.flatten(dataset.element_spec)
    packing = _tf_packing.Packing(flat_spec)
    fixed = packing.pack([leaf.numpy() for leaf in tf.nest.flatten(const)])

    def to_fixed(index):
        # (a fresh packed array each call, as make_dataset's: TensorFlow may reuse an
        # input's memory for an op's output when nothing else holds it)
        flat = packing.unpack(tf.numpy_function(lambda _: [fixed[0].copy()] + fixed[1:],
                                                [index], packing.output_dtypes,
                                                stateful=True))
        for tensor, leaf_spec in zip(flat, flat_spec):
            tensor.set_shape(leaf_spec.shape)
        return tf.nest.pack_sequence_as(dataset.element_spec, flat)
    floor_iterator = iter(tf.data.Dataset.range(1 << 62).map(to_fixed).prefetch(2))
    refs.append(floor_iterator)

    # The same floor with one numpy_function call per FLOOR_K batches (``unbatch``
    # splits them in C++): what amortizing tf.data's per-call cost would gain.
    if len(fixed) == 1:  # (every leaf packed: the transitions)
        stacked = np.stack([fixed[0]] * FLOOR_K)

        def to_fixed_k(index):
            packed = tf.numpy_function(lambda _: stacked.copy(), [index], tf.uint8,
                                       stateful=True)
            packed.set_shape([FLOOR_K, packing.size])
            return packed

        def unpack(packed):
            flat = packing.unpack([packed])
            for tensor, leaf_spec in zip(flat, flat_spec):
                tensor.set_shape(leaf_spec.shape)
            return tf.nest.pack_sequence_as(dataset.element_spec, flat)
        floor_k_iterator = iter(tf.data.Dataset.range(1 << 62).map(to_fixed_k).unbatch()
                                .map(unpack).prefetch(2))
        refs.append(floor_k_iterator)

    @tf.function
    def floor_step(iterator):
        train(next(iterator))

    # TensorFlow's own floor for fresh data: the batch as numpy arrays, copied to fresh
    # memory each step, passed to the function (which converts them in its call).
    host_batch = tf.nest.map_structure(lambda tensor: tensor.numpy(), const)

    def host():
        constant_arg_step(tf.nest.map_structure(np.copy, host_batch))

    # PackedBatches' floor: the least any replay must do, with no replay: numpy gathering
    # random rows of columns as large as the table's (the info of a real batch), packed
    # and passed to the same step as PackedBatches' batches are.
    random_rows = _learner_models.random_rows(workload)

    def gather_packed():
        packed = packed_batches.pack(host_batch._replace(data=random_rows()))
        np.asarray(packed_step(packed))  # (as fed_packed's update reads its TD errors)

    cases = {"constant": (constant_step, nothing), "host": (host, nothing),
             "gather_packed": (gather_packed, nothing),
             "fed": (feeding(iterator), nothing), "fed_packed": (fed_packed, nothing),
             "fed_k1": (feeding(k1_iterator), nothing),
             "fed_no_update": (lambda: iterator_step(iterator), nothing),
             "floor": (lambda: floor_step(floor_iterator), nothing),
             "constant_arg": (lambda: constant_arg_step(const), nothing)}
    if len(fixed) == 1:
        cases[f"floor_k{FLOOR_K}"] = (lambda: floor_step(floor_k_iterator), nothing)
    if per:
        cases["fed_in_graph"] = (lambda: in_graph_step(in_graph_iterator), nothing)
        cases["fed_eager_loop"] = (eager_loop, nothing)
    return cases

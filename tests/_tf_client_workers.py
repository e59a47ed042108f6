"""A spawned child for tests/test_tf_client.py: it attaches by name and uses TFClient in
a tf.data pipeline (a module of its own, so the parent's other workers never import TF)."""

import traceback


def insert_and_sample_in_pipeline(name, table, count, queue):
    """Inserts ``count`` items from a tf.data ``map`` and samples ``count`` items in
    another; reports the sampled values (or the error)."""
    try:
        import tensorflow as tf
        from shmreplay.tf import TFClient

        client = TFClient(name)

        def insert(i):
            value = tf.cast(i, tf.float32) + 100.0
            client.insert([tf.stack([value, value])], tf.constant([table]),
                          tf.constant([1.0], tf.float64))
            return i

        inserted = list(tf.data.Dataset.range(count).map(insert).as_numpy_iterator())
        sampled = tf.data.Dataset.range(count).map(
            lambda _: client.sample(table, [tf.float32]).data[0])
        queue.put(("ok", (len(inserted), [row.tolist() for row in sampled.as_numpy_iterator()])))
    except BaseException:
        queue.put(("error", traceback.format_exc()))
        raise

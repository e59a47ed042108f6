"""``shmreplay.jax.BatchIterator`` over a table of items of any length (issue 19, point 3):
padded batches with their lengths on the device, ``pad_to`` for one shape.

JAX is imported only in this file and test_jax.py.
"""

import multiprocessing

import jax
import numpy as np
import pytest

import _any_length_workers as W
import shmreplay
from shmreplay import rate_limiters, selectors
from shmreplay.jax import BatchIterator, JaxBatch, PaddedJaxBatch

SPAWN = multiprocessing.get_context("spawn")
LENGTHS = [3, 7, 1, 12, 5, 2]


def _table(name="eps", sampler=None):
    return shmreplay.Table(name, sampler or selectors.Prioritized(0.6), selectors.Fifo(),
                           100, rate_limiters.MinSize(1), signature=W.SIGNATURE)


def _written(lengths, base):
    starts = base + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return dict(zip(starts.tolist(), lengths))


def _check(batch, written, width):
    """Each row: a written episode whole, zeros after it; lengths on the device."""
    assert isinstance(batch, PaddedJaxBatch)
    device = jax.devices()[0]
    for leaf in jax.tree_util.tree_leaves((batch.data, batch.lengths)):
        assert isinstance(leaf, jax.Array) and leaf.devices() == {device}
    obs, step = np.asarray(batch.data["obs"]), np.asarray(batch.data["step"])
    lengths = np.asarray(batch.lengths["step"])
    assert obs.shape[1] == step.shape[1] == width
    assert (np.asarray(batch.lengths["obs"]) == lengths).all()
    for o, s, n in zip(obs, step, lengths):
        assert written[int(s[0])] == n
        assert (s[:n] == np.arange(s[0], s[0] + n)).all() and (o[:n] == s[:n, None]).all()
        assert (s[n:] == 0).all() and (o[n:] == 0).all()


def test_padded_batches_and_lengths_on_the_device(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", LENGTHS, base=100)
        with BatchIterator(client, "eps", batch_size=16, importance_beta=0.4,
                           max_batches=5) as batches:
            count = 0
            for batch in batches:
                _check(batch, _written(LENGTHS, 100), int(np.max(batch.lengths["step"])))
                assert batch.weights.shape == (16,)
                count += 1
        assert count == 5
        client.close()


def test_pad_to_gives_one_shape_and_refuses_longer_items(buffer_name):
    with shmreplay.Server([_table()], name=buffer_name) as server:
        client = server.localhost_client()
        W.write_episodes(client, "eps", LENGTHS, base=100)
        shapes = set()
        with BatchIterator(client, "eps", batch_size=8, max_batches=4, pad_to=16) as batches:
            for batch in batches:
                _check(batch, _written(LENGTHS, 100), 16)
                shapes.add(batch.data["obs"].shape)
        assert shapes == {(8, 16, 4)}
        with BatchIterator(client, "eps", batch_size=64, pad_to=11) as batches:
            with pytest.raises(ValueError, match="pad_to=11.*12 steps"):
                next(batches)
        client.close()


def test_pad_to_on_a_table_of_fixed_shapes_is_refused_at_once(buffer_name):
    table = shmreplay.Table("fixed", selectors.Uniform(), selectors.Fifo(), 10,
                            rate_limiters.MinSize(1))
    with shmreplay.Server([table], name=buffer_name) as server:
        client = server.localhost_client()
        client.insert({"x": np.zeros(3, np.float32)}, {"fixed": 1.0})
        with pytest.raises(ValueError, match="fixed shapes"):
            BatchIterator(client, "fixed", batch_size=2, pad_to=4)
        with BatchIterator(client, "fixed", batch_size=2, max_batches=1) as batches:
            assert type(next(batches)) is JaxBatch  # as before
        client.close()


def test_batches_from_actors_in_spawned_processes(buffer_name):
    with shmreplay.Server([_table(sampler=selectors.Uniform())], name=buffer_name) as server:
        client = server.localhost_client()
        dones = [SPAWN.Event() for _ in range(2)]
        plans = [([4, 9, 2, 6], 1_000), ([1, 13, 3], 2_000)]
        actors = [SPAWN.Process(target=W.actor, args=(buffer_name, "eps", lengths, base, done))
                  for (lengths, base), done in zip(plans, dones)]
        for actor in actors:
            actor.start()
        try:
            for done in dones:
                assert done.wait(60)
            written = {**_written(*plans[0]), **_written(*plans[1])}
            with BatchIterator(buffer_name, "eps", batch_size=32, max_batches=3,
                               rate_limiter_timeout_ms=5_000) as batches:
                seen = set()
                for batch in batches:
                    _check(batch, written, int(np.max(batch.lengths["step"])))
                    seen.update(np.asarray(batch.data["step"])[:, 0].tolist())
            assert seen == set(written)  # 96 draws of 7 items
        finally:
            for actor in actors:
                actor.join(10)
                if actor.is_alive():
                    actor.kill()
        client.close()
